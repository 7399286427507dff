"""``manage.py fabrika_job run | worker | crontab | list | status | kick | requeue``: parsing and dispatch.

A run lives in ``fabrika_django.runner``, the loop in ``fabrika_django.worker``, the status report in
``fabrika_django._report`` (with the admin's overview). Exit codes: 0 done, 1 a run or a requeue failed, 2 a
usage error (unknown job, unknown model, bad flag), always as one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
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
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from fabrika_django import _metrics, _report, _sweep, kicks, runner, worker
from fabrika_django._process import stop_signals
from fabrika_django._sessions import bound_idle_transactions
from fabrika_django.exceptions import UnknownJob, VersionConflict
from fabrika_django.jobs import registry
from fabrika_django.models import QueueModel

from ..._runs import pending as run_pending

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


def _refuse_running_tasks(queue_model: type[QueueModel], rows: Any) -> None:
    """A RUNNING task is being run by a worker now (or by one killed, until the job's lease expires and the task is
    retried): made READY, it would run a second time beside the first."""
    from fabrika_django.models import QueuedTask, TaskStatus

    if not issubclass(queue_model, QueuedTask):
        return
    running = [str(pk) for pk in rows.filter(status=TaskStatus.RUNNING).values_list("pk", flat=True)]
    if running:
        raise _usage(
            f"{queue_model._meta.label} {', '.join(running)} {'is' if len(running) == 1 else 'are'} RUNNING: a "
            "requeue could run it twice. Wait until it ends (a killed worker's task is retried on its own once the "
            "job's lease expires); nothing was requeued."
        )


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


def _port(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"give a TCP port from 1 to 65535, not {text!r}")
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
        # Not required: with no action, handle() lists them (argparse would only say "ACTION is required").
        actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
        self._action_names = actions.choices

        def action(name: str, help: str) -> CommandParser:
            sub = actions.add_parser(name, help=help, description=help)
            for flags, options in _COMMON_OPTIONS:
                # SUPPRESS: an option not given after the action keeps the value given before it.
                sub.add_argument(*flags, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **options)
            return sub

        run = action("run", "Run one job now; join as pending when a run of it is active. Exit 1 when it fails.")
        run.add_argument("name", help="the job's name (see 'fabrika_job list')")

        worker = action("worker", "Fire schedules, take kicks and run jobs until SIGTERM or SIGINT.")
        worker.add_argument("--concurrency", type=_positive_int, help="how many runs at once, of any jobs and lanes")
        worker.add_argument("--only", type=_job_names, metavar="NAME,NAME", help="run only these jobs")
        worker.add_argument(
            "--metrics-port", type=_port, metavar="PORT", help="serve the worker's Prometheus metrics on this port"
        )

        crontab = action("crontab", "Print a crontab (UTC) that runs each scheduled job, for hosts without a worker.")
        crontab.add_argument("--manage-py", metavar="PATH", help="the manage.py the lines call (found by default)")

        action("list", "List every job: schedule, next fire (UTC), retries, timeout, lanes, kicks, mailer.")

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

    def handle(self, *args: Any, action: str | None, **options: Any) -> None:
        if action is None:
            raise _usage(
                f"Give an action: {', '.join(self._action_names)} "
                "('manage.py fabrika_job ACTION --help' for its options)."
            )
        handler: Callable[..., None] = getattr(self, f"_handle_{action.replace('-', '_')}")
        try:
            handler(**options)
        except UnknownJob as exc:
            raise _usage(str(exc)) from exc

    # -- run, worker, kick -------------------------------------------------------------------------

    def _handle_run(self, *, name: str, **options: Any) -> None:
        job = registry.get(name)
        stop = threading.Event()
        quiet = options.get("verbosity", 1) < 1
        bound_idle_transactions()
        # SIGTERM (cron's or a supervisor's stop) ends the run as the worker's does; Ctrl-C stays an interrupt.
        with stop_signals(stop.set, signals=(signal.SIGTERM,)), _fabrika_logs_warnings_only(quiet):
            # Hosts that run jobs from cron have no worker to take kick rows: every run takes them all (into
            # the jobs' pending flags, which this run and the next ones serve), so they never pile up.
            run_pending.take_kicks([registered.name for registered in registry])
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

    def _handle_worker(
        self, *, concurrency: int | None, only: list[str] | None, metrics_port: int | None, **options: Any
    ) -> None:
        for name in only or ():
            registry.get(name)
        if metrics_port is not None:
            _serve_metrics(metrics_port)
        kwargs: dict[str, Any] = {"only": only, "stdout": self.stdout, "verbosity": options.get("verbosity", 1)}
        if concurrency is not None:
            kwargs["concurrency"] = concurrency
        worker.Worker(**kwargs).run()

    def _handle_kick(self, *, name: str, **options: Any) -> None:
        job = registry.get(name)
        kicks.kick(job.name)
        self.stdout.write(f"Kicked {job.name}: a running worker starts it within seconds.")

    # -- crontab, list, status ---------------------------------------------------------------------

    def _handle_crontab(self, *, manage_py: str | None, **options: Any) -> None:
        script = _manage_py(manage_py)
        python = shlex.quote(str(_this_python()))
        prefix = f"cd {shlex.quote(str(script.parent))} && {python} {shlex.quote(str(script))}"
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
                str(job.lanes),
                ",".join(job.kicks) or "-",
                job.mailer or "-",
            )
            for job in registry
        ]
        self._table(("job", "schedule", "next fire (UTC)", "retries", "timeout", "lanes", "kicks", "mailer"), rows)

    def _handle_status(self, *, json: bool, **options: Any) -> None:
        report = _report.status(timezone.now())
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
        self.stdout.write("Health:" if report["health"] else "Health: nothing to report.")
        for finding in report["health"]:
            self.stdout.write(f"  {finding['severity']} {finding['check']}: {finding['advice']}")

    # -- requeue -----------------------------------------------------------------------------------

    def _handle_requeue(self, *, model: str, dead: bool, ids: list[str] | None, **options: Any) -> None:
        from fabrika_django._claimers import kick_claimers

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
        _refuse_running_tasks(queue_model, rows)
        requeued, conflicts = 0, []
        for row in rows.iterator(chunk_size=500):
            try:
                row.requeue()
            except VersionConflict:
                conflicts.append(str(row.pk))
            else:
                requeued += 1
        label = queue_model._meta.label
        kicked = kick_claimers(queue_model) if requeued else []
        kicks = f" Kicked {', '.join(kicked)}." if kicked else ""
        self.stdout.write(f"Requeued {requeued} row{'' if requeued == 1 else 's'} of {label}.{kicks}")
        if conflicts:
            raise CommandError(
                f"{label} {', '.join(conflicts)} changed while being requeued and were left as they are: "
                "look at them again, then run the command again.",
                returncode=1,
            )

    def _handle_sweep_files(self, **options: Any) -> None:
        _sweep.command(self, **options)

    def _table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=False)]
        for line in (header, *rows):
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)).rstrip())


def _serve_metrics(port: int) -> None:
    """Serve the worker's metrics, or say in one line why not (no prometheus-client, the port taken)."""
    try:
        _metrics.serve(port)
    except ImproperlyConfigured as exc:
        raise _usage(str(exc)) from None
    except OSError as exc:
        raise _usage(
            f"Cannot serve metrics on port {port} ({exc.strerror or type(exc).__name__}): choose another port."
        ) from None


def _this_python() -> Path:
    """Return this interpreter's path in normal form (``sys.executable`` keeps the ``..`` it was started with)."""
    # The folder is resolved, not the file: a virtualenv's python is a symlink to the base interpreter, and the
    # base interpreter would run the job without the virtualenv's packages.
    executable = Path(sys.executable)
    return executable.parent.resolve() / executable.name


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
        pk = model._meta.pk.to_python(value)
        model._meta.pk.run_validators(pk)  # the database's integer range: SQLite overflows past 64 bits
        return pk
    except ValidationError:
        raise _usage(f"{value!r} is not an id of {model._meta.label}: give its primary key values.") from None


def _utc(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


@contextmanager
def _fabrika_logs_warnings_only(quiet: bool) -> Iterator[None]:
    """With -v 0, hold fabrika's own loggers to warnings for the block, whatever LOGGING set (cron mails output)."""
    if not quiet:
        yield
        return
    names = ["fabrika_django"] + [
        name for name in logging.root.manager.loggerDict if name.startswith("fabrika_django.")
    ]
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")]
    return "".join(f"{amount}{unit}" for amount, unit in parts if amount) or "0s"


def _json_dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True)
