"""kick(): a row in the caller's transaction (one commit), taken by workers into the pending flag; NOTIFY on
PostgreSQL at the commit."""

import logging
import select
import threading
from contextlib import contextmanager

import psycopg
import pytest
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from fabrika_django import UnknownJob, kick
from fabrika_django._channel import CHANNEL
from fabrika_django._runs import lease as run_lease
from fabrika_django._runs import pending as run_pending
from fabrika_django._runs import reads as run_reads
from fabrika_django._runs import start as run_start
from fabrika_django.models import Job, KickRequest
from testproject.lab.models import Mark

from . import processes

pytestmark = pytest.mark.django_db(transaction=True)


def pending(name="lab_slow"):
    """The job is pending: its flag is up, or a kick row waits for a worker to take it."""
    return run_reads.job_states([name], timezone.now())[name].pending


def kick_rows(name="lab_slow"):
    return KickRequest.objects.filter(job=name).count()


@pytest.fixture
def lab_slow_row():
    Job.objects.create(name="lab_slow")


class Commits:
    """Counts what a block costs its connection: statements, and commits (each autocommit statement is one)."""

    def __init__(self, using="default"):
        self.connection = connections[using]
        self.statements = 0
        self.commits = 0

    def __call__(self, execute, sql, params, many, context):
        if sql.strip().upper() == "BEGIN":  # SQLite's opening of an atomic block: neither a write nor a commit
            return execute(sql, params, many, context)
        self.statements += 1
        if not self.connection.in_atomic_block:
            self.commits += 1
        return execute(sql, params, many, context)

    @contextmanager
    def counting(self, monkeypatch):
        real = self.connection._commit

        def commit():
            self.commits += 1
            return real()

        monkeypatch.setattr(self.connection, "_commit", commit)
        self.connection.ensure_connection()  # MariaDB's session settings on connecting are no part of the block
        with self.connection.execute_wrapper(self):
            yield self
        monkeypatch.undo()


def test_kick_outside_a_transaction_is_one_statement_and_pending_at_once(lab_slow_row, monkeypatch):
    with Commits().counting(monkeypatch) as cost:
        kick("lab_slow")
    assert (cost.statements, cost.commits) == (1, 1)
    assert pending() is True
    assert kick_rows() == 1


def test_a_kick_rides_in_the_callers_commit(lab_slow_row, monkeypatch):
    with Commits().counting(monkeypatch) as cost, transaction.atomic():
        Mark.objects.create(job="lab_slow", note="row")
        kick("lab_slow")
        kick("lab_slow")  # the same transaction's second kick writes nothing more
    assert (cost.statements, cost.commits) == (2, 1)
    assert kick_rows() == 1


def test_every_kick_is_a_row_of_its_own_in_autocommit_and_in_a_transaction(lab_slow_row):
    kick("lab_slow")
    kick("lab_slow")
    assert kick_rows() == 2
    with transaction.atomic():
        kick("lab_slow")
    assert kick_rows() == 3


def test_a_kick_in_autocommit_while_the_job_is_pending_is_still_a_row(lab_slow_row):
    """The pending flag does not cover a kick: the run that serves it may have begun its start before the
    caller's commit (on PostgreSQL one statement, whose snapshot then predates the caller's rows), so its claim
    misses them. The kick's own row outlives that start and runs the job once more."""
    Job.objects.filter(name="lab_slow").update(pending_since=timezone.now())
    kick("lab_slow")
    assert kick_rows() == 1


def test_kick_inside_a_transaction_is_seen_only_when_it_commits(lab_slow_row):
    seen_inside = []
    with transaction.atomic():
        kick("lab_slow")
        # Another connection sees nothing yet: the kick's row commits with the request's transaction.
        thread = threading.Thread(target=lambda: (seen_inside.append(pending()), connections.close_all()))
        thread.start()
        thread.join()
    assert seen_inside == [False]
    assert pending() is True


def test_a_rolled_back_transaction_kicks_nothing(lab_slow_row):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        kick("lab_slow")
        raise ZeroDivisionError
    assert pending() is False
    assert kick_rows() == 0


def test_a_kick_in_a_savepoint_rolled_back_is_kicked_again_by_a_later_kick(lab_slow_row):
    with transaction.atomic():
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            kick("lab_slow")
            raise ZeroDivisionError
        kick("lab_slow")
    assert kick_rows() == 1


def test_a_kick_of_an_unknown_job_raises_unknown_job_at_once():
    with pytest.raises(UnknownJob, match="No cron job is named 'nope'"), transaction.atomic():
        kick("nope")


def test_taking_kicks_sets_the_flag_to_the_first_kick_and_leaves_no_row(lab_slow_row):
    kick("lab_slow")
    first = KickRequest.objects.get().created
    kick("lab_slow")
    assert run_pending.take_kicks(["lab_slow", "lab_items"]) == ["lab_slow"]
    assert kick_rows() == 0
    assert Job.objects.get(name="lab_slow").pending_since == first
    assert run_pending.take_kicks(["lab_slow"]) == []  # nothing left: nothing taken


def test_taking_kicks_leaves_other_jobs_kicks(lab_slow_row):
    kick("lab_items")
    assert run_pending.take_kicks(["lab_slow"]) == []
    assert kick_rows("lab_items") == 1


def test_taking_the_kick_of_a_job_without_a_row_makes_the_row_pending():
    assert not Job.objects.filter(name="lab_slow").exists()
    kick("lab_slow")
    assert run_pending.take_kicks(["lab_slow"]) == ["lab_slow"]
    assert Job.objects.get(name="lab_slow").pending_since is not None


def test_a_failing_kick_outside_a_transaction_never_breaks_the_caller_and_logs_no_message(
    monkeypatch, caplog, lab_slow_row
):
    def broken(name, *, using):
        raise DatabaseError("someone@example.com")

    monkeypatch.setattr(run_pending, "add_kick", broken)
    with caplog.at_level(logging.DEBUG):
        kick("lab_slow")
    assert "Kick not delivered job=lab_slow error=DatabaseError" in caplog.text
    assert "someone@example.com" not in caplog.text


def test_a_failing_kick_inside_a_transaction_fails_it_as_any_write_would(monkeypatch, lab_slow_row):
    def broken(name, *, using):
        raise DatabaseError("broken")

    monkeypatch.setattr(run_pending, "add_kick", broken)
    with pytest.raises(DatabaseError), transaction.atomic():
        Mark.objects.create(job="lab_slow", note="row")
        kick("lab_slow")
    assert not Mark.objects.exists()  # no row without its kick


def test_the_test_kit_records_kicks_after_their_commit(fabrika_kicks, lab_slow_row):
    with transaction.atomic():
        kick("lab_slow")
        assert fabrika_kicks == []
    assert fabrika_kicks == ["lab_slow"]
    kick("lab_slow")
    assert fabrika_kicks == ["lab_slow", "lab_slow"]


@pytest.mark.row_locks  # SQLite has one writer at a time: the second transaction's first write waits anyway
def test_concurrent_kicks_of_one_job_never_wait_for_each_other(lab_slow_row):
    """Every thread kicks inside its own open transaction, then waits for all the others to have kicked: a kick
    that locked a row shared by the job's kicks (its pending flag) would block the second thread until the first
    committed, which it never does before the barrier."""
    count = 6
    barrier = threading.Barrier(count, timeout=20)
    errors = []

    def request():
        try:
            with transaction.atomic():
                Mark.objects.create(job="lab_slow", note="row")
                kick("lab_slow")
                barrier.wait()
        except Exception as exc:  # noqa: BLE001  reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=request) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert kick_rows() == count


def _notifications(listener, timeout):
    names = []
    while select.select([listener.fileno()], [], [], timeout)[0]:
        names += [note.payload for note in listener.notifies(timeout=0.01) if note.channel == CHANNEL]
        timeout = 0.2
    return names


@pytest.mark.listen_notify
def test_a_kick_notifies_listeners_at_its_commit_once_per_transaction_and_a_rollback_notifies_nobody(lab_slow_row):
    with psycopg.connect(processes.test_database_url(), autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with transaction.atomic():
            for _ in range(3):
                kick("lab_slow")
            assert _notifications(listener, 0.3) == []  # not before the commit
        assert _notifications(listener, 2.0) == ["lab_slow"]
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            kick("lab_slow")
            raise ZeroDivisionError
        kick("lab_items")  # a later kick's notification comes after any the rollback could have sent
        assert _notifications(listener, 2.0) == ["lab_items"]


def test_a_kick_that_finds_no_row_marks_the_row_another_session_made_meanwhile():
    Job.objects.create(name="lab_slow")  # made by a worker's sync between the kick's UPDATE and its insert
    run_pending._create_pending("lab_slow", "default")
    assert pending() is True


def _serve_kick(holder):
    """A worker's start for a kick it heard (mark_pending=False): the start takes the job's kick rows itself."""
    start = run_start.Start(
        job="lab_slow", trigger="kick", holder=holder, seconds=30, max_attempt=1, mark_pending=False
    )
    return run_start.start_or_join(start)


def test_the_start_a_kick_asked_for_takes_the_kick_and_runs_for_it(lab_slow_row):
    from fabrika_django import runner

    runner.sync_jobs(["lab_slow"])
    kick("lab_slow")  # a row no worker took: the flag is still down
    assert Job.objects.get(name="lab_slow").pending_since is None
    lease = _serve_kick("worker-a")
    assert lease is not None
    assert kick_rows() == 0 and not pending()


def test_a_start_for_a_kick_that_finds_the_job_busy_leaves_the_kick_as_its_flag_for_the_busy_run(lab_slow_row):
    from fabrika_django import runner

    runner.sync_jobs(["lab_slow"])
    busy = _serve_kick_after_a_kick("worker-a")
    kick("lab_slow")  # during the run
    first = KickRequest.objects.get().created
    assert _serve_kick("worker-b") is None  # busy: no second run
    assert kick_rows() == 0
    assert Job.objects.get(name="lab_slow").pending_since == first  # the kick became the flag, not lost
    # The busy run sees it as it ends and runs once more.
    assert run_lease.end_run(busy, "succeeded", again=True, seconds=30)


def test_a_start_for_no_kick_starts_nothing(lab_slow_row):
    from fabrika_django import runner

    runner.sync_jobs(["lab_slow"])
    assert _serve_kick("worker-a") is None  # another worker's run served the kick already
    assert not pending()


def _serve_kick_after_a_kick(holder):
    kick("lab_slow")
    lease = _serve_kick(holder)
    assert lease is not None
    return lease


@pytest.mark.parametrize("again", [True, False], ids=["the-busy-run-goes-again", "the-busy-run-stops"])
def test_a_kick_a_busy_start_took_is_served_by_exactly_one_run_when_the_busy_run_ends_before_the_general_path(
    lab_slow_row, monkeypatch, again
):
    """On PostgreSQL a start that finds the job busy takes the kick rows into the flag in its one statement,
    answers nothing, and the general path (``_start_under_job_lock``) takes kicks again under the Job row's lock.
    The busy run ending in between (its own commit) must neither lose the kick nor serve it twice: the kick is
    served by the busy run's next run (it goes again), or by the general path's (it stopped), never both."""
    from fabrika_django import runner

    runner.sync_jobs(["lab_slow"])
    busy = _serve_kick_after_a_kick("worker-a")
    kick("lab_slow")  # during the run
    real = run_start._start_on_free_lease
    went_again = []

    def then_the_busy_run_ends(start):
        started = real(start)
        assert started is None  # busy
        # PostgreSQL's statement took the kick into the flag; elsewhere it did nothing, and the row waits.
        assert kick_rows() == (0 if connections["default"].vendor == "postgresql" else 1)
        went_again.append(run_lease.end_run(busy, "succeeded", again=again, seconds=30))
        return None

    monkeypatch.setattr(run_start, "_start_on_free_lease", then_the_busy_run_ends)
    served = _serve_kick("worker-b")
    monkeypatch.undo()
    assert went_again == [again]
    assert (served is None) == again  # one run for the kick: the busy run's next one, or this start's
    run = busy if again else served
    assert kick_rows() == 0 and not pending()
    # That run ends with nothing left to serve: no spare run.
    assert run_lease.end_run(run, "succeeded", again=True, seconds=30) is False
