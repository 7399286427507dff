"""The kick's and the start's statements are prepared once per session, by a name that is their text's hash."""

import pytest
from django.db import connection, transaction

from fabrika_django import runner
from fabrika_django._runs import start as run_start
from fabrika_django._sql import prepared as _prepared
from fabrika_django.kicks import request_run
from fabrika_django.models import Job, Lease

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]


def prepared_statements():
    """This session's fabrika statements: name -> times run (generic plus custom plans)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, generic_plans + custom_plans FROM pg_prepared_statements WHERE name LIKE 'fabrika_%%'"
        )
        return dict(cursor.fetchall())


def pending(name="lab_stamp"):
    return Job.objects.filter(name=name, pending_since__isnull=False).exists()


@pytest.fixture(autouse=True)
def fresh_session_statements():
    """The test database's connection outlives a test: start each with no statement prepared."""
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    _prepared._known.pop(connection.connection, None)


@pytest.fixture
def lab_stamp_rows():
    runner.sync_jobs(["lab_stamp"])


def test_a_kick_prepares_its_statement_once_and_runs_it_again_by_name(lab_stamp_rows):
    request_run("lab_stamp")
    Job.objects.filter(name="lab_stamp").update(pending_since=None)
    request_run("lab_stamp")
    assert pending()
    assert list(prepared_statements().values()) == [2]


def test_a_session_that_lost_its_statements_prepares_again(lab_stamp_rows):
    # What a transaction pooler looks like from here: the next statement reaches a session without it.
    request_run("lab_stamp")
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    Job.objects.filter(name="lab_stamp").update(pending_since=None)
    request_run("lab_stamp")
    assert pending()
    assert list(prepared_statements().values()) == [1]


def test_a_statement_another_try_prepared_under_the_name_is_used(lab_stamp_rows):
    sql = "SELECT %s::int + 1"
    name, prepare, _execute, _names = _prepared._statement(sql)
    with connection.cursor() as cursor:
        cursor.execute(prepare)  # prepared in this session without fabrika knowing it
    _prepared._known.pop(connection.connection, None)
    assert _prepared.fetchone(connection, sql, [41]) == (42,)
    assert prepared_statements() == {name: 1}


def test_the_name_is_the_hash_of_the_text_so_one_name_never_means_two_statements():
    first, _, _, _ = _prepared._statement("SELECT %s::int + 1")
    assert _prepared._statement("SELECT %s::int + 1")[0] == first
    assert _prepared._statement("SELECT %s::int + 2")[0] != first


def test_inside_a_transaction_the_statement_runs_as_it_is(lab_stamp_rows):
    with transaction.atomic():
        request_run("lab_stamp")
        # Nothing prepared, and the transaction goes on (a failed EXECUTE would have aborted it).
        assert prepared_statements() == {}
        assert pending()


def test_the_start_in_one_prepared_statement_leaves_the_session_as_it_was(lab_stamp_rows):
    Job.objects.filter(name="lab_stamp").update(pending_since=None)
    request_run("lab_stamp")
    start = run_start.Start(job="lab_stamp", trigger="kick", holder="t", seconds=30, max_attempt=1, mark_pending=False)
    attempt = run_start._start_on_free_lease(start)
    assert attempt is not None
    assert Lease.objects.get(job="lab_stamp").token is not None
    assert not pending()
    with connection.cursor() as cursor:
        # set_config(..., true): for the start's own transaction only, never the session's later commits.
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone() == ("on",)
    assert len(prepared_statements()) == 2  # the kick's and the start's


def test_named_parameters_get_one_number_each_in_order_of_first_use():
    name, prepare, execute, names = _prepared._statement("SELECT %(b)s::int, %(a)s::int, %(b)s::int")
    assert (prepare, execute, names) == (
        f"PREPARE {name} AS SELECT $1::int, $2::int, $1::int",
        f"EXECUTE {name}(%s, %s)",
        ("b", "a"),
    )
    assert _prepared.fetchone(connection, "SELECT %(b)s::int, %(a)s::int, %(b)s::int", {"a": 1, "b": 2}) == (2, 1, 2)


def test_the_tasks_claim_in_one_prepared_statement_leaves_the_session_as_it_was():
    from django.utils import timezone

    from fabrika_django._runs.claim import claim_params
    from fabrika_django._runs.statement import statement
    from fabrika_django._runs.task_claim import where_of
    from fabrika_django.backoff import DEFAULT_PERIOD
    from fabrika_django.models import QueuedTask

    QueuedTask.objects.create(task_path="testproject.lab.tasks.noop", backend="default", queue_name="default")
    built = statement(QueuedTask, connection, ("-priority", "due", "pk"), where_of("default", "default"))
    sql = built.sql
    params = {**built.fixed, **claim_params(QueuedTask, connection, DEFAULT_PERIOD, timezone.now(), 10)}
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone() == ("on",)
    assert len(_prepared.fetchall(connection, sql, params)) == 1
    assert QueuedTask.objects.get().attempts == 1  # claimed, and committed
    with connection.cursor() as cursor:
        # set_config(..., true): the claim's own transaction only; the task's RUNNING write after it is durable.
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone() == ("on",)
