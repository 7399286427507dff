"""The write guard: during a job, a write statement outside ctx.transaction() is refused.

Installed on every database connection of the thread that runs a handler, with Django's
``connection.execute_wrapper()``; the framework's own writes (claim, leases, history) pass through
``_running.framework_write()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from django.db import connections

from ._running import active_run
from .exceptions import WriteOutsideTransaction

_WRITE_VERBS = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE", "MERGE", "TRUNCATE", "CREATE", "DROP", "ALTER"})


def is_write(sql: str) -> bool:
    """Return whether ``sql`` writes: its first keyword, or the statement a leading WITH ends in."""
    words = sql.lstrip(" (\n\t").split(None, 1)
    if not words:
        return False
    verb = words[0].upper()
    if verb == "WITH":
        upper = sql.upper()
        return any(f" {write} " in upper or f"\n{write} " in upper for write in ("INSERT", "UPDATE", "DELETE"))
    return verb in _WRITE_VERBS


def _guard(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    run = active_run()
    if run is not None and not run.in_transaction and not run.framework_writes and is_write(sql):
        raise WriteOutsideTransaction(
            f"Job '{run.job.name}' wrote outside ctx.transaction(): put every write of a job inside "
            "`with ctx.transaction():` (reads may stay outside)."
        )
    return execute(sql, params, many, context)


@contextmanager
def write_guard() -> Iterator[None]:
    """Refuse writes outside ctx.transaction() on every connection of this thread, for the block."""
    with ExitStack() as stack:
        for alias in connections:
            stack.enter_context(connections[alias].execute_wrapper(_guard))
        yield
