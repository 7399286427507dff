"""``ctx.fetch``: HTTPS requests to the origins a job declares in ``@cron(..., egress=[...])``, within its time.

Built on the standard library's ``urllib.request``, so fabrika needs no HTTP dependency. A URL, and every
redirect it leads to, must be ``https`` on one of the declared origins (scheme, host and port; 443 is the
default port) and carry no credentials; anything else raises ``EgressRefused`` before a byte is sent.
Each call's timeout is at most the attempt's remaining time. HTTP error statuses come back as responses;
a failure to get any answer raises ``FetchError``. Nothing here logs or quotes a URL's path or query.
"""

from __future__ import annotations

import json as jsonlib
import ssl
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.client import HTTPException
from typing import TYPE_CHECKING, Any
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode, urlsplit

from .exceptions import EgressRefused, FabrikaError, FetchError

if TYPE_CHECKING:
    from .context import JobContext

#: Tests point this at an SSL context that trusts their own certificate; None uses the system's trust store.
_ssl_context: ssl.SSLContext | None = None


@dataclass(frozen=True)
class FetchResponse:
    """What ``ctx.fetch`` returns: any HTTP status (4xx and 5xx included), headers (lower-case names), body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """Return the body parsed as JSON (raises ValueError if it is not)."""
        return jsonlib.loads(self.body)


def fetch_for(ctx: JobContext) -> Callable[..., FetchResponse]:
    """Return ``fetch(method, url, *, headers=None, json=None, data=None, timeout=None)`` for the job of ``ctx``."""
    job = ctx.job
    allowed = frozenset(job.egress)  # @cron normalised each with origin_of()

    def fetch(
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        data: bytes | str | Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> FetchResponse:
        origin = _checked_origin(job.name, url, allowed)
        body, content_type = _body(json, data)
        if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"timeout={timeout!r} is not valid: give seconds above 0, or None for the time left.")
        left = ctx.signal.remaining()
        if left <= 0:  # 0 means the attempt ended (aborted, or its deadline passed): raise that end
            ctx.signal.throw_if_aborted()
        limit = left if timeout is None else min(timeout, left)
        request = urllib.request.Request(url, data=body, method=method.upper())
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        if content_type and not request.has_header("Content-type"):
            request.add_header("Content-type", content_type)
        opener = _opener(job.name, allowed)
        started = time.monotonic()
        try:
            try:
                answer = opener.open(request, timeout=limit)
                status = answer.status
            except HTTPError as error:
                answer, status = error, error.code  # a 4xx/5xx is an answer: the job decides what it means
            with answer:
                response = FetchResponse(status, _headers(answer.headers), _read(answer, started + limit))
        except FabrikaError:
            raise  # EgressRefused from a redirect is a PermissionError, hence an OSError: keep it as it is
        except (URLError, HTTPException, OSError) as error:
            # Past the deadline the attempt is over: say so rather than blame the network.
            ctx.signal.throw_if_aborted()
            reason = type(getattr(error, "reason", None) or error).__name__
            # No `from error`: its text may quote the URL, and a chained cause gets logged with tracebacks.
            message = f"{request.get_method()} to {origin} failed ({reason}): retry later, or check it is reachable."
            raise FetchError(message, origin=origin, reason=reason) from None
        ctx.log.debug("Fetched method=%s origin=%s status=%d", request.get_method(), origin, response.status)
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

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
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


def _opener(job_name: str, allowed: frozenset[str]) -> urllib.request.OpenerDirector:
    # Only the handlers HTTPS needs: no file:, ftp: or data: handler a crafted redirect could reach.
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),  # honours HTTPS_PROXY / NO_PROXY, as deployments behind a proxy need
        urllib.request.HTTPSHandler(context=_ssl_context or ssl.create_default_context()),
        urllib.request.HTTPDefaultErrorHandler(),
        _DeclaredRedirects(job_name, allowed),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


def _body(json: Any, data: bytes | str | Mapping[str, Any] | None) -> tuple[bytes | None, str | None]:
    if json is not None and data is not None:
        raise ValueError("ctx.fetch takes json= or data=, not both: pick one body.")
    if json is not None:
        return jsonlib.dumps(json).encode(), "application/json"
    if isinstance(data, Mapping):
        return urlencode(data, doseq=True).encode(), "application/x-www-form-urlencoded"
    return (data.encode() if isinstance(data, str) else data), None


def _headers(message: Any) -> dict[str, str]:
    # A repeated header is joined with ", " (RFC 9110 section 5.3) under its lower-case name.
    return {name.lower(): ", ".join(message.get_all(name)) for name in dict.fromkeys(message.keys())}


def _read(answer: Any, deadline: float) -> bytes:
    # The socket timeout bounds each wait, not the whole body: check the call's own deadline between chunks.
    chunks = []
    while chunk := answer.read(65536):
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise TimeoutError("the body took longer than the call's timeout")
    return b"".join(chunks)
