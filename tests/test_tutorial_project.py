"""The tutorial's project (docs/tutorial_project/, which the tutorial's pages include) works as the pages say:
it checks, migrates, has no migration missing, runs its job, and its own tests pass. Run on a copy, with its own
SQLite file, in a process of its own (its settings are the tutorial's, not the test project's)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

PROJECT = Path(__file__).resolve().parent.parent / "docs" / "tutorial_project"

pytestmark = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="the tutorial's project is on SQLite: it runs in the SQLite pass only"
)


@pytest.fixture
def project(tmp_path):
    copy = tmp_path / "tutorial_project"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns("__pycache__", "*.sqlite3*"))
    return copy


def _manage(project, *args):
    env = {key: value for key, value in os.environ.items() if key not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=project, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def test_the_tutorial_project_checks_migrates_runs_its_job_and_passes_its_tests(project):
    _manage(project, "check")
    _manage(project, "makemigrations", "--check", "--dry-run")
    _manage(project, "migrate", "-v", "0")
    place = "from shop.models import Order, Shipment; Shipment.objects.create(order=Order.objects.create(address='1')"
    _manage(project, "shell", "-v", "0", "-c", place + ")")
    assert "succeeded" in _manage(project, "fabrika_job", "run", "ship_orders")
    _manage(project, "shell", "-c", "from shop.models import Shipment; assert Shipment.objects.get().state == 'done'")
    output = _manage(project, "test", "shop", "-v", "2")
    assert "Ran 2 tests" in output and "OK" in output
