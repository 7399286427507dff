"""The worker's metrics endpoint: 127.0.0.1 unless told, the metrics token where one is set, at most eight
connections at once (idle ones wait in the kernel's backlog, not in threads), each cut off after its time."""

import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from django.test import override_settings

from fabrika_django import _metrics, _metrics_http

from .test_commands import fabrika_job

TOKEN = "t" * 40


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def served():
    """The worker's metrics served in this process on a free port; stopped after the test."""
    port = _free_port()
    _metrics.serve(port)
    _metrics.observe_attempt("lab_stamp", "succeeded", 0.2)
    yield port
    _metrics.stop()


def _get(port, headers=None, timeout=10):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - a local URL
            return response.status, response.read().decode(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), error.headers


def test_the_limits_are_eight_connections_of_ten_seconds():
    assert (_metrics_http.MAX_CONNECTIONS, _metrics_http.CONNECTION_SECONDS) == (8, 10.0)


def test_the_endpoint_listens_on_the_loopback_address_unless_told(served):
    assert _metrics._server.socket.getsockname() == ("127.0.0.1", served)
    status, body, _ = _get(served)
    assert status == 200 and 'fabrika_attempts_total{job="lab_stamp",outcome="succeeded"} 1.0' in body


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer " + "x" * 40}, 401),
        ({"Authorization": TOKEN}, 401),
        ({"Authorization": "Bearer " + TOKEN[:-1]}, 401),
        ({"Authorization": "Bearer " + TOKEN}, 200),
    ],
)
def test_with_a_metrics_token_the_endpoint_answers_only_its_bearer(served, headers, status):
    with override_settings(FABRIKA={"METRICS_TOKEN": TOKEN}):
        answer, body, sent = _get(served, headers)
    assert answer == status
    if status == 401:
        assert sent["WWW-Authenticate"] == 'Bearer realm="fabrika metrics"'
        assert "fabrika_attempts_total" not in body
    else:
        assert "fabrika_attempts_total" in body


def _connect_idle(port, count):
    """``count`` connections that send nothing (non-blocking: those past the backlog wait in the kernel)."""
    idle = []
    for _ in range(count):
        connection = socket.socket()
        connection.setblocking(False)
        connection.connect_ex(("127.0.0.1", port))
        idle.append(connection)
    return idle


def test_three_hundred_idle_connections_add_no_thread_and_each_is_cut_off(served, monkeypatch):
    monkeypatch.setattr(_metrics_http, "CONNECTION_SECONDS", 0.1)
    before = threading.active_count()
    idle = _connect_idle(served, 300)
    most = before
    answered = []
    scrape = threading.Thread(target=lambda: answered.append(_get(served, timeout=60)[0]))
    scrape.start()
    try:
        # The scrape queues behind the 300: it is answered once every one of them was accepted and cut off.
        while scrape.is_alive():
            most = max(most, threading.active_count() - 1)  # less the scrape's own thread
            time.sleep(0.01)
    finally:
        for connection in idle:
            connection.close()
        scrape.join()
    assert answered == [200]
    assert most <= before


def test_a_slow_client_is_cut_off_after_its_time(served, monkeypatch):
    monkeypatch.setattr(_metrics_http, "CONNECTION_SECONDS", 0.5)
    with socket.create_connection(("127.0.0.1", served), timeout=10) as slow:
        started = time.monotonic()
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        answer = None
        while time.monotonic() - started < 5:
            try:
                slow.sendall(b"X-Slow: 1\r\n")  # a header line each 0.1 s, never the blank line that ends them
            except OSError:  # the server closed: the write after the close is refused
                break
            slow.settimeout(0.1)
            try:
                answer = slow.recv(1024)
            except TimeoutError:
                continue
            break
        elapsed = time.monotonic() - started
    assert answer in (None, b"")  # closed, nothing served
    assert 0.4 < elapsed < 3


def test_metrics_addr_without_metrics_port_is_a_usage_error():
    assert fabrika_job("worker", "--metrics-addr", "0.0.0.0")[0:3:2] == (  # noqa: S104 - refused, never bound
        2,
        "--metrics-addr needs --metrics-port: give the port the metrics are served on.",
    )


def test_an_address_the_worker_cannot_listen_on_is_a_usage_error():
    code, _, err = fabrika_job("worker", "--metrics-port", str(_free_port()), "--metrics-addr", "192.0.2.1")
    assert code == 2
    assert err.startswith("Cannot serve metrics on 192.0.2.1 port ") and "\n" not in err.strip()
