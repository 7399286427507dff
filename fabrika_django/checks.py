"""System checks ``fabrika.E0xx`` / ``fabrika.W0xx`` (``manage.py check``).

``@cron`` refuses a bad argument at import; these judge what needs every ``jobs.py`` loaded (duplicate
names, kicks of unknown jobs, kick cycles), jobs registered without ``@cron``, the project's queue
models and ``settings.FABRIKA``.

Ids are stable and never reused; a retired id stays below as a "reserved" comment.

- E001 bad schedule, E002 bad timeout, E003 bad retries, E004 bad lanes
- E010 duplicate job name, E011 kick of an unknown job, E012 kick cycle
- E020 queue model without a queue manager, E021 bad ``Queue.max_attempts``, E022 unknown ``Queue`` option
- E030 ``FABRIKA`` is not a dict, E031 unknown key, E032 bad value, E033 unknown ``LISTEN_DATABASE``,
  E034 ``OWN_MAIL_SENDER`` that does not import to a callable, E035 ``FILE_STATE`` that does not import to a
  callable, E036 a bad ``FILE_SWEEP``, E037 a ``FILE_SWEEP`` storage whose folder is no media folder (empty,
  relative, the root, or holding the project, its settings, an app, ``STATIC_ROOT``, ``sys.prefix`` or the working
  directory)
- E040 a ``TASKS`` backend that is ``fabrika_django.tasks.FabrikaBackend`` without fabrika_django installed
  (reported by the backend's own ``check()``, which Django's tasks checks call)
- W001 a top-level ``FABRIKA_*`` setting (fabrika reads only the ``FABRIKA`` dict)
- W002 an ``actions`` entry that no installed model's ``Meta`` declares (a typo, or a permission made by hand)
- W040 a MariaDB/MySQL database whose transactions would not run at READ COMMITTED (``_isolation.py``)
- W054 (``--deploy``, PostgreSQL) a queue table whose dead tuples vacuum has not removed: its autovacuum settings
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings as django_settings
from django.core import checks
from django.utils.module_loading import import_string

from . import _isolation  # noqa: F401  registers fabrika.W040
from .conf import DEFAULTS
from .jobs import MAX_LANES, MAX_TIMEOUT, CronJob, JobRegistry, lanes_problem, registry
from .ops import _health
from .schedule import Schedule, normalize

_QUEUE_OPTIONS = ("max_attempts",)
_DECLARE_HINT = "Declare the job with @cron(...), which checks its arguments at import."


def _job_error(job: CronJob, problem: str, hint: str, id: str) -> checks.Error:
    # obj is the name: a CronJob's repr would fill the line `manage.py check` prints.
    return checks.Error(f"Cron job '{job.name}' {problem}.", hint=hint, obj=job.name, id=id)


@checks.register("fabrika")
def _check_jobs(
    app_configs: Sequence[AppConfig] | None = None, *, jobs: JobRegistry | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Check every registered job, the duplicates the registry refused, and the kick graph."""
    jobs = registry if jobs is None else jobs
    errors: list[checks.CheckMessage] = []
    for job in jobs:
        errors.extend(_check_job(job))
    for duplicate in jobs.duplicates:
        first = jobs.get(duplicate.name) if duplicate.name in jobs else None
        where = f"in {first.module} and {duplicate.module}" if first is not None else f"twice in {duplicate.module}"
        errors.append(
            _job_error(
                duplicate,
                f"is declared {where}",
                "Job names are unique across the project: give one of them another name with @cron(..., name=...).",
                "fabrika.E010",
            )
        )
    errors.extend(_check_kicks(jobs))
    errors.extend(_check_actions(jobs))
    return errors


def _check_job(job: CronJob) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    if job.schedule is not None and not isinstance(job.schedule, Schedule):
        try:
            normalize(job.schedule)
            reason = "a string, not a Schedule"
        except ValueError:
            reason = "not a cron expression"
        errors.append(
            _job_error(
                job,
                f"has schedule {job.schedule!r}, which is {reason}",
                "Give five cron fields in UTC (e.g. '15 * * * *'), a macro such as '@hourly', or None. "
                + _DECLARE_HINT,
                "fabrika.E001",
            )
        )
    if not isinstance(job.timeout, timedelta) or not timedelta(0) < job.timeout <= MAX_TIMEOUT:
        errors.append(
            _job_error(
                job,
                f"has timeout {job.timeout!r}, which is not a timedelta of more than 0 and at most one day",
                "Give e.g. timeout=timedelta(minutes=10). " + _DECLARE_HINT,
                "fabrika.E002",
            )
        )
    retries = job.retries
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        errors.append(
            _job_error(
                job,
                f"has retries={retries!r}, which is not a whole number of 0 or more",
                "Give e.g. retries=2. " + _DECLARE_HINT,
                "fabrika.E003",
            )
        )
    problem = lanes_problem(job.lanes)
    if problem is not None:
        errors.append(
            _job_error(
                job,
                f"has {problem}",
                f"Give e.g. lanes=4 (at most {MAX_LANES}: each running lane holds a database connection). "
                + _DECLARE_HINT,
                "fabrika.E004",
            )
        )
    return errors


def _check_kicks(jobs: JobRegistry) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    graph: dict[str, list[str]] = {}
    for job in jobs:
        graph[job.name] = []
        for target in job.kicks:
            if target in jobs:
                graph[job.name].append(target)
            else:
                errors.append(
                    _job_error(
                        job,
                        f"kicks '{target}', which is no registered job",
                        "Fix the name in kicks=[...], or declare that job with @cron in an installed app's jobs.py.",
                        "fabrika.E011",
                    )
                )
    for cycle in _cycles(graph):
        path = " -> ".join([*cycle, cycle[0]])
        errors.append(
            checks.Error(
                f"Cron jobs kick each other in a cycle: {path}.",
                hint="Kicks must never form a cycle: remove one of these kicks and let that job's schedule pick up.",
                obj=cycle[0],
                id="fabrika.E012",
            )
        )
    return errors


def _check_actions(jobs: JobRegistry) -> list[checks.CheckMessage]:
    declared = {
        f"{model._meta.app_label}.{codename}"
        for model in apps.get_models()
        for codename in [
            *(f"{action}_{model._meta.model_name}" for action in model._meta.default_permissions),
            *(codename for codename, _name in model._meta.permissions),
        ]
    }
    warnings: list[checks.CheckMessage] = []
    for job in jobs:
        for action in sorted(job.actions or ()):
            if action not in declared:
                # A Warning, not an Error: a permission can also be a row someone added by hand.
                warnings.append(
                    checks.Warning(
                        f"Cron job '{job.name}' holds action '{action}', which no installed model declares.",
                        hint="Give app_label.codename of a model's permission, e.g. 'tasks.change_task' "
                        "(add_, change_, delete_, view_ and the Meta.permissions of each model).",
                        obj=job.name,
                        id="fabrika.W002",
                    )
                )
    return warnings


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Return each elementary cycle of ``graph`` once, rotated to start at its smallest name, sorted."""
    found: set[tuple[str, ...]] = set()

    def walk(start: str, node: str, path: list[str], on_path: set[str]) -> None:
        for target in graph.get(node, ()):
            if target == start:
                found.add(tuple(path))
            elif target > start and target not in on_path:
                # Only names after `start`: each cycle is found once, from its smallest name.
                path.append(target)
                on_path.add(target)
                walk(start, target, path, on_path)
                on_path.discard(target)
                path.pop()

    for start in sorted(graph):
        walk(start, start, [start], {start})
    return [list(cycle) for cycle in sorted(found)]


@checks.register(checks.Tags.models, "fabrika")
def _check_queue_models(
    app_configs: Sequence[AppConfig] | None = None, *, models: Iterable[type] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Check each concrete queue model: a queue manager as its default manager, a valid ``max_attempts``."""
    from .models import QueueModel
    from .queues import DEFAULT_MAX_ATTEMPTS, QueueQuerySet

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


def _positive_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


_VALUE_RULES: dict[str, tuple[Any, str]] = {
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
    "METRICS_TOKEN": (
        lambda v: v is None or isinstance(v, str) and len(v) >= 32,
        "None, or a random string of 32 characters or more (e.g. from secrets.token_urlsafe())",
    ),
}
#: Settings whose value a message never quotes.
_SECRET_KEYS = frozenset({"METRICS_TOKEN"})


@checks.register("fabrika")
def _check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
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
        from .ops._sweep_setting import check_setting

        errors.extend(check_setting(configured["FILE_SWEEP"]))
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


@checks.register(checks.Tags.database, deploy=True)
def _check_queue_tables_vacuum(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
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
        for finding in _health._queue_bloat(_health.DEFAULT_THRESHOLDS)
    ]
