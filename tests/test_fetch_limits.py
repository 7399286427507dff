"""ctx.fetch's limits: ``max_bytes`` refuses a large body without holding it, ``timeout`` is a deadline for the
whole call (a body that trickles in included), and a bad header is refused without quoting its value.

A local HTTPS server on 127.0.0.1 with a self-signed certificate made by the test (``certificate`` from
test_egress) serves a large body (with and without Content-Length) and a trickling one.
"""

import ssl
import threading
import time
import tracemalloc
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fabrika_django.exceptions import FetchError

from .test_egress import certificate, fetching  # noqa: F401 - the certificate fixture

pytestmark = pytest.mark.django_db

MIB = 1024 * 1024
_BODY = memoryview(b"x" * (40 * MIB))  # made once, before any measurement: the server sends slices of it


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        path, _, query = self.path.partition("?")
        size = int(query or 0)
        if path == "/sized":  # Content-Length says how large
            self._start(200, ("Content-Length", str(size)))
            self._send(size)
        elif path == "/unsized":  # no length: the body ends when the connection closes (HTTP/1.0)
            self._start(200)
            self._send(size)
        elif path == "/trickle":  # 20 bytes every 0.3 s, 400 bytes in all: 6 s
            self._start(200, ("Content-Length", "400"))
            for _ in range(20):
                if self.server.stop.wait(0.3):
                    return
                self.wfile.write(b"y" * 20)
                self.wfile.flush()
        else:
            self._start(404, ("Content-Length", "0"))

    def _start(self, status, *headers):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()

    def _send(self, size):
        sent = 0
        try:
            while sent < size and not self.server.stop.is_set():
                step = min(size - sent, MIB)
                self.wfile.write(_BODY[:step])
                sent += step
        except OSError:
            pass  # the client refused the rest: that is the point

    def log_message(self, format, *args):
        pass


@pytest.fixture
def server(certificate, monkeypatch):  # noqa: F811 - the fixture imported above
    cert, key = certificate
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    httpd.stop = threading.Event()
    httpd.origin = f"https://127.0.0.1:{httpd.server_address[1]}"
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the trust store ctx.fetch then uses, as a project's would
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.stop.set()
    httpd.shutdown()
    httpd.server_close()


def _peak_while(call):
    """Run ``call()`` under tracemalloc; return its answer and the peak of Python memory it allocated."""
    tracemalloc.start()
    try:
        answer = call()
        return answer, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("path", ["/sized", "/unsized"])
def test_a_body_over_max_bytes_is_refused_fetch_too_large_without_holding_it(server, path):
    url = f"{server.origin}{path}?{32 * MIB}"
    (result, [error]), peak = _peak_while(lambda: fetching([("GET", url, {"max_bytes": MIB})], egress=[server.origin]))
    assert (result.outcome, type(error), error.code) == ("fetch_too_large", FetchError, "fetch_too_large")
    assert str(error) == (
        f"GET to {server.origin} answered more than 1048576 bytes (max_bytes): ask for less, or raise max_bytes."
    )
    assert peak < 4 * MIB  # never the 32 MiB body: at most the limit and a chunk


def test_max_bytes_defaults_to_ten_mib(server):
    result, [error] = fetching([("GET", f"{server.origin}/sized?{10 * MIB + 1}", {})], egress=[server.origin])
    assert (result.outcome, error.code) == ("fetch_too_large", "fetch_too_large")
    result, [answer] = fetching([("GET", f"{server.origin}/sized?{10 * MIB}", {})], egress=[server.origin])
    assert (result.outcome, len(answer.body)) == ("succeeded", 10 * MIB)


@pytest.mark.parametrize("path", ["/sized", "/unsized"])
def test_a_body_within_max_bytes_is_held_once_not_twice(server, path):
    size = 8 * MIB
    (result, [answer]), peak = _peak_while(
        lambda: fetching([("GET", f"{server.origin}{path}?{size}", {})], egress=[server.origin])
    )
    assert (result.outcome, len(answer.body), answer.body[:3]) == ("succeeded", size, b"xxx")
    assert isinstance(answer.body, bytes)
    assert peak < 1.5 * size  # the body and its read buffer, never a second whole copy


@pytest.mark.parametrize("max_bytes", [0, -1, 1.5, True, "10"])
def test_a_max_bytes_that_is_not_a_whole_number_above_0_is_refused_before_anything_is_sent(server, max_bytes):
    result, [error] = fetching([("GET", f"{server.origin}/sized?1", {"max_bytes": max_bytes})], egress=[server.origin])
    assert (result.outcome, type(error)) == ("handler_failed", ValueError)
    assert str(error) == f"max_bytes={max_bytes!r} is not valid: give a whole number of bytes above 0."


def test_a_trickling_body_ends_at_the_calls_timeout_not_at_its_last_byte(server):
    started = time.monotonic()
    result, [error] = fetching([("GET", f"{server.origin}/trickle", {"timeout": 1})], egress=[server.origin])
    elapsed = time.monotonic() - started
    assert (result.outcome, type(error), error.reason) == ("fetch_failed", FetchError, "TimeoutError")
    # The body takes 6 s; a per-read socket timeout never fires (a chunk comes every 0.3 s).
    assert 1 <= elapsed < 3


def test_a_trickling_body_ends_at_the_attempts_deadline(server):
    started = time.monotonic()
    result, _ = fetching(
        [("GET", f"{server.origin}/trickle", {})], egress=[server.origin], timeout=timedelta(seconds=1)
    )
    assert result.outcome == "timed_out"
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer s3cret\r\nX-Evil: 1"},
        {"Authorization": "Bearer s3cret\nX-Evil: 1"},
        {"Authorization": "Bearer s3cret\x00"},
    ],
)
def test_a_header_value_with_a_line_break_is_refused_without_quoting_it(server, headers):
    result, [error] = fetching([("GET", f"{server.origin}/sized?1", {"headers": headers})], egress=[server.origin])
    assert (result.outcome, type(error)) == ("handler_failed", ValueError)
    assert str(error) == (
        "ctx.fetch header 'Authorization' holds a line break or a control character: give a one-line value."
    )
    assert "s3cret" not in str(error) and error.__cause__ is None


def test_a_header_name_that_is_not_a_token_is_refused_without_quoting_it(server):
    headers = {"X-Token s3cret": "1"}
    result, [error] = fetching([("GET", f"{server.origin}/sized?1", {"headers": headers})], egress=[server.origin])
    assert (result.outcome, type(error)) == ("handler_failed", ValueError)
    assert str(error) == "ctx.fetch header 1's name is not a header name: use letters, digits and '-'."
