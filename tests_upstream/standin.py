"""What django-tasks-db's tests import from ``django_tasks_db`` (see ``aliases.py``), standing for fabrika.

``DatabaseBackend`` is fabrika's backend under the name their ``TASKS`` settings give. The rest are names their
tests module imports only for tests that ``selection.py`` deselects (their admin class, their SQLite lock helper,
their prune command's logger): a stand-in that fails if a selected test ever uses one.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from fabrika_django import _tasks_compat as compat  # their ``compat``: this Django's Task class
from fabrika_django.tasks import FabrikaBackend

__all__ = ["DBTaskResultAdmin", "DatabaseBackend", "compat", "exclusive_transaction", "logger", "normalize_uuid"]


class DatabaseBackend(FabrikaBackend):
    """``FabrikaBackend`` with one attempt per task unless ``OPTIONS["max_attempts"]`` says more.

    django-tasks-db does not retry: a task that raised is FAILED at once, which their tests assert after one
    worker run. One attempt is the README's advice for moving from it ("max_attempts": 1); ``options`` stays what
    the settings gave (their ``test_using_correct_backend`` compares it with ``{}``).
    """

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        if "max_attempts" not in self.options:
            self.max_attempts = 1


class not_fabrikas(contextlib.ContextDecorator):  # noqa: N801  stands for functions of theirs
    """A name of theirs only deselected tests use: calling or entering it fails, saying so."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return super().__call__(args[0])  # used as a decorator: fails when the test runs
        return self

    def __enter__(self) -> None:
        raise NotImplementedError(f"{self.name} is django-tasks-db's own: tests_upstream/selection.py deselects it.")

    def __exit__(self, *exc: object) -> None:
        return None


DBTaskResultAdmin = not_fabrikas("django_tasks_db.admin.DBTaskResultAdmin")
exclusive_transaction = not_fabrikas("django_tasks_db.utils.exclusive_transaction")
normalize_uuid = not_fabrikas("django_tasks_db.utils.normalize_uuid")
logger = logging.getLogger("tests_upstream.prune_db_task_results")
