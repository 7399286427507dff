"""ctx.fetch: only the declared HTTPS origins, redirects included, within the attempt's remaining time.

The HTTPS origin is a local http.server behind TLS with a self-signed certificate made by the openssl CLI.
"""

import http.client
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fabrika_django.exceptions import CapabilityRefused, EgressRefused, FetchError, WorkerStopping
from fabrika_django.testing import run_job

from .jobs_helpers import temporary_job

pytestmark = pytest.mark.django_db


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.seen.append(self.path)
        port = self.server.server_address[1]
        if self.path.startswith("/echo"):
            length = int(self.headers.get("Content-Length") or 0)
            echo = {
                "method": self.command,
                "path": self.path,
                "body": self.rfile.read(length).decode(),
                "auth": self.headers.get("Authorization"),
            }
            self._answer(200, json.dumps(echo).encode(), ("Content-Type", "application/json"))
        elif self.path == "/hop":
            self._answer(302, b"", ("Location", "/echo"))
        elif self.path == "/away":  # same server, another origin: localhost is not 127.0.0.1
            self._answer(302, b"", ("Location", f"https://localhost:{port}/echo"))
        elif self.path == "/stall":
            self.server.release.wait(5)
        else:
            self._answer(404, b"no such page", ("Content-Type", "text/plain"))

    do_POST = do_GET

    def _answer(self, status, body, *headers):
        self.send_response(status)
        for name, value in (*headers, ("Content-Length", str(len(body)))):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def server(certificate, monkeypatch):
    """An HTTPS server on 127.0.0.1 that ctx.fetch trusts; ``.origin``, ``.seen`` (paths asked for)."""
    cert, key = certificate
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    httpd.seen, httpd.release = [], threading.Event()
    httpd.origin = f"https://127.0.0.1:{httpd.server_address[1]}"
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the trust store ctx.fetch then uses, as a project's would
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()


def fetching(calls, **options):
    """Run a job that makes each ``(method, url, kwargs)`` call; return the run's result and what each gave."""
    answers = []

    def fetcher(ctx):
        for method, url, kwargs in calls:
            try:
                answers.append(ctx.fetch(method, url, **kwargs))
            except Exception as error:
                answers.append(error)
                raise

    with temporary_job(fetcher, **options):
        return run_job("fetcher"), answers


def test_a_declared_origin_answers_with_status_headers_and_body(server):
    url = server.origin + "/echo?q=1"
    result, [answer] = fetching([("POST", url, {"json": {"a": 1}})], egress=[server.origin])
    assert result.outcome == "succeeded"
    assert (answer.status, answer.headers["content-type"]) == (200, "application/json")
    assert answer.json() == {"method": "POST", "path": "/echo?q=1", "body": '{"a": 1}', "auth": None}


def test_an_error_status_is_an_answer_not_an_exception(server):
    result, [answer] = fetching([("GET", server.origin + "/gone", {})], egress=[server.origin])
    assert (result.outcome, answer.status, answer.body) == ("succeeded", 404, b"no such page")


def test_a_certificate_outside_the_trust_store_is_refused(server, monkeypatch, tmp_path):
    """The server's certificate is trusted only through SSL_CERT_FILE: another store makes the fetch fail."""
    other = tmp_path / "empty.pem"
    other.write_text("")
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    result, [error] = fetching([("GET", server.origin + "/echo", {})], egress=[server.origin])
    assert result.outcome == "fetch_failed"
    assert isinstance(error, FetchError) and error.reason == "SSLCertVerificationError"


def test_an_undeclared_origin_is_refused_and_fails_the_attempt_as_egress_refused(server):
    result, [error] = fetching([("GET", server.origin + "/echo?email=a@b.example", {})], egress=["https://api.example"])
    assert result.outcome == "egress_refused"
    assert isinstance(error, EgressRefused) and isinstance(error, CapabilityRefused)
    assert (error.code, error.missing) == ("egress_refused", f"egress:{server.origin}")
    assert str(error) == (
        f"Job 'fetcher' fetched {server.origin} without declaring it: add it to @cron(..., egress=['{server.origin}'])."
    )
    assert server.seen == []


@pytest.mark.parametrize(
    "url, problem",
    [
        ("http://127.0.0.1:{port}/echo", "a URL with scheme 'http' (only https is reachable)"),
        ("//127.0.0.1:{port}/echo", "a URL with scheme 'none' (only https is reachable)"),
        ("https://user:secret@127.0.0.1:{port}/echo", "a URL with credentials in it (send them in headers instead)"),
        ("https://127.0.0.1:{port}\t/echo", "a URL with spaces, control characters or backslashes"),
    ],
)
def test_a_url_that_is_not_plain_https_is_refused_before_anything_is_sent(server, url, problem):
    port = server.server_address[1]
    result, [error] = fetching([("GET", url.format(port=port), {})], egress=[server.origin])
    assert (result.outcome, type(error), server.seen) == ("egress_refused", EgressRefused, [])
    assert str(error) == (
        f"Job 'fetcher' fetched {problem}: give an https:// URL on an origin declared in @cron(egress=[...])."
    )
    assert "secret" not in str(error)


def test_a_redirect_within_the_declared_origin_is_followed(server):
    call = ("GET", server.origin + "/hop", {"headers": {"Authorization": "Bearer t"}})
    result, [answer] = fetching([call], egress=[server.origin])
    assert (result.outcome, answer.status, answer.json()["auth"]) == ("succeeded", 200, "Bearer t")
    assert server.seen == ["/hop", "/echo"]


def test_a_redirect_to_an_undeclared_origin_is_refused(server):
    result, [error] = fetching([("GET", server.origin + "/away", {})], egress=[server.origin])
    port = server.server_address[1]
    assert (result.outcome, type(error), error.missing) == (
        "egress_refused",
        EgressRefused,
        f"egress:https://localhost:{port}",
    )
    assert server.seen == ["/away"]


def test_a_redirect_to_another_declared_origin_leaves_the_credentials_behind(server):
    other = f"https://localhost:{server.server_address[1]}"
    call = ("GET", server.origin + "/away", {"headers": {"Authorization": "Bearer t"}})
    result, [answer] = fetching([call], egress=[server.origin, other])
    assert (result.outcome, answer.status, answer.json()["auth"]) == ("succeeded", 200, None)


def test_the_timeout_given_to_the_connection_is_at_most_the_time_left(server, monkeypatch):
    timeouts = []
    connect = http.client.HTTPSConnection.connect

    def recording(connection):
        timeouts.append(connection.timeout)
        connect(connection)

    monkeypatch.setattr(http.client.HTTPSConnection, "connect", recording)
    url = server.origin + "/echo"
    calls = [("GET", url, {}), ("GET", url, {"timeout": 600}), ("GET", url, {"timeout": 2})]
    result, _ = fetching(calls, egress=[server.origin], timeout=timedelta(seconds=30))
    assert result.outcome == "succeeded"
    assert 29 < timeouts[0] <= 30 and 29 < timeouts[1] <= 30 and timeouts[2] == 2


def test_an_origin_that_stalls_ends_with_the_attempts_deadline(server):
    started = time.monotonic()
    result, [error] = fetching(
        [("GET", server.origin + "/stall", {})], egress=[server.origin], timeout=timedelta(seconds=0.3)
    )
    assert result.outcome == "timed_out"
    assert time.monotonic() - started < 3


def test_a_fetch_after_the_attempt_was_aborted_raises_and_sends_nothing(server):
    answers = []

    def aborted(ctx):
        ctx.signal.abort("shutdown")
        try:
            ctx.fetch("GET", server.origin + "/echo")
        except WorkerStopping as error:
            answers.append(error)

    with temporary_job(aborted, egress=[server.origin]):
        result = run_job("aborted")
    assert (result.outcome, len(answers), server.seen) == ("shutdown", 1, [])


def test_port_443_is_the_default_port_of_a_declared_origin():
    answers = []

    def default_port(ctx):
        ctx.signal.abort("shutdown")  # the origin check passes first; the abort keeps it off the network
        for url in ("https://api.example/x", "https://API.example:443/x"):
            try:
                ctx.fetch("GET", url)
            except Exception as error:
                answers.append(type(error))

    with temporary_job(default_port, egress=["https://api.example:443"]):
        run_job("default_port")
    assert answers == [WorkerStopping, WorkerStopping]


def test_an_unreachable_origin_fails_as_fetch_failed_without_quoting_the_url():
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        origin = f"https://127.0.0.1:{probe.getsockname()[1]}"
    result, [error] = fetching([("GET", origin + "/p?email=a@b.example", {})], egress=[origin])
    assert (result.outcome, type(error), error.code, error.origin) == (
        "fetch_failed",
        FetchError,
        "fetch_failed",
        origin,
    )
    assert str(error) == f"GET to {origin} failed (ConnectionRefusedError): retry later, or check it is reachable."
    assert error.__cause__ is None and error.__suppress_context__


@pytest.mark.parametrize(
    "origin", ["http://api.example", "https://user@api.example", "https://api.example/v1", "https://api.example:x"]
)
def test_cron_refuses_an_egress_entry_that_is_not_an_https_origin_and_registers_nothing(origin):
    from fabrika_django import cron
    from fabrika_django.jobs import registry

    def refused(ctx):
        pass

    with pytest.raises(ValueError) as error:
        cron(None, egress=[origin])(refused)
    assert str(error.value) == f"egress origin {origin!r} is not an HTTPS origin: give e.g. 'https://api.example.com'."
    assert "refused" not in registry


def test_cron_keeps_each_origin_in_the_form_fetch_compares_with():
    from fabrika_django import cron
    from fabrika_django.jobs import registry

    def normalised(ctx):
        pass

    try:
        job = cron(None, egress=["https://API.example:443", "https://api.example:8443/"])(normalised)
        assert job.egress == ("https://api.example", "https://api.example:8443")
    finally:
        registry.unregister("normalised")
