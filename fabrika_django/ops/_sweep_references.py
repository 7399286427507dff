"""The file columns the sweep checks its candidates against: every ``FileField`` of every installed model, and
the values of each that keep a file of the swept storage (as stored, and in the storage's normal form)."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.apps import apps
from django.db import connections, router
from django.db.models import FileField, Model, Q

from .._sql import ops as sql

if TYPE_CHECKING:
    from django.core.files.storage import Storage


#: The lookups that find the values not in normal form (``/abs``, ``a//b``, ``./a``, ``a/./b``, ``a/../b``,
#: ``a/``): listing names never have these, so such a value is compared after it is normalised.
_ODD_FORMS = (
    ("startswith", "/"),
    ("contains", "//"),
    ("startswith", "./"),
    ("contains", "/./"),
    ("startswith", "../"),
    ("contains", "/../"),
    ("endswith", "/"),
    ("endswith", "/."),
    ("endswith", "/.."),
)


@dataclass(frozen=True)
class Reference:
    """One file column of one model, as seen from the swept storage."""

    #: The model whose table holds the column (a parent's, for a field inherited through multi-table inheritance).
    model: type[Model]
    #: The field's name, for the ORM.
    column: str
    #: The column's name in the table, for the one raw query (PostgreSQL's ``= ANY(array)``).
    db_column: str
    alias: str
    #: The field's storage's directory on this machine (resolved), or None for a storage not on a file system.
    root: str | None = field(default=None)
    #: The same directory as the storage gives it (absolute, unresolved): an absolute value may name either.
    location: str | None = field(default=None)

    def names(self, candidates: Iterable[str], swept_root: str | None) -> dict[str, set[str]]:
        """Map each value this column could hold for a candidate to the candidates it would keep.

        A candidate's own name always counts (a name held anywhere keeps the file, whatever storage the column
        names); on a file system, so does the name the same file has in the column's storage.
        """
        drop, add = self._translation(swept_root)
        mapped: dict[str, set[str]] = {}
        for name in candidates:
            mapped.setdefault(name, set()).add(name)
            if drop is not None and name.startswith(drop):
                mapped.setdefault(add + name[len(drop) :], set()).add(name)
        return mapped

    def _translation(self, swept_root: str | None) -> tuple[str | None, str]:
        """How a name of the swept storage becomes one of the column's storage: drop a prefix, add a prefix.

        Both roots are resolved and a listed name holds no "." or ".." part, so prefixes are exact.
        """
        if self.root is None or swept_root is None or self.root == swept_root:
            return None, ""
        if self.root.startswith(swept_root.rstrip(os.sep) + os.sep):  # the column's storage is inside
            return os.path.relpath(self.root, swept_root).replace(os.sep, "/") + "/", ""
        if swept_root.startswith(self.root.rstrip(os.sep) + os.sep):  # the column's storage is around it
            return "", os.path.relpath(swept_root, self.root).replace(os.sep, "/") + "/"
        return None, ""

    def normal_names(self, value: str, swept_root: str | None) -> set[str]:
        """The swept storage's names of the file a value not in normal form opens (empty: it opens none there).

        On a file system the value is joined to the storage's folder as ``FileSystemStorage.path()`` joins it;
        elsewhere it is a key, taken in its plain normal form.
        """
        if self.root is None or self.location is None:
            plain = posixpath.normpath(value)
            if plain.startswith("/") and swept_root is not None:
                return _inside(os.path.normpath(plain), swept_root)
            return set() if plain.startswith("..") else {plain}
        path = os.path.normpath(os.path.join(self.location, value))
        for base in (self.location, self.root):
            relative = _inside(path, base)
            if relative:
                break
        else:
            return set()
        names = set(relative)  # a name held anywhere keeps the file of that name
        if swept_root is not None:
            names |= _inside(os.path.join(self.root, *next(iter(relative)).split("/")), swept_root)
        return names


def _inside(path: str, folder: str) -> set[str]:
    """``{path's name relative to folder}`` where the path lies inside it, else empty."""
    prefix = folder.rstrip(os.sep) + os.sep
    if not path.startswith(prefix):
        return set()
    return {path[len(prefix) :].replace(os.sep, "/")}


def file_columns(swept_root: str | None) -> list[Reference]:
    """Every file column of every installed model, once per table (proxies and children share their tables)."""
    references: dict[tuple[str, str, str], Reference] = {}
    for model in apps.get_models():
        for column in model._meta.concrete_fields:
            if isinstance(column, FileField):
                owner = column.model  # the table that holds it, also for a child of multi-table inheritance
                alias = router.db_for_read(owner)
                key = (alias, owner._meta.db_table, str(column.column))
                if key not in references:
                    location, root = _column_folder(column.storage)
                    references[key] = Reference(owner, column.attname, key[2], alias, root, location)
    return list(references.values())


def _column_folder(storage: Storage) -> tuple[str | None, str | None]:
    """A column's storage's folder (as given, resolved) where its ``path()`` answers one, else (None, None).

    Unlike the swept storage (walked only when it is a ``FileSystemStorage``), any storage that answers ``path()``
    counts here: taking its names for files of that folder can only keep more.
    """
    try:
        folder = storage.path("")
    except NotImplementedError:  # Storage.path()'s default: the files are not on this machine
        return None, None
    return os.path.abspath(folder), os.path.realpath(folder)


def values_held(reference: Reference, values: list[str], *, lock: bool) -> list[str]:
    """The values among ``values`` that the column holds in some row."""
    connection = connections[reference.alias]
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(reference.model._meta.db_table)
        column = connection.ops.quote_name(reference.db_column)
        with connection.cursor() as cursor:
            cursor.execute(sql.SWEEP_VALUES_HELD.format(column=column, table=table), [values])
            return [row[0] for row in cursor.fetchall()]
    rows = reference.model._base_manager.using(reference.alias).filter(**{f"{reference.column}__in": values})
    if lock and connection.vendor != "sqlite":
        rows = rows.select_for_update()  # where no table lock was taken: hold what the re-check read
    return list(rows.values_list(reference.column, flat=True))


def odd_values_held(reference: Reference, *, lock: bool) -> set[str]:
    """The column's values not in normal form (rare, but each one may keep a file of the batch)."""
    odd = Q()
    for lookup, text in _ODD_FORMS:
        odd |= Q(**{f"{reference.column}__{lookup}": text})
    rows = reference.model._base_manager.using(reference.alias).filter(odd)
    if lock and connections[reference.alias].vendor not in ("sqlite", "postgresql"):
        rows = rows.select_for_update()  # as _values_held: where no table lock was taken, hold what was read
    return set(rows.values_list(reference.column, flat=True))
