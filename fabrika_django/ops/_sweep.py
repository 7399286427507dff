"""The file sweep: delete the files of the configured storages that no file column references, after a grace period.

``FABRIKA["FILE_SWEEP"] = {"storages": ["default"], "older_than_days": 7}`` turns it on; the built-in job
``fabrika_sweep_files`` runs it daily and ``manage.py fabrika_job sweep-files [--dry-run]`` now.

Deleting a referenced file is the one thing it must never do, so:

- A reference is any value of any ``FileField``/``ImageField`` of any installed model, whatever storage the field
  names: a name held anywhere keeps the file of that name, and on a file system so does the file a column of
  another storage points to (a storage inside, or around, the swept one: ``private/x.pdf`` of the default storage
  is ``x.pdf`` to a storage in ``MEDIA_ROOT/private``). A value is compared in its storage's normal form too:
  ``./a.csv``, ``a//b.csv``, ``a/x/../b.csv`` and an absolute path inside the storage's folder open the same file
  as ``a.csv`` and ``a/b.csv``, so they keep it. A column whose storage is no ``FileSystemStorage`` but answers
  ``path()`` (a subclass of another storage that writes to disk, ``InMemoryStorage``) is handled as a file system
  storage at that folder: its names keep the files they would open there (keeping more is never a loss); a
  storage without ``path()`` (S3 …) has its names compared as stored and in their plain normal form.
- Candidates go in bounded batches, each checked twice: once when listed, and again in the deleting step, inside
  a transaction that first stops writers of the referencing tables (PostgreSQL: ``LOCK TABLE … IN SHARE MODE
  NOWAIT``, retried while a writer holds them; SQLite: the database's write lock; others: ``SELECT … FOR UPDATE``
  of the re-check). A row committed before the deleting step keeps its file; one being written waits for it.
- Only files older than the grace period, never a hidden name (``.gitkeep``, ``.htaccess``), never a symbolic
  link, nothing outside the configured storages (a file system storage is walked without following links).
- Its logs and its report count files; only ``--dry-run`` names them, to the operator who asked.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.db import OperationalError, connections, transaction

from .._running import framework_write
from .._sql import ops as sql
from ._sweep_references import Reference, file_columns, odd_values_held, values_held

if TYPE_CHECKING:
    from django.core.files.storage import Storage

    from ._sweep_setting import SweepConfig


#: Candidates per deleting step: how long the referencing tables wait for writers, and the memory a batch holds.
BATCH = 500
_LOCK_TRIES = 50


@dataclass
class SweepReport:
    """What a sweep did, in counts (never names)."""

    deleted: int = 0
    referenced: int = 0
    recent: int = 0
    #: Files a writer's row claimed between the listing and the deleting step.
    kept_on_recheck: int = 0
    #: Hidden names, links, and names a database cannot hold (not UTF-8): never swept.
    skipped: int = 0
    #: Batches left for the next sweep because writers held the tables throughout.
    busy_batches: int = 0
    #: Folders the worker may not read (their files are left, and so is what they hold).
    unreadable: int = 0
    #: Orphans the worker may not delete (a folder it reads but may not write): left, the sweep goes on.
    undeletable: int = 0

    def line(self) -> str:
        return " ".join(f"{name}={value}" for name, value in vars(self).items())


def sweep(
    config: SweepConfig,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    on_orphan: Callable[[str, str], None] | None = None,
    transaction_for: Callable[[str], AbstractContextManager[object]] | None = None,
    check_abort: Callable[[], None] = lambda: None,
) -> SweepReport:
    """Sweep each storage of ``config``; with ``dry_run``, delete nothing and tell ``on_orphan(storage, name)``."""
    from django.core.files.storage import storages

    moment = now or datetime.now(UTC)
    cutoff = (moment - timedelta(days=config["older_than_days"])).timestamp()
    report = SweepReport()
    for alias in config["storages"]:
        storage = storages[alias]
        swept_root = _root(storage)
        references = file_columns(swept_root)
        for batch in _batches(_old_files(storage, swept_root, cutoff, report)):
            check_abort()
            orphans = _unreferenced(batch, references, swept_root, report, lock=False)
            if not orphans:
                continue
            if dry_run:
                for name in orphans:
                    if on_orphan is not None:
                        on_orphan(alias, name)
                report.deleted += len(orphans)
                continue
            _delete(storage, orphans, references, swept_root, cutoff, report, transaction_for or _atomic, check_abort)
    return report


def _atomic(alias: str) -> AbstractContextManager[object]:
    return transaction.atomic(using=alias)


def _root(storage: Storage) -> str | None:
    """A file system storage's directory, resolved; None for any other (S3, InMemoryStorage …), even one whose
    ``path()`` answers: InMemoryStorage's answers a path under MEDIA_ROOT that holds none of its files."""
    from django.core.files.storage import FileSystemStorage

    # isinstance sees through default_storage, a LazyObject, which answers its target's class.
    if not isinstance(storage, FileSystemStorage):
        return None
    return os.path.realpath(storage.path(""))


def _old_files(storage: Storage, root: str | None, cutoff: float, report: SweepReport) -> Iterator[str]:
    """Stream the names of the storage's files modified before ``cutoff`` (a timestamp)."""
    listing = _walk_directory(root, report) if root is not None else _walk_storage(storage, "")
    for name, modified in listing:
        if name is None:
            report.skipped += 1
            continue
        if modified is None:
            modified = storage.get_modified_time(name).timestamp()
        if modified >= cutoff:
            report.recent += 1
            continue
        yield name


def _walk_directory(root: str, report: SweepReport) -> Iterator[tuple[str | None, float | None]]:
    """Walk a directory with ``os.scandir`` (one entry at a time), following no link; hidden names stay.

    A folder the worker may not read is skipped and counted (``report.unreadable``): its files are none of the
    sweep's business until an operator lets it read them, and its path never reaches a log.
    """
    pending = [""]
    while pending:
        prefix = pending.pop()
        try:
            entries = os.scandir(os.path.join(root, prefix) if prefix else root)
        except PermissionError:
            report.unreadable += 1
            continue
        with entries:
            for entry in entries:
                name = f"{prefix}{entry.name}"
                if entry.name.startswith(".") or not _storable(name):
                    yield None, None
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted since it was listed: nothing to sweep
                    continue
                except PermissionError:  # a folder listed but not searchable: none of its entries is readable
                    report.unreadable += 1
                    break
                if stat.S_ISDIR(info.st_mode):
                    pending.append(name + "/")
                elif stat.S_ISREG(info.st_mode):
                    yield name, info.st_mtime
                else:
                    yield None, None  # a link, a socket, a device: never ours to delete


def _walk_storage(storage: Storage, prefix: str) -> Iterator[tuple[str | None, float | None]]:
    """Walk a storage without files on this machine through its own ``listdir`` (one directory at a time)."""
    directories, files = storage.listdir(prefix)
    for file_name in files:
        name = f"{prefix}{file_name}"
        yield (name, None) if not file_name.startswith(".") and _storable(name) else (None, None)
    for directory in directories:
        if directory.startswith("."):
            continue
        yield from _walk_storage(storage, f"{prefix}{directory}/")


def _storable(name: str) -> bool:
    """Whether a database column can hold the name (a file system may hand out bytes that are not UTF-8)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in name


def _batches(names: Iterator[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for name in names:
        batch.append(name)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _unreferenced(
    batch: list[str], references: list[Reference], swept_root: str | None, report: SweepReport, *, lock: bool
) -> list[str]:
    """The names of ``batch`` that no file column holds; ``lock``: the deleting step's re-check."""
    held: set[str] = set()
    for reference in references:
        wanted = reference.names(batch, swept_root)
        if not wanted:
            continue
        for value in values_held(reference, list(wanted), lock=lock):
            held.update(wanted.get(value, ()))
        for value in odd_values_held(reference, lock=lock):
            held.update(reference.normal_names(value, swept_root).intersection(batch))
    if not lock:
        report.referenced += len(held)
    return [name for name in batch if name not in held]


def _delete(
    storage: Storage,
    orphans: list[str],
    references: list[Reference],
    swept_root: str | None,
    cutoff: float,
    report: SweepReport,
    transaction_for: Callable[[str], AbstractContextManager[object]],
    check_abort: Callable[[], None],
) -> None:
    """Re-check ``orphans`` with the referencing tables' writers stopped, then delete what is still unreferenced."""
    aliases = sorted({reference.alias for reference in references}) or ["default"]
    for tries in range(_LOCK_TRIES):
        try:
            with ExitStack() as stack:
                for alias in aliases:
                    stack.enter_context(transaction_for(alias))
                    _stop_writers(alias, [r for r in references if r.alias == alias])
                still = _unreferenced(orphans, references, swept_root, report, lock=True)
                still = [name for name in still if _still_old(swept_root, name, cutoff)]
                report.kept_on_recheck += len(orphans) - len(still)
                for name in still:
                    if _deleted(storage, name):
                        report.deleted += 1
                    else:
                        report.undeletable += 1
                return
        except _Busy:
            check_abort()
            time.sleep(min(0.05 * (tries + 1), 1.0))
    report.busy_batches += 1


def _deleted(storage: Storage, name: str) -> bool:
    """Delete one orphan; False where the worker may not: one such file would otherwise fail every day's sweep at
    the same place, and its path would reach the log through the exception."""
    try:
        storage.delete(name)
    except PermissionError:
        return False
    return True


def _still_old(root: str | None, name: str, cutoff: float) -> bool:
    """On a file system, whether the file is still an old regular file: one written since the listing (a storage
    that overwrites a name, a request still saving its row) is recent again and stays."""
    if root is None:
        return True
    try:
        info = os.lstat(os.path.join(root, *name.split("/")))
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_mtime < cutoff


class _Busy(Exception):
    """A writer holds a referencing table: try the batch again shortly."""


def _stop_writers(alias: str, references: list[Reference]) -> None:
    """Hold off writers of the referencing tables until this transaction ends (see the module's docstring)."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        tables = sorted({connection.ops.quote_name(r.model._meta.db_table) for r in references})
        if not tables:
            return
        try:
            with connection.cursor() as cursor:
                # NOWAIT: never queue behind a writer (and so never join a deadlock); the batch is tried again.
                cursor.execute(sql.SWEEP_STOP_WRITERS.format(tables=", ".join(tables)))
        except OperationalError as error:
            if _sqlstate(error) == "55P03":  # lock_not_available
                raise _Busy from None
            raise
    elif connection.vendor == "sqlite":
        # SQLite has one write lock for the whole database: a write takes it, and with it the newest snapshot.
        if not references:
            return
        model = references[0].model
        table = connection.ops.quote_name(model._meta.db_table)
        column = connection.ops.quote_name(model._meta.pk.column or "id")
        with framework_write(), connection.cursor() as cursor:
            cursor.execute(sql.SWEEP_TAKE_WRITE_LOCK.format(table=table, column=column))


def _sqlstate(error: BaseException) -> str | None:
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
