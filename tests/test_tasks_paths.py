"""What the worker makes of a task row: its path is looked up among the registered tasks and never imported, and a
return value JSON cannot hold is recorded with its code.

A task is registered when a fabrika backend validates it, which Django does for each task it makes: when the module
that defines it is imported. A worker imports each installed app's ``tasks`` module before it claims; nothing a row
names is imported. The probe modules here write a file when they are imported, so an import cannot go unseen.
"""

import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import modify_settings
from django.utils import timezone

from fabrika_django._task_paths import task_of
from fabrika_django.models import QueuedTask
from fabrika_django.testing import run_tasks
from testproject.lab import tasks

from .processes import ROOT, start_manage
from .workers import WorkerProcess, wait_until

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

pytestmark = pytest.mark.django_db(transaction=True)

_TASK_IMPORT = """\
try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task
"""


@dataclass
class Probe:
    """Modules on ``sys.path`` that write ``<name>.imported`` beside them when they are imported."""

    root: Path

    def module(self, name, source=""):
        path = self.root.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for package in path.parents:
            if package == self.root:
                break
            (package / "__init__.py").touch()
        path.write_text(f"open({str(self.imported(name))!r}, 'w').close()\n{source}")

    def imported(self, name):
        return self.root / f"{name}.imported"

    def app(self):
        """``fabrika_probe_app``: an app whose ``tasks`` module has the task ``touch(path)``, and a ``helpers``
        module that is no tasks module."""
        self.module(
            "fabrika_probe_app.tasks", f"{_TASK_IMPORT}\n\n@task\ndef touch(path):\n    open(path, 'w').close()\n"
        )
        self.module("fabrika_probe_app.helpers", "\n\ndef run():\n    return 'ran'\n")


@pytest.fixture
def probe(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield Probe(tmp_path)
    for name in [name for name in sys.modules if name.startswith("fabrika_probe")]:
        del sys.modules[name]


@task
def defined_in_this_test_module():
    return "here"


def _row_naming(path, args=()):
    """A task row whose path is ``path``, written as a row is by hand (or by whoever can write one)."""
    result = tasks.noop.enqueue()
    QueuedTask.objects.filter(result_id=result.id).update(task_path=path, args=list(args))
    return result.id


def _assert_refused(result_id):
    refused = QueuedTask.objects.get(result_id=result_id)
    assert refused.last_failure == "task_not_registered"
    assert [error["exception_class_path"] for error in refused.errors] == ["django.core.exceptions.SuspiciousOperation"]
    assert refused.errors[0]["traceback"].endswith("SuspiciousOperation: task_not_registered\n")


def test_a_return_value_that_is_not_json_is_recorded_with_its_code():
    tasks.returns_an_object.enqueue()
    tasks.returns_nan.enqueue()
    for ran in run_tasks():
        assert [error.exception_class_path for error in ran.errors] == ["builtins.TypeError"]
        assert ran.errors[0].traceback.endswith("builtins.TypeError: return_value_not_json\n")
    assert set(QueuedTask.objects.values_list("last_failure", flat=True)) == {"return_value_not_json"}


def test_a_row_naming_a_module_outside_the_project_is_refused_without_importing_it(probe):
    probe.module("fabrika_probe_outside", "\n\ndef run():\n    return 'ran'\n")
    refused = _row_naming("fabrika_probe_outside.run")
    kept = tasks.noop.enqueue()
    assert [ran.id for ran in run_tasks()] == [kept.id]
    assert "fabrika_probe_outside" not in sys.modules and not probe.imported("fabrika_probe_outside").exists()
    _assert_refused(refused)


def test_a_row_naming_an_apps_module_that_is_not_its_tasks_module_is_refused_and_its_tasks_module_is_found(probe):
    probe.app()
    flag = probe.root / "touched"
    with modify_settings(INSTALLED_APPS={"append": "fabrika_probe_app"}):
        refused = _row_naming("fabrika_probe_app.helpers.run")
        touched = _row_naming("fabrika_probe_app.tasks.touch", [str(flag)])
        assert "fabrika_probe_app.tasks" not in sys.modules  # nothing here imported it: the run does
        assert [ran.id for ran in run_tasks()] == [touched]
    assert flag.exists() and probe.imported("fabrika_probe_app.tasks").exists()
    assert "fabrika_probe_app.helpers" not in sys.modules and not probe.imported("fabrika_probe_app.helpers").exists()
    _assert_refused(refused)


def test_a_row_naming_something_imported_that_is_no_task_is_refused_with_the_same_code():
    refused = _row_naming("os.system")
    assert run_tasks() == []
    _assert_refused(refused)


def test_a_task_defined_in_a_test_module_runs_since_its_module_is_imported():
    result = defined_in_this_test_module.enqueue()
    [ran] = run_tasks()
    assert ran.id == result.id and ran.status == "SUCCESSFUL" and ran.return_value == "here"


def test_a_copy_made_with_using_does_not_become_the_registered_task():
    tasks.noop.using(run_after=timezone.now() + timedelta(days=1), priority=5)
    result = tasks.noop.enqueue()
    [ran] = run_tasks()
    assert ran.id == result.id and ran.task.run_after is None and ran.task.priority == 0


def test_rows_of_one_task_enqueued_differently_each_get_the_task_as_they_were_enqueued():
    later = timezone.now() + timedelta(hours=1)
    rows = [
        QueuedTask(
            task_path=tasks.noop.module_path, backend="default", queue_name=queue, priority=priority, run_after=at
        )
        for queue, priority, at in [
            ("default", 0, None),
            ("default", 5, None),
            ("emails", 5, None),
            ("default", 5, later),
        ]
    ]
    made = [task_of(row) for row in rows]
    assert [(task.queue_name, task.priority, task.run_after) for task in made] == [
        ("default", 0, None),
        ("default", 5, None),
        ("emails", 5, None),
        ("default", 5, later),
    ]
    assert task_of(rows[1]) is made[1]  # made once: using() validates each new Task against the settings


def test_a_task_looked_up_again_after_a_setting_changed_is_checked_against_the_new_settings():
    from django.test import override_settings

    from fabrika_django._tasks_compat import InvalidTask

    row = QueuedTask(task_path=tasks.noop.module_path, backend="default", queue_name="emails", priority=0)
    task_of(row)
    backends = {"default": {"BACKEND": "fabrika_django.tasks.FabrikaBackend", "QUEUES": ["default"]}}
    with override_settings(TASKS=backends), pytest.raises(InvalidTask, match="emails"):
        task_of(row)


def _probe_settings(probe):
    """A settings module: the test project's with the probe app installed, and the environment a worker needs."""
    probe.root.joinpath("fabrika_probe_settings.py").write_text(
        "from testproject.settings import *  # noqa: F403\n\n"
        "INSTALLED_APPS = [*INSTALLED_APPS, 'fabrika_probe_app']  # noqa: F405\n"
    )
    return {"DJANGO_SETTINGS_MODULE": "fabrika_probe_settings", "PYTHONPATH": f"{probe.root}{os.pathsep}{ROOT}"}


def test_a_worker_process_runs_a_task_of_an_apps_tasks_module_and_refuses_its_other_modules(probe):
    probe.app()
    flag = probe.root / "touched"
    refused = _row_naming("fabrika_probe_app.helpers.run")
    touched = _row_naming("fabrika_probe_app.tasks.touch", [str(flag)])

    def both_taken():
        rows = QueuedTask.objects.filter(result_id__in=[refused, touched]).values_list(
            "result_id", "status", "last_failure"
        )
        ends = {str(result_id): (status, failure) for result_id, status, failure in rows}
        return ends == {touched: ("SUCCESSFUL", ""), refused: ("READY", "task_not_registered")}

    worker = WorkerProcess("--only", "tasks.default.default", FABRIKA_POLL_INTERVAL=0.2, **_probe_settings(probe))
    try:
        wait_until(both_taken, workers=[worker], what="the worker's run of both tasks")
    finally:
        worker.kill()
    assert flag.exists() and probe.imported("fabrika_probe_app.tasks").exists()
    assert not probe.imported("fabrika_probe_app.helpers").exists()
    assert "fabrika_probe_app" not in sys.modules  # the worker found its task itself
    _assert_refused(refused)


def test_a_tasks_module_that_does_not_import_stops_the_worker_at_its_start(probe):
    probe.module("fabrika_probe_app.tasks", "\nraise RuntimeError('a broken tasks module')\n")
    process = start_manage("fabrika_job", "worker", **_probe_settings(probe))
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 1
    assert stderr.rstrip().endswith("RuntimeError: a broken tasks module")


def test_get_result_in_a_process_that_never_imported_the_task_finds_it(probe):
    probe.app()
    result_id = _row_naming("fabrika_probe_app.tasks.touch", ["unused"])
    script = (
        "from fabrika_django._tasks_compat import task_backends\n"
        f"result = task_backends['default'].get_result({result_id!r})\n"
        "print(result.status, result.task.module_path)\n"
    )
    process = start_manage("shell", "-c", script, **_probe_settings(probe))
    stdout, stderr = process.communicate(timeout=120)
    assert (process.returncode, stdout.splitlines()[-1:]) == (0, ["READY fabrika_probe_app.tasks.touch"]), stderr
