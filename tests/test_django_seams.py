"""The places where fabrika relies on what Django does not document, each isolated in one function: these tests
fail when a Django release changes what that function relies on (bin/test runs them on Django 5.2 and 6.x).

- ``_sql.claim.force_index``: the claim's locking read, as Django compiles it, names its table as
  ``FROM <quoted table>``, where MariaDB's index hint is written.
- ``_runs.kickmarks.kicked_in_transaction``: a transaction's on-commit callbacks read from
  ``connection.run_on_commit``, which a rolled-back savepoint empties of its own.
- ``_runs.fence.LeaseFence._begin_with``: the fence's ``BEGIN`` sent through psycopg's ``pgconn`` inside
  Django's ``atomic()``, after which neither psycopg nor Django sends one of its own.
- ``models._queue._declare_indexes``: the queue tables' indexes added after the class is made, written to
  ``_meta.indexes`` and ``_meta.original_attrs``, which the migrations read.
"""

import time
import uuid
from io import StringIO

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from fabrika_django import runner
from fabrika_django._runs import kickmarks, locked_read
from fabrika_django._sql import claim as claim_sql
from fabrika_django.models import Lease, QueueModel
from testproject.lab.models import Item

pytestmark = pytest.mark.django_db


def test_the_claims_compiled_read_names_its_table_where_the_index_hint_goes():
    rows = Item.objects.all()
    read = locked_read.locked(rows._claim_query("default", timezone.now(), None), connection)[:50]
    sql, _params = read.query.get_compiler(connection=connection).as_sql()
    table = connection.ops.quote_name(Item._meta.db_table)
    assert f"FROM {table}" in sql
    hinted = claim_sql.force_index(sql, table, connection.ops.quote_name("an_index"))
    assert hinted.count("FORCE INDEX") == 1
    assert f"FROM {table} FORCE INDEX" in hinted


def test_a_kick_mark_is_seen_in_its_transaction_and_goes_with_its_rolled_back_savepoint():
    def marked():
        return [kickmarks.kicked_in_transaction(name, "default") for name in ("sent", "other")]

    with transaction.atomic():
        assert marked() == [False, False]
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            kickmarks.note_kick("sent", "default")
            assert marked() == [True, False]
            raise ZeroDivisionError
        assert marked() == [False, False]
        with transaction.atomic():
            kickmarks.note_kick("sent", "default")
        assert marked() == [True, False]  # a savepoint released keeps its callbacks


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_after_the_fences_begin_neither_psycopg_nor_django_begins_again():
    """psycopg would send its own BEGIN before the first statement of a transaction it did not see begin; a
    second BEGIN inside a transaction makes PostgreSQL warn (25001), so no notice means no second BEGIN."""
    import psycopg

    from fabrika_django._runs.fence import LeaseFence
    from fabrika_django._signal import AbortSignal

    runner.sync_jobs(["lab_stamp"])
    token = uuid.uuid4()
    lease = Lease.objects.get(job="lab_stamp", lane=0)
    Lease.objects.filter(pk=lease.pk).update(token=token)
    fence = LeaseFence("lab_stamp", token, AbortSignal(time.monotonic() + 60), time.monotonic() + 60, lease.pk)
    connection.ensure_connection()
    raw = connection.connection
    notices = []

    def heard(diagnostic):
        notices.append(diagnostic.sqlstate)

    raw.add_notice_handler(heard)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            assert fence._begin_with(connection)
            assert raw.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            cursor.execute("SELECT txid_current()")
            first = cursor.fetchone()
            Lease.objects.filter(pk=lease.pk).update(expires=timezone.now())
            cursor.execute("SELECT txid_current()")
            assert cursor.fetchone() == first  # one transaction: the fence's, which Django then commits
        assert raw.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        raw.remove_notice_handler(heard)
    assert notices == []


@pytest.mark.parametrize(
    "app", sorted({model._meta.app_label for model in apps.get_models() if issubclass(model, QueueModel)})
)
def test_the_migrations_see_the_indexes_added_to_each_queue_table(app):
    """The claim and dead-row indexes are added after the class is made; the migrations hold them, so a Django
    that stopped reading them from ``_meta`` would find a change here."""
    call_command("makemigrations", app, "--check", "--dry-run", stdout=StringIO())
