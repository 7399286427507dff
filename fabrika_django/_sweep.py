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
import posixpath
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import OperationalError, connections, router, transaction
from django.db.models import FileField, Model, Q

from ._running import framework_write
from .conf import settings

if TYPE_CHECKING:
    from django.core.files.storage import Storage

    from .context import JobContext

#: Candidates per deleting step: how long the referencing tables wait for writers, and the memory a batch holds.
BATCH = 500
_LOCK_TRIES = 50
_KEYS = ("storages", "older_than_days")
#: A grace period longer than this is no sweep at all, and past ~2.7 million days the cutoff leaves the calendar.
MAX_DAYS = 36500
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

#: Tests set this to ``f(point, names)``, called at "listed" (a batch found unreferenced, before its deleting
#: step), "busy" (a writer holds a referencing table) and "locked" (re-checked under the lock, before deleting).
_test_hook: Callable[[str, list[str]], None] | None = None


@dataclass
class _Report:
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

    def line(self) -> str:
        return " ".join(f"{name}={value}" for name, value in vars(self).items())


@dataclass(frozen=True)
class _Reference:
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


def configured() -> dict[str, Any] | None:
    value = settings.FILE_SWEEP
    return value if isinstance(value, dict) else None


def run_in_job(ctx: JobContext) -> _Report | None:
    """The built-in job's body: one sweep of every configured storage, fenced by the job's lease."""
    config = configured()
    if config is None:
        ctx.log.debug("File sweep not configured (FABRIKA['FILE_SWEEP'])")
        return None
    problems = check_setting(config)
    if problems:  # `manage.py check` says so too; never guess what a bad setting meant to keep
        raise ImproperlyConfigured(f"{problems[0].msg} {problems[0].hint}")
    report = sweep(
        config,
        now=ctx.now(),
        transaction_for=lambda alias: ctx.transaction(using=alias),
        check_abort=ctx.signal.throw_if_aborted,
    )
    _last_reports.clear()  # one run at a time per process (the job's lease): keep only the latest
    _last_reports[str(ctx.run_id)] = report
    ctx.log.info("Swept files %s", report.line())
    return report


#: The report of each run of this process, by run id, for ``fabrika_job sweep-files`` to print.
_last_reports: dict[str, _Report] = {}


def sweep(
    config: dict[str, Any],
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    on_orphan: Callable[[str, str], None] | None = None,
    transaction_for: Callable[[str], AbstractContextManager[Any]] | None = None,
    check_abort: Callable[[], None] = lambda: None,
) -> _Report:
    """Sweep each storage of ``config``; with ``dry_run``, delete nothing and tell ``on_orphan(storage, name)``."""
    from django.core.files.storage import storages

    moment = now or datetime.now(UTC)
    cutoff = (moment - timedelta(days=config["older_than_days"])).timestamp()
    report = _Report()
    for alias in config["storages"]:
        storage = storages[alias]
        swept_root = _root(storage)
        references = _references(swept_root)
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
            _hook("listed", orphans)
            _delete(storage, orphans, references, swept_root, cutoff, report, transaction_for or _atomic, check_abort)
    return report


def _hook(point: str, names: list[str]) -> None:
    if _test_hook is not None:
        _test_hook(point, names)


def _atomic(alias: str) -> AbstractContextManager[Any]:
    return transaction.atomic(using=alias)


def _root(storage: Storage) -> str | None:
    """A file system storage's directory, resolved; None for any other (S3, InMemoryStorage …), even one whose
    ``path()`` answers: InMemoryStorage's answers a path under MEDIA_ROOT that holds none of its files."""
    from django.core.files.storage import FileSystemStorage

    # isinstance sees through default_storage, a LazyObject, which answers its target's class.
    if not isinstance(storage, FileSystemStorage):
        return None
    return os.path.realpath(storage.path(""))


def _references(swept_root: str | None) -> list[_Reference]:
    """Every file column of every installed model, once per table (proxies and children share their tables)."""
    references: dict[tuple[str, str, str], _Reference] = {}
    for model in apps.get_models():
        for column in model._meta.concrete_fields:
            if isinstance(column, FileField):
                owner = column.model  # the table that holds it, also for a child of multi-table inheritance
                alias = router.db_for_read(owner)
                key = (alias, owner._meta.db_table, str(column.column))
                if key not in references:
                    location, root = _column_folder(column.storage)
                    references[key] = _Reference(owner, column.attname, key[2], alias, root, location)
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


def _old_files(storage: Storage, root: str | None, cutoff: float, report: _Report) -> Iterator[str]:
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


def _walk_directory(root: str, report: _Report) -> Iterator[tuple[str | None, float | None]]:
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
    batch: list[str], references: list[_Reference], swept_root: str | None, report: _Report, *, lock: bool
) -> list[str]:
    """The names of ``batch`` that no file column holds; ``lock``: the deleting step's re-check."""
    held: set[str] = set()
    for reference in references:
        wanted = reference.names(batch, swept_root)
        if not wanted:
            continue
        for value in _values_held(reference, list(wanted), lock=lock):
            held.update(wanted.get(value, ()))
        for value in _odd_values_held(reference, lock=lock):
            held.update(reference.normal_names(value, swept_root).intersection(batch))
    if not lock:
        report.referenced += len(held)
    return [name for name in batch if name not in held]


def _values_held(reference: _Reference, values: list[str], *, lock: bool) -> list[str]:
    """The values among ``values`` that the column holds in some row."""
    connection = connections[reference.alias]
    if connection.vendor == "postgresql":
        # One array parameter, not one placeholder per name: a query of 500 placeholders costs more to bind
        # on the client than to run.
        table = connection.ops.quote_name(reference.model._meta.db_table)
        column = connection.ops.quote_name(reference.db_column)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {column} FROM {table} WHERE {column} = ANY(%s)", [values])  # noqa: S608
            return [row[0] for row in cursor.fetchall()]
    rows = reference.model._base_manager.using(reference.alias).filter(**{f"{reference.column}__in": values})
    if lock and connection.vendor != "sqlite":
        rows = rows.select_for_update()  # where no table lock was taken: hold what the re-check read
    return list(rows.values_list(reference.column, flat=True))


def _odd_values_held(reference: _Reference, *, lock: bool) -> set[str]:
    """The column's values not in normal form (rare, but each one may keep a file of the batch)."""
    odd = Q()
    for lookup, text in _ODD_FORMS:
        odd |= Q(**{f"{reference.column}__{lookup}": text})
    rows = reference.model._base_manager.using(reference.alias).filter(odd)
    if lock and connections[reference.alias].vendor not in ("sqlite", "postgresql"):
        rows = rows.select_for_update()  # as _values_held: where no table lock was taken, hold what was read
    return set(rows.values_list(reference.column, flat=True))


def _delete(
    storage: Storage,
    orphans: list[str],
    references: list[_Reference],
    swept_root: str | None,
    cutoff: float,
    report: _Report,
    transaction_for: Callable[[str], AbstractContextManager[Any]],
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
                _hook("locked", still)
                for name in still:
                    storage.delete(name)
                report.deleted += len(still)
                return
        except _Busy:
            _hook("busy", orphans)
            check_abort()
            time.sleep(min(0.05 * (tries + 1), 1.0))
    report.busy_batches += 1


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


def _stop_writers(alias: str, references: list[_Reference]) -> None:
    """Hold off writers of the referencing tables until this transaction ends (see the module's docstring)."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        tables = sorted({connection.ops.quote_name(r.model._meta.db_table) for r in references})
        if not tables:
            return
        try:
            with connection.cursor() as cursor:
                # NOWAIT: never queue behind a writer (and so never join a deadlock); the batch is tried again.
                cursor.execute(f"LOCK TABLE {', '.join(tables)} IN SHARE MODE NOWAIT")
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
            cursor.execute(f"UPDATE {table} SET {column} = {column} WHERE 1 = 0")  # noqa: S608 - quoted names


def _sqlstate(error: BaseException) -> str | None:
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)


# -- the setting ----------------------------------------------------------------------------------------------------


def check_setting(value: object) -> list[checks.CheckMessage]:
    """``fabrika.E036``: FILE_SWEEP is None or {"storages": [aliases of STORAGES], "older_than_days": whole days}."""
    hint = (
        "Set FABRIKA['FILE_SWEEP'] = {'storages': ['default'], 'older_than_days': 7}: the aliases of STORAGES whose "
        "unreferenced files may go, and the days a file is kept before that; or None for no sweep."
    )

    def error(problem: str) -> list[checks.CheckMessage]:
        return [checks.Error(f"Setting FABRIKA['FILE_SWEEP'] {problem}.", hint=hint, id="fabrika.E036")]

    if value is None:
        return []
    if not isinstance(value, dict):
        return error(f"is a {type(value).__name__}, not a dict")
    unknown = sorted(str(key) for key in value if key not in _KEYS)
    if unknown:
        return error(f"has unknown key {unknown[0]!r} (it takes 'storages' and 'older_than_days')")
    days = value.get("older_than_days")
    if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= MAX_DAYS:
        return error(f"has older_than_days={days!r}, which is not a whole number of days from 1 to {MAX_DAYS}")
    aliases = value.get("storages")
    if not isinstance(aliases, list | tuple) or not aliases or not all(isinstance(a, str) for a in aliases):
        return error("has no list of storage aliases under 'storages'")
    known = getattr(django_settings, "STORAGES", {})
    for alias in aliases:
        if alias not in known:
            return error(f"names storage {alias!r}, which is not in STORAGES ({', '.join(sorted(known))})")
        if alias == "staticfiles":
            return error("names 'staticfiles': no file column references a static file, so it would empty it")
    from django.core.files.storage import storages

    for alias in aliases:
        problem = unsafe_location(storages[alias])
        if problem:
            return [
                checks.Error(
                    f"Storage {alias!r} of FABRIKA['FILE_SWEEP'] has a location that {problem}: the sweep would "
                    "delete files that are not media.",
                    hint="Give the storage an absolute folder of its own for uploaded files (MEDIA_ROOT, or "
                    "STORAGES[...]['OPTIONS']['location']), outside the project and its code.",
                    obj=alias,
                    id="fabrika.E037",
                )
            ]
    return []


def unsafe_location(storage: Storage) -> str | None:
    """Why a file system storage's folder is no place to sweep, or None where it is (or it is no file system).

    Django makes an unset ``MEDIA_ROOT`` (``''``) the working directory, and a relative one follows the working
    directory wherever the worker starts: the sweep would then delete the project's own files. So the folder must
    be given, absolute, not the filesystem's root, and hold none of the places code and configuration live in (a
    folder equal to one of them holds it).
    """
    from django.core.files.storage import FileSystemStorage

    if not isinstance(storage, FileSystemStorage):
        return None
    # base_location is the location as configured (OPTIONS["location"], else MEDIA_ROOT), before FileSystemStorage
    # makes it absolute against the working directory; location is that absolute form.
    configured = os.fspath(storage.base_location or "")
    if not configured:
        return "is empty (MEDIA_ROOT unset), so it is the working directory"
    if not os.path.isabs(configured):
        return f"is relative ({configured}), so it is wherever the worker starts"
    folder = os.path.realpath(configured)
    if os.path.dirname(folder) == folder:
        return "is the filesystem root"
    for what, path in _places_never_swept():
        place = os.path.realpath(path)
        if place == folder or place.startswith(folder.rstrip(os.sep) + os.sep):
            return f"contains {what} ({path})"
    return None


def _places_never_swept() -> Iterator[tuple[str, str]]:
    """The project's code and configuration, the interpreter's installation and the working directory."""
    base_dir = getattr(django_settings, "BASE_DIR", None)
    if base_dir:
        yield "BASE_DIR", os.fspath(base_dir)
    # Under override_settings SETTINGS_MODULE reads None; the environment still names the module Django loaded.
    module_name = getattr(django_settings, "SETTINGS_MODULE", None) or os.environ.get("DJANGO_SETTINGS_MODULE")
    settings_module = sys.modules.get(module_name or "")
    settings_file = getattr(settings_module, "__file__", None)
    if settings_file:
        yield "the settings module", settings_file
    yield "sys.prefix", sys.prefix
    static_root = getattr(django_settings, "STATIC_ROOT", None)
    if static_root:
        yield "STATIC_ROOT", os.fspath(static_root)
    yield "the working directory", os.getcwd()
    for app_config in apps.get_app_configs():
        yield f"the installed app {app_config.name}", app_config.path


# -- manage.py fabrika_job sweep-files ------------------------------------------------------------------------------


def command(out: Any, *, dry_run: bool, **options: Any) -> None:
    """``fabrika_job sweep-files [--dry-run]``: a run of the built-in job, or a listing of what it would delete."""
    from django.core.management.base import CommandError

    config = configured()
    problems = check_setting(settings.FILE_SWEEP) if settings.FILE_SWEEP is not None else []
    if config is None or problems:
        if problems:
            raise CommandError(f"{problems[0].msg} {problems[0].hint} Nothing was deleted.", returncode=2)
        raise CommandError(
            "Setting FABRIKA['FILE_SWEEP'] is not set. Turn the sweep on with FABRIKA['FILE_SWEEP'] = "
            "{'storages': ['default'], 'older_than_days': 7}.",
            returncode=2,
        )
    kept = "kept: {referenced} referenced, {recent} newer than {days} days"
    if dry_run:

        def show(storage: str, name: str) -> None:
            out.stdout.write(f"{storage}: {name if name.isprintable() else ascii(name)}")

        report = sweep(config, dry_run=True, on_orphan=show)
        counts = kept.format(days=config["older_than_days"], **vars(report)) + _unreadable(report)
        out.stdout.write(f"Would delete {report.deleted} files ({counts}); deleted nothing.")
        return
    from . import runner
    from .jobs import registry

    result = runner.run(registry.get("fabrika_sweep_files"), "manual")
    done = _last_reports.pop(str(result.run_id), None)
    if result.outcome == "coalesced":
        out.stdout.write("The file sweep is running elsewhere: marked pending, it runs once more after.")
    elif not result.ok or done is None:
        raise CommandError(
            f"The file sweep failed: {result.outcome} (run {result.run_id}); files it deleted before stay deleted, "
            "see its attempts in the admin.",
            returncode=1,
        )
    else:
        counts = kept.format(days=config["older_than_days"], **vars(done)) + _unreadable(done)
        busy = f"; {done.busy_batches} batches left for the next sweep (writers held the tables)"
        out.stdout.write(
            f"Deleted {done.deleted} files ({counts}){busy if done.busy_batches else ''} (run {result.run_id})."
        )


def _unreadable(report: _Report) -> str:
    if not report.unreadable:
        return ""
    return f"; {report.unreadable} folders skipped: the worker may not read them"
