"""The reset of every module-level cache: each one empties when a setting changes.

A cache kept at module level (a dict, a ``WeakKeyDictionary``, an ``lru_cache``'d function) holds what was
derived from the settings of its moment: the database aliases and their vendors, the installed apps and their
tables, ``FABRIKA``. When a setting changes (``override_settings`` in a test, ``setting_changed`` from any
code), what it holds may be wrong, so the convention is: **a module-level cache is made through
``resets_with_settings``**, which returns the cache unchanged and empties it on every ``setting_changed``::

    _PLANS: dict[tuple[str, str], Plan] = resets_with_settings({})

    @resets_with_settings
    @functools.lru_cache(maxsize=8)
    def _statement(alias: str) -> str: ...

Every change empties every cache: settings change in tests, not on a serving process's path, and a cache
refills on its next use, so a finer rule (which setting feeds which cache) would buy nothing and could be
wrong. A pure function of its key (a statement's text) follows the convention too, so one rule holds for
all of them and ``registered()`` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.core.signals import setting_changed

Cache = TypeVar("Cache")

_CLEARS: list[tuple[object, Callable[[], None]]] = []


def resets_with_settings(cache: Cache) -> Cache:
    """Empty ``cache`` (a mapping with ``clear()``, or an ``lru_cache``'d function) on every setting change."""
    clear = getattr(cache, "cache_clear", None) or getattr(cache, "clear", None)
    if not callable(clear):
        raise TypeError(f"{cache!r} is not a cache: give a dict (or a mapping with clear()) or an lru_cache'd function")
    _CLEARS.append((cache, clear))
    return cache


def registered() -> list[object]:
    """Every cache made through ``resets_with_settings``, in the order the modules were imported."""
    return [cache for cache, _clear in _CLEARS]


def _reset_all(**_signal: object) -> None:
    for _cache, clear in _CLEARS:
        clear()


setting_changed.connect(_reset_all, dispatch_uid="fabrika_django.caches")
