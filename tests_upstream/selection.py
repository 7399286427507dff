"""Which of django-tasks-db's tests run against fabrika, and why each one that does not is left out.

``DESELECTED``: tests about django-tasks-db's own implementation (their model's fields, indexes and helpers, their
admin, their commands' options, their worker process), which no other backend could pass. ``EXPECTED_TO_FAIL``:
backend-agnostic tests where fabrika differs on purpose; they run, as strict xfails, so a change either way shows.
``UNCOUNTED_STATEMENTS``: classes whose statement counts of their worker are not asserted (``plugin.py``).
Keys are ``Class.test_name``; a vendor-limited entry is ``(reason, {vendors})``.
"""

from __future__ import annotations

_THEIR_MODEL = "inspects their DBTaskResult model itself (its fields, properties, queryset helpers or checks)"
_THEIR_INDEX = "asserts the query plan uses their index (tasks_db_new_ordering_idx)"
_THEIR_OPTIONS = "configures their backend's OPTIONS (id_function), which FabrikaBackend does not take"
_THEIR_COMMAND = "asserts on their db_worker command's argument checks and messages"
_THEIR_OUTPUT = "asserts on their db_worker's log lines (fabrika's worker logs its own way)"
_THEIR_PRUNE = "their prune_db_task_results command: fabrika prunes with its built-in job after TASK_RESULT_DAYS"
_THEIR_LOCKS = "their model's get_locked()/exclusive_transaction helpers (fabrika's claim is tested in tests/)"
_THEIR_ADMIN = "their admin class (fabrika's tasks admin is tested in tests/test_tasks_admin.py)"

DESELECTED: dict[str, str | tuple[str, set[str]]] = {
    # DatabaseBackendTestCase
    "DatabaseBackendTestCase.test_task_name": _THEIR_MODEL,
    "DatabaseBackendTestCase.test_run_after_null_0016_migration": _THEIR_MODEL + " and a migration of theirs",
    "DatabaseBackendTestCase.test_index_scan_for_ready": _THEIR_INDEX,
    "DatabaseBackendTestCase.test_custom_id_function": _THEIR_OPTIONS,
    "DatabaseBackendTestCase.test_unknown_id_function": _THEIR_OPTIONS,
    "DatabaseBackendTestCase.test_postgres_db_id_function": _THEIR_OPTIONS,
    "DatabaseBackendTestCase.test_postgres_id_function_expression": _THEIR_OPTIONS,
    # Its subtests would each be an expected failure, and the test around them an unexpected pass; the same
    # checks but the count run in test_enqueue_task_async, and the count itself in test_get_result (an xfail).
    "DatabaseBackendTestCase.test_enqueue_task": (
        "counts one statement for an enqueue (see EXPECTED_TO_FAIL's test_get_result)",
        {"sqlite", "mysql"},
    ),
    # DatabaseBackendWorkerTestCase
    "DatabaseBackendWorkerTestCase.test_exclude_queues_requires_processing_all_queues": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_unknown_backend": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_incorrect_backend": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_negative_interval": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_infinite_interval": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_fractional_interval": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_zero_interval": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_negative_max_tasks": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_zero_max_tasks": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_too_long_worker_id": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_empty_worker_id": _THEIR_COMMAND,
    "DatabaseBackendWorkerTestCase.test_verbose_logging": _THEIR_OUTPUT,
    "DatabaseBackendWorkerTestCase.test_max_tasks": _THEIR_OUTPUT + " and its --max-tasks",
    # DatabaseTaskResultTestCase
    "DatabaseTaskResultTestCase.test_locks_tasks": _THEIR_LOCKS,
    "DatabaseTaskResultTestCase.test_locks_tasks_sqlite": _THEIR_LOCKS,
    "DatabaseTaskResultTestCase.test_locks_tasks_filtered": _THEIR_LOCKS,
    "DatabaseTaskResultTestCase.test_locks_tasks_filtered_sqlite": _THEIR_LOCKS,
    "DatabaseTaskResultTestCase.test_lock_no_rows": _THEIR_LOCKS,
    "DatabaseTaskResultTestCase.test_get_locked_with_locked_rows": _THEIR_LOCKS,
    "ConnectionExclusiveTranscationTestCase.test_exclusive_transaction": _THEIR_LOCKS,
    # DatabaseBackendPruneTaskResultsTestCase
    **{
        f"DatabaseBackendPruneTaskResultsTestCase.{name}": _THEIR_PRUNE
        for name in (
            "test_prunes_tasks",
            "test_doesnt_prune_new_tasks",
            "test_doesnt_prune_running_tasks",
            "test_only_prunes_specified_queue",
            "test_prune_all_queues",
            "test_min_age",
            "test_failed_min_age",
            "test_failed_min_age_zero",
            "test_dry_run",
            "test_unknown_backend",
            "test_incorrect_backend",
            "test_negative_age",
        )
    },
    "DatabaseWorkerProcessTestCase.test_interrupt_signals": (
        "timing: it needs the worker to exit within 2 s of a signal sent 1 s after its start, while a 2-second task "
        "runs, so its margin is 1 s minus the worker's start to the task's (Django's start and the first poll: "
        "0.6-0.7 s for fabrika's worker here); it failed 1 run in 3 on PostgreSQL on a loaded 2-core machine"
    ),
    # DBTaskResultOrderingTestCase: rows made with their model's fields, listed in its default ordering
    "DBTaskResultOrderingTestCase.test_higher_priority_tasks_come_first": _THEIR_MODEL,
    "DBTaskResultOrderingTestCase.test_earlier_run_after_comes_first_given_same_priority": _THEIR_MODEL,
    "DBTaskResultOrderingTestCase.test_earlier_enqueued_at_comes_first_given_same_priority_and_run_after": _THEIR_MODEL,
    "AdminTestCase.test_display_run_after_returns_empty_for_date_max_or_none": _THEIR_ADMIN,
    "AdminTestCase.test_display_run_after_returns_db_value": _THEIR_ADMIN,
}

_ENQUEUE_STATEMENTS = (
    "counts one statement for an enqueue: fabrika's is the row and its kick in one transaction (BEGIN, two "
    "INSERTs, COMMIT), one statement on PostgreSQL only"
)

EXPECTED_TO_FAIL: dict[str, str | tuple[str, set[str]]] = {
    "DatabaseBackendTestCase.test_get_result": (_ENQUEUE_STATEMENTS, {"sqlite", "mysql"}),
    "DatabaseBackendTestCase.test_invalid_task_path": (
        "asserts the wording of the SuspiciousOperation for a row whose path is not a task: fabrika raises it too "
        "(the task's row id and path in other words)"
    ),
    "DatabaseBackendTestCase.test_missing_task_path": (
        "asserts an ImportError for a row whose path does not import: fabrika imports nothing a row names and raises "
        "the SuspiciousOperation of a path that is no registered task (task_not_registered)"
    ),
    "DatabaseBackendWorkerTestCase.test_task_import_string": (
        "asserts 'ImportError' in the traceback of a row whose path does not import: fabrika's worker imports "
        "nothing a row names, and records a SuspiciousOperation (task_not_registered); the task FAILED holds"
    ),
    "DatabaseBackendTestCase.test_database_backend_app_missing": (
        "asserts that the check's hint names django_tasks_db: fabrika's check (fabrika.E040) reports the same "
        "mistake and names fabrika_django"
    ),
    "DatabaseBackendWorkerTestCase.test_complex_return_value": (
        "asserts json.dumps's wording ('is not JSON serializable'): fabrika fails the task with a TypeError too, "
        "worded by Django's normalize_json and its own message"
    ),
    "DatabaseWorkerProcessTestCase.test_repeat_ctrl_c": (
        "asserts their worker id in worker_ids (fabrika records host:pid), and that a second Ctrl-C fails the running "
        "task with SystemExit: fabrika's worker lets the task run through its grace (10 s), then gives the run back"
    ),
    "DatabaseWorkerProcessTestCase.test_multiple_workers": (
        "asserts their worker's log lines ('exiting gracefully', each task's id twice); the tasks all succeed"
    ),
    "DatabaseBackendWorkerTestCase.test_run_after_priority": (
        "asserts their model's default ordering of all rows, where a task without run_after sorts after deferred "
        "ones (they store it as the largest date); the second half, the order due tasks are claimed in, holds"
    ),
}

UNCOUNTED_STATEMENTS = {"DatabaseBackendWorkerTestCase"}
#: Classes whose ``start_worker()`` starts fabrika's worker process (``fabrika_job``) instead of their db_worker.
FABRIKA_WORKER_PROCESS = {"DatabaseWorkerProcessTestCase"}


def deselected(name: str, vendor: str) -> str | None:
    """The reason the test ``Class.test_name`` is not run on ``vendor``, or None when it runs."""
    return _reason(DESELECTED.get(name), vendor)


def expected_failure(name: str, vendor: str) -> str | None:
    """The reason the test is expected to fail on ``vendor`` (a difference by design), or None."""
    return _reason(EXPECTED_TO_FAIL.get(name), vendor)


def _reason(entry: str | tuple[str, set[str]] | None, vendor: str) -> str | None:
    if isinstance(entry, tuple):
        reason, vendors = entry
        return reason if vendor in vendors else None
    return entry
