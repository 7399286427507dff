"""``manage.py fabrika_job``: each action's output and exit code; usage errors are one line and exit 2."""

import json
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db.models import F
from django.utils import timezone

from fabrika_django import worker
from fabrika_django._runs import reads as run_reads
from fabrika_django.jobs import registry
from fabrika_django.models import Job, Lease
from fabrika_django.schedule import Schedule
from testproject.lab.models import Mark
from testproject.reminders.models import Reminder

from .jobs_helpers import temporary_job
from .processes import ROOT, start_manage


def fabrika_job(*args):
    """Call the command; answer (exit code, stdout, the error's text)."""
    out, err = StringIO(), StringIO()
    try:
        call_command("fabrika_job", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), err.getvalue()


def _columns(output, first):
    """The cells of the table line that starts with ``first`` (columns are two or more spaces apart)."""
    (line,) = [line for line in output.splitlines() if line.split(" ", 1)[0] == first]
    return re.split(r" {2,}", line)


def _succeed(ctx):
    pass


def _fail(ctx):
    raise RuntimeError("boom")


# -- run --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_run_of_a_job_that_succeeds_exits_0_and_says_so():
    with temporary_job(_succeed):
        code, out, _ = fabrika_job("run", "_succeed")
    assert code == 0
    assert re.fullmatch(r"Job _succeed succeeded after 1 attempt \(run [0-9a-f-]{36}\)\.\n", out)
    assert Job.objects.get(name="_succeed").last_outcome == "succeeded"


@pytest.mark.django_db
def test_run_of_a_job_that_fails_every_attempt_exits_1_naming_the_outcome(monkeypatch):
    from fabrika_django import runner

    monkeypatch.setattr(runner, "_default_pause", lambda failed_attempt: 0.0)
    with temporary_job(_fail, retries=1):
        code, out, error = fabrika_job("run", "_fail")
    assert (code, out) == (1, "")
    assert re.fullmatch(
        r"Job _fail failed: handler_failed after 2 attempts \(run [0-9a-f-]{36}\); "
        r"see its attempts in the admin or 'fabrika_job status'\.",
        error,
    )


@pytest.mark.django_db
def test_run_while_another_holds_the_lease_marks_the_job_pending_and_exits_0():
    with temporary_job(_succeed):
        Job.objects.create(name="_succeed")
        Lease.objects.create(
            job="_succeed",
            token="00000000-0000-0000-0000-000000000001",
            holder="elsewhere",
            expires=timezone.now() + timedelta(minutes=5),
        )
        code, out, _ = fabrika_job("run", "_succeed")
    assert (code, out) == (0, "Job _succeed is running elsewhere: marked pending, it runs once more after.\n")
    assert Job.objects.get(name="_succeed").pending_since is not None


@pytest.mark.django_db
def test_run_with_verbosity_0_is_silent_when_it_succeeds_whichever_side_of_the_action_it_is_given():
    with temporary_job(_succeed):
        assert fabrika_job("run", "_succeed", "-v", "0")[:2] == (0, "")
        assert fabrika_job("-v", "0", "run", "_succeed")[:2] == (0, "")
        assert fabrika_job("run", "_succeed", "--verbosity", "2")[1].startswith("Job _succeed succeeded")


@pytest.mark.django_db(transaction=True)
def test_sigterm_stops_a_run_at_once_releases_the_lease_and_exits_1():
    started = start_manage("fabrika_job", "run", "lab_slow", LAB_SLOW_SECONDS=60)
    try:
        deadline = time.monotonic() + 30
        while not Mark.objects.filter(job="lab_slow", note="start").exists():
            assert started.poll() is None and time.monotonic() < deadline, started.stderr.read()
            time.sleep(0.05)
        started.send_signal(signal.SIGTERM)
        out, err = started.communicate(timeout=30)  # well before the handler's 60 s sleep ends
    finally:
        started.kill()
    assert started.returncode == 1, err
    assert out == ""
    assert re.search(r"^CommandError: Job lab_slow failed: shutdown after 1 attempt \(run ", err, re.MULTILINE), err
    assert "Traceback" not in err
    assert Lease.objects.get(job="lab_slow").token is None
    assert list(Mark.objects.values_list("note", flat=True)) == ["start"]


@pytest.mark.django_db(transaction=True)
def test_run_with_verbosity_0_quiets_fabrikas_own_loggers_in_the_demo_project():
    # The demo's LOGGING sends fabrika_django's INFO lines to the console.
    done = start_manage("fabrika_job", "run", "lab_stamp", "-v", "0", FABRIKA_LOG_LEVEL="INFO")
    out, err = done.communicate(timeout=60)
    assert (done.returncode, out, err) == (0, "", "")


def test_no_action_lists_the_actions():
    code, _, error = fabrika_job()
    assert (code, error) == (
        2,
        "Give an action: run, worker, crontab, list, status, kick, requeue, sweep-files "
        "('manage.py fabrika_job ACTION --help' for its options).",
    )


@pytest.mark.django_db
def test_requeue_of_an_id_beyond_the_integer_range_exits_2_in_one_line():
    code, _, error = fabrika_job("requeue", "reminders.Reminder", "--id", "99999999999999999999")
    assert (code, error) == (
        2,
        "'99999999999999999999' is not an id of reminders.Reminder: give its primary key values.",
    )


@pytest.mark.django_db
def test_requeue_of_a_running_task_exits_2_and_leaves_it_running():
    from fabrika_django.models import QueuedTask
    from testproject.lab.tasks import noop

    result = noop.enqueue()
    task = QueuedTask.objects.get(result_id=result.id)
    QueuedTask.objects.filter(pk=task.pk).update(status="RUNNING", attempts=1)
    code, out, error = fabrika_job("requeue", "fabrika_django.QueuedTask", "--id", str(task.pk))
    assert (code, out) == (2, "")
    assert error == (
        f"fabrika_django.QueuedTask {task.pk} is RUNNING: a requeue could run it twice. Wait until it ends "
        "(a killed worker's task is retried on its own once the job's lease expires); nothing was requeued."
    )
    assert QueuedTask.objects.filter(pk=task.pk).values_list("status", "attempts").get() == ("RUNNING", 1)


def test_run_of_an_unknown_job_exits_2_naming_the_known_ones():
    code, out, error = fabrika_job("run", "nope")
    known = ", ".join(job.name for job in registry)
    assert (code, out) == (2, "")
    assert (
        error
        == f"No cron job is named 'nope': known jobs are {known}. Declare it with @cron in an installed app's jobs.py."
    )


def test_a_missing_argument_or_an_unknown_action_is_a_usage_error():
    assert fabrika_job("run")[::2] == (2, "Error: the following arguments are required: name")
    code, _, error = fabrika_job("bogus")
    assert code == 2 and error.startswith("Error: argument ACTION: invalid choice: 'bogus'")


# -- worker -----------------------------------------------------------------------------------------


class _FakeWorker:
    made: list[dict] = []

    def __init__(self, **kwargs):
        self.made.append(kwargs)

    def run(self):
        self.made[-1]["ran"] = True


@pytest.fixture
def fake_worker(monkeypatch):
    monkeypatch.setattr(worker, "Worker", _FakeWorker)
    _FakeWorker.made = []
    return _FakeWorker.made


def test_worker_hands_concurrency_and_only_to_the_worker_and_runs_it(fake_worker):
    assert fabrika_job("worker", "--concurrency", "3", "--only", "mark_overdue, send_reminders")[0] == 0
    assert fabrika_job("worker")[0] == 0
    assert [{key: value for key, value in made.items() if key != "stdout"} for made in fake_worker] == [
        {"concurrency": 3, "only": ["mark_overdue", "send_reminders"], "verbosity": 1, "ran": True},
        {"only": None, "verbosity": 1, "ran": True},
    ]


def test_the_worker_stops_serving_its_metrics_when_it_ends(fake_worker):
    """In-process (call_command) the metrics' port is free again once the worker returns."""
    pytest.importorskip("prometheus_client")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert fabrika_job("worker", "--metrics-port", str(port))[0] == 0
    assert fake_worker[-1]["ran"] is True
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # nothing listens there any more


def test_worker_gets_the_verbosity(fake_worker):
    assert fabrika_job("worker", "-v", "2")[0] == 0
    assert fabrika_job("worker")[0] == 0
    assert [(made["verbosity"], made["ran"]) for made in fake_worker] == [(2, True), (1, True)]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--concurrency", "0"], "Error: argument --concurrency: give a whole number from 1 to 256, not '0'"),
        (["--concurrency", "two"], "Error: argument --concurrency: give a whole number from 1 to 256, not 'two'"),
        (["--concurrency", "257"], "Error: argument --concurrency: give a whole number from 1 to 256, not '257'"),
        (
            ["--concurrency", "99999999999999999999"],
            "Error: argument --concurrency: give a whole number from 1 to 256, not '99999999999999999999'",
        ),
        (["--concurrency", "\u0663"], "Error: argument --concurrency: give a whole number from 1 to 256, not '\u0663'"),
        (["--concurrency", "+3"], "Error: argument --concurrency: give a whole number from 1 to 256, not '+3'"),
        (["--concurrency", " 3"], "Error: argument --concurrency: give a whole number from 1 to 256, not ' 3'"),
        (["--concurrency", "3_0"], "Error: argument --concurrency: give a whole number from 1 to 256, not '3_0'"),
        (["--metrics-port", "\u0663"], "Error: argument --metrics-port: give a TCP port from 1 to 65535, not '\u0663'"),
        (
            ["--metrics-port", "\uff19\uff11\uff10\uff18"],
            "Error: argument --metrics-port: give a TCP port from 1 to 65535, not '\uff19\uff11\uff10\uff18'",
        ),
        (["--only", ","], "Error: argument --only: give job names separated by commas, e.g. send_outbox,mark_overdue"),
    ],
)
def test_worker_refuses_bad_flags_with_exit_2(fake_worker, args, error):
    assert fabrika_job("worker", *args)[::2] == (2, error)
    assert fake_worker == []


def test_worker_with_an_unknown_job_in_only_exits_2_before_starting(fake_worker):
    code, _, error = fabrika_job("worker", "--only", "mark_overdue,ghost")
    assert code == 2 and error.startswith("No cron job is named 'ghost'")
    assert fake_worker == []


# -- list, status -----------------------------------------------------------------------------------


def test_list_shows_schedule_next_fire_retries_timeout_lanes_rate_kicks_and_mailer_of_every_job():
    before = Schedule("15 * * * *").next_after(timezone.now())
    with temporary_job(_succeed, kicks=["mark_overdue"], timeout=timedelta(seconds=90), lanes=4, rate_limit="20/m"):
        code, out, _ = fabrika_job("list")
    after = Schedule("15 * * * *").next_after(timezone.now())
    assert code == 0
    assert re.split(r" {2,}", out.splitlines()[0]) == [
        "job",
        "schedule",
        "next fire (UTC)",
        "retries",
        "timeout",
        "lanes",
        "rate",
        "kicks",
        "mailer",
    ]
    assert len(out.splitlines()) == 1 + len(registry) + 1  # the temporary job is listed too
    assert _columns(out, "mark_overdue") in [
        ["mark_overdue", "15 * * * *", moment.strftime("%Y-%m-%d %H:%M:%S"), "2", "10m", "1", "-", "-", "-"]
        for moment in (before, after)
    ]
    assert _columns(out, "_succeed") == ["_succeed", "-", "kick only", "0", "1m30s", "4", "20/m", "mark_overdue", "-"]


@pytest.mark.django_db
def test_status_json_counts_each_queue_table_by_state_and_shows_each_job():
    now = timezone.now()
    Reminder.objects.create(note="later", email="a@example.com", due=now + timedelta(hours=1))
    Reminder.objects.create(note="due", email="a@example.com", due=now - timedelta(hours=1))
    Reminder.objects.create(note="due too", email="a@example.com", due=now - timedelta(minutes=1))
    Reminder.objects.create(note="dead", email="a@example.com", due=now - timedelta(days=1), attempts=3)
    Reminder.objects.create(note="done", email="a@example.com", due=None)
    with temporary_job(_succeed), temporary_job(_fail):
        assert fabrika_job("run", "_succeed")[0] == 0
        Job.objects.create(name="_fail", pending_since=now, next_fire=datetime(2030, 1, 1, 0, 15, tzinfo=UTC))
        Lease.objects.create(
            job="_fail",
            token="00000000-0000-0000-0000-000000000002",
            holder="host:1:2",
            expires=now + timedelta(minutes=1),
        )
        code, out, _ = fabrika_job("status", "--json")
    assert code == 0
    report = json.loads(out)
    (reminders,) = [queue for queue in report["queues"] if queue["model"] == "reminders.Reminder"]
    age = reminders.pop("oldest_due_age_seconds")
    assert reminders == {"model": "reminders.Reminder", "waiting": 3, "due_now": 2, "dead": 1, "done": 1}
    assert 3600 <= age < 3660
    jobs = {job["name"]: job for job in report["jobs"]}
    assert set(jobs) == {job.name for job in registry} | {"_succeed", "_fail"}
    succeeded = jobs["_succeed"]
    assert (succeeded["state"], succeeded["active"], succeeded["pending"], succeeded["last_outcome"]) == (
        "idle",
        False,
        False,
        "succeeded",
    )
    assert succeeded["last_trigger"] == "manual" and succeeded["last_started"] is not None
    assert {
        key: jobs["_fail"][key] for key in ("state", "active", "pending", "holder", "last_outcome", "next_fire")
    } == {
        "state": "active, pending",
        "active": True,
        "pending": True,
        "holder": "host:1:2",
        "last_outcome": None,
        "next_fire": "2030-01-01T00:15:00+00:00",
    }
    assert jobs["mark_overdue"]["last_started"] is None


@pytest.mark.django_db
def test_status_json_timestamps_are_iso_8601_with_their_offset():
    with temporary_job(_succeed):
        assert fabrika_job("run", "_succeed")[0] == 0
        report = json.loads(fabrika_job("status", "--json")[1])
    (job,) = [job for job in report["jobs"] if job["name"] == "_succeed"]
    stamps = [report["now"], job["last_started"], job["last_finished"], job["last_success"]]
    assert [datetime.fromisoformat(stamp).utcoffset() for stamp in stamps] == [timedelta(0)] * 4


@pytest.mark.django_db
def test_status_prints_a_table_of_queues_and_one_of_jobs():
    Reminder.objects.create(note="due", email="a@example.com", due=timezone.now() - timedelta(minutes=5))
    code, out, _ = fabrika_job("status")
    assert code == 0
    assert out.startswith("Queue tables (now ")
    assert _columns(out, "reminders.Reminder")[:5] == ["reminders.Reminder", "1", "1", "0", "0"]
    assert re.fullmatch(r"5m\d*s?", _columns(out, "reminders.Reminder")[5])
    assert _columns(out, "mark_overdue") == ["mark_overdue", "idle", "never", "-", "0"]


# -- kick -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_kick_marks_the_job_pending_once_committed(django_capture_on_commit_callbacks, fabrika_kicks):
    with django_capture_on_commit_callbacks(execute=True):
        code, out, _ = fabrika_job("kick", "send_reminders")
    assert (code, out) == (0, "Kicked send_reminders: a running worker starts it within seconds.\n")
    assert fabrika_kicks == ["send_reminders"]
    assert run_reads.job_states(["send_reminders"], timezone.now())["send_reminders"].pending is True


@pytest.mark.django_db
def test_run_after_a_kick_of_a_job_that_never_ran_runs_it(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        assert fabrika_job("kick", "send_reminders")[0] == 0
    code, out, _ = fabrika_job("run", "send_reminders")
    assert code == 0 and out.startswith("Job send_reminders succeeded after 1 attempt"), out
    assert Job.objects.get(name="send_reminders").pending_since is None


def test_kick_of_an_unknown_job_exits_2():
    code, _, error = fabrika_job("kick", "ghost")
    assert code == 2 and error.startswith("No cron job is named 'ghost'")


# -- requeue ----------------------------------------------------------------------------------------


def _reminders():
    now = timezone.now()
    return {
        "dead": Reminder.objects.create(note="dead", email="a@example.com", due=now, attempts=3),
        "dead2": Reminder.objects.create(note="dead2", email="a@example.com", due=now, attempts=5),
        "waiting": Reminder.objects.create(note="waiting", email="a@example.com", due=now, attempts=1),
        "done": Reminder.objects.create(note="done", email="a@example.com", due=None, attempts=1),
    }


def _states():
    return {r.note: (r.state, r.attempts, r.version) for r in Reminder.objects.all()}


@pytest.mark.django_db
def test_requeue_dead_makes_every_dead_row_due_with_no_attempts():
    _reminders()
    assert fabrika_job("requeue", "reminders.Reminder", "--dead")[:2] == (0, "Requeued 2 rows of reminders.Reminder.\n")
    assert _states() == {
        "dead": ("waiting", 0, 1),
        "dead2": ("waiting", 0, 1),
        "waiting": ("waiting", 1, 0),
        "done": ("done", 1, 0),
    }


@pytest.mark.django_db
def test_requeue_ids_requeues_those_rows_and_with_dead_only_the_dead_among_them():
    rows = _reminders()
    code, out, _ = fabrika_job(
        "requeue", "reminders.Reminder", "--id", str(rows["waiting"].pk), "--id", str(rows["dead"].pk)
    )
    assert (code, out) == (0, "Requeued 2 rows of reminders.Reminder.\n")
    code, out, _ = fabrika_job(
        "requeue", "reminders.Reminder", "--dead", "--id", str(rows["dead2"].pk), str(rows["waiting"].pk)
    )
    assert (code, out) == (0, "Requeued 1 row of reminders.Reminder.\n")
    assert _states() == {
        "dead": ("waiting", 0, 1),
        "dead2": ("waiting", 0, 1),
        "waiting": ("waiting", 0, 1),
        "done": ("done", 1, 0),
    }


@pytest.mark.django_db
def test_requeue_of_a_missing_id_exits_2_and_requeues_nothing():
    rows = _reminders()
    before = _states()
    code, _, error = fabrika_job("requeue", "reminders.Reminder", "--id", str(rows["dead"].pk), "999999")
    assert (code, error) == (
        2,
        "No reminders.Reminder row with id 999999: nothing was requeued; check the ids (see the admin).",
    )
    assert _states() == before


@pytest.mark.django_db
def test_requeue_reports_a_row_changed_meanwhile_and_does_not_overwrite_it(monkeypatch):
    rows = _reminders()
    original = Reminder.requeue

    def raced(self, at=None):
        if self.pk == rows["dead"].pk:  # someone else writes the row between our read and our write
            Reminder.objects.filter(pk=self.pk).update(note="changed", version=F("version") + 1)
        return original(self, at)

    monkeypatch.setattr(Reminder, "requeue", raced)
    code, out, error = fabrika_job("requeue", "reminders.Reminder", "--dead")
    assert (code, out) == (1, "Requeued 1 row of reminders.Reminder.\n")
    assert error == (
        f"reminders.Reminder {rows['dead'].pk} changed while being requeued and were left as they are: "
        "look at them again, then run the command again."
    )
    assert _states()["changed"] == ("dead", 3, 1)
    assert _states()["dead2"] == ("waiting", 0, 1)


# The project's own queue models, never a model of another project (the demo's) as the example.
_MINE = (
    "this project's are fabrika_django.QueuedTask, lab.Item, lab.Parcel, outbox.OutboxMail, outbox.Registration, "
    "reminders.Reminder, reports.ReportRequest"
)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["nope.Model", "--dead"],
            f"Unknown model 'nope.Model': give app_label.Model of a queue model ({_MINE}).",
        ),
        (
            ["Reminder", "--dead"],
            f"Unknown model 'Reminder': give app_label.Model of a queue model ({_MINE}).",
        ),
        (
            ["tasks.Task", "--dead"],
            f"Model tasks.Task is not a queue model: give a model that mixes in QueueModel ({_MINE}).",
        ),
        (
            ["reminders.Reminder"],
            "Say which rows to requeue: --dead, --id ID ..., or both (the dead rows among those ids).",
        ),
        (["reminders.Reminder", "--id", "x"], "'x' is not an id of reminders.Reminder: give its primary key values."),
    ],
)
def test_requeue_usage_errors_exit_2(args, error):
    assert fabrika_job("requeue", *args)[::2] == (2, error)


# -- the same usage errors from a shell: one line on stderr, no traceback, exit 2 -----------------


@pytest.mark.parametrize(
    "args",
    [
        ["run", "nope"],
        ["run"],
        ["kick", "nope"],
        ["requeue", "nope.Model", "--dead"],
        ["requeue", "reminders.Reminder"],
        ["worker", "--concurrency", "0"],
        ["worker", "--concurrency", "99999999999999999999"],
        ["worker", "--metrics-port", "\u0663"],
        ["worker", "--only", "ghost"],
        ["status", "--bogus"],
        ["bogus"],
        [],
        ["requeue", "reminders.Reminder", "--id", "99999999999999999999"],
    ],
    ids=lambda args: " ".join(args) or "no action",
)
def test_a_usage_error_from_the_shell_is_one_line_on_stderr_and_exit_2(args, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": f"sqlite:///{tmp_path / 'unused.sqlite3'}"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "fabrika_job", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
