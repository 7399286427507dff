"""``manage.py fabrika_job run | worker | crontab | list | status | kick | requeue``: parsing and dispatch.

A run lives in ``fabrika_django.runner``, the loop in ``fabrika_django.worker``, the status report in
``fabrika_django.ops._report`` (with the admin's overview). Exit codes: 0 done, 1 a run or a requeue failed, 2 a
usage error (unknown job, unknown model, bad flag), always as one line on stderr.
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import NoReturn, TypedDict

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from fabrika_django import _metrics, kicks, runner, worker
from fabrika_django._process import stop_signals
from fabrika_django._requeue import RunningTasks, requeue_rows
from fabrika_django._sessions import bound_idle_transactions
from fabrika_django.exceptions import UnknownJob
from fabrika_django.jobs import registry
from fabrika_django.management import _show
from fabrika_django.management._show import usage as _usage
from fabrika_django.models import QueueModel, Trigger
from fabrika_django.ops import _report, _sweep_job

from ..._runs import pending as run_pending


# Options Django gives every command; repeated on each action so they may also follow the action's name.
class _Option(TypedDict, total=False):
    type: type
    choices: list[int]
    action: str


_COMMON_OPTIONS: tuple[tuple[tuple[str, ...], _Option], ...] = (
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


def _whole_number(text: str) -> int | None:
    """The value of ASCII digits, else None: ``int()`` also takes "٣", "+3", " 3" and "3_000"."""
    return int(text) if text.isascii() and text.isdigit() else None


def _concurrency(text: str) -> int:
    value = _whole_number(text)
    if value is None or not 1 <= value <= worker.MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(f"give a whole number from 1 to {worker.MAX_CONCURRENCY}, not {text!r}")
    return value


def _port(text: str) -> int:
    value = _whole_number(text)
    if value is None or not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"give a TCP port from 1 to 65535, not {text!r}")
    return value


def _job_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give job names separated by commas, e.g. send_outbox,mark_overdue")
    return names


class Command(BaseCommand):
    help = "Run, schedule and inspect fabrika_django's cron jobs and queue tables."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: object) -> CommandParser:
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
        worker.add_argument(
            "--concurrency", type=_concurrency, help="how many runs at once, of any jobs and lanes (at most 256)"
        )
        worker.add_argument("--only", type=_job_names, metavar="NAME,NAME", help="run only these jobs")
        worker.add_argument(
            "--metrics-port", type=_port, metavar="PORT", help="serve the worker's Prometheus metrics on this port"
        )
        worker.add_argument(
            "--metrics-addr",
            metavar="ADDR",
            help="the address the metrics listen on (default 127.0.0.1; 0.0.0.0 for every interface)",
        )

        crontab = action("crontab", "Print a crontab (UTC) that runs each scheduled job, for hosts without a worker.")
        crontab.add_argument("--manage-py", metavar="PATH", help="the manage.py the lines call (found by default)")

        action("list", "List every job: schedule, next fire (UTC), retries, timeout, lanes, rate, kicks, mailer.")

        status = action("status", "Show each queue table's counts and each job's state and last outcome.")
        status.add_argument("--json", action="store_true", help="print JSON instead of text")

        kick = action("kick", "Ask for a run of a job: a worker runs it within seconds.")
        kick.add_argument("name", help="the job's name")

        requeue = action("requeue", "Make rows of a queue table due now again, with no attempts.")
        requeue.add_argument("model", metavar="app_label.Model", help="the queue model (see 'status')")
        requeue.add_argument("--dead", action="store_true", help="requeue the dead rows (with --id: those of them)")
        requeue.add_argument("--id", dest="ids", nargs="+", action="extend", metavar="ID", help="requeue these rows")

        sweep = action("sweep-files", "Delete the files no file column references, per FABRIKA['FILE_SWEEP'], now.")
        sweep.add_argument("--dry-run", action="store_true", help="list what it would delete; delete nothing")

    def handle(self, *args: object, action: str | None, **options: object) -> None:
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

    def _handle_run(self, *, name: str, verbosity: int = 1, **options: object) -> None:
        job = registry.get(name)
        stop = threading.Event()
        quiet = verbosity < 1
        bound_idle_transactions()
        # SIGTERM (cron's or a supervisor's stop) ends the run as the worker's does; Ctrl-C stays an interrupt.
        with stop_signals(stop.set, signals=(signal.SIGTERM,)), _fabrika_logs_warnings_only(quiet):
            # Hosts that run jobs from cron have no worker to take kick rows: every run takes them all (into
            # the jobs' pending flags, which this run and the next ones serve), so they never pile up.
            run_pending.take_kicks([registered.name for registered in registry])
            result = runner.run(job, Trigger.MANUAL, stop=stop)
        plural = "" if result.attempts == 1 else "s"
        if result.ok and verbosity < 1:
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
        self,
        *,
        concurrency: int | None,
        only: list[str] | None,
        metrics_port: int | None,
        metrics_addr: str | None,
        verbosity: int = 1,
        **options: object,
    ) -> None:
        for name in only or ():
            registry.get(name)
        if metrics_addr is not None and metrics_port is None:
            raise _usage("--metrics-addr needs --metrics-port: give the port the metrics are served on.")
        _discover_tasks()
        if metrics_port is not None:
            _serve_metrics(metrics_port, metrics_addr or "127.0.0.1")
        made = functools.partial(worker.Worker, only=only, stdout=self.stdout, verbosity=verbosity)
        try:
            (made() if concurrency is None else made(concurrency=concurrency)).run()  # None: the worker's default
        finally:
            # A worker run inside a longer process (call_command) frees its port and threads when it ends.
            _metrics.stop()

    def _handle_kick(self, *, name: str, **options: object) -> None:
        job = registry.get(name)
        kicks.kick(job.name)
        self.stdout.write(f"Kicked {job.name}: a running worker starts it within seconds.")

    # -- crontab, list, status ---------------------------------------------------------------------

    def _handle_crontab(self, *, manage_py: str | None, **options: object) -> None:
        self._write(_show.crontab_lines(_show.manage_py(manage_py)))

    def _handle_list(self, **options: object) -> None:
        self._write(_show.job_lines(timezone.now()))

    def _handle_status(self, *, json: bool, **options: object) -> None:
        self._write(_show.status_lines(_report.status(timezone.now()), as_json=json))

    def _write(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.stdout.write(line)

    # -- requeue -----------------------------------------------------------------------------------

    def _handle_requeue(self, *, model: str, dead: bool, ids: list[str] | None, **options: object) -> None:
        queue_model = _queue_model(model)
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
        try:
            done = requeue_rows(rows, queue_model)
        except RunningTasks as refused:
            raise _usage(str(refused)) from None
        label, requeued = queue_model._meta.label, len(done.requeued)
        kicks = f" Kicked {', '.join(done.kicked)}." if done.kicked else ""
        self.stdout.write(f"Requeued {requeued} row{'' if requeued == 1 else 's'} of {label}.{kicks}")
        if done.skipped_done:
            skipped = done.skipped_done
            self.stdout.write(
                f"Skipped {skipped} done row{'' if skipped == 1 else 's'}: "
                f"{'its' if skipped == 1 else 'their'} work is finished."
            )
        if done.conflicted:
            raise CommandError(
                f"{label} {', '.join(done.conflicted)} changed while being requeued and were left as they are: "
                "look at them again, then run the command again.",
                returncode=1,
            )

    def _handle_sweep_files(self, *, dry_run: bool, **options: object) -> None:
        _sweep_job.command(self, dry_run=dry_run, **options)


def _discover_tasks() -> None:
    """Register the project's tasks before the worker starts: a tasks module that does not import stops it here,
    with its traceback, rather than failing each run of the tasks' jobs (which look for them again)."""
    if "fabrika_django.tasks" in sys.modules:  # a fabrika backend is configured: the app's ready() imported it
        from fabrika_django.tasks import discover_tasks

        discover_tasks()


def _serve_metrics(port: int, addr: str) -> None:
    """Serve the worker's metrics, or say in one line why not (no prometheus-client, the port taken, no such
    address)."""
    try:
        _metrics.serve(port, addr)
    except ImproperlyConfigured as exc:
        raise _usage(str(exc)) from None
    except OSError as exc:
        raise _usage(
            f"Cannot serve metrics on {addr} port {port} ({exc.strerror or type(exc).__name__}): choose another "
            "address or port."
        ) from None


def _queue_model(name: str) -> type[QueueModel]:
    """The queue model ``name`` (app_label.Model) names, or a usage error that lists this project's."""
    try:
        model = apps.get_model(name)
    except (LookupError, ValueError):
        model = None
    if model is not None and issubclass(model, QueueModel):
        return model
    mine = sorted(m._meta.label for m in apps.get_models() if issubclass(m, QueueModel))
    choose = f"this project's are {', '.join(mine)}" if mine else "this project has none"
    if model is None:
        raise _usage(f"Unknown model {name!r}: give app_label.Model of a queue model ({choose}).")
    raise _usage(f"Model {model._meta.label} is not a queue model: give a model that mixes in QueueModel ({choose}).")


def _to_pk(model: type[QueueModel], value: str) -> object:
    try:
        pk = model._meta.pk.to_python(value)
        model._meta.pk.run_validators(pk)  # the database's integer range: SQLite overflows past 64 bits
        return pk
    except ValidationError:
        raise _usage(f"{value!r} is not an id of {model._meta.label}: give its primary key values.") from None


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
