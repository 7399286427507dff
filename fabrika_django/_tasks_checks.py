"""``fabrika.E040``: a ``TASKS`` backend that is fabrika's, without fabrika_django in ``INSTALLED_APPS``;
``fabrika.E046``: a bad ``OPTIONS["rate_limit"]`` (``check_tasks_rate_limits``).

Django runs each backend's own ``check()`` only where its tasks checks are registered: on Django 6.1 once
something imported ``django.tasks``, on 5.2 when the backport's app is installed. So the mistake could pass
``manage.py check`` and surface as the first enqueue's error, which ``require_installed`` words as the check
does. ``checks.py`` registers ``check_tasks_backends``, which reads ``TASKS`` without making a backend, and the
backend's ``check()`` stays quiet wherever that one runs (here nothing is registered, so the backend may import
this module).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

#: The backend's class path; a subclass is fabrika's too.
_BACKEND = "fabrika_django.tasks.FabrikaBackend"


def not_installed(alias: str) -> checks.Error:
    return checks.Error(
        f"TASKS[{alias!r}] is a FabrikaBackend, but fabrika_django is not installed.",
        hint="Add 'fabrika_django' to INSTALLED_APPS and run migrate.",
        id="fabrika.E040",
    )


def require_installed(alias: str) -> None:
    """Refuse to use the backend ``alias`` without fabrika_django installed: E040's words, as one line.

    Where no tasks check ran (Django 6.x with nothing importing ``django.tasks`` when ``check`` ran), this is
    where the mistake shows: the first enqueue, rather than a model's error about ``app_label``.
    """
    if not apps.is_installed("fabrika_django"):
        error = not_installed(alias)
        raise ImproperlyConfigured(f"{error.msg} {error.hint} ({error.id})")


def check_tasks_backends(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[checks.CheckMessage]:
    """Report each ``TASKS`` alias whose backend is fabrika's while fabrika_django is not installed."""
    if apps.is_installed("fabrika_django"):
        return []
    return [not_installed(alias) for alias in fabrika_aliases()]


def fabrika_aliases() -> list[str]:
    """The ``TASKS`` aliases whose ``BACKEND`` is ``FabrikaBackend`` or a subclass (importing only the named)."""
    aliases = []
    for alias, params in getattr(django_settings, "TASKS", {}).items():
        backend = params.get("BACKEND", "") if isinstance(params, dict) else ""
        if backend == _BACKEND:
            aliases.append(alias)
            continue
        try:
            backend_class = import_string(backend)
            fabrika_class = import_string(_BACKEND)
        except (ImportError, ImproperlyConfigured):
            continue  # Django's own check reports an unknown backend; fabrika's needs django.tasks or the backport
        if isinstance(backend_class, type) and issubclass(backend_class, fabrika_class):
            aliases.append(alias)
    return aliases


def valid_rate_limits(value: object) -> dict[str, str]:
    """``OPTIONS["rate_limit"]``'s good entries, by queue (the backend's; ``check_tasks_rate_limits`` says the rest)."""
    from .jobs import rate_problem

    if not isinstance(value, dict):
        return {}
    return {queue: rate for queue, rate in value.items() if isinstance(queue, str) and rate_problem(rate) is None}


def check_tasks_rate_limits(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """``fabrika.E046``: each fabrika backend's ``OPTIONS["rate_limit"]`` is a dict of its queues to rates."""
    from .jobs import rate_problem

    errors: list[checks.CheckMessage] = []
    for alias in fabrika_aliases():
        params: Any = django_settings.TASKS[alias]
        limits = (params.get("OPTIONS") or {}).get("rate_limit")
        where = f"TASKS[{alias!r}]['OPTIONS']['rate_limit']"
        if limits is None:
            continue
        if not isinstance(limits, dict):
            errors.append(_rate_error(f"{where}={limits!r} is not a dict of queues to rates.", alias))
            continue
        queues = params.get("QUEUES") or ["default"]
        for queue, rate in limits.items():
            if queue not in queues:
                errors.append(
                    _rate_error(f"{where} names {queue!r}, which is not one of this backend's QUEUES.", alias)
                )
                continue
            problem = rate_problem(rate)
            if problem is not None:
                errors.append(_rate_error(f"{where}[{queue!r}]: {problem}.", alias))
    return errors


def check_tasks_periodic(app_configs: Sequence[AppConfig] | None = None, **kwargs: object) -> list[checks.CheckMessage]:
    """``fabrika.E041``-``E045``, ``E047``: each fabrika backend's ``OPTIONS["periodic"]`` entries (``_periodic``)."""
    errors: list[checks.CheckMessage] = []
    for alias in fabrika_aliases():
        params: Any = django_settings.TASKS[alias]
        periodic = (params.get("OPTIONS") or {}).get("periodic")
        if periodic is not None:
            # On use: it imports the tasks' machinery, which needs django.tasks (or the backport), and this module.
            from . import _periodic

            errors += _periodic.problems(alias, periodic, params.get("QUEUES") or ["default"])
    return errors


def _rate_error(message: str, alias: str) -> checks.Error:
    return checks.Error(
        message,
        hint=f"Give TASKS[{alias!r}]['OPTIONS']['rate_limit'] as {{queue: rate}}, each rate N/s, N/m or N/h "
        "(N a whole number of 1 or more), e.g. {'emails': '10/s'}.",
        id="fabrika.E046",
    )
