"""Health: each condition created for real is reported with its code, severity and advice; a healthy database
reports nothing. The PostgreSQL conditions (bloat, an old transaction) are made by real sessions."""

import json
import signal
from datetime import timedelta

import psycopg
import pytest
from django.core import checks
from django.db import connection
from django.utils import timezone

from fabrika_django import kick
from fabrika_django.checks._tables import _check_queue_tables_vacuum
from fabrika_django.models import Job, QueueSample
from fabrika_django.ops import _health
from fabrika_django.ops._health import Thresholds, health_report
from fabrika_django.testing import run_job
from testproject.lab.models import Item, Mark
from testproject.reminders.models import Reminder

from . import processes
from .jobs_helpers import temporary_job
from .test_commands import fabrika_job
from .workers import WorkerProcess, wait_until


def _of(check, findings):
    """The findings of one check: on PostgreSQL earlier tests' dead tuples may also be reported, rightly."""
    return [finding for finding in findings if finding.check == check]


def _codes(findings):
    return [(finding.check, finding.job or finding.queue or finding.pid) for finding in findings]


def _vacuum_queue_tables():
    """What a healthy database looks like: earlier tests' rolled-back rows are dead tuples until vacuumed."""
    if connection.vendor != "postgresql":
        return
    from fabrika_django.ops._counts import queue_models

    with connection.cursor() as cursor:
        for model in queue_models():
            cursor.execute(f"VACUUM {connection.ops.quote_name(model._meta.db_table)}")


@pytest.mark.django_db(transaction=True)
def test_a_healthy_database_reports_nothing():
    now = timezone.now()
    Reminder.objects.create(note="later", email="a@example.com", due=now + timedelta(hours=1))
    Reminder.objects.create(note="just due", email="a@example.com", due=now - timedelta(minutes=1))
    Reminder.objects.create(note="done", email="a@example.com", due=None)
    assert run_job("fabrika_sample_queues").ok
    assert run_job("mark_overdue").ok
    _vacuum_queue_tables()
    assert health_report(timezone.now()) == []
    code, out, _ = fabrika_job("status", "--json")
    assert (code, json.loads(out)["health"]) == (0, [])
    assert "Health: nothing to report." in fabrika_job("status")[1]


@pytest.mark.django_db
def test_a_due_row_older_than_an_hour_is_reported_with_its_age():
    now = timezone.now()
    Reminder.objects.create(note="stale", email="a@example.com", due=now - timedelta(hours=2))
    (finding,) = _of("old_due_row", health_report(now))
    assert (finding.check, finding.severity, finding.queue, finding.age_seconds) == (
        "old_due_row",
        "warning",
        "reminders.Reminder",
        7200.0,
    )
    assert "has waited 2 h (1 due now)" in finding.advice and "not keeping up" in finding.advice


@pytest.mark.django_db
def test_dead_rows_that_grew_since_the_last_sample_are_reported():
    assert run_job("fabrika_sample_queues").ok  # the last look: no dead row
    assert QueueSample.objects.filter(queue="reminders.Reminder", dead=0).count() == 1
    Reminder.objects.create(note="gave up", email="a@example.com", due=timezone.now(), attempts=3)
    (finding,) = _of("dead_rows_grew", health_report(timezone.now()))
    assert (finding.check, finding.severity, finding.queue) == ("dead_rows_grew", "warning", "reminders.Reminder")
    assert finding.advice.startswith("1 more rows of reminders.Reminder are dead than at the last look (1 now)")
    assert "'fabrika_job requeue reminders.Reminder --dead'" in finding.advice
    assert run_job("fabrika_sample_queues").ok  # looked again, yet the hour's first look still counts
    assert _codes(_of("dead_rows_grew", health_report(timezone.now()))) == [("dead_rows_grew", "reminders.Reminder")]


def _fails(ctx):
    raise RuntimeError("boom")


@pytest.mark.django_db
def test_a_scheduled_job_that_failed_three_times_and_never_succeeded_is_overdue_as_an_error():
    with temporary_job(_fails, "*/5 * * * *"):
        for _ in range(2):
            assert run_job("_fails").outcome == "handler_failed"
        assert _of("job_overdue", health_report(timezone.now())) == []
        assert run_job("_fails").outcome == "handler_failed"
        (finding,) = _of("job_overdue", health_report(timezone.now()))
    assert (finding.check, finding.severity, finding.job) == ("job_overdue", "error", "_fails")
    assert finding.advice == (
        "Job _fails never succeeded, more than 3 of its periods (5 min): its last 3 runs failed (last outcome "
        "handler_failed); open its attempts in the admin for the failing frame, fix it, and run it with "
        "'fabrika_job run _fails'."
    )


@pytest.mark.django_db
def test_a_job_whose_last_success_is_older_than_three_periods_is_overdue_as_a_warning():
    assert run_job("mark_overdue").ok  # hourly (15 * * * *)
    assert _of("job_overdue", health_report(timezone.now())) == []
    # Three hours and a bit later with no run since: what a stopped worker looks like.
    later = Job.objects.get(name="mark_overdue").last_success + timedelta(hours=3, minutes=1)
    (finding,) = _of("job_overdue", health_report(later))
    assert (finding.check, finding.severity, finding.job, finding.age_seconds) == (
        "job_overdue",
        "warning",
        "mark_overdue",
        3 * 3600 + 60.0,
    )
    assert "without failing: nothing runs it; check that a worker ('fabrika_job worker')" in finding.advice


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_the_lease_of_a_killed_worker_is_a_stuck_lease_until_taken_over():
    worker = WorkerProcess("--only", "lab_patient", FABRIKA_LEASE_SECONDS=2)
    try:
        kick("lab_patient")
        wait_until(lambda: Mark.objects.filter(note="start").exists(), workers=[worker], what="the start")
        worker.signal(signal.SIGKILL)
        worker.wait(30)
        findings = wait_until(
            lambda: _of("stuck_lease", health_report(timezone.now())), timeout=15, what="the stuck lease"
        )
    finally:
        worker.kill()
    (finding,) = findings
    assert (finding.check, finding.severity, finding.job) == ("stuck_lease", "warning", "lab_patient")
    assert f":{worker.pid}:" in finding.advice
    assert "start it now with 'fabrika_job kick lab_patient'" in finding.advice
    code, out, _ = fabrika_job("status", "--json")
    (shown,) = [item for item in json.loads(out)["health"] if item["check"] == "stuck_lease"]
    assert set(shown) == {"check", "severity", "advice", "job", "age_seconds"}
    assert (shown["check"], shown["job"]) == ("stuck_lease", "lab_patient") and shown["age_seconds"] > 0
    assert "warning stuck_lease: The lease of job lab_patient expired" in fabrika_job("status")[1]


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_an_open_transaction_of_another_session_is_reported_by_pid_state_and_age_never_its_query():
    quick = Thresholds(old_transaction=timedelta(milliseconds=300))
    assert [f for f in health_report(timezone.now(), thresholds=quick) if f.check == "old_transaction"] == []
    with psycopg.connect(processes.test_database_url()) as holder:
        holder.execute("SELECT txid_current(), 'secret@example.com'")  # an xid: vacuum's horizon stops here
        pid = holder.info.backend_pid
        findings = wait_until(
            lambda: [f for f in health_report(timezone.now(), thresholds=quick) if f.check == "old_transaction"],
            what="the old transaction",
        )
        (finding,) = findings
        assert (finding.severity, finding.pid) == ("warning", pid) and finding.age_seconds >= 0.3
        assert finding.advice.startswith(f"Session pid {pid} (idle in transaction) has had a transaction open for")
        assert f"SELECT pg_terminate_backend({pid})" in finding.advice
        assert "idle_in_transaction_session_timeout" in finding.advice
        assert "secret" not in json.dumps(finding.as_dict())
        holder.rollback()
    assert [f for f in health_report(timezone.now(), thresholds=quick) if f.check == "old_transaction"] == []


@pytest.fixture
def item_table_without_autovacuum():
    """Keep autovacuum off the lab table while a test counts its dead tuples."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE lab_item SET (autovacuum_enabled = false)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE lab_item RESET (autovacuum_enabled)")


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_dead_tuples_left_by_a_drain_are_queue_bloat_with_the_autovacuum_advice(
    item_table_without_autovacuum, monkeypatch
):
    _vacuum_queue_tables()
    small = Thresholds(bloat_dead_tuples=1000)
    monkeypatch.setattr(_health, "DEFAULT_THRESHOLDS", small)
    assert _check_queue_tables_vacuum(databases=["default"]) == []
    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(600)])
    assert run_job("lab_items").ok  # the drain: each row claimed, written and finished, three row versions
    assert Item.objects.done().count() == 600

    def bloat():
        return [f for f in health_report(timezone.now(), thresholds=small) if f.check == "queue_bloat"]

    (finding,) = wait_until(bloat, what="the statistics of the drain")  # backends report them when idle
    assert (finding.severity, finding.queue) == ("warning", "lab.Item")
    assert finding.advice.startswith("Queue table lab_item holds ")
    assert (
        "ALTER TABLE lab_item SET (autovacuum_vacuum_scale_factor = 0.0, autovacuum_vacuum_threshold = 1000)"
        in finding.advice
    )
    (warning,) = _check_queue_tables_vacuum(databases=["default"])
    assert (warning.id, warning.level, warning.obj) == ("fabrika.W054", checks.WARNING, "lab.Item")
    assert warning.hint == finding.advice
    with connection.cursor() as cursor:
        cursor.execute("VACUUM lab_item")
    wait_until(lambda: not bloat(), what="the vacuum's statistics")


# --- FABRIKA["HEALTH"] ---------------------------------------------------------------------------------------------


def test_the_health_thresholds_default_as_documented():
    assert _health.HEALTH_DEFAULTS == {
        "old_due_row_seconds": 3600,
        "old_transaction_seconds": 300,
        "old_transaction_error_seconds": 3600,
        "bloat_dead_tuples": 10_000,
        "bloat_ratio": 0.1,
        "overdue_periods": 3,
    }
    assert _health.configured_thresholds() == Thresholds()


@pytest.mark.django_db
def test_a_small_old_due_row_threshold_reports_a_row_due_a_few_seconds_ago(settings):
    Reminder.objects.create(due=timezone.now() - timedelta(seconds=5))
    assert _of("old_due_row", health_report(timezone.now())) == []  # an hour by default
    settings.FABRIKA = dict(settings.FABRIKA, HEALTH={"old_due_row_seconds": 2})
    [finding] = _of("old_due_row", health_report(timezone.now()))
    assert (finding.queue, finding.severity) == ("reminders.Reminder", "warning")
    assert 5 <= finding.age_seconds < 60
    code, out, _ = fabrika_job("status", "--json")
    # Only old_due_row is this test's: earlier tests' drains may have left a queue table's dead tuples (queue_bloat).
    assert code == 0 and "old_due_row" in [h["check"] for h in json.loads(out)["health"]]


@pytest.mark.django_db
def test_a_small_overdue_periods_threshold_reports_a_job_after_one_failure(settings):
    def fails(ctx):
        raise RuntimeError("boom")

    with temporary_job(fails, schedule="* * * * *", name="fails_once"):
        assert run_job("fails_once").ok is False
        assert _of("job_overdue", health_report(timezone.now())) == []  # three failures by default
        settings.FABRIKA = dict(settings.FABRIKA, HEALTH={"overdue_periods": 1})
        assert _codes(_of("job_overdue", health_report(timezone.now()))) == [("job_overdue", "fails_once")]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([], "is a list, not a dict"),
        ({"old_due_row": 60}, "has unknown key 'old_due_row'"),
        ({"old_due_row_seconds": 0}, "has old_due_row_seconds=0, which is not a positive number of at most 315360000"),
        ({"old_due_row_seconds": -5}, "has old_due_row_seconds=-5, which is not a positive number"),
        ({"old_due_row_seconds": "60"}, "has old_due_row_seconds='60', which is not a positive number"),
        (
            {"bloat_dead_tuples": True},
            "has bloat_dead_tuples=True, which is not a positive number of at most 1000000000",
        ),
        ({"old_transaction_seconds": 10**12}, "has old_transaction_seconds=1000000000000, which is not a positive"),
        ({"bloat_ratio": 1.5}, "has bloat_ratio=1.5, which is above 1 (a share of the live tuples)"),
        (
            {"old_transaction_seconds": 600, "old_transaction_error_seconds": 300},
            "has old_transaction_error_seconds=300 below old_transaction_seconds=600: an error comes after its warning",
        ),
        (
            {"old_transaction_error_seconds": 120},
            "has old_transaction_error_seconds=120 below old_transaction_seconds=300",
        ),
    ],
)
def test_a_bad_health_setting_is_a_check_error_of_its_own(settings, value, problem):
    from fabrika_django.checks._settings import _check_settings

    settings.FABRIKA = {"HEALTH": value}
    [error] = _check_settings()
    assert error.id == "fabrika.E038"
    assert error.msg.startswith(f"Setting FABRIKA['HEALTH'] {problem}")
    assert error.hint.startswith("Set FABRIKA['HEALTH'] to a dict of the thresholds you change")
    assert _health.configured_thresholds() == Thresholds()  # the pages that show health stay up
    settings.FABRIKA = {"HEALTH": {"bloat_ratio": 1, "old_transaction_error_seconds": 300}}
    assert _check_settings() == []
