"""Cron jobs: the ``@cron`` decorator, the frozen ``CronJob`` it returns, and the project's registry."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlsplit

from .egress import origin_of
from .exceptions import UnknownJob
from .schedule import Schedule, period_of

MAX_TIMEOUT = timedelta(days=1)
DEFAULT_TIMEOUT = timedelta(minutes=15)
#: The most lanes a job may declare: each running lane holds a database connection.
MAX_LANES = 64
MAILERS = ("installation", "own")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
_PERMISSION = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+$")
_RATE = re.compile(r"^([1-9][0-9]{0,8})/([smh])$")
#: A rate's unit in seconds, by its letter.
_RATE_UNITS = {"s": 1, "m": 60, "h": 3600}

#: A job's function: it takes the attempt's ``JobContext`` (named loosely here: context.py is built on this module,
#: so this one cannot name it) and its answer is ignored.
Handler = Callable[..., object]


@dataclass(frozen=True)
class CronJob:
    """A registered job: its function and everything ``@cron`` declared about it."""

    name: str
    func: Handler = field(repr=False, compare=False)
    schedule: Schedule | None
    retries: int = 0
    timeout: timedelta = DEFAULT_TIMEOUT
    kicks: tuple[str, ...] = ()
    mailer: str | None = None
    signs: tuple[str, ...] = ()
    egress: tuple[str, ...] = ()
    #: Django permission names the job holds; None holds everything.
    actions: frozenset[str] | None = None
    module: str = ""
    #: How many runs of the job may be active at once across the deployment, each in a lane of its own.
    lanes: int = 1
    #: The rows all its runs may claim together, as declared (``"20/s"``); None: no limit (``_runs.ratelimit``).
    rate_limit: str | None = None

    @property
    def period(self) -> timedelta:
        """Return the base of a claimed row's backoff: the schedule's period, or one minute."""
        return period_of(self.schedule)

    def __call__(self, ctx: object) -> object:
        return self.func(ctx)


class JobRegistry:
    """Every job the project's ``jobs.py`` modules declared, by name."""

    def __init__(self) -> None:
        self._registry: dict[str, CronJob] = {}
        #: Jobs refused because their name was taken; reported by the system checks.
        self.duplicates: list[CronJob] = []

    def register(self, job: CronJob) -> None:
        existing = self._registry.get(job.name)
        if existing is not None and existing.module != job.module:
            self.duplicates.append(job)
            return
        self._registry[job.name] = job

    def unregister(self, name: str) -> None:
        self._registry.pop(name, None)

    def get(self, name: str) -> CronJob:
        """Return the job named ``name`` or raise UnknownJob naming the known ones."""
        try:
            return self._registry[name]
        except KeyError:
            known = ", ".join(sorted(self._registry)) or "none"
            raise UnknownJob(
                f"No cron job is named {name!r}: known jobs are {known}. "
                "Declare it with @cron in an installed app's jobs.py."
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._registry

    def __iter__(self):
        return iter(sorted(self._registry.values(), key=lambda job: job.name))

    def __len__(self) -> int:
        return len(self._registry)


registry = JobRegistry()


def cron(
    schedule: str | None,
    *,
    name: str | None = None,
    retries: int = 0,
    timeout: timedelta = DEFAULT_TIMEOUT,
    kicks: Iterable[str] = (),
    mailer: str | None = None,
    signs: Iterable[str] = (),
    egress: Iterable[str] = (),
    actions: Iterable[str] | None = None,
    lanes: int = 1,
    rate_limit: str | None = None,
) -> Callable[[Handler], CronJob]:
    """Declare the decorated function a cron job running on ``schedule``: five cron fields in UTC (minute hour
    day-of-month month day-of-week), such as ``'15 * * * *'``, or a macro such as ``'@hourly'``; None for a job that
    runs only when kicked (and when rows it claimed come due again after their backoff).

    ``lanes``: up to this many runs of the job active at once, over every worker (1-64). ``rate_limit``: ``"N/s"``,
    ``"N/m"`` or ``"N/h"`` (N a whole number of 1 or more): the rows all its runs claim together, in every lane,
    worker and host, stay within it; ``claim()`` answers at most what it allows now and waits, bounded by
    ``ctx.signal``, when it allows none (``docs/howto/rate-limits.md``).

    Every argument is checked here, at import, and a bad one raises ValueError or TypeError naming it (a bad
    schedule: the job and the expression).
    """
    _check_retries(retries)
    _check_timeout(timeout)
    _check_lanes(lanes)
    if rate_limit is not None:
        parse_rate(rate_limit)
    declared_kicks = _names("kicks", kicks)
    if mailer is not None and mailer not in MAILERS:
        raise ValueError(f"mailer={mailer!r} is not a mailer: use 'installation', 'own' or None.")
    purposes = _names("signs", signs)
    origins = tuple(_check_origin(origin) for origin in _names("egress", egress))
    held = None if actions is None else frozenset(_check_permission(a) for a in _names("actions", actions))

    def decorate(func: Handler) -> CronJob:
        job_name = name if name is not None else func.__name__
        try:
            parsed = Schedule(schedule) if schedule is not None else None
        except ValueError as error:
            raise ValueError(f"Cron job {job_name!r}: {error}") from None
        if not isinstance(job_name, str) or not _NAME.match(job_name):
            raise ValueError(
                f"Cron job name {job_name!r} is not valid: use up to 100 letters, digits, '_', '.' or '-'."
            )
        job = CronJob(
            name=job_name,
            func=func,
            schedule=parsed,
            retries=retries,
            timeout=timeout,
            kicks=declared_kicks,
            mailer=mailer,
            signs=purposes,
            egress=origins,
            actions=held,
            module=getattr(func, "__module__", ""),
            lanes=lanes,
            rate_limit=rate_limit,
        )
        registry.register(job)
        return job

    return decorate


def _check_retries(retries: object) -> None:
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"retries={retries!r} is not valid: give a whole number, 0 or more.")


def lanes_problem(lanes: object) -> str | None:
    """Return what is wrong with a ``lanes`` value (None: nothing); @cron and the system check both say it."""
    if not isinstance(lanes, int) or isinstance(lanes, bool) or not 1 <= lanes <= MAX_LANES:
        return f"lanes={lanes!r} is out of bounds: give a whole number from 1 to {MAX_LANES}"
    return None


def _check_lanes(lanes: object) -> None:
    problem = lanes_problem(lanes)
    if problem is not None:
        raise ValueError(problem + ".")


def rate_problem(rate: object) -> str | None:
    """Return what is wrong with a rate limit (None: nothing); @cron and the tasks' system check both say it."""
    if isinstance(rate, str) and _RATE.match(rate):
        return None
    return (
        f"rate_limit={rate!r} is not a rate: give N/s, N/m or N/h (N a whole number of 1 or more, rows per second, "
        "minute or hour), e.g. '20/s'"
    )


def parse_rate(rate: object) -> tuple[int, int]:
    """Return a rate limit (``"20/s"``) as (N, its unit in seconds); a ValueError quoting a bad one."""
    match = _RATE.match(rate) if isinstance(rate, str) else None
    if match is None:
        raise ValueError(f"{rate_problem(rate)}.")
    return int(match.group(1)), _RATE_UNITS[match.group(2)]


def _check_timeout(timeout: object) -> None:
    if not isinstance(timeout, timedelta):
        raise TypeError(f"timeout={timeout!r} is not a timedelta: give e.g. timedelta(minutes=10).")
    if not timedelta(0) < timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout={timeout} is out of bounds: give more than 0 and at most one day.")


def _names(argument: str, values: Iterable[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise TypeError(f"{argument}={values!r} is a string: give a list of names, e.g. [{values!r}].")
    names = tuple(values)
    for value in names:
        if not isinstance(value, str) or not value:
            raise TypeError(f"{argument} holds {value!r}: every entry must be a non-empty string.")
    return names


def _check_origin(origin: str) -> str:
    """Return the origin in the one form ``ctx.fetch`` compares URLs with (lower case, no ``:443``)."""
    try:
        normal = origin_of(origin)
        parts = urlsplit(origin)
    except ValueError:
        normal = None
    if normal is None or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"egress origin {origin!r} is not an HTTPS origin: give e.g. 'https://api.example.com'.")
    return normal


def _check_permission(permission: str) -> str:
    if not _PERMISSION.match(permission):
        raise ValueError(f"action {permission!r} is not a Django permission name: give e.g. 'tasks.change_task'.")
    return permission


def task_job_name(backend: str, queue: str) -> str:
    """Return the name of the built-in job serving a Django task backend's queue, e.g. ``tasks.default.emails``."""
    return f"tasks.{backend}.{queue}"
