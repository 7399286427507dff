"""What ``fabrika_job crontab``, ``list`` and ``status`` print, as lines; and the one form of a usage error."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings as django_settings
from django.core.management.base import CommandError

from ..jobs import registry

if TYPE_CHECKING:
    from ..ops._report import Status


def usage(message: str) -> CommandError:
    """A usage error: one line on stderr, exit code 2."""
    return CommandError(message, returncode=2)


def crontab_lines(script: Path) -> Iterator[str]:
    """A crontab (UTC) with one line per scheduled job: change to the project, run the job with this Python."""
    python = shlex.quote(str(_this_python()))
    prefix = f"cd {shlex.quote(str(script.parent))} && {python} {shlex.quote(str(script))}"
    yield "CRON_TZ=UTC"
    for job in registry:
        if job.schedule is not None:
            command = f"{prefix} fabrika_job run {shlex.quote(job.name)}"
            escaped = command.replace("%", "\\%")  # cron turns an unescaped % into a newline
            yield f"{job.schedule.fields} {escaped}"


def job_lines(now: datetime) -> list[str]:
    """The registered jobs, one a row: schedule, next fire, retries, timeout, lanes, rate, kicks, mailer."""
    rows = [
        (
            job.name,
            job.schedule.expression if job.schedule is not None else "-",
            _utc(job.schedule.next_after(now)) or "-" if job.schedule is not None else "kick only",
            str(job.retries),
            _duration(job.timeout),
            str(job.lanes),
            job.rate_limit or "-",
            ",".join(job.kicks) or "-",
            job.mailer or "-",
        )
        for job in registry
    ]
    return _table(
        ("job", "schedule", "next fire (UTC)", "retries", "timeout", "lanes", "rate", "kicks", "mailer"), rows
    )


def status_lines(report: Status, *, as_json: bool) -> list[str]:
    """The status report (``ops._report.status``): queue tables, jobs and health, or the report as JSON."""
    if as_json:
        return [json.dumps(report, indent=2, sort_keys=True)]
    lines = [f"Queue tables (now {report['now']}):"]
    lines += _table(
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
    lines.append("Jobs:")
    lines += _table(
        ("job", "state", "last started (UTC)", "last outcome", "failures in a row"),
        [
            (j["name"], j["state"], j["last_started"] or "never", j["last_outcome"] or "-", str(j["failures_in_row"]))
            for j in report["jobs"]
        ],
    )
    lines.append("Health:" if report["health"] else "Health: nothing to report.")
    lines += [f"  {finding['severity']} {finding['check']}: {finding['advice']}" for finding in report["health"]]
    return lines


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=False)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False)).rstrip()
        for line in (header, *rows)
    ]


def _this_python() -> Path:
    """Return this interpreter's path in normal form (``sys.executable`` keeps the ``..`` it was started with)."""
    # The folder is resolved, not the file: a virtualenv's python is a symlink to the base interpreter, and the
    # base interpreter would run the job without the virtualenv's packages.
    executable = Path(sys.executable)
    return executable.parent.resolve() / executable.name


def manage_py(given: str | None) -> Path:
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
    raise usage(f"Cannot find manage.py (looked at {', '.join(map(str, candidates))}): pass --manage-py PATH.")


def _utc(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")]
    return "".join(f"{amount}{unit}" for amount, unit in parts if amount) or "0s"
