"""claim() on PostgreSQL as one statement (``_runs.claim._claim_in_one``): the locking read, the lease and, for a run in
lanes, the lane ask with its NOTIFY, in autocommit and as a prepared statement. Its rules are claim()'s own; these
tests drive that statement itself, in autocommit, from several threads at once.
"""

import threading
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import psycopg
import pytest
from django.db import connection
from django.db.models import F, Q
from django.test.utils import CaptureQueriesContext

from fabrika_django import kicks, runner
from fabrika_django._running import ActiveRun, AttemptState, LaneDemand, running
from fabrika_django.jobs import registry
from fabrika_django.models import Job, Lease
from testproject.lab.models import Item

from . import processes
from .conftest import make_job

NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
LANES_JOB = "lab_lanes"  # lanes=8 in testproject/lab/jobs.py

pytestmark = [pytest.mark.listen_notify, pytest.mark.django_db(transaction=True)]


def _due_items(count):
    Item.objects.bulk_create([Item(n=i, due=NOON - timedelta(seconds=count - i)) for i in range(count)])
    return list(Item.objects.order_by("pk").values_list("pk", flat=True))


def _lanes_run(demand):
    """The lab job's run in lanes, as the runner makes it: its attempt's state carries the run's LaneDemand."""
    return running(
        ActiveRun(
            job=registry.get(LANES_JOB), clock=lambda: NOON, state=AttemptState(fence=SimpleNamespace(), demand=demand)
        )
    )


def _kicks_until_marker(listener):
    """The kicks heard before a marker this sends now: NOTIFYs of earlier commits come before it, in commit order."""
    marker = f"marker-{uuid.uuid4()}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [kicks.CHANNEL, marker])
    heard = []
    for note in listener.notifies(timeout=10):
        if note.payload == marker:
            return heard
        heard.append(note.payload)
    raise AssertionError("the marker's NOTIFY never came")


def _lane_asked():
    return Job.objects.get(name=LANES_JOB).lane_asked is not None


def test_a_full_claim_asks_for_a_lane_and_wakes_the_workers_in_its_one_statement_only_while_a_lane_is_free():
    runner.sync_jobs([LANES_JOB])
    pks = _due_items(7)
    demand = LaneDemand(LANES_JOB, 8)
    with psycopg.connect(processes.test_database_url(), autocommit=True) as listener:
        listener.execute(f"LISTEN {kicks.CHANNEL}")
        with _lanes_run(demand), CaptureQueriesContext(connection) as queries:
            claimed = Item.objects.claim(limit=2)
        assert [row.pk for row in claimed] == pks[:2]
        assert len(queries) == 1  # read, lease and ask: one statement
        assert demand.last_full
        assert _lane_asked()
        assert _kicks_until_marker(listener) == [LANES_JOB]

        # The flag is up: one ask at a time, so a second full claim neither writes it nor wakes anyone.
        with _lanes_run(demand):
            assert [row.pk for row in Item.objects.claim(limit=2)] == pks[2:4]
        assert _kicks_until_marker(listener) == []

        # Every lane busy: a full claim asks for nothing.
        Job.objects.filter(name=LANES_JOB).update(lane_asked=None)
        for lease in Lease.objects.filter(job=LANES_JOB):
            Lease.objects.filter(pk=lease.pk).update(token=uuid.uuid4())
        with _lanes_run(demand):
            assert [row.pk for row in Item.objects.claim(limit=2)] == pks[4:6]
        assert not _lane_asked()
        assert _kicks_until_marker(listener) == []

        # A lane free again, but the claim is not full (one row of two): no ask.
        Lease.objects.filter(job=LANES_JOB, lane=3).update(token=None)
        with _lanes_run(demand), CaptureQueriesContext(connection) as queries:
            assert [row.pk for row in Item.objects.claim(limit=2)] == pks[6:]
        assert len(queries) == 1
        assert not demand.last_full
        assert not _lane_asked()
        assert _kicks_until_marker(listener) == []


def test_claimed_objects_mirror_what_the_one_statement_wrote_backoff_cap_and_dead_rows_included():
    job = make_job(schedule="0 0 * * *")  # a period of a day: the cap (30 days) comes at the sixth attempt
    Item.objects.bulk_create(
        [
            Item(n=0, due=NOON - timedelta(seconds=3), attempts=0),
            Item(n=1, due=NOON - timedelta(seconds=2), attempts=9, version=4),  # its last attempt
            Item(n=2, due=NOON - timedelta(seconds=1), attempts=10),  # dead: never claimed
            Item(n=3, due=NOON - timedelta(seconds=1), attempts=3, version=7),
            Item(n=4, due=NOON + timedelta(seconds=1)),  # not due yet
        ]
    )
    with running(ActiveRun(job=job, clock=lambda: NOON)), CaptureQueriesContext(connection) as queries:
        claimed = Item.objects.claim(limit=10)
    assert len(queries) == 1
    expected = [
        (0, 1, 1, NOON + timedelta(days=1)),
        (1, 10, 5, NOON + timedelta(days=30)),  # 2**9 days is past the cap
        (3, 4, 8, NOON + timedelta(days=8)),
    ]
    assert [(row.n, row.attempts, row.version, row.due) for row in claimed] == expected
    written = Item.objects.filter(n__in=[0, 1, 3]).order_by("n").values_list("n", "attempts", "version", "due")
    assert list(written) == expected
    assert [row.get_deferred_fields() for row in claimed] == [set()] * 3


def test_eight_threads_claiming_in_lanes_each_claim_one_statement_claim_every_row_exactly_once():
    runner.sync_jobs([LANES_JOB])
    pks = _due_items(2000)
    start = threading.Barrier(8)
    claims: list[list[int]] = [[] for _ in range(8)]
    statements: list[int] = []
    errors: list[BaseException] = []

    def claimer(mine):
        try:
            start.wait(timeout=30)
            with _lanes_run(LaneDemand(LANES_JOB, 8)):
                while True:
                    with CaptureQueriesContext(connection) as queries:
                        rows = Item.objects.claim(limit=7)
                    statements.append(len(queries))
                    if not rows:
                        break
                    mine.extend(row.pk for row in rows)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer, args=(mine,)) for mine in claims]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert not any(thread.is_alive() for thread in threads)
    assert set(statements) == {1}  # every claim took the one-statement way
    claimed = [pk for mine in claims for pk in mine]
    assert len(claimed) == len(pks)  # nobody claimed a row twice ...
    assert sorted(claimed) == pks  # ... and together they claimed the whole table
    assert sum(1 for mine in claims if mine) > 1  # they did claim at once
    assert set(Item.objects.values_list("attempts", "version", "due")) == {(1, 1, NOON + timedelta(minutes=1))}


def test_a_claim_with_a_where_on_its_own_columns_is_one_statement_that_honours_it():
    runner.sync_jobs([LANES_JOB])
    _due_items(6)
    odd = list(Item.objects.filter(n__in=[1, 3, 5]).order_by("pk").values_list("pk", flat=True))
    with _lanes_run(LaneDemand(LANES_JOB, 8)), CaptureQueriesContext(connection) as queries:
        assert [row.pk for row in Item.objects.claim(limit=2, where=Q(n__in=[1, 3, 5]))] == odd[:2]
        assert [row.pk for row in Item.objects.claim(limit=2, where=Q(n__in=[1, 3, 5]) | Q(n=5))] == odd[2:]
        assert Item.objects.claim(limit=2, where=Q(n__in=[1, 3, 5])) == []
    assert len(queries) == 3  # one statement each: read, lease and ask
    assert _lane_asked()  # the first was full: it asked in its statement
    assert set(Item.objects.filter(pk__in=odd).values_list("attempts", flat=True)) == {1}
    assert set(Item.objects.exclude(pk__in=odd).values_list("attempts", flat=True)) == {0}
    with _lanes_run(LaneDemand(LANES_JOB, 8)):
        assert Item.objects.claim(limit=2, where=Q(n__in=[])) == []  # no row can match: nothing claimed
        assert len(Item.objects.claim(limit=2, where=~Q(n__in=[]))) == 2  # every row can


def test_a_claim_on_a_filtered_queryset_goes_the_long_way_and_stays_correct():
    runner.sync_jobs([LANES_JOB])
    _due_items(6)
    odd = list(Item.objects.filter(n__in=[1, 3, 5]).order_by("pk").values_list("pk", flat=True))
    with _lanes_run(LaneDemand(LANES_JOB, 8)), CaptureQueriesContext(connection) as queries:
        assert [row.pk for row in Item.objects.filter(n__in=[1, 3, 5]).claim(limit=2)] == odd[:2]
        assert [row.pk for row in Item.objects.claim(limit=2, where=Q(n__in=[1, 3, 5], writes__lt=F("n")))] == odd[2:]
    assert len(queries) > 2  # BEGIN, read, UPDATE, COMMIT (and the ask) each
    assert _lane_asked()  # the first was full: asked the long way
