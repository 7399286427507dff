"""``fabrika_job crontab``: parsed back, each line has its job's schedule and runs the job from a shell."""

import importlib.util
import shlex
import subprocess
import sys
from datetime import date
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from fabrika_django.jobs import registry
from fabrika_django.models import Attempt
from fabrika_django.schedule import Schedule
from testproject.tasks.models import Task

from .processes import ROOT, manage_env, start_manage


def _crontab(*args):
    out = StringIO()
    call_command("fabrika_job", "crontab", *args, stdout=out)
    return out.getvalue()


def _parse(text):
    """Answer CRON_TZ and {job name: (Schedule, argv of the command, the command as the shell gets it)}."""
    lines = text.splitlines()
    assert lines[0].startswith("CRON_TZ=")
    entries = {}
    for line in lines[1:]:
        fields = line.split(" ", 5)
        command = fields[5]
        argv = shlex.split(command)
        name = argv[-1]
        assert name not in entries, f"two lines for {name}"
        entries[name] = (Schedule(" ".join(fields[:5])), argv, command)
    return lines[0].removeprefix("CRON_TZ="), entries


def test_crontab_sets_utc_and_has_one_line_per_scheduled_job_with_its_schedule():
    tz, entries = _parse(_crontab())
    assert tz == "UTC"
    scheduled = {job.name: job.schedule for job in registry if job.schedule is not None}
    assert {name: schedule for name, (schedule, _, _) in entries.items()} == scheduled
    assert "lab_slow" not in entries  # kick-only jobs have no line
    assert entries["mark_overdue"][0] == Schedule("15 * * * *")


def test_each_line_changes_to_the_project_and_calls_this_python_with_the_real_manage_py():
    _, entries = _parse(_crontab())
    manage = str((ROOT / "manage.py").resolve())
    for name, (_, argv, _) in entries.items():
        assert argv == ["cd", str(ROOT.resolve()), "&&", sys.executable, manage, "fabrika_job", "run", name]


def test_crontab_quotes_paths_the_shell_would_split(tmp_path):
    odd = tmp_path / "my project"
    odd.mkdir()
    (odd / "manage.py").write_text("")
    _, entries = _parse(_crontab("--manage-py", str(odd / "manage.py")))
    _, argv, command = entries["mark_overdue"]
    assert argv[:5] == ["cd", str(odd), "&&", sys.executable, str(odd / "manage.py")]
    assert shlex.quote(str(odd)) in command


def test_crontab_escapes_the_percent_signs_cron_would_read_as_newlines(tmp_path):
    odd = tmp_path / "100%"
    odd.mkdir()
    (odd / "manage.py").write_text("")
    line = [line for line in _crontab("--manage-py", str(odd / "manage.py")).splitlines() if "mark_overdue" in line]
    assert line == [
        f"15 * * * * cd {tmp_path}/100\\% && {sys.executable} {tmp_path}/100\\%/manage.py fabrika_job run mark_overdue"
    ]


def test_crontab_with_a_manage_py_that_does_not_exist_is_a_usage_error(tmp_path):
    with pytest.raises(CommandError) as refused:
        _crontab("--manage-py", str(tmp_path / "manage.py"))
    assert refused.value.returncode == 2
    assert str(refused.value) == f"Cannot find manage.py (looked at {tmp_path / 'manage.py'}): pass --manage-py PATH."


@pytest.mark.skipif(
    importlib.util.find_spec("fabrika_django.runner") is None,
    reason="fabrika_django.runner (the lead session's) is not there yet: 'fabrika_job run' cannot run a job",
)
@pytest.mark.django_db(transaction=True)
def test_a_line_of_the_crontab_printed_by_manage_py_runs_its_job_from_a_shell():
    late = Task.objects.create(title="late", due_day=date(2020, 1, 1))
    printed = start_manage("fabrika_job", "crontab")
    out, err = printed.communicate(timeout=60)
    assert printed.returncode == 0, err
    _, entries = _parse(out)
    _, argv, command = entries["mark_overdue"]
    assert Path(argv[4]) == (ROOT / "manage.py").resolve()
    # From another directory, as cron would start it; the environment names the test database.
    done = subprocess.run(command, shell=True, cwd="/", env=manage_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Job mark_overdue succeeded after 1 attempt")
    late.refresh_from_db()
    assert (late.overdue, late.version) == (True, 1)
    assert list(Attempt.objects.filter(job="mark_overdue").values_list("trigger", "outcome")) == [
        ("manual", "succeeded")
    ]


def test_crontab_prints_this_python_in_normal_form_when_started_through_a_roundabout_path(tmp_path):
    python = Path(sys.executable)
    roundabout = python.parent / ".." / python.parent.name / "." / python.name  # still this virtualenv's python
    printed = subprocess.run(
        [str(roundabout), str(ROOT / "manage.py"), "fabrika_job", "crontab"],
        cwd=tmp_path,
        env=manage_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    _, entries = _parse(printed.stdout)
    _, argv, _ = entries["mark_overdue"]
    # The folder in normal form, the file as it is: the virtualenv's python, not the base interpreter it links to.
    assert argv[3] == str(python.parent.resolve() / python.name)
    assert "/../" not in printed.stdout and "/./" not in printed.stdout
