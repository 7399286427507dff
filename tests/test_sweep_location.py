"""The file sweep deletes only inside a media folder of its own, never the project it runs in.

Django makes an unset ``MEDIA_ROOT`` (``''``) the working directory, so a sweep run from a project folder would
otherwise delete ``manage.py``, the settings and the models. Such a location is a system-check error
(``fabrika.E037``), and the job and ``sweep-files`` (which ``call_command`` runs without the checks, as
``--skip-checks`` does) refuse it too, deleting nothing.
"""

import os
import sys
import time

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError

from fabrika_django.checks._settings import _check_settings
from fabrika_django.testing import run_job

SWEEP = {"storages": ["default"], "older_than_days": 7}
OLD = time.time() - 400 * 24 * 3600


def _old_project(folder):
    """A project folder whose every file is a year old, as an orphan of the sweep's would be."""
    files = ["manage.py", "mysite/settings.py", "shop/models.py", "shop/views.py", "README.md"]
    for name in files:
        path = folder.joinpath(*name.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {name}\n")
        os.utime(path, (OLD, OLD))
    return files


def _files(root):
    return sorted(
        os.path.relpath(os.path.join(top, name), root).replace(os.sep, "/")
        for top, _, names in os.walk(root)
        for name in names
    )


def _refused(**options):
    """``sweep-files`` refuses with exit 2 and one line."""
    with pytest.raises(CommandError) as refused:
        call_command("fabrika_job", "sweep-files", **options)
    assert refused.value.returncode == 2
    assert "\n" not in str(refused.value)
    return str(refused.value)


@pytest.mark.django_db
def test_an_unset_media_root_from_a_project_folder_deletes_nothing_and_fails_the_check(tmp_path, settings, monkeypatch):
    files = _old_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    settings.MEDIA_ROOT = ""
    settings.FABRIKA = dict(settings.FABRIKA, FILE_SWEEP=dict(SWEEP))

    [error] = [e for e in _check_settings() if e.id == "fabrika.E037"]
    assert "Storage 'default'" in error.msg and "is empty (MEDIA_ROOT unset)" in error.msg
    with pytest.raises(SystemCheckError):  # `manage.py check`, and any command that runs the checks
        call_command("check")

    message = _refused()
    assert message.startswith("Storage 'default' of FABRIKA['FILE_SWEEP'] has a location that is empty")
    assert message.endswith("Nothing was deleted.")
    _refused(dry_run=True)
    assert run_job("fabrika_sweep_files").outcome == "handler_failed"
    assert _files(tmp_path) == sorted(files)


@pytest.mark.django_db
def test_the_filesystem_root_is_refused_and_a_dry_run_lists_nothing(settings, capsys):
    settings.MEDIA_ROOT = "/"
    settings.FABRIKA = dict(settings.FABRIKA, FILE_SWEEP=dict(SWEEP))
    assert [e.id for e in _check_settings()] == ["fabrika.E037"]
    assert "is the filesystem root" in _refused(dry_run=True)
    assert capsys.readouterr().out == ""


@pytest.mark.django_db
def test_a_media_root_that_is_the_projects_base_dir_is_refused(tmp_path, settings):
    files = _old_project(tmp_path)
    settings.BASE_DIR = tmp_path
    settings.MEDIA_ROOT = str(tmp_path)
    settings.FABRIKA = dict(settings.FABRIKA, FILE_SWEEP=dict(SWEEP))
    [error] = _check_settings()
    assert (error.id, error.obj) == ("fabrika.E037", "default")
    assert f"contains BASE_DIR ({tmp_path})" in error.msg
    assert "contains BASE_DIR" in _refused()
    assert run_job("fabrika_sweep_files").outcome == "handler_failed"
    assert _files(tmp_path) == sorted(files)


def _storage_at(settings, location):
    settings.STORAGES = {
        **settings.STORAGES,
        "uploads": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": location}},
    }
    settings.FABRIKA = dict(settings.FABRIKA, FILE_SWEEP={"storages": ["uploads"], "older_than_days": 7})


def _settings_folder():
    return os.path.dirname(sys.modules[django_settings.SETTINGS_MODULE].__file__)


def _admin_app_folder():
    from django.apps import apps

    return apps.get_app_config("admin").path


@pytest.mark.parametrize(
    ("folder", "problem"),
    [
        (lambda tmp_path, settings: "media", "is relative (media)"),
        (lambda tmp_path, settings: _settings_folder(), "contains the settings module"),
        (lambda tmp_path, settings: sys.prefix, f"contains sys.prefix ({sys.prefix})"),
        (lambda tmp_path, settings: _admin_app_folder(), "contains the installed app django.contrib.admin"),
    ],
    ids=["relative", "settings-module", "sys-prefix", "installed-app"],
)
def test_a_storage_folder_holding_code_or_configuration_is_refused(tmp_path, settings, folder, problem):
    _storage_at(settings, folder(tmp_path, settings))
    [error] = _check_settings()
    assert error.id == "fabrika.E037"
    assert "Storage 'uploads'" in error.msg and problem in error.msg


def test_a_storage_folder_holding_static_root_or_the_working_directory_is_refused(tmp_path, settings, monkeypatch):
    _storage_at(settings, str(tmp_path))
    settings.STATIC_ROOT = tmp_path / "static"
    [error] = _check_settings()
    assert f"contains STATIC_ROOT ({tmp_path / 'static'})" in error.msg
    settings.STATIC_ROOT = None
    monkeypatch.chdir(tmp_path / "..")
    _storage_at(settings, str(tmp_path / ".."))
    [error] = _check_settings()
    assert "contains the working directory" in error.msg


@pytest.mark.django_db
def test_a_media_folder_of_its_own_passes(tmp_path, settings):
    _storage_at(settings, str(tmp_path / "uploads"))
    assert _check_settings() == []
