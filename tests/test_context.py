"""JobContext members beyond the transaction: the attempt's own thread pool, ctx.executor()."""

import threading

import pytest

from fabrika_django.exceptions import LeaseLost, WriteOutsideTransaction
from fabrika_django.testing import run_job
from testproject.lab.models import Mark

from .jobs_helpers import temporary_job

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_write_from_an_executor_thread_outside_ctx_transaction_is_refused():
    def pooled(ctx):
        with ctx.executor(max_workers=2) as pool:
            pool.submit(Mark.objects.create, job="pooled", note="outside").result()

    with temporary_job(pooled):
        assert run_job("pooled").failure == "write_outside_transaction"
    assert not Mark.objects.exists()


def test_executor_threads_write_inside_ctx_transaction_on_connections_of_their_own():
    seen_threads = set()

    def write(ctx, n):
        seen_threads.add(threading.get_ident())
        with ctx.transaction():
            Mark.objects.create(job="pooled", note=str(n))

    def pooled(ctx):
        with ctx.executor(max_workers=3) as pool:
            for future in [pool.submit(write, ctx, n) for n in range(6)]:
                future.result()

    with temporary_job(pooled):
        assert run_job("pooled").ok
    assert sorted(Mark.objects.values_list("note", flat=True)) == ["0", "1", "2", "3", "4", "5"]
    assert threading.get_ident() not in seen_threads


def test_an_executor_thread_cannot_write_once_the_attempt_lost_its_lease():
    caught = []

    def write(ctx):
        try:
            with ctx.transaction():
                Mark.objects.create(job="pooled", note="late")
        except LeaseLost as exc:
            caught.append(type(exc))
            raise

    def pooled(ctx):
        ctx.signal.abort("lease_lost")
        with ctx.executor(max_workers=1) as pool:
            pool.submit(write, ctx).result()

    with temporary_job(pooled):
        assert run_job("pooled").failure == "lease_lost"
    assert caught == [LeaseLost]
    assert not Mark.objects.exists()


def test_the_executor_refuses_work_after_it_was_shut_down_and_checks_max_workers():
    def pooled(ctx):
        with pytest.raises(ValueError, match="max_workers"):
            ctx.executor(max_workers=0)
        with ctx.executor(max_workers=1) as pool:
            pass
        with pytest.raises(RuntimeError, match="shut down"):
            pool.submit(print)

    with temporary_job(pooled):
        assert run_job("pooled").ok


def test_a_thread_the_handler_starts_itself_is_not_part_of_the_run():
    # Documented in the README: only ctx.executor() carries the run to other threads.
    errors = []

    def plain_thread(ctx):
        def body():
            try:
                with ctx.transaction():
                    pass
            except RuntimeError as exc:
                errors.append(type(exc))

        thread = threading.Thread(target=body)
        thread.start()
        thread.join()

    with temporary_job(plain_thread):
        assert run_job("plain_thread").ok
    assert errors == [RuntimeError]
    assert WriteOutsideTransaction  # the refusal an executor thread gets instead


@pytest.mark.postgresql
def test_an_executor_thread_stuck_in_the_database_is_cut_off_with_an_abandoned_attempt():
    from datetime import timedelta

    from django.db import OperationalError, connection

    cut = threading.Event()

    def stuck(ctx):
        try:
            with ctx.transaction(), connection.cursor() as cursor:
                Mark.objects.create(job="stuck", note="never committed")
                cursor.execute("SELECT pg_sleep(60)")  # ignores the attempt's abort
        except OperationalError:
            cut.set()

    def pooled(ctx):
        with ctx.executor(max_workers=1) as pool:
            pool.submit(stuck, ctx)

    with temporary_job(pooled, timeout=timedelta(seconds=1)):
        assert run_job("pooled").failure == "timed_out"
        assert cut.wait(20), "the executor thread's connection was not cut off"
    assert not Mark.objects.exists()
