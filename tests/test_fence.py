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
def test_a_token_change_waits_for_an_open_fenced_transaction_while_a_renewal_does_not():
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

    def try_(change):
        def attempt():
            from fabrika_django._runs.rows import Started

            row = Lease.objects.get(job="holder")
            started = Started("holder", row.token, row.run_id, "manual", row.attempt, row.holder, 0, 0, row.pk, 1)
            with failing_lock_waits():
                return change(started)

        return _in_own_connection(attempt)

    with temporary_job(holder, timeout=timedelta(seconds=60)):
        worker = threading.Thread(target=lambda: (runner.run("holder"), connection.close()))
        worker.start()
        try:
            assert in_transaction.wait(20)
            assert try_update(expires=Now() + Value(timedelta(seconds=30))) == 1  # a renewal
            with pytest.raises(OperationalError, match=LOCK_TIMEOUT):
                try_(_rotate)  # the token of a next attempt
            with pytest.raises(OperationalError, match=LOCK_TIMEOUT):
                try_(_release)  # a release
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

    from fabrika_django._runs.fence import LeaseFence
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
    with transaction.atomic():
        assert fence._begin_with(connection)  # built for the first connection, at its default level
    connection.close()
    connection.ensure_connection()
    raw = connection.connection
    raw.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    try:
        for _transaction in range(2):  # built for this connection, then reused
            with transaction.atomic(), connection.cursor() as cursor:
                assert fence._begin_with(connection)
                assert raw.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS
                cursor.execute("SHOW transaction_isolation")
                assert cursor.fetchone() == ("serializable",)
                # Inside a transaction already: a plain statement, which finds no row of another token.
                assert not _fence_of("lab_stamp", uuid.uuid4())._begin_with(connection)
    finally:
        raw.isolation_level = None


# -- the fence against each path that changes a token (real sessions, one thread each) ---------------------


class _Session:
    """A connection of its own (a thread): each step runs there, in order; ``submit`` answers a future."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1)

    def submit(self, func, *args, **kwargs):
        return self._pool.submit(func, *args, **kwargs)

    def run(self, func, *args, **kwargs):
        return self.submit(func, *args, **kwargs).result(30)

    def close(self):
        self._pool.submit(lambda: connection.close()).result(30)
        self._pool.shutdown()


class _FencedTransaction:
    """A ``ctx.transaction()``'s database side, step by step: the atomic block and the fence's hold."""

    def __init__(self, fence):
        self.fence = fence
        self.atomic = transaction.atomic()

    def begin(self):
        self.atomic.__enter__()
        try:
            self.fence.hold(None)
        except BaseException as exc:
            self.atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def write_and_commit(self, note):
        Mark.objects.create(job="lab_stamp", note=note)
        self.atomic.__exit__(None, None, None)


def _held_lease(token, holder="fenced:1:1"):
    """Give lab_stamp's lane 0 a live lease of ``token``; answer the ``Started`` its run would hold."""
    from fabrika_django._runs.rows import Started

    runner.sync_jobs(["lab_stamp"])
    run_id = uuid.uuid4()
    Lease.objects.filter(job="lab_stamp", lane=0).update(
        token=token, holder=holder, run_id=run_id, attempt=1, expires=timezone.now() + timedelta(minutes=5)
    )
    lease_id = Lease.objects.get(job="lab_stamp", lane=0).pk
    record = Attempt.objects.create(job="lab_stamp", run_id=run_id, trigger="kick", number=1, holder=holder)
    return Started("lab_stamp", token, run_id, "kick", 1, holder, record.pk, 0, lease_id, 1)


def _lock_waiters():
    """How many sessions of this database wait for a lock now.

    PostgreSQL: pg_locks' ungranted locks. MariaDB lists a session waiting in an UPDATE neither in
    information_schema.innodb_trx nor in innodb_lock_waits, so there: a session whose one statement (of the
    fence's lock or a token's change, each a millisecond's work) has run for over half a second."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() "
                "AND command = 'Query' AND time_ms > 500 AND id <> CONNECTION_ID()"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM pg_locks AS locks JOIN pg_stat_activity AS sessions "
                "ON sessions.pid = locks.pid WHERE NOT locks.granted AND sessions.datname = current_database()"
            )
        return cursor.fetchone()[0]


def _wait_for_waiters(count, pending=()):
    """Wait until ``count`` sessions wait for a lock (an event: each of them asked for it); fail if one ended."""
    import time

    deadline = time.monotonic() + 20
    while _lock_waiters() < count:
        for future in pending:
            if future.done():
                future.result()  # an error says why
                raise AssertionError("a session that should wait for the fence went through")
        assert time.monotonic() < deadline, f"{count} sessions never waited for a lock"
        time.sleep(0.01)


def _release(started):
    from fabrika_django._runs import lease as run_lease

    return run_lease.release(started.job, started.holder)


def _rotate(started):
    from fabrika_django._runs import lease as run_lease

    return run_lease.rotate(started, 2, 60)


def _end_run(started):
    from fabrika_django._runs import lease as run_lease

    run_lease.end_run(started, "succeeded", again=False, seconds=60)  # frees the lease: answers False
    return True


_TOKEN_WRITERS = {"release": _release, "rotate": _rotate, "end_run": _end_run}


@pytest.mark.row_locks
@pytest.mark.parametrize("writer", list(_TOKEN_WRITERS))
def test_a_token_change_waits_for_an_open_fenced_transaction_of_the_old_token(writer):
    """A release, a new attempt's token, or a run's end waits until the open fenced transaction of the old token
    ended: that transaction commits while its token is still the lease's, never after the new one was set."""
    token = uuid.uuid4()
    started = _held_lease(token)
    old, changer = _Session(), _Session()
    try:
        stale = _FencedTransaction(_fence_of("lab_stamp", token))
        old.run(stale.begin)
        change = changer.submit(_TOKEN_WRITERS[writer], started)
        _wait_for_waiters(1, [change])
        # The change waits: the lease is still the old token's when the old transaction commits.
        assert Lease.objects.get(pk=started.lease_id).token == token
        old.run(stale.write_and_commit, "stale")
        assert change.result(30)
    finally:
        old.close()
        changer.close()
    assert Lease.objects.get(pk=started.lease_id).token not in (token,)
    assert list(Mark.objects.values_list("note", flat=True)) == ["stale"]


@pytest.mark.row_locks
@pytest.mark.parametrize("writer", ["release", "rotate"])
def test_a_fenced_transaction_that_begins_while_a_token_change_waits_is_refused_once_it_committed(writer):
    """The fence asked for while a token change waits is granted after the change committed, and its token check
    (a statement after the lock's, on PostgreSQL) sees the new token: LeaseLost, nothing written."""
    from fabrika_django.exceptions import LeaseLost

    token = uuid.uuid4()
    started = _held_lease(token)
    old, changer, late = _Session(), _Session(), _Session()
    try:
        first = _FencedTransaction(_fence_of("lab_stamp", token))
        old.run(first.begin)
        change = changer.submit(_TOKEN_WRITERS[writer], started)
        _wait_for_waiters(1, [change])
        second = _FencedTransaction(_fence_of("lab_stamp", token))
        begun = late.submit(second.begin)
        _wait_for_waiters(2, [change, begun])  # it queues behind the change
        old.run(first.write_and_commit, "first")
        assert change.result(30)
        with pytest.raises(LeaseLost):
            begun.result(30)
        # And one that begins after the change committed.
        with pytest.raises(LeaseLost):
            late.run(_FencedTransaction(_fence_of("lab_stamp", token)).begin)
    finally:
        old.close()
        changer.close()
        late.close()
    assert list(Mark.objects.values_list("note", flat=True)) == ["first"]


@pytest.mark.row_locks
def test_a_fenced_transaction_that_begins_after_a_takeover_committed_is_refused():
    from fabrika_django._runs import start as run_start
    from fabrika_django.exceptions import LeaseLost

    token = uuid.uuid4()
    started = _held_lease(token)
    Lease.objects.filter(pk=started.lease_id).update(expires=timezone.now() - timedelta(seconds=1))
    start = run_start.Start(job="lab_stamp", trigger="kick", holder="taker:1:1", seconds=60, max_attempt=3)
    taken = run_start.start_or_join(start)
    assert taken is not None and taken.lease_id == started.lease_id
    with pytest.raises(LeaseLost), transaction.atomic():
        _fence_of("lab_stamp", token).hold(None)
    assert not Mark.objects.exists()


@pytest.mark.row_locks
def test_a_renewal_does_not_wait_for_an_open_fenced_transaction():
    from fabrika_django._runs import lease as run_lease

    token = uuid.uuid4()
    started = _held_lease(token)
    old, renewer = _Session(), _Session()

    def renew():
        with failing_lock_waits():
            return run_lease.renew(started, 600)

    try:
        fenced = _FencedTransaction(_fence_of("lab_stamp", token))
        old.run(fenced.begin)
        before = Lease.objects.get(pk=started.lease_id).expires
        assert renewer.run(renew)  # a lock wait would fail it (300 ms, InnoDB 1 s)
        assert Lease.objects.get(pk=started.lease_id).expires > before
        old.run(fenced.write_and_commit, "inside")
    finally:
        old.close()
        renewer.close()
    assert list(Mark.objects.values_list("note", flat=True)) == ["inside"]


@pytest.mark.postgresql
def test_at_repeatable_read_a_fenced_transaction_that_waited_for_a_token_change_does_not_pass():
    """Above READ COMMITTED the transaction's one snapshot is taken by the fence's lock statement, before its
    wait: the token check then also locks the row, which fails on a token changed since that snapshot."""
    import psycopg

    from fabrika_django.exceptions import LeaseLost

    token = uuid.uuid4()
    started = _held_lease(token)
    old, changer, late = _Session(), _Session(), _Session()

    def repeatable_read():
        connection.ensure_connection()
        connection.connection.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ

    try:
        late.run(repeatable_read)
        first = _FencedTransaction(_fence_of("lab_stamp", token))
        old.run(first.begin)
        change = changer.submit(_release, started)
        _wait_for_waiters(1, [change])
        begun = late.submit(_FencedTransaction(_fence_of("lab_stamp", token)).begin)
        _wait_for_waiters(2, [change, begun])
        old.run(first.write_and_commit, "first")
        assert change.result(30)
        with pytest.raises((LeaseLost, OperationalError), match="lease was taken over|could not serialize"):
            begun.result(30)
    finally:
        old.close()
        changer.close()
        late.close()
    assert list(Mark.objects.values_list("note", flat=True)) == ["first"]
