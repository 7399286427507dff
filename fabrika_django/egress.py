"""``ctx.fetch``: HTTPS requests to the origins a job declares in ``@cron(..., egress=[...])``, within its time.

Built on the standard library's ``urllib.request``, so fabrika needs no HTTP dependency. A URL, and every
redirect it leads to, must be ``https`` on one of the declared origins (scheme, host and port; 443 is the
default port) and carry no credentials; anything else raises ``EgressRefused`` before a byte is sent.
Each call's timeout is at most the attempt's remaining time, and it is a deadline for the whole call: when it
passes, the call's sockets are shut down, so a body that trickles in cannot stretch it. A body larger than
``max_bytes`` is refused (``fetch_too_large``) as soon as its length says so or its bytes pass the limit; a body
within it is held once. HTTP error statuses come back as responses; a failure to get any answer raises
``FetchError``. Nothing here logs or quotes a URL's path or query, or a header's value.
"""

from __future__ import annotations

import functools
import http.client
import io
import json as jsonlib
import logging
import re
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.message import Message
from http.client import HTTPException, HTTPMessage, HTTPResponse
from typing import IO, Any, Protocol, TypedDict, Unpack
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode, urlsplit

from ._signal import AbortSignal
from .exceptions import EgressRefused, FabrikaError, FetchError

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
_CHUNK = 256 * 1024
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 section 5.6.2
_UNSAFE_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # any control character but the tab


@dataclass(frozen=True)
class FetchResponse:
    """What ``ctx.fetch`` returns: any HTTP status (4xx and 5xx included), headers (lower-case names), body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """Return the body parsed as JSON (raises ValueError if it is not)."""
        return jsonlib.loads(self.body)


class FetchOptions(TypedDict, total=False):
    """The keyword arguments of ``ctx.fetch`` (see ``fetch_for``)."""

    headers: Mapping[str, str] | None
    json: object
    data: bytes | str | Mapping[str, object] | None
    timeout: float | None
    max_bytes: int


class Fetch(Protocol):
    """The call ``ctx.fetch`` makes: ``fetch_for``'s answer."""

    def __call__(self, method: str, url: str, **options: Unpack[FetchOptions]) -> FetchResponse: ...


def fetch_for(
    job_name: str, origins: Iterable[str], signal: AbortSignal, log: logging.LoggerAdapter[logging.Logger]
) -> Fetch:
    """Return ``fetch(method, url, *, headers=None, json=None, data=None, timeout=None, max_bytes=10 MiB)`` for
    the job's declared ``origins`` (which @cron normalised with origin_of()), within the attempt's ``signal``."""
    allowed = frozenset(origins)

    def fetch(
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        json: object = None,
        data: bytes | str | Mapping[str, object] | None = None,
        timeout: float | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> FetchResponse:
        origin = _checked_origin(job_name, url, allowed)
        body, content_type = _body(json, data)
        if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"timeout={timeout!r} is not valid: give seconds above 0, or None for the time left.")
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
            raise ValueError(f"max_bytes={max_bytes!r} is not valid: give a whole number of bytes above 0.")
        checked = _checked_headers(headers or {})
        left = signal.remaining()
        if left <= 0:  # 0 means the attempt ended (aborted, or its deadline passed): raise that end
            signal.throw_if_aborted()
        limit = left if timeout is None else min(timeout, left)
        request = urllib.request.Request(url, data=body, method=method.upper())
        for name, value in checked:
            request.add_header(name, value)
        if content_type and not request.has_header("Content-type"):
            request.add_header("Content-type", content_type)
        deadline = _Deadline(limit)
        opener = _opener(job_name, allowed, deadline)
        try:
            with deadline:
                try:
                    answer = opener.open(request, timeout=limit)
                    status = answer.status
                except HTTPError as error:
                    answer, status = error, error.code  # a 4xx/5xx is an answer: the job decides what it means
                with answer:
                    response = FetchResponse(status, _headers(answer.headers), _read(answer, max_bytes, deadline))
        except _TooLarge:
            raise FetchError(
                f"{request.get_method()} to {origin} answered more than {max_bytes} bytes (max_bytes): "
                "ask for less, or raise max_bytes.",
                origin=origin,
                reason="max_bytes",
                code="fetch_too_large",
            ) from None
        except FabrikaError:
            raise  # EgressRefused from a redirect is a PermissionError, hence an OSError: keep it as it is
        except (URLError, HTTPException, OSError) as error:
            # Past the deadline the attempt is over: say so rather than blame the network.
            signal.throw_if_aborted()
            # A socket the deadline shut down fails in whatever way it was reading: name the cause.
            reason = "TimeoutError" if deadline.passed else type(getattr(error, "reason", None) or error).__name__
            # No `from error`: its text may quote the URL, and a chained cause gets logged with tracebacks.
            message = f"{request.get_method()} to {origin} failed ({reason}): retry later, or check it is reachable."
            raise FetchError(message, origin=origin, reason=reason) from None
        log.debug("Fetched method=%s origin=%s status=%d", request.get_method(), origin, response.status)
        return response

    return fetch


def origin_of(url: str) -> str:
    """Return ``https://host[:port]`` of ``url`` (no port for 443), or raise ValueError saying what is wrong."""
    # Whitespace and control characters are stripped by urlsplit but not by urllib's own parser: a URL the
    # two read differently could pass the check for one host and connect to another.
    if not isinstance(url, str) or any(ord(c) <= 0x20 or ord(c) == 0x7F or c == "\\" for c in url):
        raise ValueError("a URL with spaces, control characters or backslashes")
    parts = urlsplit(url)
    if parts.scheme.lower() != "https":
        raise ValueError(f"a URL with scheme {parts.scheme or 'none'!r} (only https is reachable)")
    if "@" in parts.netloc:
        raise ValueError("a URL with credentials in it (send them in headers instead)")
    port = parts.port  # ValueError for a port that is not a number
    if not parts.hostname:
        raise ValueError("a URL without a host")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"https://{host}" if port in (None, 443) else f"https://{host}:{port}"


def _checked_origin(job_name: str, url: str, allowed: frozenset[str]) -> str:
    try:
        origin = origin_of(url)
    except ValueError as problem:
        raise EgressRefused(
            f"Job '{job_name}' fetched {problem}: give an https:// URL on an origin declared in @cron(egress=[...]).",
            missing="egress",
        ) from None
    if origin not in allowed:
        raise EgressRefused(
            f"Job '{job_name}' fetched {origin} without declaring it: add it to @cron(..., egress=[{origin!r}]).",
            missing=f"egress:{origin}",
        )
    return origin


class _DeclaredRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to a declared origin: a redirect is the usual way around an egress list."""

    def __init__(self, job_name: str, allowed: frozenset[str]) -> None:
        self.job_name = job_name
        self.allowed = allowed

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> urllib.request.Request | None:
        try:
            origin = _checked_origin(self.job_name, newurl, self.allowed)
        except EgressRefused:
            fp.close()
            raise
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and origin != origin_of(req.full_url):
            # Credentials for one declared origin are not for another.
            for name in ("Authorization", "Cookie", "Proxy-authorization"):
                new.headers.pop(name, None)
                new.unredirected_hdrs.pop(name, None)
        return new


class _Deadline:
    """The end of one ``ctx.fetch`` call: at that moment every socket the call opened is shut down.

    A socket timeout bounds each wait, not the call: a server sending a byte now and then would hold it for
    ever. Shutting the sockets down wakes whatever read is blocked on them, wherever urllib is reading.
    """

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.passed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.passed:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        # The plain socket's shutdown: SSLSocket.shutdown would also drop the TLS state another thread is using.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # closed already


class _WatchedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection whose socket the call's deadline can shut down."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()
        self._deadline.watch(self.sock)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        # The system's trust store, or the one SSL_CERT_FILE / SSL_CERT_DIR name (OpenSSL reads them each time).
        self._tls = ssl.create_default_context()
        super().__init__(context=self._tls)
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> HTTPResponse:
        connection = functools.partial(_WatchedHTTPSConnection, deadline=self._deadline)
        return self.do_open(connection, req, context=self._tls)


def _opener(job_name: str, allowed: frozenset[str], deadline: _Deadline) -> urllib.request.OpenerDirector:
    # Only the handlers HTTPS needs: no file:, ftp: or data: handler a crafted redirect could reach.
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),  # honours HTTPS_PROXY / NO_PROXY, as deployments behind a proxy need
        _WatchedHTTPSHandler(deadline),
        urllib.request.HTTPDefaultErrorHandler(),
        _DeclaredRedirects(job_name, allowed),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


def _body(json: object, data: bytes | str | Mapping[str, object] | None) -> tuple[bytes | None, str | None]:
    if json is not None and data is not None:
        raise ValueError("ctx.fetch takes json= or data=, not both: pick one body.")
    if json is not None:
        return jsonlib.dumps(json).encode(), "application/json"
    if isinstance(data, Mapping):
        return urlencode(data, doseq=True).encode(), "application/x-www-form-urlencoded"
    return (data.encode() if isinstance(data, str) else data), None


def _headers(message: Message) -> dict[str, str]:
    # A repeated header is joined with ", " (RFC 9110 section 5.3) under its lower-case name.
    return {name.lower(): ", ".join(message.get_all(name) or ()) for name in dict.fromkeys(message.keys())}


def _checked_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The headers as pairs, or ValueError naming the bad one; never quoting a value (it may be a bearer token)."""
    checked = []
    for position, (name, value) in enumerate(headers.items(), start=1):
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ValueError(f"ctx.fetch header {position}'s name is not a header name: use letters, digits and '-'.")
        if not isinstance(value, str) or _UNSAFE_VALUE.search(value):
            raise ValueError(
                f"ctx.fetch header {name!r} holds a line break or a control character: give a one-line value."
            )
        checked.append((name, value))
    return checked


class _TooLarge(Exception):
    """The body is larger than the call's ``max_bytes``."""


def _read(answer: HTTPResponse | HTTPError, max_bytes: int, deadline: _Deadline) -> bytes:
    """The body, held once (BytesIO hands its buffer over); _TooLarge as soon as it passes ``max_bytes``."""
    declared = answer.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _TooLarge  # refused on its word, before a byte of the body is read
    body = io.BytesIO()
    while chunk := answer.read1(_CHUNK):
        if body.tell() + len(chunk) > max_bytes:
            raise _TooLarge
        body.write(chunk)
    if deadline.passed:
        # The deadline shut the socket down: what came so far is not the body.
        raise TimeoutError("the body took longer than the call's timeout")
    return body.getvalue()
