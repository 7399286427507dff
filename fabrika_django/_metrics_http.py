"""The worker's metrics endpoint: a small HTTP server that a scraper cannot use to hold the worker's resources.

``fabrika_job worker --metrics-port PORT [--metrics-addr ADDR]`` serves ``/metrics`` on ``ADDR`` (``127.0.0.1``
unless given: the worker runs the jobs, so it listens where only its own host reaches it until the operator
chooses otherwise). Where ``FABRIKA["METRICS_TOKEN"]`` is set it answers only ``Authorization: Bearer <token>``
(401 otherwise), as ``fabrika_django.metrics.view`` does, comparing in constant time.

It serves at most ``MAX_CONNECTIONS`` connections at once, with that many threads made at start: more connections
wait in the listening socket's backlog (the kernel's, not a thread each), and each connection is closed
``CONNECTION_SECONDS`` after it was accepted, whatever it sends, so an idle or slow client frees its slot. One
request per connection (``Connection: close``).
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
from collections.abc import Callable

from .conf import settings

logger = logging.getLogger("fabrika_django.metrics")

#: Connections served at once (and threads serving them).
MAX_CONNECTIONS = 8
#: A connection's whole life, from its accept to its close, in seconds.
CONNECTION_SECONDS = 10.0
#: A request's line and headers together; a scrape's are a few hundred bytes.
_MAX_HEAD = 8192
_PATHS = frozenset({"/", "/metrics"})


def bearer_matches(authorization: str) -> bool:
    """Whether an ``Authorization`` header carries ``FABRIKA["METRICS_TOKEN"]`` (False while no token is set)."""
    token = settings.METRICS_TOKEN
    if not token or not authorization.startswith("Bearer "):
        return False
    return hmac.compare_digest(authorization.removeprefix("Bearer ").encode(), str(token).encode())


class Server:
    """A listening socket and the threads that answer it; ``close()`` stops both."""

    def __init__(self, addr: str, port: int, render: Callable[[], tuple[bytes, str]]) -> None:
        #: ``render() -> (bytes, content_type)``: the exposition, made per request.
        self._render = render
        self.socket = _listen(addr, port)
        self._threads = [
            threading.Thread(target=self._serve, name=f"fabrika-metrics-{number}", daemon=True)
            for number in range(MAX_CONNECTIONS)
        ]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        try:
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked in accept()
        except OSError:
            pass
        self.socket.close()
        for thread in self._threads:
            thread.join(CONNECTION_SECONDS + 1)

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:  # closed
                return
            with connection:
                try:
                    self._answer(connection, time.monotonic() + CONNECTION_SECONDS)
                except OSError:  # the client went away, or its time ran out (TimeoutError)
                    pass
                except Exception as error:  # noqa: BLE001 - one scrape's failure never ends a serving thread
                    logger.warning("Metrics request failed error=%s", type(error).__name__)

    def _answer(self, connection: socket.socket, deadline: float) -> None:
        head = _read_head(connection, deadline)
        if head is None:
            return
        method, path, headers = _parse(head)
        if method is None:
            status, body, kind = "400 Bad Request", b"Bad request.\n", "text/plain"
        elif method not in ("GET", "HEAD"):
            status, body, kind = "405 Method Not Allowed", b"GET only.\n", "text/plain"
        elif settings.METRICS_TOKEN and not bearer_matches(headers.get("authorization", "")):
            status, kind = "401 Unauthorized", "text/plain"
            body = b"Send Authorization: Bearer with FABRIKA['METRICS_TOKEN'].\n"
        elif path not in _PATHS:
            status, body, kind = "404 Not Found", b"The metrics are at /metrics.\n", "text/plain"
        else:
            status = "200 OK"
            body, kind = self._render()
        lines = [f"HTTP/1.1 {status}", f"Content-Type: {kind}", f"Content-Length: {len(body)}"]
        if status.startswith("401"):
            lines.append('WWW-Authenticate: Bearer realm="fabrika metrics"')
        lines.append("Connection: close")
        payload = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if method == "HEAD" else body)
        connection.settimeout(max(deadline - time.monotonic(), 0.001))  # sendall's timeout bounds the whole send
        connection.sendall(payload)


def _listen(addr: str, port: int) -> socket.socket:
    [(family, kind, proto, _, address), *_] = socket.getaddrinfo(
        addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(socket.SOMAXCONN)
    except OSError:
        listener.close()
        raise
    return listener


def _read_head(connection: socket.socket, deadline: float) -> bytes | None:
    """The request's line and headers, or None when the client closed, sent too much, or ran out of time."""
    head = b""
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or len(head) > _MAX_HEAD:
            return None
        connection.settimeout(remaining)
        chunk = connection.recv(1024)
        if not chunk:
            return None
        head += chunk
    return head


def _parse(head: bytes) -> tuple[str | None, str, dict[str, str]]:
    """(method, path without its query, headers by lower-case name); method None for what is no HTTP request."""
    lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None, "", {}
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1].split("?", 1)[0], headers
