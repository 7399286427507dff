"""``manage.py fabrika_job run | worker | crontab | list | status | kick | requeue``: parsing and dispatch.

A run lives in ``fabrika_django.runner``, the loop in ``fabrika_django.worker``; both are imported inside
their handlers, so the other actions work whatever those modules import. Exit codes: 0 done, 1 a run or a
requeue failed, 2 a usage error (unknown job, unknown model, bad flag), always as one line on stderr.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from django.apps import apps
from django.conf import settings as django_settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count, Min, Q
from django.utils import timezone

from fabrika_django.exceptions import UnknownJob, VersionConflict
from fabrika_django.jobs import registry

# Options Django gives every command; repeated on each action so they may also follow the action's name.
_COMMON_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("-v", "--verbosity"), {"type": int, "choices": [0, 1, 2, 3]}),
    (("--settings",), {}),
    (("--pythonpath",), {}),
    (("--traceback",), {"action": "store_true"}),
    (("--no-color",), {"action": "store_true"}),
    (("--force-color",), {"action": "store_true"}),
    (("--skip-checks",), {"action": "store_true"}),
)


class _Parser(CommandParser):
    """A CommandParser whose usage errors are one line and exit 2, from a shell and from call_command."""

    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line:
            self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
        raise CommandError(f"Error: {message}", returncode=2)


def _usage(message: str) -> CommandError:
    return CommandError(message, returncode=2)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"give a whole number of 1 or more, not {text!r}")
    return value


def _job_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give job names separated by commas, e.g. send_outbox,mark_overdue")
    return names


class Command(BaseCommand):
    help = "Run, schedule and inspect fabrika_django's cron jobs and queue tables."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # Django builds a plain CommandParser; the subclass only changes how a usage error is shown
        # (the actions' parsers get it from add_subparsers(parser_class=...)).
        parser.__class__ = _Parser
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=_Parser)

        def action(name: str, help: str) -> CommandParser:
            sub = actions.add_parser(name, help=help, description=help)
            for flags, options in _COMMON_OPTIONS:
                # SUPPRESS: an option not given after the action keeps the value given before it.
                sub.add_argument(*flags, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **options)
            return sub

        run = action("run", "Run one job now; join as pending when a run of it is active. Exit 1 when it fails.")
        run.add_argument("name", help="the job's name (see 'fabrika_job list')")

        worker = action("worker", "Fire schedules, take kicks and run jobs until SIGTERM or SIGINT.")
        worker.add_argument("--concurrency", type=_positive_int, help="how many runs at once")
        worker.add_argument("--only", type=_job_names, metavar="NAME,NAME", help="run only these jobs")

        crontab = action("crontab", "Print a crontab (UTC) that runs each scheduled job, for hosts without a worker.")
        crontab.add_argument("--manage-py", metavar="PATH", help="the manage.py the lines call (found by default)")

        action("list", "List every job: schedule, next fire (UTC), retries, timeout, kicks, mailer.")

        status = action("status", "Show each queue table's counts and each job's state and last outcome.")
        status.add_argument("--json", action="store_true", help="print JSON instead of text")

        kick = action("kick", "Ask for a run of a job: a worker runs it within seconds.")
        kick.add_argument("name", help="the job's name")

        requeue = action("requeue", "Make rows of a queue table due now again, with no attempts.")
        requeue.add_argument("model", metavar="app_label.Model", help="the queue model, e.g. reminders.Reminder")
        requeue.add_argument("--dead", action="store_true", help="requeue the dead rows (with --id: those of them)")
        requeue.add_argument("--id", dest="ids", nargs="+", action="extend", metavar="ID", help="requeue these rows")

        sweep = action("sweep-files", "Delete the files no file column references, per FABRIKA['FILE_SWEEP'], now.")
        sweep.add_argument("--dry-run", action="store_true", help="list what it would delete; delete nothing")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        handler: Callable[..., None] = getattr(self, f"_handle_{action.replace('-', '_')}")
        try:
            handler(**options)
        except UnknownJob as exc:
            raise _usage(str(exc)) from exc

    # -- run, worker, kick -------------------------------------------------------------------------

    def _handle_run(self, *, name: str, **options: Any) -> None:
        job = registry.get(name)
        runner = _import("fabrika_django.runner", "the runner")
        with _stop_on_sigterm() as stop:
            result = runner.run(job, "manual", stop=stop)
        plural = "" if result.attempts == 1 else "s"
        if result.ok and options.get("verbosity", 1) < 1:
            return  # -v 0: silent unless it failed, so cron mails only failures
        if result.outcome == "coalesced":
            self.stdout.write(f"Job {job.name} is running elsewhere: marked pending, it runs once more after.")
        elif result.ok:
            self.stdout.write(
                f"Job {job.name} succeeded after {result.attempts} attempt{plural} (run {result.run_id})."
            )
        else:
            raise CommandError(
                f"Job {job.name} failed: {result.outcome} after {result.attempts} attempt{plural} "
                f"(run {result.run_id}); see its attempts in the admin or 'fabrika_job status'.",
                returncode=1,
            )

    def _handle_worker(self, *, concurrency: int | None, only: list[str] | None, **options: Any) -> None:
        for name in only or ():
            registry.get(name)
        worker = _import("fabrika_django.worker", "the worker")
        kwargs: dict[str, Any] = {"only": only, "stdout": self.stdout}
        if concurrency is not None:
            kwargs["concurrency"] = concurrency
        if "verbosity" in inspect.signature(worker.Worker).parameters:
            kwargs["verbosity"] = options.get("verbosity", 1)
        worker.Worker(**kwargs).run()

    def _handle_kick(self, *, name: str, **options: Any) -> None:
        job = registry.get(name)
        _import("fabrika_django.kicks", "kicks").kick(job.name)
        self.stdout.write(f"Kicked {job.name}: a running worker starts it within seconds.")

    # -- crontab, list, status ---------------------------------------------------------------------

    def _handle_crontab(self, *, manage_py: str | None, **options: Any) -> None:
        script = _manage_py(manage_py)
        prefix = f"cd {shlex.quote(str(script.parent))} && {shlex.quote(sys.executable)} {shlex.quote(str(script))}"
        self.stdout.write("CRON_TZ=UTC")
        for job in registry:
            if job.schedule is not None:
                command = f"{prefix} fabrika_job run {shlex.quote(job.name)}"
                escaped = command.replace("%", "\\%")  # cron turns an unescaped % into a newline
                self.stdout.write(f"{job.schedule.fields} {escaped}")

    def _handle_list(self, **options: Any) -> None:
        now = timezone.now()
        rows = [
            (
                job.name,
                job.schedule.expression if job.schedule is not None else "-",
                _utc(job.schedule.next_after(now)) or "-" if job.schedule is not None else "kick only",
                str(job.retries),
                _duration(job.timeout),
                ",".join(job.kicks) or "-",
                job.mailer or "-",
            )
            for job in registry
        ]
        self._table(("job", "schedule", "next fire (UTC)", "retries", "timeout", "kicks", "mailer"), rows)

    def _handle_status(self, *, json: bool, **options: Any) -> None:
        report = _status(timezone.now())
        if json:
            self.stdout.write(_json_dumps(report))
            return
        self.stdout.write(f"Queue tables (now {report['now']}):")
        self._table(
            ("table", "waiting", "due now", "dead", "done", "oldest due"),
            [
                (
                    q["model"],
                    str(q["waiting"]),
                    str(q["due_now"]),
                    str(q["dead"]),
                    str(q["done"]),
                    "-"
                    if q["oldest_due_age_seconds"] is None
                    else _duration(timedelta(seconds=q["oldest_due_age_seconds"])),
                )
                for q in report["queues"]
            ],
        )
        self.stdout.write("Jobs:")
        self._table(
            ("job", "state", "last started (UTC)", "last outcome", "failures in a row"),
            [
                (
                    j["name"],
                    j["state"],
                    j["last_started"] or "never",
                    j["last_outcome"] or "-",
                    str(j["failures_in_row"]),
                )
                for j in report["jobs"]
            ],
        )

    # -- requeue -----------------------------------------------------------------------------------

    def _handle_requeue(self, *, model: str, dead: bool, ids: list[str] | None, **options: Any) -> None:
        from fabrika_django.models import QueueModel

        try:
            queue_model = apps.get_model(model)
        except (LookupError, ValueError):
            raise _usage(
                f"Unknown model {model!r}: give app_label.Model of a queue model, e.g. reminders.Reminder."
            ) from None
        if not issubclass(queue_model, QueueModel):
            raise _usage(
                f"Model {queue_model._meta.label} is not a queue model: give a model that mixes in QueueModel."
            )
        if not dead and not ids:
            raise _usage("Say which rows to requeue: --dead, --id ID ..., or both (the dead rows among those ids).")
        rows = queue_model._default_manager.order_by("pk")
        if ids:
            pks = {_to_pk(queue_model, value) for value in ids}
            found = set(rows.filter(pk__in=pks).values_list("pk", flat=True))
            missing = sorted(str(pk) for pk in pks - found)
            if missing:
                raise _usage(
                    f"No {queue_model._meta.label} row with id {', '.join(missing)}: nothing was requeued; "
                    "check the ids (see the admin)."
                )
            rows = rows.filter(pk__in=pks)
        if dead:
            rows = rows.dead()
        requeued, conflicts = 0, []
        for row in rows.iterator(chunk_size=500):
            try:
                row.requeue()
            except VersionConflict:
                conflicts.append(str(row.pk))
            else:
                requeued += 1
        label = queue_model._meta.label
        self.stdout.write(f"Requeued {requeued} row{'' if requeued == 1 else 's'} of {label}.")
        if conflicts:
            raise CommandError(
                f"{label} {', '.join(conflicts)} changed while being requeued and were left as they are: "
                "look at them again, then run the command again.",
                returncode=1,
            )

    def _handle_sweep_files(self, **options: Any) -> None:
        _import("fabrika_django._sweep", "the file sweep").command(self, **options)

    def _table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=False)]
        for line in (header, *rows):
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)).rstrip())


def _import(module: str, what: str) -> Any:
    """Import ``module`` in the handler that needs it, so every other action works without it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise CommandError(
            f"{what.capitalize()} is not available in this version ({module} is missing): "
            "run jobs with 'fabrika_job run NAME' from the lines 'fabrika_job crontab' prints.",
            returncode=1,
        ) from None


@contextmanager
def _stop_on_sigterm() -> Iterator[threading.Event]:
    """Turn SIGTERM (cron's or a supervisor's stop) into the run's stop event, as the worker does."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def _manage_py(given: str | None) -> Path:
    """Find the manage.py the crontab's lines call: --manage-py, the one running, or the project's."""
    candidates = []
    if given:
        candidates.append(Path(given))
    elif os.path.basename(sys.argv[0]) == "manage.py":
        candidates.append(Path(sys.argv[0]))
    else:
        base = getattr(django_settings, "BASE_DIR", None)
        if base is not None:
            candidates.append(Path(base) / "manage.py")
        candidates.append(Path.cwd() / "manage.py")
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise _usage(f"Cannot find manage.py (looked at {', '.join(map(str, candidates))}): pass --manage-py PATH.")


def _to_pk(model: Any, value: str) -> Any:
    try:
        return model._meta.pk.to_python(value)
    except ValidationError:
        raise _usage(f"{value!r} is not an id of {model._meta.label}: give its primary key values.") from None


def _utc(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")]
    return "".join(f"{amount}{unit}" for amount, unit in parts if amount) or "0s"


def _json_dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True)


def _status(now: datetime) -> dict[str, Any]:
    """Count each queue table's rows by state and read each job's Job and Lease rows."""
    from fabrika_django.models import Job, Lease, QueueModel
    from fabrika_django.queues import max_attempts_of

    queues = []
    for model in apps.get_models():
        if not issubclass(model, QueueModel):
            continue
        limit = max_attempts_of(model)
        waiting = Q(due__isnull=False, attempts__lt=limit)
        due_now = waiting & Q(due__lte=now)
        counts = model._default_manager.aggregate(
            waiting=Count("pk", filter=waiting),
            due_now=Count("pk", filter=due_now),
            dead=Count("pk", filter=Q(due__isnull=False, attempts__gte=limit)),
            done=Count("pk", filter=Q(due__isnull=True)),
            oldest=Min("due", filter=due_now),
        )
        oldest = counts.pop("oldest")
        queues.append(
            {
                "model": model._meta.label,
                **counts,
                "oldest_due_age_seconds": None if oldest is None else round((now - oldest).total_seconds(), 3),
            }
        )
    names = [job.name for job in registry]
    states = {row["name"]: row for row in Job.objects.filter(name__in=names).values()}
    leases = {row["job"]: row for row in Lease.objects.filter(job__in=names).values()}
    jobs = []
    for job in registry:
        state: dict[str, Any] = dict(states.get(job.name) or {})
        lease: dict[str, Any] = dict(leases.get(job.name) or {})
        expires = lease.get("expires")
        active = bool(lease.get("token")) and expires is not None and expires > now
        pending = state.get("pending_since") is not None
        jobs.append(
            {
                "name": job.name,
                "state": _state_word(active, pending),
                "active": active,
                "pending": pending,
                "holder": lease.get("holder") if active else None,
                "next_fire": _utc(state.get("next_fire")),
                "last_run_id": str(state["last_run_id"]) if state.get("last_run_id") else None,
                "last_trigger": state.get("last_trigger") or None,
                "last_started": _utc(state.get("last_started")),
                "last_finished": _utc(state.get("last_finished")),
                "last_outcome": state.get("last_outcome") or None,
                "last_success": _utc(state.get("last_success")),
                "failures_in_row": state.get("failures_in_row", 0),
            }
        )
    return {"now": _utc(now), "queues": queues, "jobs": jobs}


def _state_word(active: bool, pending: bool) -> str:
    if active:
        return "active, pending" if pending else "active"
    return "pending" if pending else "idle"
