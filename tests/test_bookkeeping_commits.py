"""Durable by default: the commits that count an attempt wait for the WAL flush unless the settings say not to.

PostgreSQL only (the one database where fabrika chooses a commit's durability): ``set_config(..., true)`` lasts
for its transaction, so the statement's effect is read back with ``SHOW`` inside the same transaction.
"""

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from fabrika_django import kick, runner
from fabrika_django._runs.pending import take_kicks
from fabrika_django._runs.statement import statement
from fabrika_django._runs.task_claim import claim_at_start
from fabrika_django._sql import runs as run_sql
from fabrika_django.jobs import registry
from fabrika_django.models import KickRequest
from testproject.lab.models import Item

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]


def _commit_mode_after_taking_a_kick():
    runner.sync_jobs(["lab_items"])
    with transaction.atomic():
        kick("lab_items")
        assert take_kicks(["lab_items"]) == ["lab_items"]
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            return cursor.fetchone()[0]


def test_taking_kicks_commits_durably_by_default():
    assert _commit_mode_after_taking_a_kick() == "on"
    assert not KickRequest.objects.exists()


def test_async_bookkeeping_commits_lets_taking_kicks_skip_the_flush():
    with override_settings(FABRIKA={**django_settings.FABRIKA, "ASYNC_BOOKKEEPING_COMMITS": True}):
        assert _commit_mode_after_taking_a_kick() == "off"


@pytest.mark.parametrize("async_commits", [False, True])
def test_the_run_start_the_task_start_and_the_claim_follow_the_same_setting(async_commits):
    with override_settings(FABRIKA={**django_settings.FABRIKA, "ASYNC_BOOKKEEPING_COMMITS": async_commits}):
        statements = [
            run_sql.free_lease_start(connection, require_pending=True),
            claim_at_start("default", "default")(connection, timezone.now(), registry.get("tasks.default.default"))[0],
            statement(Item, connection, ("due", "pk"), None).sql,  # a queue table's claim, as one statement
        ]
    assert all(("synchronous_commit" in sql) is async_commits for sql in statements)
