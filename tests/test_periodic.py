"""Periodic Django tasks (``TASKS[alias]["OPTIONS"]["periodic"]``): one task per fire, across workers and crashes."""

import io
import json
import os
import signal
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from importlib.util import find_spec
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from fabrika_django import _periodic
from fabrika_django._tasks_checks import check_tasks_periodic
from fabrika_django._tasks_compat import task_backends
from fabrika_django.jobs import registry
from fabrika_django.models import Attempt, Job, KickRequest, QueuedTask
from fabrika_django.testing import run_job, run_tasks

from .workers import WorkerProcess, wait_until

MARK = "testproject.lab.tasks.mark"
JOB = "tasks.default.periodic.tick"


def _tasks(periodic):
    backend = {
        "BACKEND": "fabrika_django.tasks.FabrikaBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"max_attempts": 3, "timeout": 60, "periodic": periodic},
    }
    return override_settings(TASKS={"default": backend})


def _registered(periodic):
    """The backend made under ``periodic``: its entries' jobs registered."""
    task_backends["default"]  # noqa: B018  made under the settings: its jobs registered
    return [job.name for job in registry if ".periodic." in job.name]


@pytest.fixture(autouse=True)
def forget_periodic_jobs():
    yield
    for job in list(registry):
        if ".periodic." in job.name:
            registry.unregister(job.name)


# -- the entries, their jobs and their checks --------------------------------------------------------------


def test_each_good_entry_is_a_scheduled_job_named_after_the_backend_and_the_entry():
    periodic = {
        "tick": {"task": MARK, "schedule": "*/5 * * * *", "args": ["tick"]},
        "nightly_cleanup": {"task": MARK, "schedule": "30 3 * * 1-5", "kwargs": {"note": "night"}},
        "Bad-Name": {"task": MARK, "schedule": "* * * * *"},
        "broken": {"task": MARK, "schedule": "61 * * * *"},
    }
    with _tasks(periodic):
        assert _registered(periodic) == ["tasks.default.periodic.nightly_cleanup", "tasks.default.periodic.tick"]
        assert registry.get(JOB).schedule.expression == "*/5 * * * *"


@pytest.mark.django_db
def test_a_run_of_the_entry_s_job_enqueues_its_task_once_with_its_arguments_and_priority():
    periodic = {"tick": {"task": MARK, "schedule": "0 0 1 1 *", "args": ["tick"], "priority": 7}}
    with _tasks(periodic):
        _registered(periodic)
        assert run_job(JOB).ok
        row = QueuedTask.objects.get()
        assert (row.task_path, row.args, row.kwargs, row.priority, row.status) == (MARK, ["tick"], {}, 7, "READY")
        assert run_job(JOB).ok  # a manual run of its own: one more task
        assert QueuedTask.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_an_entry_s_task_outside_a_tasks_module_is_registered_before_a_run_claims_it(tmp_path, monkeypatch):
    """A worker that never ran the entry's job (another one did, and wrote the row) imports the task the settings
    name before it claims: a row's path is only looked up among the registered tasks, never imported."""
    task_import = "from django.tasks import task" if find_spec("django.tasks") else "from django_tasks import task"
    (tmp_path / "fabrika_periodic_probe.py").write_text(f"{task_import}\n\n\n@task\ndef tick():\n    return 'ticked'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with _tasks({"tick": {"task": "fabrika_periodic_probe.tick", "schedule": "0 3 * * *"}}):
            row = QueuedTask.objects.create(
                task_path="fabrika_periodic_probe.tick", backend="default", queue_name="default"
            )
            assert "fabrika_periodic_probe" not in sys.modules
            [ran] = run_tasks()
    finally:
        sys.modules.pop("fabrika_periodic_probe", None)
    assert ran.id == str(row.result_id) and ran.return_value == "ticked"


def test_the_checks_name_each_bad_entry_with_an_id_per_kind_of_mistake():
    periodic = {
        "fine": {"task": MARK, "schedule": "* * * * *"},
        "Bad-Name": {"task": MARK, "schedule": "* * * * *"},
        "nowhere": {"task": "testproject.lab.tasks.nowhere", "schedule": "* * * * *"},
        "not_a_task": {"task": "testproject.lab.models.Mark", "schedule": "* * * * *"},
        "bad_schedule": {"task": MARK, "schedule": "61 * * * *"},
        "bad_args": {"task": MARK, "schedule": "* * * * *", "args": {"a": 1}},
        "nan": {"task": MARK, "schedule": "* * * * *", "args": [float("nan")]},
        "no_schedule": {"task": MARK},
    }
    with _tasks(periodic):
        found = [(error.id, error.msg.split(":")[0]) for error in check_tasks_periodic()]
    where = "TASKS['default']['OPTIONS']['periodic']"
    assert found == [
        ("fabrika.E041", f"{where}['Bad-Name']"),
        ("fabrika.E042", f"{where}['nowhere']"),
        ("fabrika.E042", f"{where}['not_a_task']"),
        ("fabrika.E044", f"{where}['bad_schedule']"),
        ("fabrika.E045", f"{where}['bad_args']"),
        ("fabrika.E045", f"{where}['nan']"),
        ("fabrika.E047", f"{where}['no_schedule'] lacks 'schedule'."),
    ]
    with _tasks(["not", "a", "dict"]):
        assert [error.id for error in check_tasks_periodic()] == ["fabrika.E047"]
    # An entry whose job's name a queue's job has already (a queue named "periodic.<name>").
    clash = _periodic.problems("default", {"tick": {"task": MARK, "schedule": "@daily"}}, ["default", "periodic.tick"])
    assert [error.id for error in clash] == ["fabrika.E041"]
    # The lab's tasks are the default backend's: an entry of another backend naming one is E043.
    assert [error.id for error in _periodic.problems("other", {"theirs": {"task": MARK, "schedule": "@daily"}})] == [
        "fabrika.E043"
    ]


@pytest.mark.django_db
def test_fabrika_job_list_shows_the_entry_s_job_with_its_next_fire(capsys):
    periodic = {"tick": {"task": MARK, "schedule": "0 0 1 1 *"}}
    with _tasks(periodic):
        _registered(periodic)
        call_command("fabrika_job", "list")
    line = next(line for line in capsys.readouterr().out.splitlines() if JOB in line)
    assert "0 0 1 1 *" in line


@pytest.mark.django_db
def test_the_admin_and_status_treat_the_entry_s_job_as_a_job_and_run_now_enqueues_one_task(
    admin_client, django_capture_on_commit_callbacks
):
    periodic = {"tick": {"task": MARK, "schedule": "0 0 1 1 *"}}
    with _tasks(periodic):
        _registered(periodic)
        assert run_job(JOB).ok
        assert JOB in admin_client.get(reverse("admin:fabrika_django_job_changelist")).content.decode()
        page = admin_client.get(reverse("admin:fabrika_django_job_change", args=[JOB])).content.decode()
        assert "0 0 1 1 *" in page
        with django_capture_on_commit_callbacks(execute=True):
            assert admin_client.post(reverse("admin:fabrika_django_job_run", args=[JOB])).status_code == 302
        assert Job.objects.get(name=JOB).pending_since is not None or KickRequest.objects.filter(job=JOB).exists()
        assert run_job(JOB).ok  # what the worker does with the kick: a run of its own, one more task
        call_command("fabrika_job", "status", "--json", stdout=(out := io.StringIO()))
    assert QueuedTask.objects.count() == 2
    (state,) = [job for job in json.loads(out.getvalue())["jobs"] if job["name"] == JOB]
    assert state["last_outcome"] == "succeeded"


# -- real workers ----------------------------------------------------------------------------------------------


def _workers_env(periodic, **extra):
    return {
        "FABRIKA_LAB_PERIODIC": json.dumps(periodic),
        "FABRIKA_LEASE_SECONDS": 2,
        "FABRIKA_POLL_INTERVAL": 0.2,
        **extra,
    }


def _periodic_tasks():
    return QueuedTask.objects.filter(task_path=MARK)


def _run_ended(name, after):
    return Attempt.objects.filter(job=name, started__gte=after).exclude(outcome="running").exists()


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_two_workers_enqueue_exactly_one_task_for_a_fire():
    # Yearly: the fire the test makes due is the only one the workers can meet.
    periodic = {"tick": {"task": MARK, "schedule": "0 0 1 1 *", "args": ["fire"]}}
    env = _workers_env(periodic)
    workers = [WorkerProcess("--only", JOB, **env) for _ in range(2)]
    try:
        wait_until(lambda: Job.objects.filter(name=JOB, next_fire__isnull=False).exists(), workers=workers,
                   what="the entry's first fire, set when it first appears")  # fmt: skip
        assert not _periodic_tasks().exists()  # no fire for the times before the entry existed
        # The fire of 1 January comes due for both workers at once.
        began = timezone.now()
        Job.objects.filter(name=JOB).update(next_fire=datetime(timezone.now().year, 1, 1, tzinfo=UTC))
        wait_until(lambda: _run_ended(JOB, began), workers=workers, what="the fire's run")
        wait_until(lambda: Job.objects.get(name=JOB).next_fire > timezone.now(), workers=workers, what="the next fire")
    finally:
        for worker in workers:
            worker.kill()
    assert list(_periodic_tasks().values_list("args", flat=True)) == [["fire"]]
    assert Attempt.objects.filter(job=JOB).count() == 1


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_fires_missed_while_no_worker_ran_become_one_task():
    periodic = {"tick": {"task": MARK, "schedule": "0 0 * * *"}}
    runner_rows = Job.objects.create(name=JOB, next_fire=(timezone.now() - timedelta(days=3)).replace(
        hour=0, minute=0, second=0, microsecond=0))  # fmt: skip
    assert runner_rows.next_fire < timezone.now()
    worker = WorkerProcess("--only", JOB, **_workers_env(periodic))
    try:
        wait_until(lambda: Job.objects.get(name=JOB).next_fire > timezone.now(), workers=[worker], what="the run")
        wait_until(lambda: _run_ended(JOB, runner_rows.next_fire), workers=[worker], what="the run's end")
    finally:
        worker.kill()
    assert _periodic_tasks().count() == 1  # three midnights missed: one task
    assert Attempt.objects.filter(job=JOB).count() == 1


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_after_the_enqueue_s_commit_causes_no_second_task():
    periodic = {"tick": {"task": MARK, "schedule": "0 0 1 1 *"}}
    with tempfile.TemporaryDirectory() as folder:
        hold = Path(folder) / "hold"
        hold.touch()
        first = WorkerProcess("--only", JOB, **_workers_env(periodic, LAB_PERIODIC_HOLD=hold))
        second = None
        try:
            wait_until(lambda: Job.objects.filter(name=JOB, next_fire__isnull=False).exists(), workers=[first],
                       what="the entry's first fire")  # fmt: skip
            Job.objects.filter(name=JOB).update(next_fire=datetime(timezone.now().year, 1, 1, tzinfo=UTC))
            seen = Path(f"{hold}.seen")
            wait_until(seen.exists, workers=[first], what="the enqueue committed, its attempt not ended")
            assert seen.read_text() == str(first.pid)
            assert _periodic_tasks().count() == 1
            first.signal(signal.SIGKILL)
            first.wait(30)
            os.remove(hold)
            second = WorkerProcess("--only", JOB, **_workers_env(periodic))
            wait_until(
                lambda: Attempt.objects.filter(job=JOB, outcome="succeeded").exists(),
                timeout=60,
                workers=[second],
                what="the run taken over and ended",
            )
        finally:
            first.kill()
            if second is not None:
                second.kill()
    assert _periodic_tasks().count() == 1
    attempts = list(Attempt.objects.filter(job=JOB).order_by("number").values_list("number", "outcome"))
    assert attempts == [(1, "crashed"), (2, "succeeded")]  # the same run, resumed
