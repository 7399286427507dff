"""claim() under concurrency: real threads, each with its own database connection.

On PostgreSQL and MariaDB/MySQL, rows another transaction holds are skipped, never waited for; on SQLite (no
row locks) the claim takes the database write lock first, so two claimers never read the same rows.
"""

import contextlib
import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from fabrika_django._running import ActiveRun, running
from fabrika_django._runs import claim as run_claim
from fabrika_django.models import TASK_ATTEMPTS_CEILING, QueuedTask, TaskStatus
from testproject.lab.models import Item

from .conftest import make_job
from .locks import LOCK_TIMEOUT, failing_lock_waits

NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _due_items(count):
    """``count`` due rows, oldest first by pk, made in one statement."""
    Item.objects.bulk_create([Item(n=i, due=NOON - timedelta(seconds=count - i)) for i in range(count)])
    return list(Item.objects.order_by("pk").values_list("pk", flat=True))


def _due_tasks(count, priorities):
    """``count`` due tasks of the default queue, their priorities cycling through ``priorities``, among tasks the
    claim must pass by: done ones (more than due), given-up ones, tasks not yet due and another queue's. Answers
    the due tasks' pks in claim order (higher priority first, then earlier due, then pk)."""
    task = {"task_path": "testproject.lab.tasks.noop", "backend": "default", "queue_name": "default"}
    other = [QueuedTask(**task, priority=priorities[i % len(priorities)], due=None) for i in range(count * 2)]
    other += [QueuedTask(**task, due=NOON - timedelta(days=1), attempts=TASK_ATTEMPTS_CEILING) for _ in range(100)]
    other += [QueuedTask(**task, priority=100, due=NOON + timedelta(seconds=1 + i)) for i in range(count // 2)]
    other += [QueuedTask(**dict(task, queue_name="other"), due=NOON - timedelta(days=2)) for _ in range(count // 2)]
    for row in other[: count * 2]:
        row.status = TaskStatus.SUCCESSFUL
    QueuedTask.objects.bulk_create(other, batch_size=1000)
    due = [
        QueuedTask(**task, priority=priorities[i % len(priorities)], due=NOON - timedelta(seconds=count - i % 97))
        for i in range(count)
    ]
    QueuedTask.objects.bulk_create(due, batch_size=1000)
    _analyze(QueuedTask)
    mine = QueuedTask.objects.filter(queue_name="default", due__lte=NOON, attempts__lt=TASK_ATTEMPTS_CEILING)
    return list(mine.order_by("-priority", "due", "pk").values_list("pk", flat=True))


def _claim_tasks(limit):
    return [row.pk for row in QueuedTask.objects.claim(limit=limit, where=Q(backend="default", queue_name="default"))]


def _analyze(model=Item):
    """Refresh the table's statistics, as a running database would have them."""
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE TABLE {table}" if connection.vendor == "mysql" else f"ANALYZE {table}")
        if connection.vendor == "mysql":
            cursor.fetchall()  # it answers a status row


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


@pytest.fixture
def effects():
    """A table with one row per effect, its key the item's: a row finished twice would break the key."""
    table = connection.ops.quote_name("test_item_effect")
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {table} (item_id BIGINT NOT NULL PRIMARY KEY, claimer INTEGER NOT NULL)")
    try:
        yield table
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE {table}")


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_eight_threads_claim_and_finish_five_thousand_rows_each_exactly_once(effects):
    _due_items(5000)
    job = make_job(schedule="*/5 * * * *")
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def claimer(number):
        try:
            start.wait(timeout=30)
            with running(ActiveRun(job=job, clock=lambda: NOON)):
                while rows := Item.objects.claim(limit=50):
                    for row in rows:
                        with transaction.atomic(), connection.cursor() as cursor:
                            effect = f"INSERT INTO {effects} (item_id, claimer) VALUES (%s, %s)"
                            cursor.execute(effect, [row.pk, number])
                            row.finish(writes=1)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer, args=(number,)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert errors == []  # an IntegrityError here: a row's effect twice; a VersionConflict: a row claimed twice
    assert not any(thread.is_alive() for thread in threads)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*), COUNT(DISTINCT claimer) FROM {effects}")
        effect_rows, claimers = cursor.fetchone()
    assert effect_rows == 5000
    assert claimers > 1  # they did run at once
    assert not Item.objects.waiting().exists()
    assert set(Item.objects.values_list("attempts", "version", "writes", "due")) == {(1, 2, 1, None)}


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


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backlog", [False, True], ids=["mostly-done", "mostly-due"])
def test_on_mariadb_claim_reads_the_due_index_in_order_without_sorting(job_run, backlog):
    """InnoDB locks every row it reads: a claim that scanned the table would lock (and make others skip) it all."""
    Item.objects.bulk_create(
        [Item(n=i, due=NOON - timedelta(seconds=i) if backlog or i % 20 == 0 else None) for i in range(4000)]
    )
    _analyze()
    with job_run(now=NOON), CaptureQueriesContext(connection) as queries:
        assert len(Item.objects.claim(limit=50)) == 50
    (select,) = [query["sql"] for query in queries if query["sql"].startswith("SELECT")]
    assert select.endswith("FOR UPDATE SKIP LOCKED")
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {select}")
        columns = [column[0] for column in cursor.description]
        (plan,) = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    index = next(index.name for index in Item._meta.indexes if index.fields == ["due", "id"])
    assert (plan["type"], plan["key"]) == ("range", index)
    assert "filesort" not in (plan["Extra"] or "")


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_a_claim_in_progress_on_a_backlog_leaves_the_rest_of_the_backlog_to_another_claimer(monkeypatch):
    """Locks only what it takes: on InnoDB a table scan and sort would lock every due row until it commits."""
    pks = _due_items(2000)
    _analyze()  # the optimizer knows most of the table is due

    with _claim_paused_in_a_thread(monkeypatch) as first:
        with running(ActiveRun(job=make_job(), clock=lambda: NOON)):
            second = [row.pk for row in Item.objects.claim(limit=50)]
    assert first == pks[:50]
    assert second == pks[50:100]


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("priorities", [(0,), (2, -1, 0, 1, -2)], ids=["equal-priorities", "mixed-priorities"])
def test_a_task_claim_in_progress_on_a_backlog_leaves_the_next_tasks_to_another_claimer(monkeypatch, priorities):
    """As a queue table's: on MariaDB a claim that read the backlog through an index out of the tasks' claim order
    sorted it, and locked every due task it sorted, so a second claimer (a lane, another worker) found none."""
    in_order = _due_tasks(2000, priorities)

    with _claim_paused_in_a_thread(monkeypatch, claim=lambda: _claim_tasks(10)) as first:
        with running(ActiveRun(job=make_job(), clock=lambda: NOON)):
            second = _claim_tasks(10)
    assert first == in_order[:10]
    assert second == in_order[10:20]


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("priorities", [(0,), (2, -1, 0, 1, -2)], ids=["equal-priorities", "mixed-priorities"])
def test_on_mariadb_the_task_claim_reads_only_the_tasks_it_takes_in_claim_order(job_run, priorities):
    """MariaDB/MySQL build the claim index whole: done, given-up and future tasks are in it, before and among the
    due ones. The claim reads it one priority at a time from that priority's first due task, so it examines (and
    locks) only about the tasks it takes, and sorts nothing."""
    in_order = _due_tasks(2000, priorities)
    with job_run(now=NOON), CaptureQueriesContext(connection) as queries:
        assert _claim_tasks(10) == in_order[:10]
    (select,) = [query["sql"] for query in queries if query["sql"].startswith("SELECT")]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"ANALYZE FORMAT=JSON {select}")
        plan = json.loads(cursor.fetchone()[0])
        transaction.set_rollback(True)
    (read,) = _tables_read(plan)
    assert read["key"] == "fabrika_task_claim"
    assert "filesort" not in json.dumps(plan)
    # The ten it takes, and at most the given-up tasks due before them (attempts is not in the index); not the done
    # tasks, the future ones, nor the rest of the backlog.
    assert read["r_rows"] <= 10 + 100


def _tables_read(plan):
    """The tables an ``ANALYZE FORMAT=JSON`` plan reads, wherever they sit in it (under a filesort too)."""
    if isinstance(plan, dict):
        found = [plan["table"]] if isinstance(plan.get("table"), dict) else []
        return found + [table for key, value in plan.items() if key != "table" for table in _tables_read(value)]
    if isinstance(plan, list):
        return [table for value in plan for table in _tables_read(value)]
    return []


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
def test_at_read_committed_a_row_added_among_the_rows_a_claim_holds_does_not_wait_for_it(monkeypatch, isolation):
    """Why fabrika needs READ COMMITTED on MariaDB/MySQL (check fabrika.W040): at REPEATABLE READ the claim's
    locking read also locks the gaps between the rows it walks, and a request adding a row there waits."""
    _due_items(200)
    with _claim_paused_in_a_thread(monkeypatch, isolation=isolation) as first:
        among = Item.objects.filter(pk=first[10]).values_list("due", flat=True).get() + timedelta(microseconds=1)
        with failing_lock_waits():
            if isolation == "read committed":
                Item.objects.create(n=9999, due=among)
            else:
                with pytest.raises(OperationalError, match=LOCK_TIMEOUT):
                    Item.objects.create(n=9999, due=among)


@contextlib.contextmanager
def _claim_paused_in_a_thread(monkeypatch, *, isolation=None, claim=None):
    """Claim 50 rows (or as ``claim`` does) in a thread and hold the claim's transaction open (its rows locked)
    for the block.

    Answers the list of the claimed pks, filled when the block begins.
    """
    claim = claim or (lambda: [row.pk for row in Item.objects.claim(limit=50)])
    locked, release = threading.Event(), threading.Event()
    lease = run_claim._lease
    claimer_thread = []

    def paused_lease(model, using, rows, *args, **kwargs):
        if threading.current_thread() in claimer_thread:
            claimed.extend(row.pk for row in rows)
            locked.set()  # the claimer holds its rows' locks here, inside its transaction
            release.wait(30)
        return lease(model, using, rows, *args, **kwargs)

    monkeypatch.setattr(run_claim, "_lease", paused_lease)
    claimed: list[int] = []

    def claimer():
        try:
            if isolation is not None:
                with connection.cursor() as cursor:
                    cursor.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {isolation.upper()}")
            if connection.vendor == "postgresql":
                # The claim is one statement there (no step between its read and its lease to pause at): it
                # runs inside a transaction the run did not open, which holds its locks until the block ends.
                with transaction.atomic(), running(ActiveRun(job=make_job(), clock=lambda: NOON)):
                    found = claim()
                    if not locked.is_set():  # a claim that goes the long way paused in its lease instead
                        claimed.extend(found)
                        locked.set()
                        release.wait(30)
            else:
                with running(ActiveRun(job=make_job(), clock=lambda: NOON)):
                    claim()
        finally:
            connection.close()

    thread = threading.Thread(target=claimer)
    claimer_thread.append(thread)
    thread.start()
    try:
        assert locked.wait(30)
        yield claimed
    finally:
        release.set()
        thread.join(30)
