"""Metrics: the database gauges of ``fabrika_django.metrics.view`` and a real worker's ``--metrics-port``,
scraped and parsed with ``prometheus_client.parser``, carry the values the test caused."""

import signal
import socket
import urllib.request
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fabrika_django import _metrics, kick, runner
from fabrika_django._runs import reads as run_reads
from fabrika_django.models import Job, KickRequest
from fabrika_django.testing import run_job
from testproject.lab.models import Item, Mark
from testproject.reminders.models import Reminder

from .jobs_helpers import temporary_job
from .test_commands import fabrika_job
from .workers import WorkerProcess, wait_until

URL = "/metrics/fabrika/"
TOKEN = "t" * 40


def _samples(text):
    """Every sample as {(name, frozenset(labels.items())): value}."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples, name, **labels):
    return samples[name, frozenset(labels.items())]


def _fails(ctx):
    raise RuntimeError("boom")


@pytest.mark.django_db
def test_the_view_serves_queue_and_job_gauges_computed_at_scrape_time(admin_client):
    now = timezone.now()
    Reminder.objects.create(note="later", email="a@example.com", due=now + timedelta(hours=1))
    Reminder.objects.create(note="due", email="a@example.com", due=now - timedelta(minutes=10))
    Reminder.objects.create(note="dead", email="a@example.com", due=now, attempts=3)
    Reminder.objects.create(note="done", email="a@example.com", due=None)
    assert run_job("mark_overdue").ok
    with temporary_job(_fails):
        run_job("_fails")
        run_job("_fails")
        response = admin_client.get(URL)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain; version=")
    samples = _samples(response.content.decode())
    rows = {
        state: _value(samples, "fabrika_queue_rows", queue="reminders.Reminder", state=state)
        for state in ("waiting", "due_now", "dead", "done")
    }
    assert rows == {"waiting": 2, "due_now": 1, "dead": 1, "done": 1}
    assert 600 <= _value(samples, "fabrika_queue_oldest_due_age_seconds", queue="reminders.Reminder") < 660
    assert _value(samples, "fabrika_job_failures_in_row", job="_fails") == 2
    assert _value(samples, "fabrika_job_pending", job="_fails") == 0
    assert _value(samples, "fabrika_job_active_lanes", job="_fails") == 0
    assert 0 <= _value(samples, "fabrika_job_last_success_age_seconds", job="mark_overdue") < 60
    assert ("fabrika_job_last_success_age_seconds", frozenset({("job", "_fails")})) not in samples


@pytest.mark.django_db
def test_the_view_answers_a_bearer_of_the_token_and_refuses_everyone_else(client, django_user_model):
    with override_settings(FABRIKA={"METRICS_TOKEN": TOKEN}):
        assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
        refused = client.get(URL, HTTP_AUTHORIZATION="Bearer wrong")
        assert (refused.status_code, refused["WWW-Authenticate"]) == (401, 'Bearer realm="fabrika metrics"')
        assert client.get(URL).status_code == 401
        client.force_login(django_user_model.objects.create_user("someone"))
        assert client.get(URL).status_code == 403
    assert client.get(URL, HTTP_AUTHORIZATION="Bearer ").status_code == 403  # no token set: staff only


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:  # noqa: S310
        return _samples(response.read().decode())


@pytest.mark.django_db(transaction=True)
def test_a_kick_whose_run_takes_its_kick_row_itself_is_timed_from_that_row(monkeypatch):
    """A worker that hears a kick's NOTIFY starts the run, whose start takes the kick row (on PostgreSQL in its own
    statement): the pending flag is never set, so the kick's wait is read from the row."""
    instruments = _metrics._make_instruments()
    monkeypatch.setattr(_metrics, "_instruments", instruments)
    runner.sync_jobs(["lab_stamp"])
    kick("lab_stamp")
    assert KickRequest.objects.filter(job="lab_stamp").exists()
    assert Job.objects.get(name="lab_stamp").pending_since is None
    holder = runner.default_holder()
    with _metrics.run_in_progress("lab_stamp", run_reads.KickWait("lab_stamp", holder)):
        assert runner.run("lab_stamp", "kick", holder=holder).ok
    assert not KickRequest.objects.filter(job="lab_stamp").exists()  # the run's start took it
    count = instruments.registry.get_sample_value("fabrika_kick_start_latency_seconds_count", {"job": "lab_stamp"})
    assert count == 1


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_worker_serves_its_own_metrics_while_it_runs_jobs():
    port = _free_port()
    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(120)])
    worker = WorkerProcess("--only", "lab_items,lab_patient", "--metrics-port", str(port))
    try:
        wait_until(lambda: "Worker started" in worker.output(), workers=[worker], what="the worker")
        kick("lab_items")
        wait_until(lambda: Item.objects.done().count() == 120, workers=[worker], what="every item done")
        kick("lab_patient")  # runs until the worker stops
        wait_until(lambda: Mark.objects.filter(note="start").exists(), workers=[worker], what="the patient start")

        def scraped_while_running():
            samples = _scrape(port)
            return samples if _value(samples, "fabrika_runs_in_progress", job="lab_patient") == 1 else None

        samples = wait_until(scraped_while_running, workers=[worker], what="a scrape during the run")
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait(30)
        worker.kill()
    assert _value(samples, "fabrika_attempts_total", job="lab_items", outcome="succeeded") == 1
    assert _value(samples, "fabrika_attempt_duration_seconds_count", job="lab_items") == 1
    assert _value(samples, "fabrika_runs_in_progress", job="lab_items") == 0
    # Three full claims of 50, then 20, then an empty one that ends the loop.
    assert _value(samples, "fabrika_claim_rows_count", job="lab_items") == 4
    assert _value(samples, "fabrika_claim_rows_sum", job="lab_items") == 120
    assert _value(samples, "fabrika_claim_rows_bucket", job="lab_items", le="0.0") == 1
    assert _value(samples, "fabrika_kick_start_latency_seconds_count", job="lab_items") == 1
    assert 0 < _value(samples, "fabrika_kick_start_latency_seconds_sum", job="lab_items") < 10


def test_a_metrics_port_that_is_not_a_port_is_a_usage_error():
    assert fabrika_job("worker", "--metrics-port", "http")[0:3:2] == (
        2,
        "Error: argument --metrics-port: give a TCP port from 1 to 65535, not 'http'",
    )


def test_a_short_metrics_token_is_refused_by_the_checks_without_quoting_it():
    from django.core import checks

    from fabrika_django.checks._settings import _check_settings

    with override_settings(FABRIKA={"METRICS_TOKEN": "hunter2"}):
        assert _check_settings() == [
            checks.Error(
                "Setting FABRIKA['METRICS_TOKEN'] is a value, which is not valid.",
                hint="Give None, or a random string of 32 characters or more (e.g. from secrets.token_urlsafe()).",
                id="fabrika.E032",
            )
        ]
    with override_settings(FABRIKA={"METRICS_TOKEN": TOKEN}):
        assert _check_settings() == []
