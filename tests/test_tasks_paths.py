"""What the worker makes of a task row: a path outside the project is refused before anything is imported, and a
return value JSON cannot hold is recorded with its code."""

import sys

import pytest

from fabrika_django.models import QueuedTask
from fabrika_django.testing import run_tasks
from testproject.lab import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_return_value_that_is_not_json_is_recorded_with_its_code():
    tasks.returns_an_object.enqueue()
    tasks.returns_nan.enqueue()
    for ran in run_tasks():
        assert [error.exception_class_path for error in ran.errors] == ["builtins.TypeError"]
        assert ran.errors[0].traceback.endswith("builtins.TypeError: return_value_not_json\n")
    assert set(QueuedTask.objects.values_list("last_failure", flat=True)) == {"return_value_not_json"}


def test_a_row_naming_a_module_outside_the_project_is_refused_without_importing_it(tmp_path, monkeypatch):
    probe = tmp_path / "fabrika_import_probe.py"
    probe.write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    row = tasks.noop.enqueue()
    QueuedTask.objects.filter(result_id=row.id).update(task_path="fabrika_import_probe.run")
    kept = tasks.noop.enqueue()
    assert [ran.id for ran in run_tasks()] == [kept.id]
    assert "fabrika_import_probe" not in sys.modules and not (tmp_path / "imported").exists()
    refused = QueuedTask.objects.get(result_id=row.id)
    assert refused.last_failure == "task_not_registered"
    assert [error["exception_class_path"] for error in refused.errors] == ["django.core.exceptions.SuspiciousOperation"]
    assert refused.errors[0]["traceback"].endswith("SuspiciousOperation: task_not_registered\n")


def test_a_row_naming_something_imported_that_is_no_task_is_refused_with_the_same_code():
    row = tasks.noop.enqueue()
    QueuedTask.objects.filter(result_id=row.id).update(task_path="os.system")
    assert run_tasks() == []
    assert QueuedTask.objects.get(result_id=row.id).last_failure == "task_not_registered"
