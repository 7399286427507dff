"""Server-side prepared statements (PostgreSQL ``PREPARE`` / ``EXECUTE``) for the statements on a kick's path.

Planning the kick's statement and the worker's one-statement start costs more than running them: after an
idle spell, about half a millisecond each on a two-core machine. A prepared statement is planned once per
database session. Django turns psycopg's own preparing off (``prepare_threshold`` None), since a statement
psycopg prepared under a generated name (``_pg3_0``) could meet another client's statement of the same name
behind a transaction pooler. Here the name is a hash of the statement's text, so whichever server session a
pooler hands out, a name always means the same statement: at worst it is missing there and prepared again.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import cache, cache_dict

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper

    from . import SQLParam

    _Params = Sequence[SQLParam] | Mapping[str, SQLParam]  # what Django's cursor takes, None aside

# For each psycopg connection, the names of the statements it prepared. Behind a pooler the server session
# under a connection changes, so this is a hint only: a statement found missing is prepared again.
_known: weakref.WeakKeyDictionary[object, set[str]] = cache_dict(weak=True)

_MISSING = "26000"  # invalid_sql_statement_name: no prepared statement of that name in this session
_DUPLICATE = "42P05"  # duplicate_prepared_statement: another try prepared it first in this session
_PLACEHOLDER = re.compile(r"%(?:\((\w+)\))?s")


def fetchone(connection: BaseDatabaseWrapper, sql: str, params: _Params) -> tuple[Any, ...] | None:
    """Run ``sql`` as a prepared statement on Django's ``connection``; return a row.

    Placeholders are ``%s`` with a list of parameters, or ``%(name)s`` with a dict. Inside a transaction, and
    with ``server_side_binding`` (its cursors take one statement at a time), the statement runs as it is: a
    failed ``EXECUTE`` of a missing statement would abort the transaction.
    """
    with connection.cursor() as cursor:
        _execute(connection, cursor, sql, params)
        return cursor.fetchone()


def fetchall(connection: BaseDatabaseWrapper, sql: str, params: _Params) -> list[tuple[Any, ...]]:
    """As ``fetchone``, answering every row."""
    with connection.cursor() as cursor:
        _execute(connection, cursor, sql, params)
        return cursor.fetchall()


def _execute(connection: BaseDatabaseWrapper, cursor: CursorWrapper, sql: str, params: _Params) -> None:
    if connection.in_atomic_block or connection.settings_dict["OPTIONS"].get("server_side_binding"):
        cursor.execute(sql, params)
        return
    _execute_prepared(connection, cursor, sql, params)


def _execute_prepared(connection: BaseDatabaseWrapper, cursor: CursorWrapper, sql: str, params: _Params) -> None:
    """Run ``sql`` as its prepared statement, leaving its rows in ``cursor``."""
    name, prepare, execute, names = _statement(sql)
    values = [params[key] for key in names] if isinstance(params, Mapping) else list(params)
    known = _known.setdefault(connection.connection, set())
    if name in known and _try(cursor, execute, values, ok=(_MISSING,)):
        return
    # First use in this session, or the session lost it (DISCARD ALL, a pooler's other session): prepare
    # and run in one round trip.
    if _try(cursor, f"{prepare}; {execute}", values, ok=(_DUPLICATE,)):
        cursor.nextset()
        known.add(name)
        return
    # Prepared here already, unknown to this process (another client behind a pooler).
    if _try(cursor, execute, values, ok=(_MISSING,)):
        known.add(name)
        return
    known.discard(name)
    cursor.execute(sql, params)


def _try(cursor: CursorWrapper, sql: str, params: Sequence[SQLParam], *, ok: tuple[str, ...]) -> bool:
    """Execute; False when the database refused with one of the ``ok`` states (anything else raises)."""
    try:
        cursor.execute(sql, params)
    except Exception as exc:
        if getattr(exc.__cause__, "sqlstate", None) not in ok:
            raise
        return False
    return True


@cache(maxsize=16)
def _statement(sql: str) -> tuple[str, str, str, tuple[str, ...]]:
    """Return the statement's name (a hash of its text), its ``PREPARE``, its ``EXECUTE`` (a ``%s`` for each
    number), and the order of its named parameters.

    ``%s`` placeholders are numbered ``$1``, ``$2``… in order; each distinct ``%(name)s`` gets one number, at
    its first appearance, and the names come back in that order (empty for ``%s`` placeholders).
    """
    name = "fabrika_" + hashlib.sha256(sql.encode()).hexdigest()[:20]
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        key = match.group(1)
        if key is None:
            names.append("")
            return f"${len(names)}"
        if key not in names:
            names.append(key)
        return f"${names.index(key) + 1}"

    prepared = _PLACEHOLDER.sub(number, sql)
    execute = f"EXECUTE {name}({', '.join(['%s'] * len(names))})"
    return name, f"PREPARE {name} AS {prepared}", execute, tuple(key for key in names if key)
