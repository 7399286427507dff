"""Lanes (``@cron(lanes=N)``): up to ``lanes`` runs of one job at once, each with a lease, fence and history of its own.

The rules of starting and ending are tested on every backend through ``fabrika_django._runs``; the multi-process parts
(real worker processes draining a table in several lanes, SIGKILL, SIGTERM, a cut connection, a takeover) need
row locks and SKIP LOCKED, so they run on PostgreSQL and MariaDB (SQLite's single writer serializes lanes).
"""

import signal
import threading
import time
from datetime import timedelta

import pytest
from django.core import checks
from django.db import connection, connections
from django.utils import timezone

from fabrika_django import cron, kick, runner
from fabrika_django._runs import lease as run_lease
from fabrika_django._runs import pending as run_pending
from fabrika_django._runs import rows as run_rows
from fabrika_django._runs import start as run_start
from fabrika_django.checks._jobs import _check_jobs
from fabrika_django.jobs import CronJob, JobRegistry, registry
from fabrika_django.models import Attempt, Job, Lease
from testproject.lab.models import Effect, Item

from .workers import WorkerProcess, wait_until

LANES_JOB = "lab_lanes"  # lanes=LAB_LANES (8 unless the environment says otherwise) in testproject/lab/jobs.py


# -- the declaration --------------------------------------------------------------------------------------


@pytest.mark.parametrize("lanes", [0, 65, -1, 2.0, "4", True, None])
def test_cron_refuses_lanes_out_of_bounds_at_import_with_the_bounds(lanes):
    with pytest.raises(ValueError) as refused:
        cron(None, lanes=lanes)
    assert str(refused.value) == f"lanes={lanes!r} is out of bounds: give a whole number from 1 to 64."


def test_lanes_default_to_one_and_take_1_to_64():
    try:
        declared = [
            cron(None, name=f"_lanes_{n}", **kwargs)(lambda ctx: None).lanes
            for n, kwargs in ((0, {}), (1, {"lanes": 1}), (64, {"lanes": 64}))
        ]
        assert declared == [1, 1, 64]
    finally:
        for n in (0, 1, 64):
            registry.unregister(f"_lanes_{n}")


def test_system_check_e004_reports_lanes_out_of_bounds():
    jobs = JobRegistry()
    jobs.register(CronJob(name="wide", func=lambda ctx: None, schedule=None, lanes=100))
    jobs.register(CronJob(name="fine", func=lambda ctx: None, schedule=None, lanes=8))
    assert _check_jobs(jobs=jobs) == [
        checks.Error(
            "Cron job 'wide' has lanes=100 is out of bounds: give a whole number from 1 to 64.",
            hint="Give e.g. lanes=4 (at most 64: each running lane holds a database connection). "
            "Declare the job with @cron(...), which checks its arguments at import.",
            obj="wide",
            id="fabrika.E004",
        )
    ]


# -- starting and ending, on every backend ---------------------------------------------------------------


def _start(name, holder, *, mark_pending=True):
    job = registry.get(name)
    start = run_start.Start(
        job=name,
        trigger="kick",
        holder=holder,
        seconds=30,
        max_attempt=1 + job.retries,
        mark_pending=mark_pending,
        lanes=job.lanes,
    )
    return run_start.start_or_join(start)


def _active():
    return sorted(Lease.objects.filter(job=LANES_JOB, token__isnull=False).values_list("lane", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_kick_starts_an_idle_job_in_lane_0_and_kicks_while_it_runs_coalesce_into_one_pending():
    runner.sync_jobs([LANES_JOB])
    assert Lease.objects.filter(job=LANES_JOB).count() == registry.get(LANES_JOB).lanes
    first = _start(LANES_JOB, "a")
    assert (first.lane, first.lanes, _active()) == (0, 8, [0])
    assert Attempt.objects.get(pk=first.attempt_id).lane == 0
    # A kick while a lane runs: pending (the running lane serves it as it ends), no second run.
    assert _start(LANES_JOB, "b") is None
    assert _start(LANES_JOB, "c", mark_pending=False) is None
    assert _active() == [0]
    assert Job.objects.get(name=LANES_JOB).pending_since is not None


@pytest.mark.django_db(transaction=True)
def test_a_full_claim_asks_for_one_more_lane_while_one_is_free_and_the_ask_lapses_when_none_is():
    runner.sync_jobs([LANES_JOB])
    leases = [_start(LANES_JOB, "first")]
    for lane in range(1, 8):
        assert run_pending.ask_for_lane(LANES_JOB, 8) is True
        assert run_pending.ask_for_lane(LANES_JOB, 8) is False  # one ask at a time
        started = _start(LANES_JOB, f"grow-{lane}", mark_pending=False)
        assert started.lane == lane
        leases.append(started)
        assert Job.objects.get(name=LANES_JOB).lane_asked is None
    assert _active() == list(range(8))
    # Every lane busy: asking writes nothing, and a start for it is a coalesced one.
    assert run_pending.ask_for_lane(LANES_JOB, 8) is False
    assert _start(LANES_JOB, "ninth", mark_pending=False) is None
    assert _active() == list(range(8))
    # Each lane's attempt row says its lane.
    assert sorted(Attempt.objects.filter(job=LANES_JOB).values_list("lane", flat=True)) == list(range(8))


@pytest.mark.django_db(transaction=True)
def test_an_ask_for_a_lane_counts_the_lanes_it_is_given_each_time():
    """The ask's statement is compiled once per job and lane count: a count given later is its own statement."""
    runner.sync_jobs([LANES_JOB])
    _start(LANES_JOB, "first")  # lane 0 busy
    assert run_pending.ask_for_lane(LANES_JOB, 1) is False  # one lane, and it is busy
    assert Job.objects.get(name=LANES_JOB).lane_asked is None
    assert run_pending.ask_for_lane(LANES_JOB, 8) is True  # lanes 1 to 7 are free
    assert run_pending.ask_for_lane(LANES_JOB, 1) is False  # the flag is up, and one lane is still busy


@pytest.mark.django_db(transaction=True)
def test_an_empty_queue_drains_down_to_one_run_which_serves_the_kick():
    runner.sync_jobs([LANES_JOB])
    first = _start(LANES_JOB, "first")
    run_pending.ask_for_lane(LANES_JOB, 8)
    second = _start(LANES_JOB, "second", mark_pending=False)
    assert _start(LANES_JOB, "kick") is None  # kicked while both run: pending
    # The first ends with a short claim (the queue is drained) while the second still runs: it leaves the kick.
    assert run_lease.end_run(first, "succeeded", again=True, seconds=30, backlog=False) is False
    assert _active() == [1]
    assert Job.objects.get(name=LANES_JOB).pending_since is not None
    # The last run to end serves it, even with a short claim: one more run, in its own lane.
    assert run_lease.end_run(second, "succeeded", again=True, seconds=30, backlog=False) is True
    assert _active() == [1] and Job.objects.get(name=LANES_JOB).pending_since is None


@pytest.mark.django_db(transaction=True)
def test_a_run_with_backlog_serves_the_kick_beside_other_lanes():
    runner.sync_jobs([LANES_JOB])
    first = _start(LANES_JOB, "first")
    run_pending.ask_for_lane(LANES_JOB, 8)
    _start(LANES_JOB, "second", mark_pending=False)
    assert _start(LANES_JOB, "kick") is None
    assert run_lease.end_run(first, "succeeded", again=True, seconds=30, backlog=True) is True
    assert _active() == [0, 1]


@pytest.mark.django_db(transaction=True)
def test_an_expired_lane_is_taken_over_first_and_its_run_resumes_in_that_lane():
    runner.sync_jobs([LANES_JOB])
    first = _start(LANES_JOB, "first")
    run_pending.ask_for_lane(LANES_JOB, 8)
    second = _start(LANES_JOB, "vanished", mark_pending=False)
    Lease.objects.filter(pk=second.lease_id).update(expires=timezone.now() - timedelta(seconds=1))
    taken = _start(LANES_JOB, "takeover")
    assert (taken.lane, taken.run_id, taken.attempt) == (1, second.run_id, 2)
    assert Attempt.objects.get(pk=second.attempt_id).outcome == "crashed"
    assert Attempt.objects.get(pk=first.attempt_id).outcome == "running"  # the other lane is untouched
    # The stale attempt's end does not write the job's summary nor free the lane now held by the takeover.
    assert run_lease.end_run(second, "lease_lost", again=True, seconds=30) is False
    assert Lease.objects.get(pk=second.lease_id).holder == "takeover"


@pytest.mark.django_db(transaction=True)
def test_ctx_lane_is_the_runs_lane():
    seen = []

    @cron(None, name="_lanes_ctx", lanes=3)
    def _lanes_ctx(ctx):
        seen.append(ctx.lane)

    try:
        runner.sync_jobs(["_lanes_ctx"])
        Lease.objects.filter(job="_lanes_ctx", lane=0).update(
            token="00000000-0000-0000-0000-000000000001", holder="x", expires=timezone.now() + timedelta(minutes=1)
        )
        Job.objects.filter(name="_lanes_ctx").update(lane_asked=timezone.now())
        result = runner.run("_lanes_ctx", mark_pending=False)
        assert result.outcome == "succeeded" and seen == [1]
        assert Attempt.objects.get(job="_lanes_ctx").lane == 1
    finally:
        registry.unregister("_lanes_ctx")


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_process_stopped_while_it_holds_the_jobs_row_blocks_other_starts_only_about_two_leases(settings):
    from django.db import transaction

    settings.FABRIKA = {**getattr(settings, "FABRIKA", {}), "LEASE_SECONDS": 1}
    runner.sync_jobs([LANES_JOB])
    held, wake, ended = threading.Event(), threading.Event(), []

    def stopped():
        try:
            with transaction.atomic():
                run_rows.lock_job(LANES_JOB)
                held.set()
                wake.wait(60)  # a stopped process: its session sits idle inside the start's transaction
                Job.objects.filter(name=LANES_JOB).count()
        except Exception as exc:  # noqa: BLE001  the class is the point
            ended.append(type(exc).__name__)
        finally:
            connections.close_all()

    thread = threading.Thread(target=stopped)
    thread.start()
    try:
        assert held.wait(10)
        began = time.monotonic()
        with transaction.atomic():
            run_rows.lock_job(LANES_JOB)  # granted once the server ended the idle session (2 s: two leases)
        waited = time.monotonic() - began
    finally:
        wake.set()
        thread.join(30)
    assert 1.0 < waited < 20, waited
    assert ended in (["OperationalError"], ["InterfaceError"], ["InternalError"])  # the session was ended


# -- real worker processes ---------------------------------------------------------------------------------


def _rows(count):
    due = timezone.now() - timedelta(seconds=1)
    Item.objects.bulk_create([Item(n=n, due=due) for n in range(count)], batch_size=5000)


def _assert_each_row_done_once(count):
    assert Item.objects.done().count() == count
    assert Effect.objects.count() == count  # unique on the row: a second finish would have failed
    assert list(Item.objects.values_list("writes", flat=True).distinct()) == [1]


def _drain_then_the_backed_off_rows(rows, workers):
    """Wait for the drain; then make the rows a cut-off attempt had claimed due now (as their backoff's end
    would), kick, and wait for every row."""
    wait_until(
        lambda: not Item.objects.due_now().exists() and not _active(), timeout=180, workers=workers, what="the drain"
    )
    Item.objects.filter(due__isnull=False).update(due=timezone.now())
    kick(LANES_JOB)
    wait_until(lambda: Item.objects.done().count() == rows, timeout=120, workers=workers, what="every row")
    wait_until(lambda: not _active(), workers=workers, what="the lanes' end")


class _Sampler(threading.Thread):
    """Samples how many leases of the job hold a token (runs active or left), and which lanes, until stopped."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.most = 0
        self.lanes: set[int] = set()
        self.samples = 0

    def run(self):
        try:
            while not self.stop.is_set():
                held = list(Lease.objects.filter(job=LANES_JOB, token__isnull=False).values_list("lane", flat=True))
                self.most = max(self.most, len(held))
                self.lanes.update(held)
                self.samples += 1
                time.sleep(0.002)
        finally:
            connections.close_all()


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_never_more_than_lanes_runs_at_once_while_2000_kicks_arrive_from_20_threads_and_no_row_twice():
    env = {"LAB_LANES": 4, "LAB_CLAIM": 5, "LAB_ITEM_SECONDS": 0.002, "FABRIKA_POLL_INTERVAL": 0.2}
    workers = [WorkerProcess("--only", LANES_JOB, "--concurrency", "4", **env) for _ in range(3)]
    sampler = _Sampler()
    errors = []

    def kicker(thread):
        try:
            for n in range(100):
                Item.objects.create(n=thread * 100 + n, due=timezone.now())
                kick(LANES_JOB)
        except Exception as exc:  # noqa: BLE001  reported below
            errors.append(exc)
        finally:
            connections.close_all()

    try:
        for worker in workers:
            wait_until(lambda w=worker: "Worker started" in w.output(), workers=[worker], what="a worker's start")
        sampler.start()
        threads = [threading.Thread(target=kicker, args=(t,)) for t in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        wait_until(lambda: Item.objects.done().count() == 2000, timeout=120, workers=workers, what="every row done")
        wait_until(lambda: not _active(), workers=workers, what="the lanes' end")
    finally:
        sampler.stop.set()
        sampler.join(10)
        for worker in workers:
            worker.kill()
    _assert_each_row_done_once(2000)
    # The lanes job's workers ran at most its 4 lanes at once (3 workers x 4 slots = 12), and did run several.
    assert sampler.samples > 10
    assert 2 <= sampler.most <= 4, (sampler.most, sampler.lanes)
    assert sampler.lanes <= {0, 1, 2, 3}
    assert set(Attempt.objects.filter(job=LANES_JOB).values_list("outcome", flat=True)) == {"succeeded"}


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_20000_row_drain_in_8_lanes_over_3_workers_loses_no_row_when_one_worker_is_sigkilled():
    rows = 20_000
    _rows(rows)
    env = {"LAB_LANES": 8, "FABRIKA_LEASE_SECONDS": 2, "FABRIKA_POLL_INTERVAL": 0.2}
    workers = [WorkerProcess("--only", LANES_JOB, "--concurrency", "3", **env) for _ in range(3)]
    try:
        for worker in workers:
            wait_until(lambda w=worker: "Worker started" in w.output(), workers=[worker], what="a worker's start")
        kick(LANES_JOB)
        victim = workers[0]
        # The victim holds lanes of its own before it dies.
        wait_until(
            lambda: (
                Lease.objects.filter(job=LANES_JOB, holder__contains=f":{victim.pid}:").exists()
                and Item.objects.done().count() >= 2000
            ),
            timeout=120,
            workers=workers,
            what="the victim running a lane mid-drain",
        )
        victim.signal(signal.SIGKILL)
        victim.wait(30)
        # Read at once: the leases expire 2 s after the last renewal, and only then can anyone take them over.
        victim_lanes = set(
            Lease.objects.filter(job=LANES_JOB, holder__contains=f":{victim.pid}:").values_list("lane", flat=True)
        )
        survivors = workers[1:]
        assert Item.objects.done().count() < rows
        # The others drain what nobody holds, and take the dead lanes over once their leases expire.
        wait_until(
            lambda: Attempt.objects.filter(job=LANES_JOB, outcome="crashed").count() >= len(victim_lanes),
            timeout=120,
            workers=survivors,
            what="the dead lanes taken over",
        )
        wait_until(
            lambda: not Item.objects.due_now().exists() and not _active(),
            timeout=300,
            workers=survivors,
            what="the table drained",
        )
        # What the dead lanes had claimed waits for its backoff (a minute), not lost: at most a batch a lane,
        # claimed once. A drain slower than the backoff (a loaded machine) has done some of them again already.
        waiting = Item.objects.filter(due__isnull=False)
        assert 0 < waiting.count() + Item.objects.filter(attempts=2).count()
        assert waiting.count() <= 50 * len(victim_lanes)
        assert set(waiting.values_list("attempts", "writes").distinct()) <= {(1, 0)}
        # Bring the backoff's end forward, as the clock would, and kick: those rows get done, once.
        waiting.update(due=timezone.now())
        kick(LANES_JOB)
        wait_until(lambda: Item.objects.done().count() == rows, timeout=120, workers=survivors, what="every row")
    finally:
        for worker in workers:
            worker.kill()
    _assert_each_row_done_once(rows)
    assert Item.objects.filter(attempts=2).count() > 0  # the dead lanes' rows, claimed again after the backoff
    crashed = Attempt.objects.filter(job=LANES_JOB, outcome="crashed")
    assert set(crashed.values_list("lane", flat=True)) == victim_lanes
    assert all(f":{victim.pid}:" in holder for holder in crashed.values_list("holder", flat=True))


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_sigterm_stops_the_lanes_of_one_worker_and_the_other_workers_lanes_go_on():
    rows = 3000
    _rows(rows)
    env = {"LAB_LANES": 4, "LAB_ITEM_SECONDS": 0.002, "FABRIKA_LEASE_SECONDS": 60, "FABRIKA_POLL_INTERVAL": 0.2}
    first = WorkerProcess("--only", LANES_JOB, "--concurrency", "2", **env)
    second = WorkerProcess("--only", LANES_JOB, "--concurrency", "2", **env)
    workers = [first, second]
    try:
        for worker in workers:
            wait_until(lambda w=worker: "Worker started" in w.output(), workers=[worker], what="a worker's start")
        kick(LANES_JOB)
        wait_until(
            lambda: (
                {first.pid, second.pid}
                <= {
                    int(h.split(":")[1])
                    for h in Lease.objects.filter(job=LANES_JOB).exclude(holder="").values_list("holder", flat=True)
                }
            ),
            timeout=60,
            workers=workers,
            what="lanes in both workers",
        )
        first.signal(signal.SIGTERM)
        assert first.wait(20) == 0, first.output()
        # Its lanes were released at once (a 60 s lease would still hold them otherwise), the other's run on.
        assert not Lease.objects.filter(job=LANES_JOB, holder__contains=f":{first.pid}:", token__isnull=False)
        _drain_then_the_backed_off_rows(rows, [second])
    finally:
        for worker in workers:
            worker.kill()
    _assert_each_row_done_once(rows)
    outcomes = Attempt.objects.filter(job=LANES_JOB)
    stopped = outcomes.filter(holder__contains=f":{first.pid}:").exclude(outcome="succeeded")
    assert set(stopped.values_list("outcome", flat=True)) == {"shutdown"}
    assert not outcomes.filter(holder__contains=f":{second.pid}:").exclude(outcome="succeeded").exists()


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_cut_connection_of_one_lane_fails_only_that_lanes_attempt_and_no_row_is_lost():
    from fabrika_django._sql.fence import FENCE_LOCK_CLASS

    rows = 3000
    _rows(rows)
    env = {"LAB_LANES": 4, "LAB_ITEM_SECONDS": 0.002, "FABRIKA_POLL_INTERVAL": 0.2}
    worker = WorkerProcess("--only", LANES_JOB, "--concurrency", "4", **env)
    try:
        kick(LANES_JOB)
        wait_until(lambda: len(_active()) >= 2, timeout=60, workers=[worker], what="two lanes running")
        lane, lease_id = Lease.objects.filter(job=LANES_JOB, token__isnull=False).values_list("lane", "pk")[0]
        # That lane's session: the one holding its fence's advisory lock (keyed by its lease), in a transaction.
        sql = (
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
            "AND objid = %s AND objsubid = 2 AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )

        def cut():
            with connection.cursor() as cursor:
                cursor.execute(sql, [FENCE_LOCK_CLASS, lease_id])
                return cursor.fetchall()

        wait_until(cut, timeout=30, workers=[worker], what="the lane's session in a fenced transaction")
        _drain_then_the_backed_off_rows(rows, [worker])
    finally:
        worker.kill()
    _assert_each_row_done_once(rows)
    failed = Attempt.objects.filter(job=LANES_JOB).exclude(outcome="succeeded")
    assert failed.exists()
    assert set(failed.values_list("lane", flat=True)) == {lane}  # the other lanes were not touched


@pytest.mark.postgresql  # the frozen holder's fenced transactions are ended through pg_terminate_backend
@pytest.mark.django_db(transaction=True)
def test_a_frozen_workers_lanes_are_taken_over_and_its_stale_attempts_write_nothing_when_it_wakes():
    rows = 3000
    _rows(rows)
    env = {"LAB_LANES": 4, "LAB_ITEM_SECONDS": 0.002, "FABRIKA_LEASE_SECONDS": 2, "FABRIKA_POLL_INTERVAL": 0.2}
    frozen = WorkerProcess("--only", LANES_JOB, "--concurrency", "2", **env)
    other = WorkerProcess("--only", LANES_JOB, "--concurrency", "2", **env)
    workers = [frozen, other]
    try:
        kick(LANES_JOB)
        wait_until(
            lambda: Lease.objects.filter(
                job=LANES_JOB, holder__contains=f":{frozen.pid}:", token__isnull=False
            ).exists(),
            timeout=60,
            workers=workers,
            what="a lane in the worker to freeze",
        )
        frozen.signal(signal.SIGSTOP)
        try:
            wait_until(
                lambda: Attempt.objects.filter(job=LANES_JOB, outcome="crashed").exists(),
                timeout=60,
                workers=[other],
                what="the frozen lane taken over",
            )
        finally:
            frozen.signal(signal.SIGCONT)
        _drain_then_the_backed_off_rows(rows, workers)
    finally:
        for worker in workers:
            worker.kill()
    _assert_each_row_done_once(rows)
    crashed = Attempt.objects.filter(job=LANES_JOB, outcome="crashed")
    assert all(f":{frozen.pid}:" in holder for holder in crashed.values_list("holder", flat=True))


# -- what operators read --------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_status_the_jobs_page_the_overview_and_the_metric_show_active_lanes_of_lanes(admin_client):
    import json
    from io import StringIO

    from django.core.management import call_command
    from prometheus_client.parser import text_string_to_metric_families

    runner.sync_jobs([LANES_JOB])
    _start(LANES_JOB, "first")
    run_pending.ask_for_lane(LANES_JOB, 8)
    _start(LANES_JOB, "second", mark_pending=False)
    run_pending.ask_for_lane(LANES_JOB, 8)
    _start(LANES_JOB, "third", mark_pending=False)

    text, as_json = StringIO(), StringIO()
    call_command("fabrika_job", "status", stdout=text)
    call_command("fabrika_job", "status", "--json", stdout=as_json)
    line = next(line for line in text.getvalue().splitlines() if line.startswith(LANES_JOB))
    assert "active 3/8" in line
    job = next(job for job in json.loads(as_json.getvalue())["jobs"] if job["name"] == LANES_JOB)
    assert (job["state"], job["active"], job["active_lanes"], job["lanes"]) == ("active 3/8", True, 3, 8)

    jobs_page = admin_client.get("/admin/fabrika_django/job/").content.decode()
    overview = admin_client.get("/admin/fabrika_django/overview/").content.decode()
    assert "active 3/8" in jobs_page
    assert "active 3/8" in " ".join(overview.split())

    metrics = admin_client.get("/metrics/fabrika/").content.decode()
    samples = {
        (sample.name, sample.labels.get("job")): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
    }
    assert samples[("fabrika_job_active_lanes", LANES_JOB)] == 3
    assert samples[("fabrika_job_active_lanes", "lab_slow")] == 0


@pytest.mark.django_db(transaction=True)
def test_the_lanes_bench_check_without_effects_passes_a_clean_drain_and_catches_a_row_claimed_twice():
    """bench/lanes.py's default handler makes no Effect: its check must still see a row two lanes claimed."""
    from django.db import transaction

    from bench.lanes import _check
    from fabrika_django import VersionConflict
    from fabrika_django._running import ActiveRun, running
    from fabrika_django.schedule import Schedule

    job = CronJob(name="bench_check", func=lambda ctx: None, schedule=Schedule("*/5 * * * *"))

    def finish(row):
        with transaction.atomic():
            row.finish(writes=row.writes + 1)

    past = timezone.now() - timedelta(seconds=1)
    Item.objects.bulk_create([Item(n=n, due=past) for n in range(3)])
    with running(ActiveRun(job=job)):
        for row in Item.objects.claim(limit=3):
            finish(row)
    _check(3, effects=False)  # claimed once, finished once

    Item.objects.all().delete()
    Item.objects.bulk_create([Item(n=n, due=past) for n in range(3)])
    with running(ActiveRun(job=job)):
        first = Item.objects.claim(limit=3)
        # A second lane's claim of a row the first still holds (what SKIP LOCKED and the lease rule out).
        Item.objects.filter(pk=first[0].pk).update(due=past)
        (again,) = Item.objects.claim(limit=1)
        assert again.pk == first[0].pk
        finish(again)
        with pytest.raises(VersionConflict):
            finish(first[0])
        for row in first[1:]:
            finish(row)
    assert Item.objects.done().count() == 3  # every row done once: counting alone would pass
    with pytest.raises(SystemExit, match="versions"):
        _check(3, effects=False)
