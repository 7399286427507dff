"""The write guard: during a job, a write outside ctx.transaction() is refused, and so is a write to a
table whose permission the job does not hold.

Installed on every database connection of the thread that runs a handler, with Django's
``connection.execute_wrapper()``; the framework's own writes (claim, leases, history) pass the transaction
rule through ``_running.framework_write()``. The permission rule applies to a job that declares ``actions``,
and to every job when ``ENFORCE_ACTIONS`` is on: an INSERT needs ``add_``, an UPDATE ``change_`` (claim
too), a DELETE ``delete_``; fabrika's own tables are exempt.

Statements are read with sqlparse's tokenizer (Django's own dependency), never by their first word: a comment
before the verb, a second statement after a read, a data-modifying CTE, ``UPDATE ONLY``, schema-qualified and
quoted names are all seen; PREPARE is read for the statement it prepares, and MySQL's executable comments
(``/*! … */``, ``/*!50000 … */``, MariaDB's ``/*M! … */``) for the SQL MySQL runs from them. A statement the guard
cannot classify (DDL, a DO block, CALL, COPY, EXECUTE, ``SELECT … INTO`` that makes a table or sets a variable, ...)
counts as a write whose table is unknown: it needs ctx.transaction(), and a job that declares actions may not run
it (the framework's own EXECUTEs excepted). So does a write whose table the guard cannot name for sure: a Unicode
escaped name (``U&"…"``), or more than one table (``UPDATE a JOIN b``, ``UPDATE a, b``, ``DELETE a, b FROM …``).
Each SQL string is classified once (an LRU cache): the guard sees every statement of every job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import sqlparse.lexer
from django.apps import apps
from django.db import connections
from sqlparse import tokens as T

from ._running import active_run
from ._sql import cache
from .conf import settings
from .exceptions import CapabilityRefused, WriteOutsideTransaction

if TYPE_CHECKING:
    from django.db import models
    from sqlparse.tokens import _TokenType

    from .jobs import CronJob

    #: A token as sqlparse's lexer yields it: its type and its text.
    _Token: TypeAlias = tuple[_TokenType, str]
    #: What Django's execute wrappers are handed: the next ``execute(sql, params, many, context)``.
    _Execute: TypeAlias = Callable[[str, object, bool, dict[str, object]], object]

_ACTION_OF_VERB = {"INSERT": "add", "REPLACE": "add", "UPDATE": "change", "DELETE": "delete", "TRUNCATE": "delete"}
# Statements that change no table's rows: reads, transaction control, session settings.
_NEUTRAL_VERBS = frozenset(
    {"SELECT", "VALUES", "TABLE", "SHOW", "EXPLAIN", "DESCRIBE", "SAVEPOINT", "RELEASE", "ROLLBACK", "BEGIN",
     "START", "COMMIT", "END", "SET", "RESET", "PRAGMA", "LISTEN", "UNLISTEN", "FETCH", "CLOSE", "DEALLOCATE",
     "DISCARD"}
)  # fmt: skip
# A write verb after one of these words is a clause of another statement, not a write of its own:
# SELECT … FOR [NO KEY] UPDATE, ON CONFLICT … DO UPDATE, ON DUPLICATE KEY UPDATE, MERGE … THEN UPDATE,
# INSERT OR REPLACE, ON DELETE CASCADE; after AS or a dot it is a name (an alias, a column).
_CLAUSE_BEFORE = frozenset({"FOR", "KEY", "DO", "THEN", "OR", "ON", "AS", "."})
# Words between a write verb and its table: UPDATE ONLY t, DELETE FROM ONLY t, INSERT OR REPLACE INTO t, ...
_BEFORE_TARGET = frozenset(
    {"INTO", "FROM", "ONLY", "TABLE", "IGNORE", "LOW_PRIORITY", "QUICK", "DELAYED", "OR", "REPLACE", "ABORT",
     "FAIL", "ROLLBACK"}
)  # fmt: skip
_QUOTES = '"`[]'
# The words that end an UPDATE's tables (MySQL's multi-table UPDATE lists or joins them before SET).
_JOINS = frozenset({"JOIN", "INNER JOIN", "LEFT JOIN", "RIGHT JOIN", "CROSS JOIN", "STRAIGHT_JOIN", "NATURAL JOIN"})
# What may stand between INSERT/REPLACE/MERGE and INTO; an INTO after anything else is SELECT … INTO.
_INTO_AFTER = frozenset({"INSERT", "REPLACE", "MERGE", "IGNORE", "LOW_PRIORITY", "HIGH_PRIORITY", "DELAYED", "OR",
                         "ABORT", "FAIL", "ROLLBACK"})  # fmt: skip
# MySQL runs the text of /*! … */ (and MariaDB of /*M! … */), after an optional version number.
_EXECUTABLE_COMMENT = re.compile(r"/\*M?!\d*(.*?)\*/\Z", re.DOTALL)
# Statements longer than this are classified each time (a bulk INSERT's text varies with its row count).
_CACHED_CHARS = 4096


@dataclass(frozen=True)
class _Write:
    """One write a statement makes: the permission action ("add", "change", "delete") and its table.

    ``action`` or ``table`` is None when the guard cannot tell: a DO block, DDL, a statement it cannot read.
    """

    action: str | None
    table: str | None


def is_write(sql: str) -> bool:
    """Return whether ``sql`` writes, or may write as far as the guard can tell, in any of its statements."""
    return bool(_writes(sql))


def required_permissions(sql: str) -> tuple[str, ...]:
    """Return the permissions ("app.change_model") the writes of ``sql`` need; fabrika's tables need none.

    Raises ValueError for a write whose table or action the guard cannot tell.
    """
    needed, unknown = _permissions(sql)
    if unknown:
        raise ValueError("the write guard cannot tell which table this statement writes")
    return needed


def _permissions(sql: str) -> tuple[tuple[str, ...], bool]:
    """Return the permissions the writes of ``sql`` need, and whether one write's table is unknown."""
    needed: list[str] = []
    unknown = False
    for write in _writes(sql):
        if write.action is None or write.table is None:
            unknown = True
            continue
        model = _model_of_table(write.table)
        if model is not None:
            opts = model._meta
            needed.append(f"{opts.app_label}.{write.action}_{opts.model_name}")
    return tuple(needed), unknown


def _guard(execute: _Execute, sql: str, params: object, many: bool, context: dict[str, object]) -> object:
    run = active_run()
    if run is not None and is_write(sql):
        if not run.in_transaction and not run.framework_writes:
            raise WriteOutsideTransaction(
                f"Job '{run.job.name}' wrote outside ctx.transaction(): put every write of a job inside "
                "`with ctx.transaction():` (reads may stay outside)."
            )
        if run.job.actions is not None or settings.ENFORCE_ACTIONS:
            _check_permission(run.job, sql, framework=bool(run.framework_writes))
    return execute(sql, params, many, context)


def _check_permission(job: CronJob, sql: str, *, framework: bool) -> None:
    needed, unknown = _permissions(sql)
    # The framework's own unreadable statements are EXECUTEs of its prepared statements (a kick), which touch
    # only its own tables; what it does to an application's table (claim) is plain SQL, checked above.
    if unknown and not framework:
        raise CapabilityRefused(
            f"Job '{job.name}' ran a statement whose table the write guard cannot tell (DDL, a DO block, "
            "EXECUTE, or SQL it cannot read): a job that declares actions writes through the ORM or plain "
            "INSERT/UPDATE/DELETE statements.",
            missing="",
        )
    for permission in needed:
        if permission not in (job.actions or ()):
            raise CapabilityRefused(
                f"Job '{job.name}' needs the permission {permission!r} for this write: "
                f"add it to @cron(..., actions=[..., {permission!r}]).",
                missing=permission,
            )


def _writes(sql: str) -> tuple[_Write, ...]:
    if len(sql) > _CACHED_CHARS:
        return _classify(sql)
    return _cached_classify(sql)


def _classify(sql: str) -> tuple[_Write, ...]:
    """Read ``sql`` with sqlparse's tokenizer: every write of every statement, CTEs included."""
    writes: list[_Write] = []
    for statement in _statements(sql):
        if statement[0][1].upper() == "PREPARE":
            # PREPARE name [(types)] AS statement: the statement is what it will write.
            words = [value.upper() for _, value in statement]
            statement = statement[words.index("AS") + 1 :] if "AS" in words else []
            if not statement:
                writes.append(_Write(None, None))
                continue
        first = statement[0][1].upper()
        if first not in _NEUTRAL_VERBS and first != "WITH" and first not in _ACTION_OF_VERB and first != "MERGE":
            writes.append(_Write(None, None))  # DDL, DO, CALL, COPY, LOCK, or what the guard cannot read
            continue
        if _selects_into(statement):
            writes.append(_Write(None, None))  # SELECT … INTO newtab makes a table (MySQL's: a variable, a file)
        for index, (ttype, value) in enumerate(statement):
            verb = value.upper()
            if ttype not in T.Keyword or not (verb in _ACTION_OF_VERB or verb == "MERGE"):
                continue
            if index and statement[index - 1][1].upper() in _CLAUSE_BEFORE:
                continue
            if index and index + 1 < len(statement) and statement[index + 1][1] == "(":
                continue  # a function inside a statement: REPLACE (...), INSERT (...) (MySQL's string functions)
            # MERGE may insert, change and delete: it needs all three; the guard reads it as unknown.
            action = _ACTION_OF_VERB.get(verb)
            writes.append(_Write(action, _target(statement, index + 1, verb) if action else None))
    return tuple(writes)


def _selects_into(statement: list[_Token]) -> bool:
    """Whether an INTO of the statement follows no INSERT, REPLACE or MERGE (``SELECT … INTO …``)."""
    for index, (ttype, value) in enumerate(statement):
        if ttype in T.Keyword and value.upper() == "INTO":
            before = index - 1
            while before >= 0 and statement[before][1].upper() in _INTO_AFTER - {"INSERT", "REPLACE", "MERGE"}:
                before -= 1
            if before < 0 or statement[before][1].upper() not in ("INSERT", "REPLACE", "MERGE"):
                return True
    return False


_cached_classify = cache(maxsize=1024)(_classify)


def _tokens(sql: str) -> Iterator[_Token]:
    """sqlparse's tokens of ``sql``, with each executable comment's text read as SQL in its place."""
    for ttype, value in sqlparse.lexer.tokenize(sql):
        executable = _EXECUTABLE_COMMENT.match(value) if ttype in T.Comment else None
        if executable:
            yield from _tokens(executable.group(1))
        else:
            yield ttype, value


def _statements(sql: str) -> Iterator[list[_Token]]:
    """Yield each statement of ``sql`` as its significant tokens (no whitespace, comments or leading '(')."""
    statement: list[_Token] = []
    for ttype, value in _tokens(sql):
        if ttype in T.Whitespace or ttype in T.Comment or ttype in T.Newline:
            continue
        if ttype in T.Punctuation and value == ";":
            if statement:
                yield statement
            statement = []
        elif statement or value != "(":
            statement.append((ttype, value))
    if statement:
        yield statement


def _target(statement: list[_Token], index: int, verb: str) -> str | None:
    """Return the one table named after a write verb (its last part, unquoted), or None if none is named or the
    guard cannot be sure of it (a Unicode-escaped name, more than one table)."""
    while index < len(statement) and statement[index][1].upper() in _BEFORE_TARGET:
        index += 1
    name = None
    while index < len(statement):
        ttype, value = statement[index]
        if not (ttype in T.Name or ttype in T.Literal.String.Symbol or ttype in T.Keyword):
            return None
        if index + 1 < len(statement) and statement[index + 1][1] == "&":
            return None  # U&"d\0061t": PostgreSQL's escaped name, which may spell any table
        name = value.strip(_QUOTES)
        # A schema-qualified name: keep the part after the last dot.
        if index + 2 < len(statement) and statement[index + 1][1] == ".":
            index += 2
            continue
        return None if _more_tables(statement, index + 1, verb) else name
    return name


def _more_tables(statement: list[_Token], index: int, verb: str) -> bool:
    """Whether more tables follow the first one: ``a, b`` (MySQL's multi-table forms), or ``a JOIN b`` before an
    UPDATE's SET (MySQL's UPDATE writes any of them; PostgreSQL's FROM and USING come after and are only read)."""
    if index < len(statement) and statement[index][1] == ",":
        return True
    if verb != "UPDATE":
        return False
    for _, value in statement[index:]:
        word = " ".join(value.upper().split())
        if word == "SET":
            return False
        if word == "," or word in _JOINS:
            return True
    return False


def _model_of_table(table: str) -> type[models.Model] | None:
    tables = _models_by_table()
    return tables.get(table) or tables.get(table.lower())


@cache(maxsize=1)
def _models_by_table() -> dict[str, type[models.Model]]:
    """Map each application table to the model whose permission guards it; fabrika's tables are exempt."""
    tables: dict[str, type[models.Model]] = {}
    for model in apps.get_models(include_auto_created=True):
        opts = model._meta
        if opts.app_label == "fabrika_django" or opts.proxy:
            continue
        # An automatic many-to-many table is guarded by the model that declares the field.
        owner = opts.auto_created if isinstance(opts.auto_created, type) else model  # False, or the declaring model
        tables.setdefault(opts.db_table, owner)
    return tables


@contextmanager
def write_guard() -> Iterator[None]:
    """Refuse writes outside ctx.transaction() on every connection of this thread, for the block."""
    with ExitStack() as stack:
        for alias in connections:
            stack.enter_context(connections[alias].execute_wrapper(_guard))
        yield
