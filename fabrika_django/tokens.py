"""Signed tokens per purpose (``ctx.tokens``, and ``sign``/``verify`` for views) and absolute URLs (``ctx.url``).

A token is ``django.core.signing`` over ``{"c": claims, "e": expiry}`` with a salt of its own per purpose, so a
token signed for "unsubscribe" never verifies as another purpose. It is signed, not encrypted: anyone holding it
can read its claims, so put ids in them, never an address.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.core import signing
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from .conf import settings
from .exceptions import CapabilityRefused, TokenExpired, TokenInvalid

#: The longest life a token may be given: ten years.
MAX_DAYS = 3650
_SALT = "fabrika_django.tokens:"


def sign(purpose: str, claims: Mapping[str, object], *, days: float, now: datetime | None = None) -> str:
    """Return a URL-safe token carrying ``claims`` for ``purpose``, valid for ``days`` from ``now``."""
    _check_purpose(purpose)
    if not isinstance(claims, Mapping):
        raise TypeError(f"Token claims must be a dict of ids, not {type(claims).__name__}.")
    if isinstance(days, bool) or not isinstance(days, int | float) or not 0 < days <= MAX_DAYS:
        raise ValueError(f"days={days!r} is not a token's life: give a number of days above 0, at most {MAX_DAYS}.")
    expires = (now or timezone.now()) + timedelta(days=days)
    try:
        return signing.dumps({"c": dict(claims), "e": int(expires.timestamp())}, salt=_SALT + purpose, compress=True)
    except TypeError:
        raise TypeError("Token claims must be JSON values (ids, strings, numbers): convert the others first.") from None


def verify(purpose: str, token: str, *, now: datetime | None = None) -> dict[str, Any]:
    """Return the claims of ``token`` if it was signed for ``purpose`` and has not expired.

    Raises TokenInvalid for a tampered, foreign or malformed token and TokenExpired past its ``days``.
    """
    _check_purpose(purpose)
    if not isinstance(token, str) or not token:
        raise TokenInvalid("The link's token is missing: open the link from the e-mail whole.")
    try:
        payload = signing.loads(token, salt=_SALT + purpose)
    except signing.BadSignature:
        raise TokenInvalid("The link's token is not valid: open the link from the e-mail whole.") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("c"), dict) or not isinstance(payload.get("e"), int):
        raise TokenInvalid("The link's token is not valid: open the link from the e-mail whole.")
    if (now or timezone.now()).timestamp() >= payload["e"]:
        raise TokenExpired("The link has expired: ask for a new one.")
    return payload["c"]


class Tokens:
    """``ctx.tokens``: sign and verify for the purposes the job declared in ``signs``, on the run's clock."""

    def __init__(self, job_name: str, purposes: tuple[str, ...], clock: Callable[[], datetime]) -> None:
        self._job_name = job_name
        self._purposes = purposes
        self._clock = clock

    def sign(self, purpose: str, claims: Mapping[str, object], *, days: float) -> str:
        """Return a token for ``purpose`` (declared in ``signs``) carrying ``claims``, valid for ``days``."""
        self._check_declared(purpose)
        return sign(purpose, claims, days=days, now=self._clock())

    def verify(self, purpose: str, token: str) -> dict[str, Any]:
        """Return the claims of a token for ``purpose`` (declared in ``signs``), or raise TokenInvalid/TokenExpired."""
        self._check_declared(purpose)
        return verify(purpose, token, now=self._clock())

    def _check_declared(self, purpose: str) -> None:
        if purpose not in self._purposes:
            raise CapabilityRefused(
                f"Job '{self._job_name}' used the token purpose {purpose!r} without declaring it: "
                f"add it to @cron(..., signs=[{purpose!r}]).",
                missing=f"signs:{purpose}",
            )


def absolute_url(
    name: str, *, query: Mapping[str, object] | None = None, kwargs: Mapping[str, object] | None = None
) -> str:
    """Return ``BASE_URL`` joined with the path of the view ``name`` and ``query`` as its query string."""
    try:
        path = reverse(name, kwargs=dict(kwargs or {}))
    except NoReverseMatch:
        raise ValueError(
            f"No URL named {name!r} takes these kwargs: name a view of the project's urls.py ('app:name')."
        ) from None
    url = str(settings.BASE_URL).rstrip("/") + path
    return f"{url}?{urlencode(query, doseq=True)}" if query else url


def _check_purpose(purpose: object) -> None:
    if not isinstance(purpose, str) or not purpose:
        raise ValueError(f"Token purpose {purpose!r} is not valid: give the name declared in @cron(signs=[...]).")
