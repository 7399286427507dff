"""``fabrika.E030``–``E038``, ``W001``: ``settings.FABRIKA``, its keys and their values."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

from django.apps import AppConfig
from django.conf import settings as django_settings
from django.core import checks
from django.utils.module_loading import import_string

from ..conf import DEFAULTS
from ..ops import _health


def _positive_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


_VALUE_RULES: dict[str, tuple[Callable[[object], bool], str]] = {
    "ENVIRONMENT": (lambda v: isinstance(v, str), "a string, e.g. 'production'"),
    "BASE_URL": (
        lambda v: isinstance(v, str) and v.startswith(("http://", "https://")),
        "an absolute http(s) URL, e.g. 'https://example.com'",
    ),
    "LEASE_SECONDS": (_positive_number, "a number of seconds above 0, e.g. 30"),
    "POLL_INTERVAL": (_positive_number, "a number of seconds above 0, e.g. 1.0"),
    "LISTEN_DATABASE": (lambda v: v is None or isinstance(v, str), "a database alias, e.g. 'default', or None to poll"),
    "RUN_HISTORY_DAYS": (_positive_int, "a whole number of days, 1 or more"),
    "MAIL_LEDGER_DAYS": (_positive_int, "a whole number of days, 1 or more"),
    "FILE_STATE": (lambda v: v is None or isinstance(v, str), "None or a dotted path to a callable"),
    "TASK_RESULT_DAYS": (_positive_int, "a whole number of days, 1 or more"),
    "STORE_ERROR_MESSAGES": (lambda v: isinstance(v, bool), "True or False"),
    "OWN_MAIL_SENDER": (lambda v: v is None or isinstance(v, str), "None or a dotted path to a factory"),
    "ENFORCE_ACTIONS": (lambda v: isinstance(v, bool), "True or False"),
    "ASYNC_BOOKKEEPING_COMMITS": (lambda v: isinstance(v, bool), "True or False"),
    "METRICS_TOKEN": (
        lambda v: v is None or isinstance(v, str) and len(v) >= 32,
        "None, or a random string of 32 characters or more (e.g. from secrets.token_urlsafe())",
    ),
}
#: Settings whose value a message never quotes.
_SECRET_KEYS = frozenset({"METRICS_TOKEN"})


@checks.register("fabrika")
def _check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[checks.CheckMessage]:
    """Check ``settings.FABRIKA``: a dict of known keys with valid values; no top-level ``FABRIKA_*``."""
    errors: list[checks.CheckMessage] = []
    stray = sorted(name for name in dir(django_settings) if name.startswith("FABRIKA_"))
    for name in stray:
        key = name.removeprefix("FABRIKA_")
        errors.append(
            checks.Warning(
                f"Setting {name} is not read by fabrika_django.",
                hint=f"Put it in the FABRIKA dict instead: FABRIKA = {{{key!r}: ...}}."
                if key in DEFAULTS
                else "fabrika_django reads only the FABRIKA dict; remove this setting.",
                id="fabrika.W001",
            )
        )
    configured = getattr(django_settings, "FABRIKA", {})
    if not isinstance(configured, dict):
        errors.append(
            checks.Error(
                f"Setting FABRIKA is a {type(configured).__name__}, not a dict.",
                hint="Set FABRIKA = {'LEASE_SECONDS': 30, ...} with the keys you change, or remove it.",
                id="fabrika.E030",
            )
        )
        return errors
    for key in sorted(configured, key=str):
        if key not in DEFAULTS:
            close = difflib.get_close_matches(str(key), DEFAULTS, n=1)
            errors.append(
                checks.Error(
                    f"Setting FABRIKA has unknown key {key!r}.",
                    hint=(f"Did you mean {close[0]!r}? " if close else "")
                    + f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                    id="fabrika.E031",
                )
            )
            continue
        rule = _VALUE_RULES.get(key)
        if rule is not None and not rule[0](configured[key]):
            errors.append(
                checks.Error(
                    f"Setting FABRIKA[{key!r}] is "
                    f"{'a value' if key in _SECRET_KEYS else repr(configured[key])}, which is not valid.",
                    hint=f"Give {rule[1]}.",
                    id="fabrika.E032",
                )
            )
    listen = configured.get("LISTEN_DATABASE", DEFAULTS.get("LISTEN_DATABASE"))
    if isinstance(listen, str) and listen not in django_settings.DATABASES:
        errors.append(
            checks.Error(
                f"Setting FABRIKA['LISTEN_DATABASE'] names database {listen!r}, which is not in DATABASES.",
                hint=f"Name one of {', '.join(sorted(django_settings.DATABASES))}, or add a DATABASES entry "
                "that connects directly (not through a transaction pooler).",
                id="fabrika.E033",
            )
        )
    errors.extend(
        _check_callable(
            "OWN_MAIL_SENDER",
            configured.get("OWN_MAIL_SENDER"),
            "Name a function that returns a Django e-mail backend (or None), e.g. 'myapp.mail.sender'.",
            "fabrika.E034",
        )
    )
    errors.extend(
        _check_callable(
            "FILE_STATE",
            configured.get("FILE_STATE"),
            "Name a function (field_file) -> 'live' | 'pending' | 'quarantined' | 'rejected', "
            "e.g. 'myapp.scan.file_state'.",
            "fabrika.E035",
        )
    )
    if "FILE_SWEEP" in configured:
        from ..ops._sweep_setting import check_setting

        errors.extend(check_setting(configured["FILE_SWEEP"]))
    errors.extend(_health.check_setting(configured.get("HEALTH")))
    return errors


def _check_callable(key: str, path: object, hint: str, id: str) -> list[checks.CheckMessage]:
    """A dotted path that does not import would fail only when first used: say so at check time."""
    if not isinstance(path, str) or not path:
        return []
    try:
        target = import_string(path)
    except ImportError:
        target = None
    if callable(target):
        return []
    return [
        checks.Error(f"Setting FABRIKA[{key!r}] is {path!r}, which does not import to a callable.", hint=hint, id=id)
    ]
