"""Shared rate limits: ``@cron(..., rate_limit="N/s|N/m|N/h")`` and a task queue's
``OPTIONS["rate_limit"]``: one token bucket row per job, taken in the claim's own transaction.

The declaration, the checks and one process's claims run on every backend; real worker processes sharing one
bucket (two workers, lanes, a window that must never hold more than N·(1 + t) claims) need row locks, so they run
on PostgreSQL and MariaDB.
"""

import re
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from fabrika_django import _metrics, kick
from fabrika_django._running import CLAIMS_AT_START, active_run
from fabrika_django._tasks_checks import check_tasks_rate_limits
from fabrika_django.checks._jobs import _check_jobs
from fabrika_django.jobs import CronJob, JobRegistry, cron, parse_rate, registry
from fabrika_django.models import Job, QueuedTask, RateBucket
from fabrika_django.testing import run_job
from testproject.lab import tasks
from testproject.lab.models import Item, Taken

from .jobs_helpers import temporary_job
from .test_metrics import _free_port, _scrape, _value
from .workers import WorkerProcess, wait_until

NOTATION = "give N/s, N/m or N/h (N a whole number of 1 or more, rows per second, minute or hour), e.g. '20/s'"


# -- the declaration and the checks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "parsed"), [("1/s", (1, 1)), ("20/s", (20, 1)), ("600/m", (600, 60)), ("3/h", (3, 3600))]
)
def test_a_rate_is_n_per_second_minute_or_hour(rate, parsed):
    assert parse_rate(rate) == parsed


@pytest.mark.parametrize("rate", ["0/s", "-1/s", "1.5/s", "20/d", "20/S", " 20/s", "20 /s", "20", "/s", 20, True, ""])
def test_cron_refuses_a_bad_rate_at_import_quoting_it_and_naming_the_notation(rate):
    with pytest.raises(ValueError) as refused:
        cron(None, name="_bad_rate", rate_limit=rate)
    assert str(refused.value) == f"rate_limit={rate!r} is not a rate: {NOTATION}."
    assert "_bad_rate" not in registry


def test_a_job_keeps_its_rate_as_declared_and_has_none_by_default():
    with temporary_job(lambda ctx: None, name="_limited", rate_limit="20/s") as limited:
        assert limited.rate_limit == "20/s"
    with temporary_job(lambda ctx: None, name="_unlimited") as unlimited:
        assert unlimited.rate_limit is None


def test_system_check_e005_reports_a_bad_rate_of_a_job_registered_without_cron():
    jobs = JobRegistry()
    jobs.register(CronJob(name="fast", func=lambda ctx: None, schedule=None, rate_limit="10/d"))
    jobs.register(CronJob(name="fine", func=lambda ctx: None, schedule=None, rate_limit="10/s"))
    assert [(error.id, error.msg) for error in _check_jobs(jobs=jobs)] == [
        ("fabrika.E005", f"Cron job 'fast' has rate_limit='10/d' is not a rate: {NOTATION}.")
    ]


def _tasks(**options):
    backend = {"BACKEND": "fabrika_django.tasks.FabrikaBackend", "QUEUES": ["default", "emails"], "OPTIONS": options}
    return override_settings(TASKS={"default": backend})


def test_system_check_e046_reports_each_bad_rate_limit_option_naming_the_notation():
    with _tasks(rate_limit={"emails": "10/d", "default": "5/s", "other": "1/s"}):
        errors = check_tasks_rate_limits()
    assert [(error.id, error.msg) for error in errors] == [
        (
            "fabrika.E046",
            f"TASKS['default']['OPTIONS']['rate_limit']['emails']: rate_limit='10/d' is not a rate: {NOTATION}.",
        ),
        (
            "fabrika.E046",
            "TASKS['default']['OPTIONS']['rate_limit'] names 'other', which is not one of this backend's QUEUES.",
        ),
    ]
    assert "N/s, N/m or N/h" in errors[0].hint
    with _tasks(rate_limit="10/s"):
        assert [error.msg for error in check_tasks_rate_limits()] == [
            "TASKS['default']['OPTIONS']['rate_limit']='10/s' is not a dict of queues to rates."
        ]
    with _tasks(rate_limit={"emails": "10/s"}):
        assert check_tasks_rate_limits() == []
    with _tasks():
        assert check_tasks_rate_limits() == []


# -- one process's claims, on every backend ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_claims_take_at_most_the_tokens_and_the_bucket_starts_full_and_is_written_in_the_claim():
    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(10)])
    claimed = []

    def rated(ctx):
        claimed.append(len(Item.objects.claim(limit=2)))  # the bucket starts full: 3 tokens
        claimed.append(len(Item.objects.claim(limit=5)))  # one left
        # The next token comes in 20 seconds, after the attempt's deadline: nothing, at once.
        claimed.append(len(Item.objects.claim(limit=5)))

    with temporary_job(rated, rate_limit="3/m", timeout=timedelta(seconds=10)):
        assert run_job("rated").ok
    assert claimed == [2, 1, 0]
    assert Item.objects.filter(attempts=1).count() == 3
    tokens, updated = RateBucket.objects.values_list("tokens", "updated").get(job="rated")
    assert 0 <= tokens < 0.1 and updated <= timezone.now()
    assert Job.objects.get(name="rated").pending_since is None  # no run back to back that would find no token
    RateBucket.objects.filter(job="rated").delete()


@pytest.mark.django_db
def test_a_rate_limited_job_runs_in_a_tests_own_transaction_too():
    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(4)])
    claimed = []

    def rated(ctx):
        claimed.extend(len(Item.objects.claim(limit=5)) for _ in range(2))

    with temporary_job(rated, rate_limit="2/h", timeout=timedelta(seconds=10)):
        assert run_job("rated").ok
    assert claimed == [2, 0]


@pytest.mark.django_db(transaction=True)
def test_a_claim_with_no_token_waits_for_the_next_and_counts_the_wait(monkeypatch):
    instruments = _metrics._make_instruments()
    monkeypatch.setattr(_metrics, "_instruments", instruments)
    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(4)])
    times = []

    def rated(ctx):
        while rows := Item.objects.claim(limit=4):
            times.append((time.monotonic(), len(rows)))
            with ctx.transaction():
                for row in rows:
                    row.finish()

    with temporary_job(rated, rate_limit="2/s", timeout=timedelta(seconds=30)):
        assert run_job("rated").ok
    assert [count for _, count in times] == [2, 1, 1]  # full bucket, then one token every half second
    assert times[1][0] - times[0][0] >= 0.4 and times[2][0] - times[1][0] >= 0.4
    waited = instruments.registry.get_sample_value("fabrika_job_rate_limited_seconds_total", {"job": "rated"})
    assert waited >= 0.8
    assert not Item.objects.due_now().exists()
    RateBucket.objects.filter(job="rated").delete()


@pytest.mark.django_db(transaction=True)
def test_an_unlimited_job_claims_as_before_without_a_statement_to_the_bucket():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(3)])
    sent = {}

    def unlimited(ctx):
        for limited in (False, True):
            with CaptureQueriesContext(connection) as queries:
                Item.objects.claim(limit=1)
            sent[limited] = [query["sql"] for query in queries.captured_queries]
            active_run().job = registry.get("limited")  # the same claim, as the limited job's (the probe)

    with temporary_job(unlimited), temporary_job(lambda ctx: None, name="limited", rate_limit="5/s"):
        assert run_job("unlimited").ok
    bucket = RateBucket._meta.db_table
    assert sent[False] and not any(bucket in sql for sql in sent[False])
    assert any(bucket in sql for sql in sent[True])  # the probe: the limited claim's statements name it
    RateBucket.objects.all().delete()


@pytest.mark.django_db(transaction=True)
def test_an_aborted_attempt_stops_waiting_for_a_token():
    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(3)])
    answered = []

    def rated(ctx):
        assert len(Item.objects.claim(limit=5)) == 1
        threading.Timer(0.3, ctx.signal.abort, ("shutdown",)).start()  # the worker stopping, from its own thread
        started = time.monotonic()
        answered.append((Item.objects.claim(limit=5), time.monotonic() - started))  # the next token: a minute

    with temporary_job(rated, rate_limit="1/m", timeout=timedelta(minutes=5)):
        run_job("rated")
    [(rows, waited)] = answered
    assert rows == [] and 0.25 < waited < 5
    assert Item.objects.filter(attempts=0).count() == 2
    RateBucket.objects.filter(job="rated").delete()


@pytest.mark.django_db(transaction=True)
def test_an_empty_queue_answers_at_once_even_without_a_token():
    Item.objects.create(n=1, due=timezone.now() - timedelta(seconds=1))

    def rated(ctx):
        started = time.monotonic()
        while Item.objects.claim(limit=5):
            pass
        assert time.monotonic() - started < 5  # the next token would be a minute away

    with temporary_job(rated, rate_limit="1/m", timeout=timedelta(minutes=5)):
        assert run_job("rated").ok
    RateBucket.objects.filter(job="rated").delete()


@pytest.mark.django_db(transaction=True)
def test_a_rate_limited_task_queue_starts_at_most_its_tokens_and_has_no_claim_in_the_start():
    with _tasks(max_attempts=3, timeout=60, rate_limit={"emails": "2/h"}):
        from fabrika_django._tasks_compat import task_backends
        from fabrika_django.testing import run_tasks

        task_backends["default"]  # noqa: B018  made under the settings: its jobs registered
        assert registry.get("tasks.default.emails").rate_limit == "2/h"
        assert "tasks.default.emails" not in CLAIMS_AT_START  # a start's claim would pass the bucket
        assert "tasks.default.default" in CLAIMS_AT_START
        for n in range(5):
            tasks.mark.using(queue_name="emails").enqueue(f"m{n}")
        assert len(run_tasks(queue="emails")) == 2
        assert QueuedTask.objects.filter(queue_name="emails", status="SUCCESSFUL").count() == 2
    RateBucket.objects.all().delete()


# -- real workers sharing one bucket -----------------------------------------------------------------------------


def _most_in_a_window(instants, seconds=1.0):
    """The most instants any closed window of ``seconds`` holds."""
    instants = sorted(instants)
    most, low = 0, 0
    for high, instant in enumerate(instants):
        while (instant - instants[low]).total_seconds() > seconds:
            low += 1
        most = max(most, high - low + 1)
    return most


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_two_workers_in_four_lanes_drain_100_rows_once_within_10_per_second():
    """Each worker runs two lanes at most, so the job's four need both: one bucket for two processes."""
    port = _free_port()
    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(100)])
    env = {"LAB_RATE": "10/s", "LAB_RATE_LANES": "4", "LAB_CLAIM": "5", "FABRIKA_POLL_INTERVAL": 0.2}
    first = WorkerProcess("--only", "lab_rated", "--concurrency", "2", "--metrics-port", str(port), **env)
    second = WorkerProcess("--only", "lab_rated", "--concurrency", "2", **env)
    workers = [first, second]
    try:
        for worker in workers:
            wait_until(lambda w=worker: "Worker started" in w.output(), workers=[worker], what="a worker's start")
        kick("lab_rated")
        wait_until(lambda: Item.objects.done().count() == 100, timeout=90, workers=workers, what="every row done")
        samples = _scrape(port)
    finally:
        for worker in workers:
            worker.signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(30)
            worker.kill()
        RateBucket.objects.filter(job="lab_rated").delete()
    assert set(Item.objects.values_list("writes", "attempts").distinct()) == {(1, 1)}  # each row claimed once
    dues = list(Taken.objects.values_list("due", flat=True))
    assert len(dues) == 100
    assert _most_in_a_window(dues) <= 20  # N·(1 + t) for N = 10, t = 1
    assert (max(dues) - min(dues)).total_seconds() >= 8.5  # 90 rows past the full bucket, at 10 a second
    assert len(set(Taken.objects.values_list("pid", flat=True))) == 2  # both workers claimed
    assert _value(samples, "fabrika_job_rate_limited_seconds_total", job="lab_rated") > 0


@pytest.mark.django_db(transaction=True)
def test_one_worker_in_four_lanes_keeps_the_rate_on_every_database():
    """SQLite's one process too: four lanes, threads of one worker, share the bucket (its write lock)."""
    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(60)])
    env = {"LAB_RATE": "20/s", "LAB_RATE_LANES": "4", "LAB_CLAIM": "5", "FABRIKA_POLL_INTERVAL": 0.2}
    worker = WorkerProcess("--only", "lab_rated", "--concurrency", "4", **env)
    try:
        wait_until(lambda: "Worker started" in worker.output(), workers=[worker], what="the worker's start")
        kick("lab_rated")
        wait_until(lambda: Item.objects.done().count() == 60, timeout=60, workers=[worker], what="every row done")
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait(30)
        worker.kill()
        RateBucket.objects.filter(job="lab_rated").delete()
    assert set(Item.objects.values_list("writes", "attempts").distinct()) == {(1, 1)}
    dues = list(Taken.objects.values_list("due", flat=True))
    assert len(dues) == 60
    assert _most_in_a_window(dues) <= 40  # N·(1 + t) for N = 20, t = 1
    assert (max(dues) - min(dues)).total_seconds() >= 1.9  # 40 rows past the full bucket, at 20 a second


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_task_queue_at_5_per_second_starts_its_tasks_within_the_rate_on_two_workers():
    env = {"FABRIKA_LAB_EMAILS_RATE": "5/s", "FABRIKA_POLL_INTERVAL": 0.2}
    workers = [WorkerProcess("--only", "tasks.default.emails", "--concurrency", "2", **env) for _ in range(2)]
    try:
        for worker in workers:
            wait_until(lambda w=worker: "Worker started" in w.output(), workers=[worker], what="a worker's start")
        for n in range(30):
            tasks.mark.using(queue_name="emails").enqueue(f"m{n}")
        done = QueuedTask.objects.filter(queue_name="emails", status="SUCCESSFUL")
        wait_until(lambda: done.count() == 30, timeout=90, workers=workers, what="every task done")
    finally:
        for worker in workers:
            worker.signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(30)
            worker.kill()
        RateBucket.objects.filter(job="tasks.default.emails").delete()
    started = list(QueuedTask.objects.filter(queue_name="emails").values_list("started_at", flat=True))
    assert QueuedTask.objects.filter(queue_name="emails", attempts=1).count() == 30  # each started once
    assert _most_in_a_window(started) <= 10  # N·(1 + t) for N = 5, t = 1
    assert (max(started) - min(started)).total_seconds() >= 4  # 25 tasks past the full bucket, at 5 a second


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_worker_told_to_stop_ends_a_claim_waiting_for_a_token():
    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(3)])
    worker = WorkerProcess("--only", "lab_rated", LAB_RATE="1/m", LAB_RATE_LANES="1", LAB_CLAIM="1")
    try:
        wait_until(lambda: "Worker started" in worker.output(), workers=[worker], what="the worker's start")
        kick("lab_rated")
        wait_until(lambda: Taken.objects.count() == 1, workers=[worker], what="the first row")
        # The next claim waits for a token a minute away; SIGTERM aborts the attempt's signal.
        wait_until(lambda: RateBucket.objects.filter(job="lab_rated").exists(), workers=[worker], what="the bucket")
        stopped = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        assert time.monotonic() - stopped < 15
    finally:
        worker.kill()
        RateBucket.objects.filter(job="lab_rated").delete()
    assert Taken.objects.count() == 1 and Item.objects.filter(attempts=0).count() == 2


# -- where the rate is shown -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_jobs_page_shows_the_rate_as_declared_under_the_schedule_and_on_the_jobs_page(admin_client):
    from django.urls import reverse

    Job.objects.create(name="lab_rated")
    Job.objects.create(name="lab_slow")
    html = admin_client.get(reverse("admin:fabrika_django_job_changelist")).content.decode()
    rated = html[html.index(">lab_rated<") :]
    rated = rated[: rated.index("</tr>")]
    assert '<span class="fabrika-quiet">at most <code>10/s</code></span>' in rated
    slow = html[html.index(">lab_slow<") :]
    assert "at most" not in slow[: slow.index("</tr>")]
    page = admin_client.get(reverse("admin:fabrika_django_job_change", args=["lab_rated"])).content.decode()
    assert re.search(r"rate limit:?</label>\s*<div class=\"readonly\">10/s</div>", page, re.I)
