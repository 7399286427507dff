"""``fabrika.E020``–``E022``, ``W054``: the project's queue models, and (``--deploy``) their tables' dead tuples."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

from django.apps import AppConfig, apps
from django.core import checks

from ..ops import _health

_QUEUE_OPTIONS = ("max_attempts",)


@checks.register(checks.Tags.models, "fabrika")
def _check_queue_models(
    app_configs: Sequence[AppConfig] | None = None, *, models: Iterable[type] | None = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """Check each concrete queue model: a queue manager as its default manager, a valid ``max_attempts``."""
    from ..models import QueueModel
    from ..queues import DEFAULT_MAX_ATTEMPTS, QueueQuerySet

    if models is None:
        configs = apps.get_app_configs() if app_configs is None else app_configs
        models = [model for config in configs for model in config.get_models()]
    errors: list[checks.CheckMessage] = []
    for model in models:
        if not issubclass(model, QueueModel) or model._meta.abstract:
            continue
        manager = model._default_manager
        if not issubclass(getattr(manager, "_queryset_class", type(None)), QueueQuerySet):
            errors.append(
                checks.Error(
                    f"Queue model '{model._meta.label}' has default manager '{manager.name}' "
                    f"({type(manager).__name__}), which is not a QueueManager: claim() and the state filters "
                    "are missing.",
                    hint="Derive the manager from fabrika_django.queues.QueueManager (or its queryset from "
                    "QueueQuerySet), or declare `objects = QueueManager()` first.",
                    obj=model,
                    id="fabrika.E020",
                )
            )
        options = getattr(model, "Queue", None)
        for option in sorted(name for name in vars(options or object) if not name.startswith("_")):
            if option not in _QUEUE_OPTIONS:
                close = difflib.get_close_matches(option, _QUEUE_OPTIONS, n=1)
                errors.append(
                    checks.Error(
                        f"Queue model '{model._meta.label}' has unknown Queue option '{option}'.",
                        hint=(f"Did you mean '{close[0]}'? " if close else "")
                        + f"Queue options are: {', '.join(_QUEUE_OPTIONS)}.",
                        obj=model,
                        id="fabrika.E022",
                    )
                )
        max_attempts = getattr(options, "max_attempts", DEFAULT_MAX_ATTEMPTS)
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            errors.append(
                checks.Error(
                    f"Queue model '{model._meta.label}' has Queue.max_attempts={max_attempts!r}, "
                    "which is not a whole number of 1 or more.",
                    hint="Set `class Queue: max_attempts = 5` (10 when omitted).",
                    obj=model,
                    id="fabrika.E021",
                )
            )
    return errors


@checks.register(checks.Tags.database, deploy=True)
def _check_queue_tables_vacuum(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """PostgreSQL, ``check --deploy --database``: a queue table bloated by dead tuples needs autovacuum settings."""
    if not databases:
        return []
    return [
        checks.Warning(
            f"Queue table of {finding.queue} is bloated with dead tuples that vacuum has not removed.",
            hint=finding.advice,
            obj=finding.queue,
            id="fabrika.W054",
        )
        for finding in _health.queue_bloat(_health.configured_thresholds())
    ]
