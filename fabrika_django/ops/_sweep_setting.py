"""``FABRIKA["FILE_SWEEP"]``: what it holds, and the check (``fabrika.E036``, ``fabrika.E037``) that refuses a
setting the sweep could not follow safely: a storage whose folder holds code, configuration or the working
directory is never swept."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypedDict, cast

from django.apps import apps
from django.conf import settings as django_settings
from django.core import checks

from ..conf import settings

if TYPE_CHECKING:
    from django.core.files.storage import Storage

_KEYS = ("storages", "older_than_days")
#: A grace period longer than this is no sweep at all, and past ~2.7 million days the cutoff leaves the calendar.
MAX_DAYS = 36500


class SweepConfig(TypedDict):
    """``FABRIKA["FILE_SWEEP"]`` once ``check_setting`` found nothing wrong with it."""

    storages: Sequence[str]
    older_than_days: int


def configured() -> SweepConfig | None:
    value = settings.FILE_SWEEP
    # Its shape is what check_setting accepts: every caller checks it so before the sweep reads it.
    return cast("SweepConfig", value) if isinstance(value, dict) else None


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
