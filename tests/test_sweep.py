"""The file sweep tries hard to delete a referenced file, and must fail to.

Referenced files live in other apps (outbox, reports), in a model with a storage of its own (lab.Document,
``MEDIA_ROOT/private``), under names that need quoting, and in rows committed while the sweep runs. Old orphans go,
recent orphans stay, hidden names, links and a storage that is not configured are never touched, and the sweep's
logs count files without naming them.
"""

import io
import logging
import os
import threading
import time

import pytest
from django.core.files.storage import FileSystemStorage
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction

from fabrika_django.checks._settings import _check_settings
from fabrika_django.ops import _sweep
from fabrika_django.testing import run_job
from testproject.lab.models import Document
from testproject.outbox.models import OutboxMail, Person
from testproject.reports.models import ReportRequest

DAY = 24 * 3600
SWEEP = {"storages": ["default"], "older_than_days": 7}
QUOTED = 'outbox/it\'s "quoted" 100% _x_ ; DROP TABLE x; --.pdf'
UNICODE = "outbox/Müller – ünïcode ✓.pdf"


@pytest.fixture
def media(tmp_path, settings):
    """MEDIA_ROOT, a second storage "archive" that the sweep is not told about, and FILE_SWEEP on "default"."""
    root = tmp_path / "media"
    root.mkdir()
    settings.MEDIA_ROOT = str(root)
    settings.STORAGES = {
        **settings.STORAGES,
        "archive": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "archive")},
        },
    }
    settings.FABRIKA = dict(settings.FABRIKA, FILE_SWEEP=dict(SWEEP))
    return root


def _file(root, name, *, days):
    """Write ``root/name`` last modified ``days`` ago."""
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


def _person():
    return Person.objects.get_or_create(email="ada@example.org", defaults={"name": "Ada"})[0]


def _outbox(name):
    return OutboxMail.objects.create(person=_person(), kind="k", subject="s", text="t", attachment=name)


def _storage_with_every_kind_of_file(root, tmp_path):
    """Old referenced files of every kind, old and recent orphans, and what the sweep must never look at."""
    for name in ["outbox/ref.pdf", QUOTED, UNICODE]:
        _file(root, name, days=30)
        _outbox(name)
    _file(root, "reports/report-1.csv", days=30)
    ReportRequest.objects.create(result="reports/report-1.csv")  # another app
    _file(root, "private/docs/contract.pdf", days=30)
    Document.objects.create(file="docs/contract.pdf")  # its own storage: "private/docs/..." to the default one
    _file(root, "outbox/orphan.pdf", days=8)
    _file(root, "deep/a/b/c/orphan's %.txt", days=400)
    _file(root, "outbox/recent-orphan.pdf", days=6)
    _file(root, "outbox/.gitkeep", days=400)
    _file(root, ".hidden/orphan.pdf", days=400)
    secret = _file(tmp_path, "secret.txt", days=400)  # outside the storage
    os.symlink(secret, root / "outbox" / "link-to-secret.txt")
    os.utime(root / "outbox" / "link-to-secret.txt", (0, 0), follow_symlinks=False)
    _file(tmp_path / "archive", "outbox/orphan.pdf", days=400)  # a storage not configured


SURVIVORS = sorted(
    [
        ".hidden/orphan.pdf",
        QUOTED,
        UNICODE,
        "outbox/.gitkeep",
        "outbox/link-to-secret.txt",
        "outbox/recent-orphan.pdf",
        "outbox/ref.pdf",
        "private/docs/contract.pdf",
        "reports/report-1.csv",
    ]
)


@pytest.mark.django_db(transaction=True)
def test_the_sweep_deletes_old_orphans_only(media, tmp_path, caplog):
    _storage_with_every_kind_of_file(media, tmp_path)
    with caplog.at_level(logging.DEBUG, logger="fabrika_django"):
        result = run_job("fabrika_sweep_files")
    assert result.ok
    assert _files(media) == SURVIVORS
    assert _files(tmp_path / "archive") == ["outbox/orphan.pdf"]
    assert (tmp_path / "secret.txt").exists()
    # The log counts files and never names one.
    [line] = [r.getMessage().split(" ", 3)[3] for r in caplog.records if "Swept files" in r.getMessage()]
    assert line == (
        "Swept files deleted=2 referenced=5 recent=1 kept_on_recheck=0 skipped=3 busy_batches=0 unreadable=0 "
        "undeletable=0"
    )
    for record in caplog.records:
        assert "orphan" not in record.getMessage() and "outbox" not in record.getMessage()


@pytest.mark.django_db(transaction=True)
def test_a_second_configured_storage_is_swept_too(media, tmp_path, settings):
    settings.FABRIKA = dict(settings.FABRIKA, FILE_SWEEP={"storages": ["default", "archive"], "older_than_days": 7})
    _file(media, "outbox/orphan.pdf", days=30)
    _file(tmp_path / "archive", "outbox/orphan.pdf", days=30)
    _file(tmp_path / "archive", "outbox/ref.pdf", days=30)
    _outbox("outbox/ref.pdf")  # the name is held: kept in every storage, whatever the field's own storage
    assert run_job("fabrika_sweep_files").ok
    assert (_files(media), _files(tmp_path / "archive")) == ([], ["outbox/ref.pdf"])


@pytest.mark.django_db(transaction=True)
def test_a_batch_boundary_keeps_every_reference(media, monkeypatch):
    monkeypatch.setattr(_sweep, "BATCH", 7)
    for number in range(40):
        _file(media, f"many/{number:02d}.bin", days=30)
        if number % 3 == 0:
            _outbox(f"many/{number:02d}.bin")
    assert run_job("fabrika_sweep_files").ok
    assert _files(media) == [f"many/{number:02d}.bin" for number in range(0, 40, 3)]


@pytest.mark.django_db(transaction=True)
def test_dry_run_lists_what_it_would_delete_and_deletes_nothing(media, tmp_path):
    _storage_with_every_kind_of_file(media, tmp_path)
    before = _files(media)
    out = io.StringIO()
    call_command("fabrika_job", "sweep-files", "--dry-run", stdout=out)
    *listed, summary = out.getvalue().splitlines()
    assert sorted(listed) == ["default: deep/a/b/c/orphan's %.txt", "default: outbox/orphan.pdf"]
    assert summary == "Would delete 2 files (kept: 5 referenced, 1 newer than 7 days); deleted nothing."
    assert _files(media) == before


@pytest.mark.django_db(transaction=True)
def test_the_command_runs_the_job_and_counts_what_it_deleted(media, tmp_path):
    _storage_with_every_kind_of_file(media, tmp_path)
    out = io.StringIO()
    call_command("fabrika_job", "sweep-files", stdout=out)
    assert out.getvalue().startswith("Deleted 2 files (kept: 5 referenced, 1 newer than 7 days) (run ")
    assert _files(media) == SURVIVORS


@pytest.mark.django_db
def test_without_file_sweep_the_job_deletes_nothing_and_the_command_says_how_to_turn_it_on(media, settings):
    settings.FABRIKA = dict(settings.FABRIKA, FILE_SWEEP=None)
    _file(media, "outbox/orphan.pdf", days=400)
    assert run_job("fabrika_sweep_files").ok
    assert _files(media) == ["outbox/orphan.pdf"]
    with pytest.raises(CommandError) as refused:
        call_command("fabrika_job", "sweep-files")
    assert refused.value.returncode == 2
    assert str(refused.value) == (
        "Setting FABRIKA['FILE_SWEEP'] is not set. Turn the sweep on with "
        "FABRIKA['FILE_SWEEP'] = {'storages': ['default'], 'older_than_days': 7}."
    )


# --- rows committed while the sweep runs ------------------------------------------------------------------------


def _in_thread(target):
    errors = []

    def run():
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - handed to the test, which raises it
            errors.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def _watch(monkeypatch, hook):
    """Call ``hook(point, names)`` at the sweep's seams, wrapped from outside: "listed" (a batch found unreferenced,
    before its deleting step), "busy" (a writer holds a referencing table, PostgreSQL) and "deleting" (each name as
    the storage deletes it, inside the deleting step: re-checked, writers still stopped)."""
    deleting_step, stop_writers, delete = _sweep._delete, _sweep._stop_writers, FileSystemStorage.delete

    def listed(storage, orphans, *args):
        hook("listed", list(orphans))
        return deleting_step(storage, orphans, *args)

    def busy(alias, references):
        try:
            stop_writers(alias, references)
        except _sweep._Busy:
            hook("busy", [])
            raise

    def deleting(storage, name):
        hook("deleting", [name])
        return delete(storage, name)

    monkeypatch.setattr(_sweep, "_delete", listed)
    monkeypatch.setattr(_sweep, "_stop_writers", busy)
    monkeypatch.setattr(FileSystemStorage, "delete", deleting)


@pytest.mark.django_db(transaction=True)
def test_the_seams_the_sweep_tests_watch_are_reached(media, monkeypatch):
    # A watch that is never called cannot fail a test: each seam is met where the tests expect it.
    _file(media, "outbox/orphan.pdf", days=30)
    seen = []
    _watch(monkeypatch, lambda point, names: seen.append((point, names)))
    report = _sweep.sweep(SWEEP)
    assert report.deleted == 1
    assert seen == [("listed", ["outbox/orphan.pdf"]), ("deleting", ["outbox/orphan.pdf"])]


@pytest.mark.django_db(transaction=True)
def test_a_row_committed_between_the_listing_and_the_deleting_step_keeps_its_file(media, monkeypatch):
    _file(media, "outbox/late.pdf", days=30)
    _file(media, "outbox/orphan.pdf", days=30)
    seen = []

    def hook(point, names):
        seen.append((point, sorted(names)))
        if point == "listed":  # the listing found both unreferenced; a request now saves a row holding one
            thread, errors = _in_thread(lambda: _outbox("outbox/late.pdf"))
            thread.join(10)
            assert not errors and not thread.is_alive()

    _watch(monkeypatch, hook)
    assert run_job("fabrika_sweep_files").ok
    assert _files(media) == ["outbox/late.pdf"]
    assert seen == [("listed", ["outbox/late.pdf", "outbox/orphan.pdf"]), ("deleting", ["outbox/orphan.pdf"])]


@pytest.mark.django_db(transaction=True)
def test_a_row_being_written_during_the_deleting_step_keeps_its_file(media, monkeypatch):
    """A writer's transaction holds a row with the file, uncommitted, when the deleting step begins: the sweep
    waits for it and sees the row once committed. Without its lock the re-check would not see the uncommitted
    row and would delete the file. PostgreSQL: the NOWAIT lock fails ("busy"), the writer commits, the next try
    sees the row. SQLite: the step waits for the database's write lock, which the writer gives up as it commits
    (after at most 2 s here)."""
    _file(media, "outbox/in-flight.pdf", days=30)
    _file(media, "outbox/orphan.pdf", days=30)
    inserted, may_commit = threading.Event(), threading.Event()
    points, state = [], {}

    def writer():
        with transaction.atomic():
            _outbox("outbox/in-flight.pdf")
            inserted.set()
            may_commit.wait(2)  # a sweep that does not wait for writers goes on without us meanwhile

    def hook(point, names):
        points.append(point)
        if point == "listed":
            state["thread"], state["errors"] = _in_thread(writer)
            assert inserted.wait(10)
        elif point == "busy" and not may_commit.is_set():
            may_commit.set()
            state["thread"].join(10)

    _watch(monkeypatch, hook)
    assert run_job("fabrika_sweep_files").ok
    may_commit.set()
    state["thread"].join(10)
    assert state["errors"] == []
    assert _files(media) == ["outbox/in-flight.pdf"]
    assert OutboxMail.objects.filter(attachment="outbox/in-flight.pdf").exists()
    if connection.vendor == "postgresql":
        assert points[:2] == ["listed", "busy"] and points[-1] == "deleting"
    else:
        assert points == ["listed", "deleting"]


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_writer_that_starts_during_the_deleting_step_waits_for_it(media, monkeypatch):
    _file(media, "outbox/orphan.pdf", days=30)
    backend, done = [], threading.Event()
    state = {"waited": False}

    def writer():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend.append(cursor.fetchone()[0])
        _outbox("outbox/other.pdf")
        done.set()

    def hook(point, names):
        if point != "deleting":
            return
        state["thread"], state["errors"] = _in_thread(writer)
        # Wait until the writer's INSERT is queued behind the sweep's lock (pg_locks is live, not a snapshot).
        deadline = time.monotonic() + 10
        with connection.cursor() as cursor:
            while time.monotonic() < deadline and not state["waited"]:
                cursor.execute(
                    "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [backend[0] if backend else 0]
                )
                state["waited"] = cursor.fetchone()[0] > 0
        assert not done.is_set()

    _watch(monkeypatch, hook)
    assert run_job("fabrika_sweep_files").ok
    state["thread"].join(10)
    assert state["waited"] and done.is_set() and state["errors"] == []
    assert _files(media) == []


# --- the setting --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("default", "is a str, not a dict"),
        ({"storages": ["default"]}, "has older_than_days=None, which is not a whole number of days from 1 to 36500"),
        ({"storages": ["default"], "older_than_days": 10**6}, "has older_than_days=1000000, which is not a whole"),
        ({"storages": ["default"], "older_than_days": 0}, "has older_than_days=0, which is not"),
        ({"storages": ["default"], "older_than_days": True}, "has older_than_days=True, which is not"),
        ({"storages": [], "older_than_days": 7}, "has no list of storage aliases under 'storages'"),
        ({"storages": "default", "older_than_days": 7}, "has no list of storage aliases under 'storages'"),
        ({"storages": ["nope"], "older_than_days": 7}, "names storage 'nope', which is not in STORAGES"),
        ({"storages": ["staticfiles"], "older_than_days": 7}, "names 'staticfiles'"),
        ({"storages": ["default"], "older_than_days": 7, "batch": 5}, "has unknown key 'batch'"),
    ],
)
def test_a_bad_file_sweep_setting_is_a_system_check_error(settings, value, problem):
    settings.FABRIKA = {"FILE_SWEEP": value}
    [error] = _check_settings()
    assert error.id == "fabrika.E036"
    assert error.msg.startswith(f"Setting FABRIKA['FILE_SWEEP'] {problem}")
    settings.FABRIKA = {"FILE_SWEEP": {"storages": ["default"], "older_than_days": 7}}
    assert _check_settings() == []


@pytest.mark.django_db(transaction=True)
def test_a_storage_without_files_on_this_machine_is_walked_through_its_own_listdir(media, settings):
    from datetime import UTC, datetime, timedelta

    from django.core.files.base import ContentFile
    from django.core.files.storage import storages

    settings.STORAGES = {**settings.STORAGES, "memory": {"BACKEND": "django.core.files.storage.InMemoryStorage"}}
    memory = storages["memory"]
    for name in ["outbox/ref.pdf", "outbox/orphan.pdf", "a/b/orphan.txt", "a/.hidden"]:
        memory.save(name, ContentFile(b"x"))
    _outbox("outbox/ref.pdf")
    later = datetime.now(UTC) + timedelta(days=8)  # every file is past its grace period by then
    report = _sweep.sweep({"storages": ["memory"], "older_than_days": 7}, now=later)
    assert (report.deleted, report.referenced, report.skipped) == (2, 1, 1)
    assert memory.exists("outbox/ref.pdf") and memory.exists("a/.hidden")
    assert not memory.exists("outbox/orphan.pdf") and not memory.exists("a/b/orphan.txt")


@pytest.mark.django_db(transaction=True)
def test_a_file_written_again_between_the_listing_and_the_deleting_step_stays(media, monkeypatch):
    _file(media, "outbox/reused.pdf", days=30)
    _file(media, "outbox/orphan.pdf", days=30)

    def hook(point, names):
        if point == "listed":  # a storage that overwrites names writes a new upload under the old name
            _file(media, "outbox/reused.pdf", days=0)

    _watch(monkeypatch, hook)
    assert run_job("fabrika_sweep_files").ok
    assert _files(media) == ["outbox/reused.pdf"]


@pytest.mark.django_db
def test_a_bad_file_sweep_fails_the_job_and_deletes_nothing(media, settings):
    settings.FABRIKA = dict(settings.FABRIKA, FILE_SWEEP={"storages": ["default"]})
    _file(media, "outbox/orphan.pdf", days=400)
    assert run_job("fabrika_sweep_files").outcome == "handler_failed"
    assert _files(media) == ["outbox/orphan.pdf"]
