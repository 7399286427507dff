"""The lease fence: a stale attempt can never commit after its replacement started."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, transaction
from django.db.models import Value
from django.db.models.functions import Now
from django.utils import timezone

from fabrika_django import runner
from fabrika_django.models import Attempt, Job, Lease
from testproject.lab.models import Mark

from .jobs_helpers import temporary_job
from .locks import LOCK_TIMEOUT, failing_lock_waits

pytestmark = [pytest.mark.django_db(transaction=True)]


def _in_own_connection(func):
    """Run ``func`` in a thread of its own (so on a connection of its own) and return what it returned."""
    box = {}

    def target():
        try:
            box["value"] = func()
        except BaseException as exc:  # noqa: B036  handed back to the test
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_an_attempt_whose_lease_was_taken_over_cannot_begin_a_transaction():
    inside = threading.Event()
    go_on = threading.Event()
    refused = []

    def stale(ctx):
        if ctx.trigger == "manual" and ctx.attempt == 1 and not inside.is_set():
            inside.set()
            go_on.wait(20)
            try:
                with ctx.transaction():
                    Mark.objects.create(job="stale", note="stale")
            except Exception as exc:
                refused.append(type(exc).__name__)
                raise
        else:
            with ctx.transaction():
                Mark.objects.create(job="stale", note="replacement")

    with temporary_job(stale, timeout=timedelta(seconds=60)):
        results = []
        first = threading.Thread(target=lambda: results.append(runner.run("stale")) or connection.close())
        first.start()
        assert inside.wait(20)
        # The holder stops renewing in time (a pause, a partition): its lease expires, another run takes over.
        Lease.objects.filter(job="stale").update(expires=timezone.now() - timedelta(seconds=1))
        replacement = _in_own_connection(lambda: runner.run("stale", trigger="kick"))
        go_on.set()
        first.join(30)
    assert replacement.outcome == "succeeded"
    assert refused == ["LeaseLost"]
    assert results[0].outcome == "lease_lost"
    assert list(Mark.objects.values_list("note", flat=True)) == ["replacement"]
    assert sorted(Attempt.objects.values_list("outcome", flat=True)) == ["lease_lost", "succeeded"]
    assert Job.objects.get(name="stale").last_outcome == "succeeded"  # the stale run speaks for nobody


@pytest.mark.row_locks
def test_a_takeover_waits_for_an_open_fenced_transaction_while_a_renewal_does_not():
    in_transaction = threading.Event()
    finish = threading.Event()

    def holder(ctx):
        with ctx.transaction():
            Mark.objects.create(job="holder", note="inside")
            in_transaction.set()
            finish.wait(20)

    def try_update(**values):
        def attempt():
            with failing_lock_waits():
                return Lease.objects.filter(job="holder").update(**values)

        return _in_own_connection(attempt)

    with temporary_job(holder, timeout=timedelta(seconds=60)):
        worker = threading.Thread(target=lambda: (runner.run("holder"), connection.close()))
        worker.start()
        try:
            assert in_transaction.wait(20)
            assert try_update(expires=Now() + Value(timedelta(seconds=30))) == 1  # a renewal
            with pytest.raises(OperationalError, match=LOCK_TIMEOUT):
                try_update(token=uuid.uuid4())  # a takeover
            with pytest.raises(OperationalError, match=LOCK_TIMEOUT):
                try_update(token=None)  # a release
        finally:
            finish.set()
            worker.join(30)
    assert list(Mark.objects.values_list("note", flat=True)) == ["inside"]


def test_a_lease_left_by_a_vanished_holder_is_taken_over_and_its_run_resumed():
    calls = []

    def resumable(ctx):
        calls.append((ctx.attempt, ctx.trigger))

    with temporary_job(resumable, retries=2):
        runner.sync_jobs(["resumable"])
        run_id = uuid.uuid4()
        # A holder that was killed mid-attempt: its attempt row says running, its lease has expired.
        Lease.objects.filter(job="resumable").update(
            token=uuid.uuid4(), holder="gone:1:1", run_id=run_id, attempt=1, expires=timezone.now() - timedelta(1)
        )
        Attempt.objects.create(job="resumable", run_id=run_id, trigger="schedule", number=1)
        Job.objects.filter(name="resumable").update(last_trigger="schedule", last_run_id=run_id)
        result = runner.run("resumable")
    assert (result.outcome, result.run_id) == ("succeeded", run_id)
    assert calls == [(2, "schedule")]
    assert list(Attempt.objects.order_by("number").values_list("number", "outcome")) == [
        (1, "crashed"),
        (2, "succeeded"),
    ]


def test_a_live_lease_is_not_taken_over():
    with temporary_job(lambda ctx: None, name="held"):
        runner.sync_jobs(["held"])
        Lease.objects.filter(job="held").update(
            token=uuid.uuid4(),
            holder="alive:1:1",
            run_id=uuid.uuid4(),
            attempt=1,
            expires=timezone.now() + timedelta(minutes=5),
        )
        result = runner.run("held")
    assert result.coalesced
    assert not Attempt.objects.exists()


def _fence_of(job, token):
    import time

    from fabrika_django._fence import LeaseFence
    from fabrika_django.context import AbortSignal

    lease_id = Lease.objects.get(job=job, lane=0).pk
    return LeaseFence(job, token, AbortSignal(time.monotonic() + 60), time.monotonic() + 60, lease_id)


@pytest.mark.postgresql
def test_the_fence_begins_the_transaction_as_psycopg_would_with_the_connections_isolation_level():
    """The fence's lock goes out with the transaction's BEGIN: that BEGIN keeps the configured isolation level,
    also on a new connection after the fence built its query for an earlier one."""
    import psycopg

    runner.sync_jobs(["lab_stamp"])
    token = uuid.uuid4()
    Lease.objects.filter(job="lab_stamp").update(token=token)
    fence = _fence_of("lab_stamp", token)
    with transaction.atomic(), connection.cursor() as cursor:
        assert fence._begin_with(connection, cursor)  # built for the first connection, at its default level
    connection.close()
    connection.ensure_connection()
    raw = connection.connection
    raw.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    try:
        for _transaction in range(2):  # built for this connection, then reused
            with transaction.atomic(), connection.cursor() as cursor:
                assert fence._begin_with(connection, cursor)
                assert raw.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS
                cursor.execute("SHOW transaction_isolation")
                assert cursor.fetchone() == ("serializable",)
                # Inside a transaction already: a plain statement, which finds no row of another token.
                assert not _fence_of("lab_stamp", uuid.uuid4())._begin_with(connection, cursor)
    finally:
        raw.isolation_level = None
