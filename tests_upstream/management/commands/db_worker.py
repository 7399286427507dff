"""``db_worker`` as django-tasks-db's tests call it: ``--batch`` runs every due task of the chosen queues once,
through fabrika's worker path (``fabrika_django.testing.run_tasks``), and returns.

Only the options their selected tests pass do anything (queues, excluded queues, backend); the others are
accepted and ignored. Their checks of these options' values, and the long-running worker, are theirs:
``selection.py`` deselects those tests.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from fabrika_django._tasks_compat import task_backends
from fabrika_django.tasks import FabrikaBackend
from fabrika_django.testing import run_tasks


class Command(BaseCommand):
    help = "Run the due tasks of the chosen queues once on fabrika's worker path (django-tasks-db's tests only)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--queue-name", default="default")
        parser.add_argument("--exclude-queues", default="")
        parser.add_argument("--backend", dest="backend_name", default="default")
        parser.add_argument("--batch", action="store_true")
        parser.add_argument("--interval", type=float, default=1.0)
        parser.add_argument("--no-startup-delay", dest="startup_delay", action="store_false")
        parser.add_argument("--max-tasks", type=int, default=None)
        parser.add_argument("--worker-id", default="")

    def handle(self, *, queue_name: str, exclude_queues: str, backend_name: str, batch: bool, **options: Any) -> None:
        if not batch:
            raise CommandError("This stand-in runs --batch only: fabrika's long-running worker is fabrika_job worker.")
        backend = task_backends[backend_name]
        if not isinstance(backend, FabrikaBackend):
            return  # not a backend of tasks in the database: nothing of its to run (as theirs)
        wanted = queue_name.split(",")
        excluded = set(filter(None, exclude_queues.split(",")))
        queues = sorted(backend.queues) if "*" in wanted else wanted
        for queue in queues:
            if queue in backend.queues and queue not in excluded:
                run_tasks(queue=queue, backend=backend_name)
