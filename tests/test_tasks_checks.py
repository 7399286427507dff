"""``fabrika.E040`` in a project that forgot fabrika_django in INSTALLED_APPS, checked by a real ``manage.py check``
on this Django (5.2 with the backport's app, or 6.x once an app imports ``django.tasks``)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import django
from django.test import override_settings

from fabrika_django._tasks_checks import check_tasks_backends
from fabrika_django.tasks import FabrikaBackend

ROOT = Path(__file__).resolve().parent.parent
IMMEDIATE = (
    "django.tasks.backends.immediate.ImmediateBackend"
    if django.VERSION >= (6,)
    else "django_tasks.backends.immediate.ImmediateBackend"
)

SETTINGS = """
SECRET_KEY = "not secret"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", {tasks_app!r}]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}}
TASKS = {{"default": {{"BACKEND": "fabrika_django.tasks.FabrikaBackend"}}}}
USE_TZ = True
"""


def _check(tmp_path, tasks_app):
    (tmp_path / "forgot_settings.py").write_text(textwrap.dedent(SETTINGS.format(tasks_app=tasks_app)))
    shop = tmp_path / "shop"
    shop.mkdir()
    (shop / "__init__.py").write_text("")
    # An app whose models use Django's tasks, as a project's would: on Django 6.x that import registers the
    # tasks checks (the backport's app does it on 5.2).
    (shop / "models.py").write_text("from django.tasks import task  # noqa: F401\n" if django.VERSION >= (6,) else "")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="forgot_settings", PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    return subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "-m", "django", "check"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_project_without_fabrika_in_installed_apps_fails_the_check_with_e040_once(tmp_path):
    checked = _check(tmp_path, "django_tasks" if django.VERSION < (6,) else "shop")
    assert checked.returncode == 1
    assert checked.stderr.count("fabrika.E040") == 1
    assert (
        "?: (fabrika.E040) TASKS['default'] is a FabrikaBackend, but fabrika_django is not installed.\n"
        "\tHINT: Add 'fabrika_django' to INSTALLED_APPS and run migrate." in checked.stderr
    )


class OwnBackend(FabrikaBackend):
    """A project's own subclass: fabrika's backend too."""


def test_fabrikas_check_names_each_alias_of_its_backend_or_a_subclass_and_no_other():
    backends = {
        "default": {"BACKEND": "fabrika_django.tasks.FabrikaBackend"},
        "own": {"BACKEND": f"{__name__}.OwnBackend"},
        "immediate": {"BACKEND": IMMEDIATE},
        "missing": {"BACKEND": "nowhere.Backend"},
    }
    with override_settings(INSTALLED_APPS=["django.contrib.contenttypes"], TASKS=backends):
        assert [(e.id, e.msg) for e in check_tasks_backends()] == [
            ("fabrika.E040", "TASKS['default'] is a FabrikaBackend, but fabrika_django is not installed."),
            ("fabrika.E040", "TASKS['own'] is a FabrikaBackend, but fabrika_django is not installed."),
        ]
    with override_settings(TASKS=backends):
        assert check_tasks_backends() == []  # installed


def test_an_enqueue_without_fabrika_in_installed_apps_says_so_in_one_line(tmp_path):
    # Where check ran no tasks check (Django 6.x, nothing imported django.tasks), the first enqueue says it.
    _check(tmp_path, "django_tasks" if django.VERSION < (6,) else "shop")
    tasks_module = "django.tasks" if django.VERSION >= (6,) else "django_tasks"
    (tmp_path / "shop" / "tasks.py").write_text(f"from {tasks_module} import task\n\n\n@task\ndef ping():\n    pass\n")
    script = "import django; django.setup(); from shop.tasks import ping; ping.enqueue()"
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="forgot_settings", PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    ran = subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 1
    assert ran.stderr.splitlines()[-1] == (
        "django.core.exceptions.ImproperlyConfigured: TASKS['default'] is a FabrikaBackend, but fabrika_django is "
        "not installed. Add 'fabrika_django' to INSTALLED_APPS and run migrate. (fabrika.E040)"
    )
