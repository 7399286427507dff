"""The file sweep keeps a file a column names in any form its storage opens, and walks what it can read.

A column may hold ``./reports/a.csv``, ``reports//c.csv``, ``reports/x/../b.csv`` or an absolute path inside
MEDIA_ROOT: each opens the listed file through its ``FieldFile``, so each keeps it.
"""

import io
import os
import time
from contextlib import contextmanager

import pytest
from django.core.files.storage import InMemoryStorage
from django.core.management import call_command
from django.core.management.base import CommandError

from fabrika_django.checks._settings import _check_settings
from fabrika_django.testing import run_job
from testproject.lab.models import Document
from testproject.reports.models import ReportRequest

from .test_sweep import _in_thread, _watch

DAY = 24 * 3600
SWEEP = {"storages": ["default"], "older_than_days": 7}


@pytest.fixture
def media(tmp_path, settings):
    root = tmp_path / "media"
    root.mkdir()
    settings.MEDIA_ROOT = str(root)
    settings.FABRIKA = dict(settings.FABRIKA, FILE_SWEEP=dict(SWEEP))
    return root


def _file(root, name, *, days=30):
    path = root.joinpath(*name.split("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"content of " + name.encode())
    stamp = time.time() - days * DAY
    os.utime(path, (stamp, stamp))
    return path


def _files(root):
    return sorted(
        os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
        for folder, _, names in os.walk(root)
        for name in names
    )


def _odd_references(media):
    """Old files each held by a value not in normal form (each opening its file), and one orphan."""
    values = {
        "reports/a.csv": "./reports/a.csv",
        "reports/b.csv": "reports/x/../b.csv",
        "reports/c.csv": "reports//c.csv",
        "reports/d.csv": str(media / "reports" / "d.csv"),
        "reports/e.csv": "reports/./e.csv",
    }
    for name, value in values.items():
        _file(media, name)
        row = ReportRequest.objects.create(result=value)
        with row.result.open("rb") as opened:  # the premise: the column's FieldFile opens the listed file
            assert opened.read() == b"content of " + name.encode()
    _file(media, "reports/orphan.csv")
    _file(media, "private/docs/kept.pdf")
    Document.objects.create(file="./docs//kept.pdf")  # its own storage, MEDIA_ROOT/private
    return sorted([*values, "private/docs/kept.pdf"])


@pytest.mark.django_db(transaction=True)
def test_a_column_value_not_in_normal_form_keeps_the_file_it_opens(media):
    kept = _odd_references(media)
    assert run_job("fabrika_sweep_files").ok
    assert _files(media) == kept


@pytest.mark.django_db(transaction=True)
def test_a_dry_run_does_not_list_a_file_held_in_another_form(media):
    _odd_references(media)
    out = io.StringIO()
    call_command("fabrika_job", "sweep-files", "--dry-run", stdout=out)
    assert out.getvalue().splitlines()[:-1] == ["default: reports/orphan.csv"]


@pytest.mark.django_db(transaction=True)
def test_a_column_whose_storage_is_no_file_system_storage_but_answers_path_keeps_its_files(media, monkeypatch):
    field = ReportRequest._meta.get_field("result")
    monkeypatch.setattr(field, "storage", InMemoryStorage(location=str(media / "reports")))
    _file(media, "reports/a.csv")
    _file(media, "reports/b.csv")
    _file(media, "reports/orphan.csv")
    ReportRequest.objects.create(result="./a.csv")  # "reports/a.csv" of the swept storage
    ReportRequest.objects.create(result=str(media / "reports" / "b.csv"))
    assert run_job("fabrika_sweep_files").ok
    assert _files(media) == ["reports/a.csv", "reports/b.csv"]


@pytest.mark.django_db(transaction=True)
def test_a_row_committed_before_the_deleting_step_keeps_its_file_in_another_form_too(media, monkeypatch):
    _file(media, "reports/late.csv")
    _file(media, "reports/orphan.csv")
    seen = []

    def hook(point, names):
        seen.append((point, sorted(names)))
        if point == "listed":  # both unreferenced when listed; a request now saves a row holding one
            thread, errors = _in_thread(lambda: ReportRequest.objects.create(result="./reports//late.csv"))
            thread.join(10)
            assert not errors and not thread.is_alive()

    _watch(monkeypatch, hook)
    assert run_job("fabrika_sweep_files").ok
    assert _files(media) == ["reports/late.csv"]
    assert seen == [("listed", ["reports/late.csv", "reports/orphan.csv"]), ("deleting", ["reports/orphan.csv"])]


# --- what the sweep cannot read, and how far back it may look -----------------------------------------------------


@contextmanager
def _unreadable(folder):
    """Make ``folder`` unreadable to the worker: its mode, and (root reads any mode) the refusal the OS then gives."""
    folder.chmod(0)
    real = os.scandir

    def scandir(path):
        if os.path.realpath(path) == os.path.realpath(folder):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    try:
        with pytest.MonkeyPatch.context() as patch:
            if os.geteuid() == 0:
                patch.setattr(os, "scandir", scandir)
            yield
    finally:
        folder.chmod(0o755)


@pytest.mark.django_db(transaction=True)
def test_an_unreadable_folder_is_skipped_and_counted_and_the_rest_is_swept(media):
    _file(media, "locked/old.csv")
    _file(media, "open/orphan.csv")
    out = io.StringIO()
    with _unreadable(media / "locked"):
        call_command("fabrika_job", "sweep-files", stdout=out)
    assert out.getvalue().startswith(
        "Deleted 1 files (kept: 0 referenced, 0 newer than 7 days; 1 folders skipped: the worker may not read them)"
    )
    assert str(media) not in out.getvalue()
    assert _files(media) == ["locked/old.csv"]


@contextmanager
def _read_only(folder):
    """Make ``folder`` one the worker may read but not delete from: its mode, and (as root) the OS's refusal."""
    folder.chmod(0o555)
    real = os.remove

    def remove(path, *args, **kwargs):
        if os.path.dirname(os.path.realpath(path)) == os.path.realpath(folder):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path, *args, **kwargs)

    try:
        with pytest.MonkeyPatch.context() as patch:
            if os.geteuid() == 0:
                patch.setattr(os, "remove", remove)
            yield
    finally:
        folder.chmod(0o755)


@pytest.mark.django_db(transaction=True)
def test_a_file_the_worker_may_not_delete_is_kept_and_counted_and_the_rest_is_swept(media):
    # A folder the worker may read but not write: its old orphans stay, the sweep goes on past them, every day.
    _file(media, "locked/a.csv")
    _file(media, "locked/b.csv")
    _file(media, "open/orphan.csv")
    out = io.StringIO()
    with _read_only(media / "locked"):
        call_command("fabrika_job", "sweep-files", stdout=out)
        assert run_job("fabrika_sweep_files").outcome == "succeeded"
    assert out.getvalue().startswith(
        "Deleted 1 files (kept: 0 referenced, 0 newer than 7 days; 2 files the worker may not delete)"
    )
    assert str(media) not in out.getvalue()
    assert _files(media) == ["locked/a.csv", "locked/b.csv"]


@pytest.mark.django_db
def test_a_grace_period_past_the_bound_is_a_check_error_not_an_overflow(media, settings):
    settings.FABRIKA = dict(settings.FABRIKA, FILE_SWEEP={"storages": ["default"], "older_than_days": 10**6})
    [error] = _check_settings()
    assert (error.id, error.msg) == (
        "fabrika.E036",
        "Setting FABRIKA['FILE_SWEEP'] has older_than_days=1000000, which is not a whole number of days from 1 to "
        "36500.",
    )
    with pytest.raises(CommandError) as refused:
        call_command("fabrika_job", "sweep-files", "--dry-run")
    assert refused.value.returncode == 2 and "from 1 to 36500" in str(refused.value)
