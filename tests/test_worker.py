"""The worker: kicks start runs, coalesce, schedules fire once across workers, stops and outages are survived.

In-process workers (threads) where a test moves the clock; real ``fabrika_job worker`` processes otherwise.
"""

import contextlib
import logging
import random
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import OperationalError, connection, transaction
from django.test import override_settings

from fabrika_django import kick
from fabrika_django._listen import listen_alias
from fabrika_django._process import configure_logging
from fabrika_django._runs import lease as run_lease
from fabrika_django.models import Attempt, Job, KickRequest, Lease
from fabrika_django.testing import FixedClock, run_job
from fabrika_django.worker import Worker
from testproject.lab.models import Item, Mark

from .jobs_helpers import temporary_job
from .workers import WorkerProcess, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAST_POLL = 0.05


def fast_poll():
    return override_settings(FABRIKA={**django_settings.FABRIKA, "POLL_INTERVAL": FAST_POLL})


@contextlib.contextmanager
def worker_thread(**options):
    """Run a Worker in a thread of this process for the block; stop it and wait for it after."""
    worker = Worker(install_signals=False, **options)
    thread = threading.Thread(target=worker.run, name="test-worker")
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive(), "the worker did not stop"


class Watch:
    """What an in-process worker dispatched and how many scans it finished: events an absence can wait for.

    A test that proves a worker did NOT run something waits until the worker finished two scans begun after
    the moment that matters (the first may have been under way already), then reads ``dispatched``.
    """

    def __init__(self, worker):
        self.dispatched = []
        self.scans = 0
        self._changed = threading.Condition()
        scan, dispatch = worker._scan, worker._dispatch

        def counted_scan():
            scan()
            with self._changed:
                self.scans += 1
                self._changed.notify_all()

        def recorded_dispatch(name, trigger):
            self.dispatched.append((name, trigger))
            dispatch(name, trigger)

        worker._scan, worker._dispatch = counted_scan, recorded_dispatch

    def a_full_scan(self, timeout=30):
        """Return once a scan that began after this call has finished."""
        with self._changed:
            target = self.scans + 2
            assert self._changed.wait_for(lambda: self.scans >= target, timeout), "the worker stopped scanning"


@contextlib.contextmanager
def watched_worker_thread(**options):
    """worker_thread() with a Watch installed before the worker's first scan."""
    worker = Worker(install_signals=False, **options)
    watch = Watch(worker)
    thread = threading.Thread(target=worker.run, name="test-worker")
    thread.start()
    try:
        yield watch
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive(), "the worker did not stop"


def runs(name):
    return list(Attempt.objects.filter(job=name).order_by("started", "pk").values_list("trigger", "outcome"))


def mark(ctx, note):
    with ctx.transaction():
        Mark.objects.create(job=ctx.job.name, note=note, attempt=ctx.attempt)


# -- in-process workers ----------------------------------------------------------------------------------


def test_a_worker_starts_a_kicked_job_and_leaves_it_idle():
    def kicked(ctx):
        mark(ctx, ctx.trigger)

    with temporary_job(kicked), fast_poll(), worker_thread(only=["kicked"]):
        with transaction.atomic():
            kick("kicked")
        wait_until(lambda: Mark.objects.filter(job="kicked").exists(), what="the kicked run")
        wait_until(lambda: Lease.objects.filter(job="kicked", token=None).exists(), what="the lease's release")
    assert list(Mark.objects.values_list("note", flat=True)) == ["kick"]
    assert Job.objects.get(name="kicked").pending_since is None


def test_a_worker_with_only_leaves_other_jobs_alone():
    def served(ctx):
        mark(ctx, "served")

    def ignored(ctx):
        mark(ctx, "ignored")

    with temporary_job(served), temporary_job(ignored), fast_poll(), watched_worker_thread(only=["served"]) as watch:
        kick("ignored")
        kick("served")
        wait_until(lambda: Mark.objects.filter(note="served").exists(), what="the served job's run")
        watch.a_full_scan()  # it saw the ignored job's pending flag, if it looks at that job at all
    assert watch.dispatched == [("served", "kick")]
    assert list(Mark.objects.values_list("note", flat=True)) == ["served"]
    assert KickRequest.objects.filter(job="ignored").exists()  # left for a worker that serves it


def test_a_new_scheduled_job_gets_its_next_fire_from_the_clock():
    clock = FixedClock(datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC))

    def hourly(ctx):
        mark(ctx, "ran")

    with temporary_job(hourly, "@hourly"), fast_poll(), worker_thread(only=["hourly"], clock=clock):
        wait_until(lambda: Job.objects.filter(name="hourly", next_fire__isnull=False).exists(), what="next_fire")
    assert Job.objects.get(name="hourly").next_fire == datetime(2026, 3, 1, 13, 0, tzinfo=UTC)
    assert not Mark.objects.exists()


def test_fires_missed_while_no_worker_ran_are_made_up_with_one_run():
    clock = FixedClock(datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC))

    def minutely(ctx):
        mark(ctx, ctx.trigger)

    with temporary_job(minutely, "* * * * *"):
        Job.objects.create(name="minutely", next_fire=datetime(2026, 3, 1, 11, 1, tzinfo=UTC))  # 60 fires ago
        with fast_poll(), watched_worker_thread(only=["minutely"], clock=clock) as watch:
            wait_until(lambda: runs("minutely") == [("schedule", "succeeded")], what="the make-up run")
            watch.a_full_scan()  # after the run: any fire still owed would have been dispatched
    assert watch.dispatched == [("minutely", "schedule")]
    assert runs("minutely") == [("schedule", "succeeded")]
    assert Job.objects.get(name="minutely").next_fire == datetime(2026, 3, 1, 12, 1, tzinfo=UTC)


def test_a_kick_only_job_wakes_by_itself_when_a_row_it_failed_is_due_again():
    clock = FixedClock(datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC))
    Item.objects.create(n=1, due=clock())

    def picky(ctx):
        for row in Item.objects.claim(limit=10):
            with ctx.row(row, step="first_try"):
                if row.attempts == 1:
                    raise RuntimeError("not yet")
                with ctx.transaction():
                    row.finish()

    with temporary_job(picky, None), fast_poll(), watched_worker_thread(only=["picky"], clock=clock) as watch:
        kick("picky")
        wait_until(lambda: runs("picky") == [("kick", "succeeded")], what="the kicked run")
        due_again = Item.objects.get().due
        assert due_again == clock() + timedelta(minutes=1)  # the backoff of a job without a schedule
        wait_until(lambda: Job.objects.get(name="picky").next_fire == due_again, what="the wake")
        watch.a_full_scan()
        assert watch.dispatched == [("picky", "kick")]  # nothing before the row is due
        clock.advance(timedelta(minutes=1))
        wait_until(lambda: Item.objects.done().exists(), what="the row done without a kick")
    assert runs("picky") == [("kick", "succeeded"), ("schedule", "succeeded")]
    assert Job.objects.get(name="picky").next_fire is None  # the wake fired once


def test_a_fire_during_the_jobs_run_becomes_one_more_run_after_it():
    clock = FixedClock(datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC))
    started = threading.Semaphore(0)
    release = threading.Event()

    def busy(ctx):
        mark(ctx, "start")
        started.release()
        release.wait(30)
        mark(ctx, "end")

    with temporary_job(busy, "* * * * *"), fast_poll(), worker_thread(only=["busy"], clock=clock):
        wait_until(lambda: Job.objects.filter(name="busy", next_fire__isnull=False).exists(), what="init")
        clock.advance(timedelta(minutes=1))
        assert started.acquire(timeout=30)
        clock.advance(timedelta(minutes=1))  # fires while the run is active
        wait_until(lambda: Job.objects.get(name="busy").pending_since is not None, what="the pending run")
        release.set()
        assert started.acquire(timeout=30)
        wait_until(lambda: Lease.objects.filter(job="busy", token=None).exists(), what="the runs' end")
    assert list(Mark.objects.values_list("note", flat=True)) == ["start", "end", "start", "end"]
    assert runs("busy") == [("schedule", "succeeded"), ("kick", "succeeded")]
    assert Job.objects.get(name="busy").next_fire == datetime(2026, 3, 1, 12, 3, tzinfo=UTC)


@pytest.mark.row_locks
def test_three_workers_under_a_moving_clock_run_each_fire_exactly_once():
    clock = FixedClock(datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC))

    def each_minute(ctx):
        mark(ctx, ctx.trigger)

    with temporary_job(each_minute, "* * * * *"), fast_poll(), contextlib.ExitStack() as stack:
        watches = [
            stack.enter_context(watched_worker_thread(only=["each_minute"], clock=clock, concurrency=2))
            for _ in range(3)
        ]
        wait_until(lambda: Job.objects.filter(name="each_minute", next_fire__isnull=False).exists(), what="init")
        for minute in range(1, 6):
            clock.advance(timedelta(minutes=1))
            wait_until(lambda m=minute: Mark.objects.count() >= m, what=f"fire {minute}")
            wait_until(lambda: Lease.objects.filter(job="each_minute", token=None).exists(), what="the run's end")
            for watch in watches:
                watch.a_full_scan()  # every worker has looked at the fire again
            assert sum(len(watch.dispatched) for watch in watches) == minute
        assert Mark.objects.count() == 5
    assert runs("each_minute") == [("schedule", "succeeded")] * 5


@pytest.mark.row_locks
def test_a_kick_heard_by_two_workers_makes_one_run():
    def heard(ctx):
        mark(ctx, "ran")

    with temporary_job(heard), fast_poll(), contextlib.ExitStack() as stack:
        watches = [stack.enter_context(watched_worker_thread(only=["heard"])) for _ in range(2)]
        for kicks in range(1, 6):
            kick("heard")
            wait_until(lambda k=kicks: Mark.objects.count() >= k, what=f"run {kicks}")
            wait_until(lambda: Lease.objects.filter(job="heard", token=None).exists(), what="the run's end")
            for watch in watches:
                watch.a_full_scan()  # both workers have looked again
            assert Mark.objects.count() == kicks
    # Both workers race for each kick; the one that loses leaves the flag alone: the winner's run served it.
    assert runs("heard") == [("kick", "succeeded")] * 5


@contextlib.contextmanager
def worker_with_a_stuck_loop(**options):
    """An in-process worker whose loop, once ``stuck.set()`` is called, stays inside its next scan until the block
    ends; yields (heard, stuck, in_scan), ``heard`` the names of the kicks its listener heard (once handled). Its
    listener is LISTENing when the block starts."""
    worker = Worker(install_signals=False, **options)
    scan, stuck, in_scan, release = worker._scan, threading.Event(), threading.Event(), threading.Event()
    kicked, heard = worker._kicked, []

    def kicked_and_noted(name):
        kicked(name)
        heard.append(name)

    def scan_then_hang():
        scan()
        if stuck.is_set():
            in_scan.set()
            release.wait(30)

    worker._scan, worker._kicked = scan_then_hang, kicked_and_noted
    thread = threading.Thread(target=worker.run, name="test-worker")
    thread.start()
    try:
        wait_until(_listening, what="the worker's LISTEN")
        yield heard, stuck, in_scan
    finally:
        release.set()
        worker.stop()
        thread.join(30)
        assert not thread.is_alive(), "the worker did not stop"


def _listening():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.postgresql
def test_a_kick_starts_its_run_while_the_workers_loop_is_inside_a_scan():
    # The listener hands a kick straight to a free runner slot: the loop (stuck here in a scan, as behind a slow
    # statement) is not on the way from a NOTIFY to its run.
    def prompt(ctx):
        mark(ctx, ctx.trigger)

    with temporary_job(prompt), fast_poll(), worker_with_a_stuck_loop(only=["prompt"]) as (_heard, stuck, in_scan):
        stuck.set()
        assert in_scan.wait(30), "the loop never scanned"
        kick("prompt")
        wait_until(lambda: Mark.objects.filter(job="prompt").exists(), what="the kick's run, with the loop stuck")
        wait_until(lambda: Lease.objects.filter(job="prompt", token=None).exists(), what="the run's end")
    assert runs("prompt") == [("kick", "succeeded")]


@pytest.mark.postgresql
def test_a_kick_heard_while_every_runner_slot_is_busy_runs_once_a_slot_is_free():
    # The listener places a kick only in a free slot; one it cannot place stays a row that the scan after the
    # busy run's end takes.
    started, release = threading.Event(), threading.Event()

    def occupying(ctx):
        mark(ctx, "occupying")
        started.set()
        release.wait(30)

    def waiting(ctx):
        mark(ctx, "waiting")

    with temporary_job(occupying), temporary_job(waiting), fast_poll():
        with worker_with_a_stuck_loop(only=["occupying", "waiting"], concurrency=1) as (heard, _stuck, _in_scan):
            kick("occupying")
            assert started.wait(30), "the first run never started"
            kick("waiting")
            wait_until(lambda: "waiting" in heard, what="the second kick heard, every slot busy")
            assert not Mark.objects.filter(job="waiting").exists()
            release.set()
            wait_until(lambda: Mark.objects.filter(job="waiting").exists(), what="the second kick's run")
            wait_until(lambda: Lease.objects.filter(token__isnull=False).count() == 0, what="the runs' end")
    assert runs("waiting") == [("kick", "succeeded")]
    assert runs("occupying") == [("kick", "succeeded")]


@pytest.mark.postgresql
def test_a_kick_heard_during_the_jobs_only_lane_runs_it_once_more_after():
    # At its lanes' limit, a kick's NOTIFY starts nothing: it leaves the job pending, and the live run goes once
    # more as it ends.
    started = threading.Semaphore(0)
    release = threading.Event()

    def single(ctx):
        mark(ctx, "start")
        started.release()
        release.wait(30)

    with temporary_job(single), fast_poll():
        with worker_with_a_stuck_loop(only=["single"], concurrency=2) as (heard, _stuck, _in_scan):
            kick("single")
            assert started.acquire(timeout=30), "the first run never started"
            kick("single")
            wait_until(lambda: len(heard) == 2, what="the second kick heard during the run")
            release.set()
            assert started.acquire(timeout=30), "the job did not run once more"
            wait_until(lambda: Lease.objects.filter(job="single", token=None).exists(), what="the runs' end")
    assert runs("single") == [("kick", "succeeded"), ("kick", "succeeded")]


def test_stopping_a_worker_aborts_its_attempt_releases_the_lease_and_hands_the_job_over():
    reasons = []
    started = threading.Event()

    def patient(ctx):
        started.set()
        ctx.signal.wait(60)
        reasons.append(ctx.signal.reason)

    with temporary_job(patient), fast_poll():
        with worker_thread(only=["patient"]):
            kick("patient")
            assert started.wait(30)
        # The block's exit stopped the worker and waited for it.
    assert reasons == ["shutdown"]
    assert runs("patient") == [("kick", "shutdown")]
    assert Lease.objects.get(job="patient").token is None
    assert Job.objects.get(name="patient").pending_since is not None  # the next worker runs it at once


def test_a_run_cut_off_by_the_database_frees_its_lease_and_runs_again_without_waiting_for_expiry(monkeypatch):
    real_end = run_lease.end_run
    failures = []

    def end_once_broken(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        return real_end(*args, **kwargs)

    monkeypatch.setattr(run_lease, "end_run", end_once_broken)

    def cut(ctx):
        mark(ctx, "ran")

    with temporary_job(cut), fast_poll(), worker_thread(only=["cut"]):
        kick("cut")
        wait_until(lambda: Mark.objects.count() == 2, what="the run again")
        wait_until(lambda: Lease.objects.filter(job="cut", token=None).exists(), what="the lease's release")
    assert runs("cut") == [("kick", "succeeded"), ("kick", "succeeded")]  # the lease (30 s) never expired


def test_verbosity_sets_the_level_of_fabrika_logs():
    package = logging.getLogger("fabrika_django")
    before = package.level
    try:
        levels = []
        for verbosity in (0, 1, 2, 3):
            configure_logging(verbosity)
            levels.append(package.level)
    finally:
        package.setLevel(before)
    assert levels == [logging.WARNING, logging.INFO, logging.DEBUG, logging.DEBUG]


def test_a_listen_database_missing_from_databases_is_refused_with_the_fix():
    with pytest.raises(ImproperlyConfigured, match="'ghost', which is not in DATABASES: name a database alias"):
        listen_alias("ghost")


def test_the_worker_listens_on_postgresql_and_polls_elsewhere_or_when_turned_off():
    assert listen_alias("default") == ("default" if connection.vendor == "postgresql" else None)
    assert listen_alias(None) is None


def test_the_history_job_prunes_attempts_older_than_run_history_days():
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    for age in (40, 31, 29, 1):
        Attempt.objects.create(
            job="x",
            run_id="00000000-0000-0000-0000-000000000001",
            trigger="kick",
            number=age,
            started=now - timedelta(days=age),
            outcome="succeeded",
        )
    with override_settings(FABRIKA={**django_settings.FABRIKA, "RUN_HISTORY_DAYS": 30}):
        result = run_job("fabrika_prune_history", now=now)
    assert result.outcome == "succeeded"
    assert sorted(Attempt.objects.filter(job="x").values_list("number", flat=True)) == [1, 29]
    assert Job.objects.get(name="fabrika_prune_history").last_outcome == "succeeded"


# -- worker processes ------------------------------------------------------------------------------------


def test_a_kick_with_a_worker_process_running_starts_the_job():
    worker = WorkerProcess("--only", "lab_slow", LAB_SLOW_SECONDS=0, FABRIKA_POLL_INTERVAL=0.2)
    try:
        with transaction.atomic():
            Mark.objects.create(job="request", note="row")
            kick("lab_slow")
        wait_until(
            lambda: Mark.objects.filter(job="lab_slow", note="end").exists(), workers=[worker], what="the kicked run"
        )
    finally:
        worker.kill()
    assert list(Mark.objects.filter(job="lab_slow").values_list("note", "pid")) == [
        ("start", worker.pid),
        ("end", worker.pid),
    ]


@pytest.mark.row_locks
def test_a_thousand_kicks_from_twenty_threads_make_few_runs_one_at_a_time_and_a_run_after_the_last():
    worker = WorkerProcess("--only", "lab_slow", LAB_SLOW_SECONDS=0.2)
    last_kick_sent = []
    lock = threading.Lock()

    def kicker(seed):
        jitter = random.Random(seed)
        try:
            for _ in range(50):
                time.sleep(jitter.uniform(0, 0.04))  # the kicks spread over about a second: several runs
                before = time.time()
                with transaction.atomic():
                    kick("lab_slow")
            with lock:
                last_kick_sent.append(before)
        finally:
            connection.close()

    try:
        # A first run shows the worker is up, so the kicks below meet it running.
        kick("lab_slow")
        wait_until(lambda: Mark.objects.filter(note="end").exists(), workers=[worker], what="the first run")
        threads = [threading.Thread(target=kicker, args=(seed,)) for seed in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(last_kick_sent) == 20

        def settled():
            idle = Lease.objects.filter(job="lab_slow", token=None).exists()
            return idle and Job.objects.get(name="lab_slow").pending_since is None

        wait_until(settled, workers=[worker], what="the kicks' runs")
    finally:
        worker.kill()
    notes = list(Mark.objects.filter(job="lab_slow").values_list("note", "at"))
    # Never two runs at once: each start is followed by its end before the next start.
    assert [note for note, _ in notes] == ["start", "end"] * (len(notes) // 2)
    assert 3 <= len(notes) // 2 <= 40  # several runs during the kicks, yet coalesced
    last_start = max(at for note, at in notes if note == "start")
    assert last_start.timestamp() > max(last_kick_sent)


# PostgreSQL only: proving every worker looked at the fire again reads each session's last query from
# pg_stat_activity, which MariaDB keeps nowhere without performance_schema (off by default). On MariaDB three
# workers and one schedule are covered by test_three_workers_under_a_moving_clock_run_each_fire_exactly_once.
@pytest.mark.postgresql
def test_three_worker_processes_run_each_due_fire_exactly_once():
    workers = [WorkerProcess("--only", "lab_yearly", FABRIKA_POLL_INTERVAL=FAST_POLL) for _ in range(3)]
    try:
        wait_until(
            lambda: Job.objects.filter(name="lab_yearly", next_fire__isnull=False).exists(),
            workers=workers,
            what="next_fire",
        )
        for fires in range(1, 6):
            # As though the clock passed a fire (missed ones too: each New Year since 2021).
            Job.objects.filter(name="lab_yearly").update(next_fire=datetime(2021 + fires, 1, 1, tzinfo=UTC))
            wait_until(lambda n=fires: Mark.objects.count() >= n, workers=workers, what=f"fire {fires}")
            wait_until(
                lambda: Job.objects.get(name="lab_yearly").next_fire.year > 2026, workers=workers, what="the next fire"
            )
            _every_worker_scanned_since(_database_clock(), workers)
            assert Mark.objects.count() == fires
    finally:
        for worker in workers:
            worker.kill()
    assert list(Mark.objects.values_list("note", flat=True)) == ["schedule"] * 5
    assert set(Mark.objects.values_list("pid", flat=True)) <= {worker.pid for worker in workers}


def _database_clock():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _every_worker_scanned_since(moment, workers):
    """Wait until each worker process's loop ran its scan query after ``moment`` (PostgreSQL's own record)."""

    def scanned():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(DISTINCT pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE %s AND query_start > %s",
                ["SELECT job.name, job.pending_since IS NOT NULL%", moment],
            )
            return cursor.fetchone()[0] >= len(workers)

    wait_until(scanned, workers=workers, what="a scan of every worker")


@pytest.mark.postgresql
@pytest.mark.listen_notify
def test_a_worker_whose_connections_were_cut_recovers_and_serves_the_next_kick():
    worker = WorkerProcess("--only", "lab_slow", LAB_SLOW_SECONDS=0)
    try:
        kick("lab_slow")
        wait_until(lambda: Mark.objects.filter(note="end").count() == 1, workers=[worker], what="the first run")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            (cut,) = cursor.fetchone()
        assert cut >= 2  # at least the listener and the loop's connection
        kick("lab_slow")
        wait_until(lambda: Mark.objects.filter(note="end").count() == 2, workers=[worker], what="the next run")
        wait_until(
            lambda: "Listen connection lost" in worker.output(), workers=[worker], what="the listener's log line"
        )
        # Nothing is left blocked: the run released its lease.
        wait_until(
            lambda: Lease.objects.filter(job="lab_slow", token=None).exists(),
            workers=[worker],
            what="the lease's release",
        )
    finally:
        worker.kill()


@pytest.mark.parametrize("concurrency", [0, 257, 10**20])
def test_a_worker_refuses_a_concurrency_outside_one_to_256(concurrency):
    with pytest.raises(ValueError, match=r"is not valid: give 1 to 256\.$"):
        Worker(concurrency=concurrency, install_signals=False)
