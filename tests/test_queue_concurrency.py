"""claim() under concurrency: real threads, each with its own database connection.

On PostgreSQL, rows another transaction holds are skipped, never waited for; on SQLite (no row locks) the
claim takes the database write lock first, so two claimers never read the same rows.
"""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, connection, connections, transaction

from fabrika_django._running import ActiveRun, running
from testproject.lab.models import Item

from .conftest import make_job
from .locks import LOCK_TIMEOUT, failing_lock_waits

NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _due_items(count):
    """``count`` due rows, oldest first by pk, made in one statement."""
    Item.objects.bulk_create([Item(n=i, due=NOON - timedelta(seconds=count - i)) for i in range(count)])
    return list(Item.objects.order_by("pk").values_list("pk", flat=True))


def _claim_in_threads(threads, limit):
    """Let ``threads`` claimers, each on its own connection, claim until none finds a row; answer their claims."""
    job = make_job(schedule="*/5 * * * *")
    start = threading.Barrier(threads)
    claims: list[list[int]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def claimer(mine):
        try:
            start.wait(timeout=30)
            with running(ActiveRun(job=job, clock=lambda: NOON)):
                while rows := Item.objects.claim(limit=limit):
                    mine.extend(row.pk for row in rows)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()  # this thread's own connection

    workers = [threading.Thread(target=claimer, args=(mine,)) for mine in claims]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert errors == []
    assert not any(worker.is_alive() for worker in workers)
    return claims


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_eight_concurrent_claimers_claim_every_row_exactly_once():
    pks = _due_items(3000)

    claims = _claim_in_threads(8, limit=50)

    claimed = [pk for mine in claims for pk in mine]
    assert len(claimed) == len(pks)  # nobody claimed a row twice ...
    assert sorted(claimed) == pks  # ... and together they claimed the whole table
    assert set(Item.objects.values_list("attempts", "version", "due")) == {(1, 1, NOON + timedelta(minutes=5))}


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_claim_skips_a_row_held_for_update_by_another_transaction_and_does_not_wait(job_run):
    held, second, third = _due_items(3)
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {Item._meta.db_table} WHERE id = %s FOR UPDATE", [held])
        # From here, waiting for a lock is an error on this connection, not a delay.
        with failing_lock_waits():
            with pytest.raises(OperationalError, match=LOCK_TIMEOUT), transaction.atomic():
                list(Item.objects.select_for_update().filter(pk=held))  # the control: a locking read would wait

            with job_run(now=NOON):
                claimed = Item.objects.claim(limit=2)

        assert [row.pk for row in claimed] == [second, third]
        assert Item.objects.get(pk=held).attempts == 0
    finally:
        other.rollback()
        other.close()

    with job_run(now=NOON):
        assert [row.pk for row in Item.objects.claim()] == [held]


@pytest.mark.django_db(transaction=True)
def test_two_threads_claiming_at_once_never_get_the_same_row():
    pks = _due_items(300)

    first, second = _claim_in_threads(2, limit=7)

    assert set(first).isdisjoint(second)
    assert sorted(first + second) == pks
    assert set(Item.objects.values_list("attempts", "version")) == {(1, 1)}
