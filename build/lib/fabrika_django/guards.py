"""The write guard: during a job, a write outside ctx.transaction() is refused, and so is a write to a
table whose permission the job does not hold.

Installed on every database connection of the thread that runs a handler, with Django's
``connection.execute_wrapper()``; the framework's own writes (claim, leases, history) pass the transaction
rule through ``_running.framework_write()``. The permission rule applies to a job that declares ``actions``,
and to every job when ``ENFORCE_ACTIONS`` is on: an INSERT needs ``add_``, an UPDATE ``change_`` (claim
too), a DELETE ``delete_``; fabrika's own tables are exempt.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import connections

from ._running import active_run
from .conf import settings
from .exceptions import CapabilityRefused, WriteOutsideTransaction

if TYPE_CHECKING:
    from .jobs import CronJob

_WRITE_VERBS = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE", "MERGE", "TRUNCATE", "CREATE", "DROP", "ALTER"})


# A data-modifying statement inside a WITH; "UPDATE <table> SET" keeps out SELECT ... FOR UPDATE.
_WRITE_IN_WITH = re.compile(r"\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM)\b", re.IGNORECASE)


def is_write(sql: str) -> bool:
    """Return whether ``sql`` writes: its first keyword, or the statement a leading WITH ends in."""
    words = sql.lstrip(" (\n\t").split(None, 1)
    if not words:
        return False
    verb = words[0].upper()
    if verb == "WITH":
        return _WRITE_IN_WITH.search(sql) is not None
    return verb in _WRITE_VERBS


_TARGET = re.compile(r"^\s*(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+[`\"]?([^`\"\s(]+)", re.IGNORECASE)
_ACTION_OF_VERB = {"INSERT": "add", "UPDATE": "change", "DELETE": "delete"}


def _guard(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    run = active_run()
    if run is not None and is_write(sql):
        if not run.in_transaction and not run.framework_writes:
            raise WriteOutsideTransaction(
                f"Job '{run.job.name}' wrote outside ctx.transaction(): put every write of a job inside "
                "`with ctx.transaction():` (reads may stay outside)."
            )
        if run.job.actions is not None or settings.ENFORCE_ACTIONS:
            _check_permission(run.job, sql)
    return execute(sql, params, many, context)


def required_permission(sql: str) -> str | None:
    """Return the permission a write statement needs ("app.change_model"), or None for an exempt table."""
    match = _TARGET.match(sql)
    if match is None:
        return None
    model = _models_by_table().get(match.group(2))
    if model is None:
        return None
    opts = model._meta
    return f"{opts.app_label}.{_ACTION_OF_VERB[match.group(1).split()[0].upper()]}_{opts.model_name}"


def _check_permission(job: CronJob, sql: str) -> None:
    needed = required_permission(sql)
    if needed is not None and needed not in (job.actions or ()):
        raise CapabilityRefused(
            f"Job '{job.name}' needs the permission {needed!r} for this write: "
            f"add it to @cron(..., actions=[..., {needed!r}]).",
            missing=needed,
        )


@lru_cache(maxsize=1)
def _models_by_table() -> dict[str, Any]:
    """Map each application table to the model whose permission guards it; fabrika's tables are exempt."""
    tables: dict[str, Any] = {}
    for model in apps.get_models(include_auto_created=True):
        opts = model._meta
        if opts.app_label == "fabrika_django" or opts.proxy:
            continue
        # An automatic many-to-many table is guarded by the model that declares the field.
        owner = opts.auto_created or model
        tables.setdefault(opts.db_table, owner)
    return tables


@contextmanager
def write_guard() -> Iterator[None]:
    """Refuse writes outside ctx.transaction() on every connection of this thread, for the block."""
    with ExitStack() as stack:
        for alias in connections:
            stack.enter_context(connections[alias].execute_wrapper(_guard))
        yield
