"""The import names django-tasks-db's tests use, answered by modules of this package: ``install()`` once, before
Django is set up (the pytest plugin's import does it).

``django_tasks_db`` (its backend, admin, utils, commands) is ``standin``, whose ``compat`` is fabrika's own
``_tasks_compat``; ``django_tasks_db.models`` is ``models`` (needs the app registry, so imported only when their
tests are); ``tests`` is a package whose ``tasks`` is ``tasks``. A finder first in ``sys.meta_path``, so the real
``django_tasks_db`` (installed for the benchmarks) is never the one imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
from typing import Any

ALIASES = {
    "django_tasks_db": "tests_upstream.standin",
    "django_tasks_db.admin": "tests_upstream.standin",
    "django_tasks_db.utils": "tests_upstream.standin",
    "django_tasks_db.models": "tests_upstream.models",
    "django_tasks_db.management": "tests_upstream.management",
    "django_tasks_db.management.commands": "tests_upstream.management.commands",
    "django_tasks_db.management.commands.db_worker": "tests_upstream.management.commands.db_worker",
    "django_tasks_db.management.commands.prune_db_task_results": "tests_upstream.standin",
    "tests.tasks": "tests_upstream.tasks",
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == "tests":
            # A package of its own: fabrika's tests/ would otherwise answer ``tests.tasks``.
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        if fullname in ALIASES:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        if spec.name == "tests":
            module = types.ModuleType("tests")
            module.__path__ = []
            return module
        return importlib.import_module(ALIASES[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        return None  # an alias's module is imported already; the ``tests`` package is empty


_FINDER = _AliasFinder()


def install() -> None:
    """Put the alias finder first in ``sys.meta_path`` (once), and forget any ``tests`` imported before."""
    if _FINDER in sys.meta_path:
        return
    sys.meta_path.insert(0, _FINDER)
    for name in [name for name in sys.modules if name == "tests" or name.startswith(("tests.", "django_tasks_db"))]:
        del sys.modules[name]
