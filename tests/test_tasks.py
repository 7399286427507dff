"""fabrika_django.tasks.FabrikaBackend: transactional enqueue, results, retries, priorities, signals, pruning."""

from datetime import timedelta

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from fabrika_django._tasks_compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from fabrika_django.jobs import registry
from fabrika_django.models import TASK_ATTEMPTS_CEILING, QueuedTask
from fabrika_django.tasks import FabrikaBackend
from fabrika_django.testing import run_job, run_tasks
from testproject.lab import tasks
from testproject.lab.models import Mark

pytestmark = pytest.mark.django_db(transaction=True)

SUCCESSFUL, FAILED, READY = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED, TaskResultStatus.READY


def _due_now():
    """Bring the failed attempts' backoff to an end, as the clock would."""
    QueuedTask.objects.filter(due__isnull=False).update(due=timezone.now())


def test_the_backend_supports_defer_async_get_result_and_priority():
    backend = task_backends["default"]
    assert isinstance(backend, FabrikaBackend)
    flags = (backend.supports_defer, backend.supports_async_task, backend.supports_get_result)
    assert flags + (backend.supports_priority,) == (True, True, True, True)


def test_each_queue_of_the_backend_has_its_kick_only_job_sweeping_every_minute():
    jobs = {job.name: job for job in registry if job.name.startswith("tasks.")}
    assert sorted(jobs) == ["tasks.default.default", "tasks.default.emails"]
    assert jobs["tasks.default.emails"].schedule.expression == "* * * * *"
    assert jobs["tasks.default.emails"].timeout == timedelta(seconds=120)  # twice the task's timeout of 60 s


def test_a_rolled_back_transaction_enqueues_nothing_and_kicks_nothing(fabrika_kicks):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        tasks.add.enqueue(1, 2)
        raise ZeroDivisionError
    assert QueuedTask.objects.count() == 0
    assert fabrika_kicks == []


def test_enqueue_inside_a_transaction_writes_the_row_there_and_kicks_once_it_commits(fabrika_kicks):
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert QueuedTask.objects.filter(result_id=result.id).exists()  # the caller's own transaction
        assert fabrika_kicks == []
    assert fabrika_kicks == ["tasks.default.default"]
    assert result.status == READY and result.args == [1, 2] and result.attempts == 0
    assert default_task_backend.get_result(result.id) == result


def test_enqueues_in_one_transaction_write_one_kick_row_and_a_rolled_back_savepoint_takes_its_kick_along():
    """The transaction's first enqueue writes the kick's row; later ones find its marker among the transaction's
    on-commit callbacks and write none; a savepoint rolled back drops its marker with its row. The callbacks are
    read through Django's ``run_on_commit``, which neither 5.2 nor 6.1 documents: this file runs on both."""
    from fabrika_django.models import KickRequest

    with transaction.atomic():
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            tasks.noop.enqueue()
            raise ZeroDivisionError
        tasks.noop.enqueue()
        tasks.noop.enqueue()
    assert QueuedTask.objects.count() == 2
    assert KickRequest.objects.filter(job="tasks.default.default").count() == 1


def test_a_committed_task_runs_and_its_result_reads_back_successful():
    result = tasks.add.enqueue(2, 3)
    [ran] = run_tasks()
    assert (ran.id, ran.status, ran.return_value) == (result.id, SUCCESSFUL, 5)
    result.refresh()
    assert result.status == SUCCESSFUL and result.return_value == 5 and result.attempts == 1
    assert result.enqueued_at <= result.started_at == result.last_attempted_at <= result.finished_at
    assert len(result.worker_ids) == 1 and result.errors == []


def test_a_task_writes_like_plain_django_code_without_the_write_guard():
    tasks.mark.enqueue("hello")
    [ran] = run_tasks()
    assert ran.status == SUCCESSFUL
    assert list(Mark.objects.values_list("note", flat=True)) == ["hello"]


def test_async_tasks_and_tasks_that_take_the_context_run():
    added = tasks.async_add.enqueue(20, 22)
    told = tasks.with_context.enqueue("x")
    run_tasks()
    assert tasks.async_add.get_result(added.id).return_value == 42
    assert tasks.with_context.get_result(told.id).return_value == {"attempt": 1, "id": told.id, "label": "x"}


def test_higher_priority_runs_first_then_the_earlier_enqueue():
    tasks.relaxed.enqueue(1)
    tasks.mark.enqueue("plain 1")
    tasks.urgent.enqueue(2)
    tasks.mark.enqueue("plain 2")
    tasks.urgent.enqueue(3)
    run_tasks()
    notes = list(Mark.objects.order_by("pk").values_list("note", flat=True))
    assert notes == ["urgent 2", "urgent 3", "plain 1", "plain 2", "relaxed 1"]


def test_a_task_with_run_after_waits_for_it():
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    assert run_tasks() == []
    QueuedTask.objects.filter(result_id=later.id).update(due=timezone.now())
    assert [result.id for result in run_tasks()] == [later.id]


def test_a_failing_task_is_retried_after_the_claims_backoff_then_failed_with_one_error_per_attempt():
    result = tasks.always_fails.enqueue("hunter2")
    before = timezone.now()
    [first] = run_tasks()
    row = QueuedTask.objects.get(result_id=result.id)
    assert first.status == READY and len(first.errors) == 1
    # The claim's backoff, its period one minute (the sweep's schedule): due again a minute after the claim.
    assert before + timedelta(seconds=59) <= row.due <= timezone.now() + timedelta(seconds=61)
    assert run_tasks() == []  # not retried at once
    for _ in range(2):
        _due_now()
        run_tasks()
    result.refresh()
    assert result.status == FAILED and result.attempts == 3 and result.finished_at is not None
    assert [error.exception_class_path for error in result.errors] == ["builtins.ValueError"] * 3
    assert all("hunter2" not in error.traceback for error in result.errors)
    assert "in always_fails" in result.errors[0].traceback
    assert QueuedTask.objects.dead().filter(result_id=result.id).exists()
    _due_now()
    assert run_tasks() == []  # dead: never claimed again
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


@override_settings(FABRIKA={"STORE_ERROR_MESSAGES": True})
def test_store_error_messages_keeps_the_message_in_the_traceback():
    tasks.always_fails.enqueue("hunter2")
    [ran] = run_tasks()
    assert "ValueError: the secret is hunter2" in ran.errors[0].traceback


def test_a_return_value_that_is_not_json_fails_the_attempt_with_a_type_error():
    tasks.returns_an_object.enqueue()
    [ran] = run_tasks()
    assert ran.status == READY
    assert [error.exception_class_path for error in ran.errors] == ["builtins.TypeError"]


def test_a_task_raising_keyboard_interrupt_on_a_handler_thread_fails_its_attempt_and_the_run_goes_on():
    # run_tasks() outside a transaction runs the job's handler on a handler thread, as the worker does.
    interrupted = tasks.interrupts_itself.enqueue()
    after = tasks.noop.enqueue()
    assert [(ran.id, ran.status) for ran in run_tasks()] == [(interrupted.id, READY), (after.id, SUCCESSFUL)]
    interrupted.refresh()
    assert [error.exception_class_path for error in interrupted.errors] == ["builtins.KeyboardInterrupt"]


def test_get_result_of_an_unknown_or_malformed_id_raises_task_result_does_not_exist():
    for result_id in ("8f3e6a1c-0000-4000-8000-000000000000", "nope"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


async def _aget(result_id):
    return await default_task_backend.aget_result(result_id)


def test_aget_result_reads_the_row_and_raises_for_an_unknown_id():
    from asgiref.sync import async_to_sync

    result = tasks.add.enqueue(1, 2)
    assert async_to_sync(_aget)(result.id) == result
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(_aget)("8f3e6a1c-0000-4000-8000-000000000000")


def test_enqueue_refuses_arguments_that_are_not_json_and_writes_nothing():
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)
    assert QueuedTask.objects.count() == 0


def test_enqueue_validates_as_djangos_base_class_does():
    with pytest.raises(InvalidTask):
        tasks.add.using(queue_name="nope")
    with pytest.raises(InvalidTask):
        tasks.add.using(run_after=timezone.now().replace(tzinfo=None))


def test_djangos_task_signals_are_sent_for_enqueue_start_and_finish():
    seen = []

    def record(signal_name):
        return lambda sender, task_result, **kwargs: seen.append((signal_name, sender, task_result.status))

    receivers = [
        (task_enqueued, record("enqueued")),
        (task_started, record("started")),
        (task_finished, record("finished")),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    try:
        tasks.add.enqueue(1, 2)
        run_tasks()
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    assert seen == [
        ("enqueued", FabrikaBackend, READY),
        ("started", FabrikaBackend, TaskResultStatus.RUNNING),
        ("finished", FabrikaBackend, SUCCESSFUL),
    ]


def test_a_task_claimed_again_after_its_last_attempt_was_lost_is_failed_not_run():
    result = tasks.mark.enqueue("never")
    # What a worker killed in the third and last attempt leaves: RUNNING, three claims, due after the backoff.
    QueuedTask.objects.filter(result_id=result.id).update(status="RUNNING", attempts=3, worker_ids=["a", "b", "c"])
    [ran] = run_tasks()
    assert ran.status == FAILED and ran.attempts == 3
    assert [error.exception_class_path for error in ran.errors] == ["fabrika_django.exceptions.LeaseLost"]
    assert not Mark.objects.exists()


def test_run_tasks_inside_a_test_transaction_runs_inline(django_db_blocker):
    with transaction.atomic():
        result = tasks.add.enqueue(4, 5)
        [ran] = run_tasks()
    assert ran.id == result.id and ran.return_value == 9


def test_finished_tasks_are_pruned_after_task_result_days_by_the_built_in_job():
    old, recent, failed_old, waiting = (tasks.add.enqueue(n, n) for n in range(4))
    long_ago = timezone.now() - timedelta(days=8)
    QueuedTask.objects.filter(result_id=old.id).update(finished_at=long_ago, status="SUCCESSFUL", due=None)
    QueuedTask.objects.filter(result_id=failed_old.id).update(finished_at=long_ago, status="FAILED", attempts=100)
    QueuedTask.objects.filter(result_id=recent.id).update(finished_at=timezone.now() - timedelta(days=6))
    assert run_job("fabrika_prune_history").ok
    assert sorted(str(pk) for pk in QueuedTask.objects.values_list("result_id", flat=True)) == sorted(
        [recent.id, waiting.id]
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, r"\['max_attempts'\]=0 is out of bounds: give a whole number from 1 to 100"),
        ({"timeout": 0}, r"\['timeout'\]=0 is out of bounds: give seconds"),
        ({"lanes": 65}, r"\['lanes'\]=65 is out of bounds: give a whole number from 1 to 64"),
        ({"retries": 2}, r"unknown keys 'retries': FabrikaBackend takes max_attempts, timeout, lanes"),
    ],
)
def test_bad_options_are_refused_naming_the_option_and_its_bounds(options, message):
    params = {"BACKEND": "fabrika_django.tasks.FabrikaBackend", "OPTIONS": options}
    with pytest.raises(ImproperlyConfigured, match=message):
        FabrikaBackend("other", params)


def test_a_queue_name_that_cannot_name_a_job_is_refused():
    with pytest.raises(ImproperlyConfigured, match=r"holds 'mail box', which cannot name a job"):
        FabrikaBackend("other", {"QUEUES": ["mail box"]})


def test_another_backend_alias_gets_jobs_of_its_own():
    backends = {
        "default": {"BACKEND": "fabrika_django.tasks.FabrikaBackend", "QUEUES": ["default"]},
        "bulk": {"BACKEND": "fabrika_django.tasks.FabrikaBackend", "QUEUES": ["default"]},
    }
    try:
        with override_settings(TASKS=backends):
            result = tasks.add.using(backend="bulk").enqueue(1, 1)
            assert run_tasks() == []  # the default backend's queue is another job
            assert [ran.id for ran in run_tasks(backend="bulk")] == [result.id]
    finally:
        registry.unregister("tasks.bulk.default")


def test_a_task_whose_function_is_gone_fails_its_attempts_as_not_registered_and_run_tasks_goes_on():
    gone = tasks.add.enqueue(1, 2)
    QueuedTask.objects.filter(result_id=gone.id).update(task_path="testproject.lab.tasks.removed")
    kept = tasks.add.enqueue(3, 4)
    assert [result.id for result in run_tasks()] == [kept.id]
    row = QueuedTask.objects.get(result_id=gone.id)
    assert (row.status, row.last_failure) == ("READY", "task_not_registered")
    assert [error["exception_class_path"] for error in row.errors] == ["django.core.exceptions.SuspiciousOperation"]


def test_the_checks_report_fabrika_django_missing_from_installed_apps_once():
    # Where fabrika's checks are registered they say it (the backend's own check, which Django's tasks checks
    # call where they run, then stays quiet); tests/test_tasks_checks.py runs a project without them.
    with override_settings(INSTALLED_APPS=["django.contrib.contenttypes"]):
        [error] = [message for message in checks.run_checks(tags=["fabrika"]) if message.id == "fabrika.E040"]
        assert task_backends["default"].check() == []
    assert (error.id, error.msg, error.hint) == (
        "fabrika.E040",
        "TASKS['default'] is a FabrikaBackend, but fabrika_django is not installed.",
        "Add 'fabrika_django' to INSTALLED_APPS and run migrate.",
    )


@override_settings(FABRIKA={"LEASE_SECONDS": 1})
def test_a_run_that_lost_its_lease_starts_no_further_task():
    tasks.loses_the_lease.enqueue()
    waiting = tasks.mark.enqueue("never")
    run_tasks()
    row = QueuedTask.objects.get(result_id=waiting.id)
    assert (row.status, row.worker_ids, row.started_at) == ("READY", [], None)
    assert not Mark.objects.exists()


@pytest.mark.postgresql
def test_the_task_claim_walks_its_claim_index_in_order_past_no_given_up_task(job_run):
    """Given-up (FAILED) tasks are dead rows: they stay out of the (backend, queue, priority, due) claim index."""
    from django.db import connection
    from django.db.models import Q
    from django.test.utils import CaptureQueriesContext

    now = timezone.now()
    task = {"task_path": "testproject.lab.tasks.mark", "backend": "default", "queue_name": "default"}
    old = now - timedelta(days=1)
    QueuedTask.objects.bulk_create(
        [QueuedTask(**task, due=old, attempts=TASK_ATTEMPTS_CEILING, status=FAILED) for _ in range(3000)]
    )
    QueuedTask.objects.bulk_create([QueuedTask(**task, due=now - timedelta(seconds=i)) for i in range(100)])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {QueuedTask._meta.db_table}")
    with job_run(now=now), CaptureQueriesContext(connection) as queries:
        assert len(QueuedTask.objects.claim(limit=50, where=Q(backend="default", queue_name="default"))) == 50
    # One prepared statement (_runs.statement, _sql.prepared): its locking read is the WITH item ``picked``.
    (claim,) = [query["sql"] for query in queries if "WITH picked" in query["sql"]]
    execute = "EXECUTE " + claim.rsplit("; EXECUTE ", 1)[1]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {execute}")
        lines = [row[0] for row in cursor.fetchall()]
    starts = [index for index, line in enumerate(lines) if line.lstrip().startswith("CTE ")]
    read = next(index for index in starts if lines[index].strip() == "CTE picked")
    plan = "\n".join(lines[read : min([index for index in starts if index > read], default=len(lines))])

    assert "fabrika_task_claim" in plan, plan
    assert "Sort" not in plan, plan  # in the claim's order, from the index
    assert "Rows Removed by Filter" not in plan, plan  # no given-up task read and thrown away


@pytest.fixture
def inserts_skipped():
    """PostgreSQL: a trigger on the tasks' table that skips every INSERT (it answers no row)."""
    from django.db import connection

    table = connection.ops.quote_name(QueuedTask._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION fabrika_test_skip() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'"
        )
        cursor.execute(
            f"CREATE TRIGGER fabrika_test_skip BEFORE INSERT ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION fabrika_test_skip()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER fabrika_test_skip ON {table}")
            cursor.execute("DROP FUNCTION fabrika_test_skip()")


@pytest.mark.postgresql
@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "in-a-transaction"])
def test_an_enqueue_whose_insert_answers_no_row_raises_a_clear_error_also_under_python_O(inserts_skipped, atomic):
    """The check is a raise, not an ``assert`` that ``python -O`` would drop (leaving a task with no row)."""
    from django.db import DatabaseError

    with pytest.raises(DatabaseError, match="task's row was not inserted"):
        if atomic:
            with transaction.atomic():
                tasks.noop.enqueue()
        else:
            tasks.noop.enqueue()
    assert not QueuedTask.objects.exists()
