"""The places where fabrika relies on what Django does not document, each isolated in one function: these tests
fail when a Django release changes what that function relies on (CI runs them on Django 5.2 and 6.x).

- ``queues._unchanged_since_the_manager``: a queryset's private state and ``Query.__dict__`` tell the manager's
  own queryset from a changed one (the claim's read is compiled once only for the former).
- ``_sql.claim.force_index``: the claim's locking read, as Django compiles it, names its table as
  ``FROM <quoted table>``, where MariaDB's index hint is written.
- ``_runs.kickmarks.kicked_in_transaction`` (``connection.run_on_commit``): tests/test_tasks.py.
- ``_runs.fence.LeaseFence._begin_with`` (the fence's ``BEGIN`` through psycopg's ``pgconn``): tests/test_fence.py.
"""

import pytest
from django.db import connection
from django.db.models import Count, F, Q
from django.utils import timezone

from fabrika_django import queues
from fabrika_django._runs import locked_read
from fabrika_django._sql import claim as claim_sql
from testproject.lab.models import Item

pytestmark = pytest.mark.django_db


def test_the_managers_own_queryset_is_told_unchanged():
    assert queues._unchanged_since_the_manager(Item.objects.all())


@pytest.mark.parametrize(
    "change",
    [
        lambda rows: rows.filter(pk=1),
        lambda rows: rows.exclude(pk=1),
        lambda rows: rows.filter(Q(pk__gt=0) | Q(pk__lt=0)),
        lambda rows: rows.annotate(counted=Count("pk")),
        lambda rows: rows.alias(twice=F("pk") * 2),
        lambda rows: rows.order_by("-pk"),
        lambda rows: rows.defer("attempts"),
        lambda rows: rows.only("pk"),
        lambda rows: rows.distinct(),
        lambda rows: rows.extra(where=["1 = 1"]),
        lambda rows: rows.select_for_update(),
        lambda rows: rows.none(),
        lambda rows: rows.values("pk"),
        lambda rows: rows.values_list("pk"),
        lambda rows: rows[:3],
    ],
)
def test_any_change_to_the_queryset_is_told_changed(change):
    assert not queues._unchanged_since_the_manager(change(Item.objects.all()))


def test_the_claims_compiled_read_names_its_table_where_the_index_hint_goes():
    rows = Item.objects.all()
    read = locked_read.locked(rows._claim_query("default", timezone.now(), None), connection)[:50]
    sql, _params = read.query.get_compiler(connection=connection).as_sql()
    table = connection.ops.quote_name(Item._meta.db_table)
    assert f"FROM {table}" in sql
    hinted = claim_sql.force_index(sql, table, connection.ops.quote_name("an_index"))
    assert hinted.count("FORCE INDEX") == 1
    assert f"FROM {table} FORCE INDEX" in hinted
