"""What a queryset hands the claim (``Claimable``), the claim's statement on PostgreSQL, built once per shape
(``_sql.claim``), and the one decoder of the rows every claim's read answers.

A claim is one statement where its rows are the manager's own (``plain``), its table has no parent, its claim
order names local columns, and its ``where`` is a plain condition on its own table's columns (lookups such as
``kind="welcome"`` or ``queue_name__in=[...]``, no relation followed, no expression): Django tasks' claim of one
backend's queue is such a claim, so is a queue table's. Anything else goes the long way (``claim``).

Its "due now" and ``where`` are compiled once (``_queuestate.q_sql``, the ORM's own SQL of the condition) with
a stand-in for "now" (``_sql.Compiled``); each claim binds its time afresh. A claimed row's new ``due`` is one of
a few instants the worker computes (``row_backoffs``, the same for every count past the backoff's cap), sent as
an array from which the UPDATE picks by the attempts it finds; ``due`` is not read back: the object gets the
instant written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import EmptyResultSet, FieldDoesNotExist
from django.db.models import Q
from django.db.models.constants import LOOKUP_SEP

from .._queuestate import q_sql, state_q
from .._sql import SAMPLE_NOW, Compiled, cache_dict, quoted
from .._sql import claim as claim_sql

if TYPE_CHECKING:
    from django.db import models
    from django.db.backends.base.base import BaseDatabaseWrapper

#: A claim's statement by what decides its text and fixed values; None where the claim goes the long way.
#: A ``where`` is part of the key, so the cache is emptied past ``_MAX_SHAPES`` (a claim whose ``where`` holds
#: a new value each time, such as a time, would otherwise grow it without end).
_STATEMENTS: dict[tuple[Any, ...], Statement | None] = cache_dict()
_MAX_SHAPES = 256


@dataclass(frozen=True)
class Claimable:
    """What a queryset hands the claim (``QueueQuerySet.claim``): its rows and what it says about claiming them."""

    rows: Any  # the QueueQuerySet
    #: Its claim order: field names, ``-`` for descending (``CLAIM_ORDER`` unless the queryset sets its own).
    order: tuple[str, ...]
    #: The claim's rows on a database at an instant, with a ``where``: unlocked, unlimited, in claim order.
    query: Callable[[str, datetime, Q | None], Any]
    #: The rows are the model's whole table as its manager gives them: the claim's read may be built once.
    plain: bool
    #: Give up rows the claim read but could not decode, by (pk, version): no retry can help them.
    give_up: Callable[[str, list[tuple[Any, int]]], None]


@dataclass(frozen=True)
class Statement:
    """A claim's statement: its WITH items (``_sql.claim.ctes``), its answer's columns and order, the values of
    its fixed parameters, and the decoder of the rows it answers."""

    ctes: str
    columns: str
    order: str
    fixed: dict[str, Any]
    decode: Decoder

    @property
    def sql(self) -> str:
        """The claim as a statement of its own."""
        return claim_sql.alone(self.ctes, self.columns, self.order)


def statement(
    model: type[models.Model],
    connection: BaseDatabaseWrapper,
    order: tuple[str, ...],
    where: Q | None,
    *,
    ask: tuple[str, tuple[Any, ...]] | None = None,
    extra: Callable[[list[bool]], claim_sql.Extra] | None = None,
) -> Statement | None:
    """The claim of ``model``'s due rows in ``order`` (field names, ``-`` for descending) and ``where``, as one
    statement on PostgreSQL; None where it must go the long way (see the module's docstring).

    ``ask``: the lane ask's UPDATE and parameters (``pending.lane_ask``), folded in; ``extra``: what a claim
    riding in a run's start adds, for the claim order's descending flags (``_sql.tasks.start_first``).
    """
    try:
        key = (model, connection.alias, order, where, ask, extra)
        hash(key)
    except TypeError:  # a where= value that cannot be a key (a list inside a set...): compiled each time
        return None
    if key not in _STATEMENTS:
        if len(_STATEMENTS) >= _MAX_SHAPES:
            _STATEMENTS.clear()
        _STATEMENTS[key] = _build(model, connection, order, where, ask, extra)
    return _STATEMENTS[key]


def _build(
    model: type[models.Model],
    connection: BaseDatabaseWrapper,
    order: tuple[str, ...],
    where: Q | None,
    ask: tuple[str, tuple[Any, ...]] | None,
    extra: Callable[[list[bool]], claim_sql.Extra] | None,
) -> Statement | None:
    opts = model._meta
    if opts.parents or (where is not None and not _on_own_columns(model, where)):
        return None
    ordered = _order_columns(model, connection, order)
    if ordered is None:
        return None
    try:
        condition_q = state_q(model, "due_now", SAMPLE_NOW) & (where or Q())
        condition = Compiled(*q_sql(model, condition_q, connection), SAMPLE_NOW)
    except EmptyResultSet:  # a where no row can match (``n__in=[]``): the long way answers nothing
        return None
    if not condition.usable:
        return None
    condition_sql, fixed = condition.named()
    fields = [field for field in opts.concrete_fields if field.attname != "due"]
    returned = [connection.ops.quote_name(str(field.column)) for field in fields]
    ask_sql = None
    if ask is not None:
        ask_sql, ask_fixed = _named(*ask, prefix="ask")
        fixed = {**fixed, **ask_fixed}
    table = claim_sql.Table(*quoted(connection, model, "due", "attempts", "version", "pk"))
    ctes = claim_sql.ctes(
        connection,
        table,
        condition_sql,
        ordered,
        returned,
        ask=ask_sql,
        extra=extra([desc for _column, desc in ordered]) if extra is not None else None,
    )
    columns, by_order = claim_sql.answer(returned, ordered)
    return Statement(ctes, columns, by_order, fixed, Decoder(model, fields, connection))


def _order_columns(
    model: type[models.Model], connection: BaseDatabaseWrapper, order: tuple[str, ...]
) -> list[tuple[str, bool]] | None:
    """The claim order as quoted local columns, each with whether it runs descending; None for anything else."""
    columns = []
    for name in order:
        desc, name = name.startswith("-"), name.removeprefix("-")
        try:
            field: Any = model._meta.pk if name == "pk" else model._meta.get_field(name)
        except FieldDoesNotExist:
            return None
        if not field.concrete or field.is_relation:
            return None
        columns.append((connection.ops.quote_name(field.column), desc))
    return columns


def _on_own_columns(model: type[models.Model], where: Q) -> bool:
    """Whether ``where`` is a plain condition on the model's own columns: each term a field or a field and one
    lookup, with a value that is no expression; no relation followed."""
    for child in where.children:
        if isinstance(child, Q):
            if not _on_own_columns(model, child):
                return False
            continue
        if not isinstance(child, tuple):
            return False
        lookup, value = child
        name, *rest = lookup.split(LOOKUP_SEP)
        try:
            field: Any = model._meta.pk if name == "pk" else model._meta.get_field(name)
        except FieldDoesNotExist:
            return False
        if not field.concrete or field.many_to_many or len(rest) > 1 or hasattr(value, "resolve_expression"):
            return False
        if rest and rest[0] not in field.get_lookups():
            return False
    return True


def _named(sql: str, params: tuple[Any, ...], *, prefix: str) -> tuple[str, dict[str, Any]]:
    """SQL with ``%s`` placeholders, its parameters named ``prefix0``, ``prefix1``... in order."""
    pieces = sql.split("%s")
    text = pieces[0] + "".join(f"%({prefix}{index})s{piece}" for index, piece in enumerate(pieces[1:]))
    return text, {f"{prefix}{index}": value for index, value in enumerate(params)}


class Decoder:
    """Rows of a model from a claim's read, each decoded as the ORM would (its fields' converters), one by one.

    A row whose columns cannot be decoded (JSON nested deeper than Python's decoder follows, written outside the
    ORM) is answered apart (``undecodable``): it must fail alone, not the batch it came in.
    """

    def __init__(self, model: type[models.Model], fields: list[Any], connection: BaseDatabaseWrapper) -> None:
        self.model = model
        self.names = [field.attname for field in fields]
        self._connection = connection
        # Only the columns that have converters, each with its expression made once: a task's start waits for this.
        self._converting = []
        for index, field in enumerate(fields):
            column = field.get_col(model._meta.db_table)
            converters = connection.ops.get_db_converters(column) + field.get_db_converters(connection)
            if converters:
                self._converting.append((index, column, converters))
        self._pk = self.names.index(model._meta.pk.attname)
        self._version = self.names.index("version")

    def rows(self, using: str, found: list[tuple[Any, ...]]) -> tuple[list[Any], list[tuple[Any, int]]]:
        """The model's objects of ``found``, and (pk, version) of each row that could not be decoded."""
        rows, undecodable = [], []
        for values in found:
            try:
                rows.append(self.model.from_db(using, self.names, self._convert(values)))
            except (RecursionError, ValueError):
                undecodable.append((values[self._pk], values[self._version]))
        return rows, undecodable

    def _convert(self, values: tuple[Any, ...]) -> list[Any]:
        converted = list(values)
        for index, column, converters in self._converting:
            value = converted[index]
            for converter in converters:
                value = converter(value, column, self._connection)
            converted[index] = value
        return converted
