"""A run: attempts, retries, outcomes, the history, and the refusals of the write guard."""

import logging
import random
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from fabrika_django import runner
from fabrika_django._runs import start as run_start
from fabrika_django.kicks import request_run
from fabrika_django.models import Attempt, Job, KickRequest, Lease
from fabrika_django.testing import run_job
from testproject.lab.models import Item, Mark

from .jobs_helpers import temporary_job
from .workers import wait_until

pytestmark = pytest.mark.django_db


def outcomes(name):
    return list(Attempt.objects.filter(job=name).order_by("number").values_list("number", "outcome"))


def test_a_run_that_returns_succeeds_and_is_recorded():
    def quiet(ctx):
        with ctx.transaction():
            Mark.objects.create(job=ctx.job.name, note="done", attempt=ctx.attempt)

    with temporary_job(quiet):
        result = run_job("quiet")
    assert (result.ok, result.outcome, result.failure, result.attempts) == (True, "succeeded", None, 1)
    assert outcomes("quiet") == [(1, "succeeded")]
    assert list(Mark.objects.values_list("note", "attempt")) == [("done", 1)]
    job = Job.objects.get(name="quiet")
    assert (job.last_outcome, job.failures_in_row, job.last_success is not None) == ("succeeded", 0, True)
    assert Lease.objects.get(job="quiet").token is None  # released


def test_failing_twice_then_succeeding_with_two_retries_succeeds_after_three_attempts():
    def flaky(ctx):
        if ctx.attempt < 3:
            raise RuntimeError("not yet")

    with temporary_job(flaky, retries=2):
        result = run_job("flaky")
    assert (result.outcome, result.attempts) == ("succeeded", 3)
    assert outcomes("flaky") == [(1, "handler_failed"), (2, "handler_failed"), (3, "succeeded")]


def test_failing_twice_with_one_retry_fails_and_keeps_both_attempts():
    def flaky(ctx):
        if ctx.attempt < 3:
            raise RuntimeError("not yet")

    with temporary_job(flaky, retries=1):
        result = run_job("flaky")
    assert (result.ok, result.failure, result.attempts) == (False, "handler_failed", 2)
    assert outcomes("flaky") == [(1, "handler_failed"), (2, "handler_failed")]
    assert Job.objects.get(name="flaky").failures_in_row == 1
    assert Attempt.objects.filter(job="flaky").first().error_class == "builtins.RuntimeError"


def test_a_write_outside_ctx_transaction_is_refused_and_writes_nothing():
    def careless(ctx):
        Mark.objects.create(job="careless", note="outside")

    with temporary_job(careless):
        result = run_job("careless")
    assert result.failure == "write_outside_transaction"
    assert outcomes("careless") == [(1, "write_outside_transaction")]
    assert not Mark.objects.exists()


def test_reads_outside_ctx_transaction_are_allowed():
    Mark.objects.create(job="x", note="seed")

    def reader(ctx):
        assert Mark.objects.count() == 1
        with ctx.transaction():
            Mark.objects.create(job="reader", note="read")

    with temporary_job(reader):
        assert run_job("reader").ok


@pytest.mark.parametrize("opened_by", ["ctx.transaction", "transaction.atomic"])
@pytest.mark.parametrize(
    "threaded", [False, pytest.param(True, marks=pytest.mark.django_db(transaction=True))], ids=["inline", "thread"]
)
def test_claim_inside_a_transaction_the_handler_opened_is_refused_with_its_code(opened_by, threaded):
    """Its locks would last as long as the handler's block: claim is a short transaction of its own."""
    Item.objects.create()

    def greedy(ctx):
        with ctx.transaction() if opened_by == "ctx.transaction" else transaction.atomic():
            Item.objects.claim(limit=1)

    with temporary_job(greedy):
        result = run_job("greedy")
    assert result.failure == "claim_inside_transaction"
    assert outcomes("greedy") == [(1, "claim_inside_transaction")]
    assert Item.objects.get().attempts == 0


def test_claim_in_a_job_uses_the_schedule_period_for_the_backoff(fabrika_clock):
    Item.objects.create(due=fabrika_clock.now - timedelta(seconds=1))

    def worker(ctx):
        (row,) = Item.objects.claim(limit=5)
        with ctx.transaction():
            row.finish(n=7)

    with temporary_job(worker, schedule="*/10 * * * *"):
        assert run_job("worker").ok
    item = Item.objects.get()
    assert (item.state, item.n, item.attempts, item.version) == ("done", 7, 1, 2)


def test_a_kick_of_an_undeclared_job_is_refused_with_its_code():
    def kicker(ctx):
        ctx.kick("somebody_else")

    with temporary_job(kicker):
        result = run_job("kicker")
    assert result.failure == "undeclared_kick"
    assert outcomes("kicker") == [(1, "undeclared_kick")]


def test_a_declared_kick_goes_out_when_the_transaction_commits(fabrika_kicks):
    def target(ctx):
        pass

    def kicker(ctx):
        with ctx.transaction():
            ctx.kick("target")
            assert fabrika_kicks == []

    with temporary_job(target), temporary_job(kicker, kicks=["target"]):
        assert run_job("kicker").ok
    assert fabrika_kicks == ["target"]
    assert KickRequest.objects.filter(job="target").exists()


def test_a_kick_in_a_rolled_back_transaction_goes_nowhere(fabrika_kicks):
    def target(ctx):
        pass

    def kicker(ctx):
        with pytest.raises(ZeroDivisionError), ctx.transaction():
            ctx.kick("target")
            raise ZeroDivisionError

    with temporary_job(target), temporary_job(kicker, kicks=["target"]):
        assert run_job("kicker").ok
    assert fabrika_kicks == []


@pytest.mark.django_db(transaction=True)
def test_a_keyboard_interrupt_a_handler_raises_on_its_thread_is_its_failed_attempt(caplog):
    # Outside a transaction run_job runs the handler on a handler thread, as the worker does; Ctrl-C's
    # KeyboardInterrupt only ever reaches the main thread, so this one is the handler's own.
    def interrupted(ctx):
        raise KeyboardInterrupt("someone@example.com")

    with temporary_job(interrupted, retries=0):
        result = run_job("interrupted")
    assert result.failure == "handler_failed"
    (attempt,) = Attempt.objects.filter(job="interrupted")
    assert attempt.error_class == "builtins.KeyboardInterrupt"
    assert "someone@example.com" not in caplog.text


def test_no_exception_message_reaches_the_history_or_the_log(caplog):
    def leaky(ctx):
        raise ValueError("someone@example.com")

    caplog.set_level(logging.DEBUG)
    with temporary_job(leaky):
        result = run_job("leaky")
    assert result.failure == "handler_failed"
    (attempt,) = Attempt.objects.filter(job="leaky")
    stored = " ".join(str(value) for value in Attempt.objects.filter(job="leaky").values().first().values())
    assert "someone@example.com" not in stored
    assert attempt.error_class == "builtins.ValueError"
    assert "test_runner.py" in attempt.frames and "in leaky" in attempt.frames
    assert "someone@example.com" not in caplog.text
    assert "outcome=handler_failed" in caplog.text


@override_settings(FABRIKA={"STORE_ERROR_MESSAGES": True})
def test_the_exception_message_is_kept_when_the_setting_says_so():
    def leaky(ctx):
        raise ValueError("kept on purpose")

    with temporary_job(leaky):
        run_job("leaky")
    assert Attempt.objects.get(job="leaky").message == "kept on purpose"


def test_ctx_carries_the_run_and_a_log_adapter_with_ids(caplog):
    seen = {}

    def curious(ctx):
        seen.update(job=ctx.job.name, attempt=ctx.attempt, trigger=ctx.trigger, run=ctx.run_id)
        ctx.log.info("row=%s code=%s", 42, "sent")

    caplog.set_level(logging.INFO)
    with temporary_job(curious):
        result = run_job("curious")
    assert seen == {"job": "curious", "attempt": 1, "trigger": "manual", "run": result.run_id}
    assert f"job=curious run={result.run_id} attempt=1 row=42 code=sent" in caplog.text


def test_run_job_refuses_an_unknown_mail_mode():
    with pytest.raises(ValueError, match="use 'locmem' or 'none'"):
        run_job("anything", mail="smtp")


@pytest.mark.django_db(transaction=True)
def test_a_handler_that_sleeps_past_its_timeout_cannot_write_and_the_retry_runs():
    woke = threading.Event()

    def sleepy(ctx):
        if ctx.attempt == 1:
            woke.wait(5)  # ignores ctx.signal on purpose
            with ctx.transaction():
                Mark.objects.create(job="sleepy", note="late")
        else:
            with ctx.transaction():
                Mark.objects.create(job="sleepy", note="retry")

    with temporary_job(sleepy, retries=1, timeout=timedelta(seconds=1)):
        result = runner.run("sleepy", pause=lambda n: 0)
        returned_while_the_first_attempt_slept = not woke.is_set()
        woke.set()
    assert returned_while_the_first_attempt_slept
    assert (result.outcome, result.attempts) == ("succeeded", 2)
    assert outcomes("sleepy") == [(1, "timed_out"), (2, "succeeded")]
    assert list(Mark.objects.values_list("note", flat=True)) == ["retry"]


@pytest.mark.django_db(transaction=True)
def test_a_late_commit_is_refused_after_the_deadline_even_inside_an_open_transaction():
    late = threading.Event()
    refused = []

    def slow_writer(ctx):
        try:
            with ctx.transaction():
                Mark.objects.create(job="slow_writer", note="inside")
                late.wait(3)  # past the one-second deadline, inside the transaction
        except Exception as exc:
            refused.append(type(exc).__name__)
            raise

    with temporary_job(slow_writer, timeout=timedelta(seconds=1)):
        result = runner.run("slow_writer")
        late.set()
    assert result.failure == "timed_out"
    assert not Mark.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_second_run_while_one_is_active_coalesces_and_the_job_runs_once_more():
    started = threading.Event()
    release = threading.Event()
    runs = []

    def busy(ctx):
        runs.append(ctx.trigger)
        started.set()
        release.wait(10)

    with temporary_job(busy):
        results = []
        first = threading.Thread(target=lambda: results.append(runner.run("busy")) or connection.close())
        first.start()
        assert started.wait(10)
        second = runner.run("busy", trigger="kick")
        assert second.coalesced and second.ok
        assert Job.objects.get(name="busy").pending_since is not None
        release.set()
        first.join(20)
    assert runs == ["manual", "kick"]
    assert results[0].runs == 2
    assert Job.objects.get(name="busy").pending_since is None
    assert Lease.objects.get(job="busy").token is None


@pytest.mark.django_db(transaction=True)
def test_a_retry_pause_longer_than_the_lease_keeps_the_lease_and_the_retry_runs():
    paused = threading.Event()

    def failing(ctx):
        raise RuntimeError("always")

    def long_pause(failed_attempt):
        paused.set()
        return 2.5  # the lease is 1 s: the job's timeout

    with temporary_job(failing, retries=1, timeout=timedelta(seconds=1)):
        results = []
        first = threading.Thread(
            target=lambda: results.append(runner.run("failing", pause=long_pause)) or connection.close()
        )
        first.start()
        assert paused.wait(10)
        first_expiry = Lease.objects.get(job="failing").expires
        wait_until(lambda: timezone.now() > first_expiry + timedelta(seconds=0.3), what="the first lease's expiry")
        second = runner.run("failing", trigger="kick", mark_pending=False)
        first.join(20)
    assert second.coalesced  # the paused run still held its lease
    assert (results[0].outcome, results[0].attempts) == ("handler_failed", 2)
    assert outcomes("failing") == [(1, "handler_failed"), (2, "handler_failed")]


def _start(job, holder, *, mark_pending=True):
    start = run_start.Start(
        job=job.name, trigger="kick", holder=holder, seconds=30, max_attempt=1 + job.retries, mark_pending=mark_pending
    )
    return run_start.start_or_join(start)


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql
def test_on_postgresql_a_run_on_a_free_lease_starts_in_one_statement_and_a_held_lease_takes_the_locked_path():
    from django.test.utils import CaptureQueriesContext

    from fabrika_django.jobs import registry

    job = registry.get("lab_slow")
    runner.sync_jobs([job.name])
    with CaptureQueriesContext(connection) as started:
        lease = _start(job, "holder-a")
    assert lease is not None and lease.attempt_id is not None
    assert len(started.captured_queries) == 1
    attempt = Attempt.objects.get(pk=lease.attempt_id)
    assert (attempt.run_id, attempt.number, attempt.outcome, attempt.trigger) == (lease.run_id, 1, "running", "kick")
    assert Lease.objects.get(job=job.name).token == lease.token
    assert Job.objects.get(name=job.name).last_run_id == lease.run_id

    # Held: the one statement takes nothing, and the locked path marks the job pending.
    assert _start(job, "holder-b") is None
    assert Job.objects.get(name=job.name).pending_since is not None
    assert Lease.objects.get(job=job.name).token == lease.token


@pytest.mark.django_db(transaction=True)
def test_a_worker_serving_a_kick_that_a_run_already_served_starts_nothing():
    from fabrika_django.jobs import registry

    job = registry.get("lab_slow")
    runner.sync_jobs([job.name])
    # Two workers heard one kick; the first one's run started (clearing the flag) and ended before the second
    # one got to it: the second finds the lease free and the flag down, and must not run the job again.
    assert _start(job, "second-worker", mark_pending=False) is None
    assert Lease.objects.get(job=job.name).token is None and not Attempt.objects.exists()

    Job.objects.filter(name=job.name).update(pending_since=timezone.now())
    lease = _start(job, "second-worker", mark_pending=False)
    assert lease is not None and Job.objects.get(name=job.name).pending_since is None


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_runs_and_kicks_of_one_job_from_many_threads_never_deadlock():
    """The one-statement start, the locked start and the end all take the Job row before the Lease row.

    Eight threads start runs (serving a kick or not), end them and kick, for a few seconds: taken in the
    other order, a start and an end meet in a deadlock within a second, and PostgreSQL fails one of them.
    """
    runner.sync_jobs(["lab_stamp"])
    errors = []
    until = time.monotonic() + 4

    def hammer(seed):
        draw = random.Random(seed)
        try:
            while time.monotonic() < until:
                if draw.random() < 0.3:
                    request_run("lab_stamp")
                else:
                    runner.run("lab_stamp", "kick", mark_pending=draw.random() < 0.5)
        except Exception as exc:  # a deadlock surfaces here as OperationalError
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=hammer, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Attempt.objects.filter(job="lab_stamp", outcome="succeeded").count() >= 8
    assert not Attempt.objects.filter(job="lab_stamp").exclude(outcome="succeeded").exists()


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_handler_that_ignores_its_abort_inside_a_transaction_has_its_connection_cut_and_its_locks_freed():
    from .locks import failing_lock_waits

    item = Item.objects.create(due=None)
    holding, hold, woke = threading.Event(), threading.Event(), threading.Event()

    def stubborn(ctx):
        with ctx.transaction():
            Item.objects.select_for_update().get(pk=item.pk)
            holding.set()
            hold.wait(15)  # ignores ctx.signal on purpose, with the row locked
            woke.set()

    try:
        with temporary_job(stubborn, timeout=timedelta(seconds=1)):
            result = runner.run("stubborn")
            assert holding.is_set()
            assert result.failure == "timed_out"
            assert not woke.is_set()  # the run ended without waiting for the handler (its release needs the lease)
            # The run has moved on; the row is free at once, not when the handler wakes.
            with failing_lock_waits(), transaction.atomic():
                assert Item.objects.select_for_update().get(pk=item.pk).pk == item.pk
    finally:
        hold.set()
