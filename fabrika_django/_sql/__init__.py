"""The one home of fabrika's hand-written SQL, and the helpers its statements share.

Each module here holds the statements of one concern, each statement a function named for what it does, written
once per vendor where the vendors differ; the rest of the package calls them by name (as Procrastinate's
``manager.py`` calls ``queries.sql``) and never writes SQL of its own. A statement names a table through
``table()``, which asks the app registry, so no module here imports the models (the models import the claim's
statements).

Two helpers serve every module of the package:

- ``cache`` / ``cache_dict``: a statement cache, made through ``_caches.resets_with_settings``, the one
  home of every cache's reset on Django's ``setting_changed`` (a statement built once may depend on a
  setting: ``DATABASES``, ``FABRIKA``, a model's options under ``override_settings``).
- ``Compiled``: a queryset's or condition's SQL compiled once with a stand-in for "now", the time bound afresh
  on each use (``Compiled.bind``), where compiling each time cost more than running the statement.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.apps import apps

from .._caches import resets_with_settings

if TYPE_CHECKING:
    from django.db import models
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import _SQLType

    #: A statement's parameter as Django's cursor takes it (django-stubs' own type; a type only).
    SQLParam = _SQLType

_F = TypeVar("_F", bound=Callable[..., object])

#: Stands for "now" while a statement is compiled once (``Compiled``): no real instant is ever this one.
SAMPLE_NOW = datetime(2000, 1, 1, tzinfo=UTC)


def cache(maxsize: int = 64) -> Callable[[_F], _F]:
    """``functools.lru_cache`` whose contents are dropped on ``setting_changed`` (``_caches``, the one reset)."""

    def decorate(func: _F) -> _F:
        return resets_with_settings(functools.lru_cache(maxsize=maxsize)(func))  # type: ignore[return-value]

    return decorate


def cache_dict(*, weak: bool = False) -> Any:
    """A module-level dict cache, emptied on ``setting_changed`` (``weak``: a ``WeakKeyDictionary``, for a cache
    keyed by objects that come and go, such as connections)."""
    return resets_with_settings(weakref.WeakKeyDictionary() if weak else {})


def table(connection: BaseDatabaseWrapper, model_name: str) -> str:
    """The quoted table of fabrika's model ``model_name`` (``"Job"``, ``"Lease"``…) on ``connection``."""
    return str(connection.ops.quote_name(apps.get_model("fabrika_django", model_name)._meta.db_table))


def quoted(connection: BaseDatabaseWrapper, model: type[models.Model], *names: str) -> list[str]:
    """The model's quoted table name, then the quoted column of each field named (``"pk"`` too)."""
    opts = model._meta
    fields: list[Any] = [opts.pk if name == "pk" else opts.get_field(name) for name in names]
    return [connection.ops.quote_name(opts.db_table), *(connection.ops.quote_name(f.column) for f in fields)]


class Compiled:
    """SQL compiled once with ``SAMPLE_NOW`` among its parameters, bound to a real "now" on each use.

    ``sql`` and ``params`` are what the compiler answered; ``at`` the positions in ``params`` that were the
    sample (as the database takes it, ``prepare(SAMPLE_NOW)``). ``usable`` is False when the sample was not
    found exactly once: a statement whose "now" cannot be swapped must be compiled each time.
    """

    def __init__(self, sql: str, params: Sequence[SQLParam], sample: object) -> None:
        self.sql = sql
        self.params = list(params)
        self.at = [index for index, value in enumerate(self.params) if type(value) is type(sample) and value == sample]
        self.usable = len(self.at) == 1

    def bind(self, now: SQLParam) -> list[SQLParam]:
        """The parameters with ``now`` (as the database takes it) in the sample's place."""
        values = list(self.params)
        for index in self.at:
            values[index] = now
        return values

    def named(self) -> tuple[str, dict[str, SQLParam]]:
        """The SQL with ``%(now)s`` in the sample's place and ``%(pN)s`` for the rest; the fixed values by name.

        For a statement built of named parameters (``%(name)s``) around this condition.
        """
        pieces = self.sql.split("%s")
        text, fixed = pieces[0], {}
        for index, value in enumerate(self.params):
            if index in self.at:
                text += "%(now)s"
            else:
                fixed[f"p{index}"] = value
                text += f"%(p{index})s"
            text += pieces[index + 1]
        return text, fixed
