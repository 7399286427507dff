"""Health: what is stuck or about to hurt, each finding with a code, a severity and a sentence of what to do.

Codes (public: a monitor may match them): ``stuck_lease``, ``job_overdue``, ``dead_rows_grew``, ``old_due_row``,
and on PostgreSQL ``queue_bloat`` and ``old_transaction``. Every read is bounded: one row per job (leases and job
states), one counting statement per queue table (from its partial index), one sample per queue through the
samples' index, and the statistics views filtered to the queue tables and this database.

A finding names sessions by pid, state and age, never by their query text (it can quote a user's data).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.core import checks
from django.db import connections, models, router

from .._runs import reads as run_reads
from .._sql import ops as sql
from ..conf import settings
from ..jobs import registry
from ..models._tables import Job
from . import _counts
from ._history import dead_at_last_look


@dataclass(frozen=True)
class Thresholds:
    """When a condition becomes a finding: ``FABRIKA["HEALTH"]`` (``configured_thresholds()``), or a test's own."""

    #: A due row older than this is ``old_due_row``.
    old_due_row: timedelta = timedelta(hours=1)
    #: A transaction open longer than this is ``old_transaction`` (an error past ``old_transaction_error``).
    old_transaction: timedelta = timedelta(minutes=5)
    old_transaction_error: timedelta = timedelta(hours=1)
    #: A queue table with at least this many dead tuples, and more than ``bloat_ratio`` of its live ones.
    bloat_dead_tuples: int = 10_000
    bloat_ratio: float = 0.1
    #: "Since the last look": the oldest sample within this window is the count compared with.
    last_look: timedelta = timedelta(hours=1)
    #: A job whose last success is older than this many of its periods is ``job_overdue``.
    overdue_periods: int = 3


DEFAULT_THRESHOLDS = Thresholds()

#: ``FABRIKA["HEALTH"]``'s keys and defaults: seconds, counts and a ratio.
HEALTH_DEFAULTS: dict[str, int | float] = {
    "old_due_row_seconds": 3600,
    "old_transaction_seconds": 300,
    "old_transaction_error_seconds": 3600,
    "bloat_dead_tuples": 10_000,
    "bloat_ratio": 0.1,
    "overdue_periods": 3,
}
#: The largest value of each kind a threshold may take: ten years of seconds, and as many periods or tuples (no
#: finding comes later than that, and past it the time arithmetic overflows).
_MOST = {"seconds": 10 * 365 * 86400, "count": 10**9}


def configured_thresholds() -> Thresholds:
    """The thresholds ``FABRIKA["HEALTH"]`` sets (the defaults for what it leaves out, or all where it is bad:
    ``manage.py check`` says what, and health stays on rather than breaking the pages that show it)."""
    given = settings.HEALTH
    if given is None or check_setting(given):
        return DEFAULT_THRESHOLDS
    value = {**HEALTH_DEFAULTS, **given}
    return Thresholds(
        old_due_row=timedelta(seconds=value["old_due_row_seconds"]),
        old_transaction=timedelta(seconds=value["old_transaction_seconds"]),
        old_transaction_error=timedelta(seconds=value["old_transaction_error_seconds"]),
        bloat_dead_tuples=value["bloat_dead_tuples"],
        bloat_ratio=value["bloat_ratio"],
        overdue_periods=value["overdue_periods"],
    )


def check_setting(value: object) -> list[checks.CheckMessage]:
    """``fabrika.E038``: ``FABRIKA["HEALTH"]`` is a dict of known keys with positive numbers, a ratio of at most 1,
    and an error threshold no lower than its warning threshold."""

    def error(problem: str) -> list[checks.CheckMessage]:
        return [
            checks.Error(
                f"Setting FABRIKA['HEALTH'] {problem}.",
                hint="Set FABRIKA['HEALTH'] to a dict of the thresholds you change, e.g. {'old_due_row_seconds': "
                f"600}}; its keys and defaults: {', '.join(f'{k}={v}' for k, v in HEALTH_DEFAULTS.items())}.",
                id="fabrika.E038",
            )
        ]

    if value is None:
        return []
    if not isinstance(value, dict):
        return error(f"is a {type(value).__name__}, not a dict")
    unknown = sorted(str(key) for key in value if key not in HEALTH_DEFAULTS)
    if unknown:
        return error(f"has unknown key {unknown[0]!r}")
    for key, given in value.items():
        most = _MOST["seconds" if key.endswith("_seconds") else "count"]
        if not isinstance(given, int | float) or isinstance(given, bool) or not 0 < given <= most:
            return error(f"has {key}={given!r}, which is not a positive number of at most {most}")
    if value.get("bloat_ratio", 0) > 1:
        return error(f"has bloat_ratio={value['bloat_ratio']!r}, which is above 1 (a share of the live tuples)")
    merged = {**HEALTH_DEFAULTS, **value}
    if merged["old_transaction_error_seconds"] < merged["old_transaction_seconds"]:
        return error(
            f"has old_transaction_error_seconds={merged['old_transaction_error_seconds']!r} below "
            f"old_transaction_seconds={merged['old_transaction_seconds']!r}: an error comes after its warning"
        )
    return []


@dataclass(frozen=True)
class Finding:
    """One condition: ``check`` (a code), ``severity`` ("warning" | "error"), ``advice`` (what to do)."""

    check: str
    severity: str
    advice: str
    job: str | None = None
    queue: str | None = None
    pid: int | None = None
    age_seconds: float | None = None

    def as_dict(self) -> dict[str, str | int | float]:
        """Return the finding as ``status --json`` prints it: the keys that apply, nothing null."""
        return {key: value for key, value in asdict(self).items() if value is not None}


def health_report(
    now: datetime,
    *,
    counts: dict[str, _counts.QueueCounts] | None = None,
    thresholds: Thresholds | None = None,
) -> list[Finding]:
    """Return every finding, errors first. ``counts``: queue counts already read (by label), to read them once;
    ``thresholds``: ``FABRIKA["HEALTH"]``'s unless given."""
    if thresholds is None:
        thresholds = configured_thresholds()
    if counts is None:
        counts = {model._meta.label: _counts.count_queue(model, now, done=False) for model in _counts.queue_models()}
    findings = [
        *_stuck_leases(now),
        *_overdue_jobs(now, thresholds),
        *_dead_rows_grew(now, counts, thresholds),
        *_old_due_rows(now, counts, thresholds),
        *queue_bloat(thresholds),
        *_old_transactions(thresholds),
    ]
    return sorted(findings, key=lambda finding: finding.severity != "error")


def _words(seconds: float) -> str:
    """Say a duration in the largest two units: ``2 h 5 min``, ``40 s``."""
    whole = int(seconds)
    days, hours, minutes = whole // 86400, whole % 86400 // 3600, whole % 3600 // 60
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (whole % 60, "s")]
    shown = [f"{amount} {unit}" for amount, unit in parts if amount][:2]
    return " ".join(shown) or "0 s"


def _stuck_leases(now: datetime) -> list[Finding]:
    """A lease with a token whose expiry passed: its holder stopped renewing it, and nobody took it over yet."""
    findings = []
    for job, holder, expires in run_reads.expired_leases(now):
        age = (now - expires).total_seconds() if expires is not None else 0.0
        findings.append(
            Finding(
                "stuck_lease",
                "warning",
                f"The lease of job {job} expired {_words(age)} ago and its holder ({holder or 'unknown'}) no longer "
                f"renews it: the job's next start takes it over and retries the cut-off attempt; start it now with "
                f"'fabrika_job kick {job}', and look at that worker (killed, out of memory, frozen) if it recurs.",
                job=job,
                age_seconds=round(age, 3),
            )
        )
    return findings


def _overdue_jobs(now: datetime, thresholds: Thresholds) -> list[Finding]:
    """A scheduled job whose last success is older than a few of its periods (or that failed that often since)."""
    scheduled = {job.name: job for job in registry if job.schedule is not None}
    findings = []
    for name, state in sorted(run_reads.job_states(list(scheduled), now).items()):
        last_success, failures, last_outcome = state.last_success, state.failures_in_row, state.last_outcome
        period = scheduled[name].period
        limit = period * thresholds.overdue_periods
        if last_success is not None:
            late = now - last_success > limit
        else:
            late = failures >= thresholds.overdue_periods  # never succeeded, and failed that many times
        if not late:
            continue
        age = None if last_success is None else (now - last_success).total_seconds()
        since = "never succeeded" if age is None else f"last succeeded {_words(age)} ago"
        late_by = f"more than {thresholds.overdue_periods} of its periods ({_words(period.total_seconds())})"
        if failures:
            advice = (
                f"Job {name} {since}, {late_by}: its last {failures} runs failed (last outcome {last_outcome}); "
                "open its attempts in the admin for the failing frame, fix it, and run it with "
                f"'fabrika_job run {name}'."
            )
        else:
            advice = (
                f"Job {name} {since}, {late_by}, without failing: nothing runs it; check that a worker "
                "('fabrika_job worker') or the crontab ('fabrika_job crontab') is running."
            )
        findings.append(
            Finding(
                "job_overdue",
                "error" if failures else "warning",
                advice,
                job=name,
                age_seconds=None if age is None else round(age, 3),
            )
        )
    return findings


def _dead_rows_grew(now: datetime, counts: dict[str, _counts.QueueCounts], thresholds: Thresholds) -> list[Finding]:
    """A queue table with more dead rows than at the last look (its oldest sample of the last hour)."""
    before = dead_at_last_look(list(counts), now, thresholds.last_look)
    findings = []
    for label, earlier in sorted(before.items()):
        dead = counts[label].dead
        if dead <= earlier:
            continue
        findings.append(
            Finding(
                "dead_rows_grew",
                "warning",
                f"{dead - earlier} more rows of {label} are dead than at the last look ({dead} now): they used all "
                "their attempts; open the table's dead rows in the admin, fix the cause their last failure names, "
                f"and requeue them (or 'fabrika_job requeue {label} --dead').",
                queue=label,
            )
        )
    return findings


def _old_due_rows(now: datetime, counts: dict[str, _counts.QueueCounts], thresholds: Thresholds) -> list[Finding]:
    """A queue table whose oldest due row has waited longer than the threshold."""
    findings = []
    for label, counted in sorted(counts.items()):
        if counted.oldest_due is None:
            continue
        age = (now - counted.oldest_due).total_seconds()
        if age <= thresholds.old_due_row.total_seconds():
            continue
        findings.append(
            Finding(
                "old_due_row",
                "warning",
                f"The oldest due row of {label} has waited {_words(age)} ({counted.due_now} due now): the job that "
                "claims this table is not running or not keeping up; check its last outcome, that a worker runs, "
                "and give it more lanes or a larger claim if it is busy.",
                queue=label,
                age_seconds=round(age, 3),
            )
        )
    return findings


def _postgresql_aliases(models_: list[type[models.Model]]) -> list[str]:
    aliases = {router.db_for_read(model) for model in models_}
    return sorted(alias for alias in aliases if connections[alias].vendor == "postgresql")


def queue_bloat(thresholds: Thresholds) -> list[Finding]:
    """PostgreSQL: a queue table whose dead tuples (left by claims and finishes) vacuum has not removed."""
    by_alias: dict[str, dict[str, str]] = {}
    for model in _counts.queue_models():
        alias = router.db_for_read(model)
        if connections[alias].vendor == "postgresql":
            by_alias.setdefault(alias, {})[model._meta.db_table] = model._meta.label
    findings = []
    for alias, tables in sorted(by_alias.items()):
        with connections[alias].cursor() as cursor:
            cursor.execute(sql.POSTGRESQL_TABLE_BLOAT, [list(tables)])
            rows = cursor.fetchall()
        for table, dead, live, vacuumed in rows:
            if dead < thresholds.bloat_dead_tuples or dead <= live * thresholds.bloat_ratio:
                continue
            when = "never vacuumed" if vacuumed is None else f"last vacuumed {_words(float(vacuumed))} ago"
            findings.append(
                Finding(
                    "queue_bloat",
                    "warning",
                    f"Queue table {table} holds {dead} dead tuples beside {live} live ones ({when}): claims slow "
                    "down as they grow. Let autovacuum visit it by a fixed number of changes rather than a share of "
                    f"the table: ALTER TABLE {table} SET (autovacuum_vacuum_scale_factor = 0.0, "
                    "autovacuum_vacuum_threshold = 1000); if a vacuum ran and they stayed, an old transaction holds "
                    "them (see old_transaction).",
                    queue=tables[table],
                )
            )
    return findings


def _old_transactions(thresholds: Thresholds) -> list[Finding]:
    """PostgreSQL: a session whose open transaction holds back vacuum's horizon on fabrika's database."""
    findings = []
    for alias in _postgresql_aliases([Job, *_counts.queue_models()]):
        with connections[alias].cursor() as cursor:
            cursor.execute(sql.POSTGRESQL_OLD_TRANSACTIONS, [thresholds.old_transaction.total_seconds()])
            rows = cursor.fetchall()
        for pid, state, age in rows:
            seconds = float(age)
            findings.append(
                Finding(
                    "old_transaction",
                    "error" if seconds > thresholds.old_transaction_error.total_seconds() else "warning",
                    f"Session pid {pid} ({state}) has had a transaction open for {_words(seconds)}: until it ends, "
                    "vacuum removes no dead row of any table and the queue tables bloat. End it (or "
                    f"SELECT pg_terminate_backend({pid}) if it is stuck), and bound such sessions with "
                    "idle_in_transaction_session_timeout.",
                    pid=pid,
                    age_seconds=round(seconds, 3),
                )
            )
    return findings
