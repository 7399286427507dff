"""Reliability: what killing, freezing and cutting off workers found, each on real processes and PostgreSQL.

Each test waits for the event the rule promises (a row done, a takeover, a recorded outcome) and fails with the
workers' logs when it does not come.
"""

import dataclasses
import io
import signal
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.backends.signals import connection_created
from django.db.models.functions import Now
from django.utils import timezone

from fabrika_django import kick
from fabrika_django.models import Attempt, Job, Lease
from fabrika_django.testing import run_job
from testproject.lab.models import Item, Mark

from .jobs_helpers import temporary_job
from .processes import start_manage
from .workers import WorkerProcess, wait_until

# A short lease and a quick poll: a takeover comes within seconds, so a stall stands out.
SHORT = {"FABRIKA_LEASE_SECONDS": 2, "FABRIKA_POLL_INTERVAL": 0.2}


def _past():
    return timezone.now() - timedelta(seconds=1)


def _lease_expired(name):
    """True once the job's lease expired by the database's clock (its holder stopped renewing it)."""
    return Lease.objects.filter(job=name, token__isnull=False, expires__lt=Now()).exists()


def _started(worker):
    wait_until(lambda: "Worker started" in worker.output(), workers=[worker], what=f"worker {worker.pid} to start")


# -- 1. a run cut off with nobody taking over leaves the job pending ---------------------------------------


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_run_cut_off_by_a_frozen_worker_leaves_the_job_pending_and_its_rows_get_done():
    Item.objects.bulk_create([Item(n=n, due=_past()) for n in range(300)])
    worker = WorkerProcess("--only", "lab_items", LAB_ITEM_SECONDS=0.02, **SHORT)
    try:
        _started(worker)
        kick("lab_items")
        wait_until(lambda: Item.objects.done().count() >= 20, workers=[worker], what="the first rows done")
        worker.signal(signal.SIGSTOP)
        wait_until(lambda: _lease_expired("lab_items"), what="the frozen worker's lease to expire")
        worker.signal(signal.SIGCONT)
        wait_until(
            lambda: Attempt.objects.filter(job="lab_items", outcome="lease_lost").exists(),
            workers=[worker],
            what="the frozen attempt to end lease_lost",
        )
        # Nobody kicks: the job must run again on its own and take every row never claimed.
        wait_until(
            lambda: (
                not Item.objects.filter(attempts=0).exists()
                and Attempt.objects.filter(job="lab_items", outcome="succeeded").exists()
            ),
            timeout=30,
            workers=[worker],
            what="the job to run again by itself after its run was cut off",
        )
    finally:
        worker.kill()
    # Only the batch the cut-off attempt held waits for its backoff.
    assert Item.objects.waiting().count() <= 50


@pytest.mark.django_db(transaction=True)
def test_an_attempt_frozen_past_its_lease_is_over_even_when_nobody_took_the_lease():
    # lab_patient waits on ctx.signal and writes nothing, so only the renewing thread acts once the process
    # goes on: a late renewal that still finds the token must not carry the attempt on as if it never stopped.
    reasons = Path(tempfile.mkdtemp()) / "reasons"
    worker = WorkerProcess("--only", "lab_patient", LAB_PATIENT_SECONDS=60, LAB_SIGNAL_FILE=str(reasons), **SHORT)
    try:
        _started(worker)
        kick("lab_patient")
        wait_until(lambda: Mark.objects.filter(job="lab_patient").exists(), workers=[worker], what="its start")
        worker.signal(signal.SIGSTOP)
        wait_until(lambda: _lease_expired("lab_patient"), what="the frozen worker's lease to expire")
        worker.signal(signal.SIGCONT)
        wait_until(
            lambda: Attempt.objects.filter(job="lab_patient", outcome="lease_lost").exists(),
            timeout=15,
            workers=[worker],
            what="the frozen attempt to end lease_lost",
        )
    finally:
        worker.kill()
    assert reasons.read_text().split()[1:] == ["lease_lost"]


@pytest.mark.django_db(transaction=True)
def test_a_takeover_that_finds_the_holder_back_coalesces_and_leaves_the_job_pending(monkeypatch):
    from django.conf import settings as django_settings
    from django.test import override_settings

    from fabrika_django import runner
    from fabrika_django.worker import Worker

    runner.sync_jobs(["lab_items"])
    # The holder renewed after all, between the worker's scan (which saw its lease expired) and the takeover.
    Lease.objects.filter(job="lab_items").update(
        token=uuid.uuid4(), holder="back:1:1", run_id=uuid.uuid4(), attempt=1, expires=Now() + timedelta(minutes=1)
    )
    scan = Worker._read_states

    def seen_expired(worker):
        states = scan(worker)
        states["lab_items"] = dataclasses.replace(states["lab_items"], held=False, orphaned=1)
        return states

    monkeypatch.setattr(Worker, "_read_states", seen_expired)
    worker = Worker(install_signals=False, only=["lab_items"])
    thread = threading.Thread(target=worker.run)
    with override_settings(FABRIKA={**django_settings.FABRIKA, "POLL_INTERVAL": 0.05}):
        thread.start()
        try:
            wait_until(
                lambda: Job.objects.filter(name="lab_items", pending_since__isnull=False).exists(),
                what="the coalesced takeover's pending flag",
            )
        finally:
            worker.stop()
            thread.join(30)
    assert Lease.objects.get(job="lab_items").holder == "back:1:1"


# -- 2. a poison row kills only itself ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_poison_row_inside_ctx_row_is_the_only_dead_row(fabrika_clock):
    Item.objects.bulk_create([Item(n=n, due=fabrika_clock.now - timedelta(seconds=1)) for n in range(100)])

    def poison_batch(ctx):
        while rows := Item.objects.claim(limit=50):
            for row in rows:
                with ctx.row(row, step="work"):
                    if row.n == 10:
                        raise ValueError("poison")
                    with ctx.transaction():
                        row.finish()

    with temporary_job(poison_batch):
        for _ in range(12):
            assert run_job("poison_batch").ok
            fabrika_clock.advance(timedelta(days=31))  # past any backoff
    assert list(Item.objects.dead().values_list("n", "last_failure")) == [(10, "work")]
    assert Item.objects.done().count() == 99


# -- 3. the real outcome is recorded once the connection is back ---------------------------------------


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_an_attempt_failed_by_a_connection_cut_is_recorded_as_it_ended_not_as_crashed():
    worker = WorkerProcess("--only", "lab_reader", FABRIKA_POLL_INTERVAL=0.2)
    try:
        _started(worker)
        kick("lab_reader")
        wait_until(lambda: Mark.objects.filter(job="lab_reader").exists(), workers=[worker], what="the start")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )

        def first_attempt():
            return Attempt.objects.filter(job="lab_reader").order_by("started", "id").first()

        wait_until(lambda: first_attempt().outcome != "running", workers=[worker], what="the attempt's end recorded")
    finally:
        worker.kill()
    attempt = first_attempt()
    assert (attempt.outcome, attempt.error_class.rsplit(".", 1)[-1]) == ("handler_failed", "OperationalError")


@pytest.mark.django_db(transaction=True)
def test_an_attempt_whose_end_cannot_be_written_keeps_its_outcome_until_the_database_is_back(monkeypatch):
    from django.conf import settings as django_settings
    from django.db import OperationalError
    from django.test import override_settings

    from fabrika_django._runs import lease as run_lease
    from fabrika_django.worker import Worker

    # The database is away for the attempt's end (its first write and the retry on a new connection) and for
    # the run's end; it is back for the worker's next scan.
    failures = {"end_attempt": 2, "end_run": 1}

    def away(name):
        real = getattr(run_lease, name)

        def write(*args, **kwargs):
            if failures[name]:
                failures[name] -= 1
                raise OperationalError("server closed the connection unexpectedly")
            return real(*args, **kwargs)

        return write

    for name in failures:
        monkeypatch.setattr(run_lease, name, away(name))

    def fails_on_its_own(ctx):
        raise ValueError("the handler's own failure")

    def first_attempt():
        return Attempt.objects.filter(job="fails_on_its_own").order_by("started", "id").first()

    with temporary_job(fails_on_its_own):
        worker = Worker(install_signals=False, only=["fails_on_its_own"])
        thread = threading.Thread(target=worker.run)
        with override_settings(FABRIKA={**django_settings.FABRIKA, "POLL_INTERVAL": 0.05}):
            thread.start()
            try:
                kick("fails_on_its_own")
                wait_until(lambda: first_attempt() and first_attempt().outcome != "running", what="the first end")
            finally:
                worker.stop()
                thread.join(30)
    attempt = first_attempt()
    assert (attempt.outcome, attempt.error_class.rsplit(".", 1)[-1]) == ("handler_failed", "ValueError")
    assert failures == {"end_attempt": 0, "end_run": 0}


@pytest.mark.django_db(transaction=True)
def test_a_kept_outcome_is_written_when_the_run_goes_on_to_its_next_attempt(monkeypatch):
    """A server restart: the first attempt's end cannot be written, the run retries and succeeds.

    The first attempt must end as it ended (handler_failed), not stay ``running`` until a takeover marks it
    ``crashed`` (the chaos bench's restarts showed that).
    """
    from django.conf import settings as django_settings
    from django.db import OperationalError
    from django.test import override_settings

    from fabrika_django._runs import lease as run_lease
    from fabrika_django.worker import Worker

    real_end_attempt = run_lease.end_attempt
    failures = {"end_attempt": 2}  # the attempt's end, and the retry on a new connection

    def end_attempt(*args, **kwargs):
        if failures["end_attempt"]:
            failures["end_attempt"] -= 1
            raise OperationalError("the database system is shutting down")
        return real_end_attempt(*args, **kwargs)

    monkeypatch.setattr(run_lease, "end_attempt", end_attempt)
    calls = []

    def fails_once(ctx):
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise OperationalError("terminating connection due to administrator command")

    def attempts():
        return list(Attempt.objects.filter(job="fails_once").order_by("number").values_list("number", "outcome"))

    with temporary_job(fails_once, retries=1):
        worker = Worker(install_signals=False, only=["fails_once"])
        thread = threading.Thread(target=worker.run)
        with override_settings(FABRIKA={**django_settings.FABRIKA, "POLL_INTERVAL": 0.05}):
            thread.start()
            try:
                kick("fails_once")
                wait_until(lambda: (2, "succeeded") in attempts(), what="the second attempt's success")
                wait_until(lambda: not Lease.objects.filter(job="fails_once", token__isnull=False).exists(),
                           what="the run's end")  # fmt: skip
            finally:
                worker.stop()
                thread.join(30)
    assert calls == [1, 2]
    assert attempts() == [(1, "handler_failed"), (2, "succeeded")]


# -- 4. a stale attempt's end leaves the job's summary alone -------------------------------------------


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_stale_attempt_ending_after_a_takeover_leaves_the_summary_to_the_run_that_goes_on():
    Item.objects.bulk_create([Item(n=n, due=_past()) for n in range(1000)])
    env = dict(SHORT, LAB_ITEM_SECONDS=0.05)
    # One run at a time in the first worker: its lab_stamp run starts only once its lab_items run ended.
    first = WorkerProcess("--only", "lab_items,lab_stamp", "--concurrency", "1", **env)
    second = None
    try:
        _started(first)
        kick("lab_items")
        wait_until(lambda: Item.objects.done().count() >= 10, workers=[first], what="the first rows done")
        second = WorkerProcess("--only", "lab_items", **env)
        _started(second)
        first.signal(signal.SIGSTOP)
        wait_until(
            lambda: Lease.objects.filter(job="lab_items", holder__contains=f":{second.pid}:").exists(),
            workers=[second],
            what="the second worker's takeover",
        )
        first.signal(signal.SIGCONT)
        kick("lab_stamp")
        wait_until(
            lambda: Mark.objects.filter(job="lab_stamp", pid=first.pid).exists(),
            workers=[first, second],
            what="the first worker's stale run to end (its next run started)",
        )
        job = Job.objects.get(name="lab_items")
        lease = Lease.objects.get(job="lab_items")
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert f":{second.pid}:" in lease.holder and lease.run_id == job.last_run_id  # the run goes on
    assert (job.last_outcome, job.failures_in_row) == ("", 0)


# -- 5. `fabrika_job run` names the run it started -----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_command_names_the_run_that_did_the_work_not_the_rerun_for_a_kick_during_it():
    proc = start_manage("fabrika_job", "run", "lab_slow", LAB_SLOW_SECONDS=2)
    try:
        deadline = time.monotonic() + 30
        while not Mark.objects.filter(job="lab_slow").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        kick("lab_slow")  # during the run: it runs once more before the command ends
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert Attempt.objects.filter(job="lab_slow").count() == 2
    started = Attempt.objects.get(job="lab_slow", trigger="manual").run_id
    assert f"(run {started})" in out, out


# -- 6. a holder frozen inside ctx.transaction() blocks its job about a lease ----------------------------


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_holder_frozen_inside_a_fenced_transaction_blocks_the_takeover_only_about_a_lease():
    with tempfile.TemporaryDirectory() as folder:
        hold = Path(folder) / "hold"
        hold.touch()
        first = WorkerProcess("--only", "lab_hold", LAB_HOLD_FILE=hold, **SHORT)
        second = None
        try:
            _started(first)
            kick("lab_hold")
            wait_until(lambda: hold.read_text(), workers=[first], what="the first attempt inside its transaction")
            second = WorkerProcess("--only", "lab_hold", **SHORT)
            _started(second)
            first.signal(signal.SIGSTOP)
            stopped = time.monotonic()
            # Bounded by the lease (2 s: on PostgreSQL the takeover ends the frozen session, on MariaDB the
            # server's idle-transaction timeout of one lease does), then a poll and the start of a run; a loaded
            # machine gets a margin, but a takeover that waits for the frozen transaction never comes while the
            # holder stays frozen.
            bound = 10
            wait_until(
                lambda: Mark.objects.filter(job="lab_hold", pid=second.pid).exists(),
                timeout=bound,
                workers=[second],
                what="the takeover while the holder is frozen inside ctx.transaction()",
            )
            assert time.monotonic() - stopped < bound
        finally:
            first.signal(signal.SIGCONT)
            first.kill()
            if second is not None:
                second.kill()
    # The frozen attempt's transaction never committed: one start, the second worker's.
    assert list(Mark.objects.filter(job="lab_hold").values_list("pid", flat=True)) == [second.pid]


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_on_mariadb_a_fabrika_process_s_idle_transactions_end_after_one_lease(settings):
    from fabrika_django._sessions import bound_idle_transactions

    if "mariadb" not in connection.mysql_server_info.lower():
        pytest.skip("MySQL has no idle_transaction_timeout: a frozen holder waits there until it resumes")
    settings.FABRIKA = {**settings.FABRIKA, "LEASE_SECONDS": 7.5}
    connection.ensure_connection()
    try:
        bound_idle_transactions()
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@session.idle_transaction_timeout")
            assert cursor.fetchone()[0] == 8  # one lease, in whole seconds: the frozen holder's bound is its lease
    finally:  # the bound is a worker's: this test process's later connections go without it
        connection_created.disconnect(dispatch_uid="fabrika_bound_idle_transactions")
        connection.close()


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_the_server_ends_a_cut_off_fabrika_session_within_two_leases(settings):
    from fabrika_django._sessions import bound_idle_transactions

    settings.FABRIKA = {**settings.FABRIKA, "LEASE_SECONDS": 7.5}
    connection.close()
    try:
        bound_idle_transactions()
        connection.ensure_connection()  # a new connection: the bound comes with it
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'), "
                "current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout'), "
                "inet_client_addr() IS NOT NULL"
            )
            idle, interval, count, user_timeout, over_tcp = cursor.fetchone()
        if not over_tcp:
            pytest.skip("a Unix socket has no TCP keepalives: the server ignores the settings there")
        # The first probe after a lease of silence, three a third of a lease apart: about two leases in all.
        assert (idle, interval, count, user_timeout) == ("8", "3", "3", "7500")  # the last in milliseconds
    finally:  # the bound is a worker's: this test process's later connections go without it
        connection_created.disconnect(dispatch_uid="fabrika_bound_idle_transactions")
        connection.close()


# -- 7. a requeue kicks the jobs that claim the table --------------------------------------------------


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_requeued_dead_row_of_a_kick_only_job_runs_within_seconds():
    worker = WorkerProcess("--only", "lab_items", FABRIKA_POLL_INTERVAL=0.2)
    try:
        _started(worker)
        Item.objects.create(n=1, due=_past())
        kick("lab_items")  # lab_items claims lab.Item once: fabrika remembers it
        wait_until(lambda: Item.objects.done().exists(), workers=[worker], what="the first row done")
        wait_until(lambda: Lease.objects.filter(job="lab_items", token=None).exists(), workers=[worker])
        dead = Item.objects.create(n=2, due=_past(), attempts=10)
        call_command("fabrika_job", "requeue", "lab.Item", "--id", str(dead.pk), stdout=io.StringIO())
        wait_until(
            lambda: Item.objects.get(pk=dead.pk).due is None,
            timeout=15,
            workers=[worker],
            what="the requeued row done",
        )
    finally:
        worker.kill()


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_live_holder_inside_a_long_fenced_transaction_keeps_its_lease_and_commits():
    with tempfile.TemporaryDirectory() as folder:
        hold = Path(folder) / "hold"
        hold.touch()
        # Three leases long inside one transaction: renewals keep the lease, so nobody ends it.
        first = WorkerProcess("--only", "lab_hold", LAB_HOLD_FILE=hold, LAB_HOLD_SECONDS=6, **SHORT)
        second = None
        try:
            _started(first)
            second = WorkerProcess("--only", "lab_hold", LAB_HOLD_FILE=hold, LAB_HOLD_SECONDS=6, **SHORT)
            _started(second)
            kick("lab_hold")
            wait_until(
                lambda: Attempt.objects.filter(job="lab_hold").exclude(outcome="running").exists(),
                timeout=60,
                workers=[first, second],
                what="the long attempt's end",
            )
        finally:
            first.kill()
            if second is not None:
                second.kill()
    holders = list(Attempt.objects.filter(job="lab_hold").values_list("outcome", "holder"))
    assert len(holders) == 1 and holders[0][0] == "succeeded"
    (pid,) = Mark.objects.filter(job="lab_hold").values_list("pid", flat=True)
    assert f":{pid}:" in holders[0][1]
