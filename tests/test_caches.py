"""Every module-level cache of fabrika_django empties when a setting changes, so it never answers for old settings."""

import importlib
import pkgutil
import weakref

from django.conf import settings
from django.test import override_settings

import fabrika_django
from fabrika_django import _caches, guards
from testproject.reminders.models import Reminder


def _modules():
    for info in pkgutil.walk_packages(fabrika_django.__path__, "fabrika_django."):
        if ".migrations" in info.name or info.name.endswith("_pytest_plugin"):
            continue
        yield importlib.import_module(info.name)


def test_every_lru_cache_at_module_level_is_made_through_the_reset():
    registered = {id(cache) for cache in _caches.registered()}
    unregistered = [
        f"{module.__name__}.{name}"
        for module in _modules()
        for name, value in vars(module).items()
        if callable(getattr(value, "cache_clear", None))
        and getattr(value, "__module__", module.__name__) == module.__name__
        and id(value) not in registered
    ]
    assert unregistered == []


def test_a_setting_change_empties_every_registered_cache():
    class Key:  # a weakly referable key, for a WeakKeyDictionary
        pass

    key = Key()
    guards._models_by_table()  # an lru_cache'd function, filled through its use
    guards._cached_classify("UPDATE reminders_reminder SET note = 'x'")
    for cache in _caches.registered():
        if isinstance(cache, weakref.WeakKeyDictionary):
            cache[key] = "stale"
        elif isinstance(cache, dict):
            cache[("stale",)] = "stale"
    assert guards._models_by_table.cache_info().currsize == 1
    with override_settings(FABRIKA={**settings.FABRIKA}):
        pass
    for cache in _caches.registered():
        size = cache.cache_info().currsize if hasattr(cache, "cache_info") else len(cache)
        assert size == 0, f"{cache!r} kept {size} entries across a setting change"


def test_the_write_guard_reads_the_tables_of_the_apps_installed_now():
    assert guards._model_of_table("reminders_reminder") is Reminder  # read, and kept
    without = [app for app in settings.INSTALLED_APPS if app not in ("testproject.reminders", "testproject.lab")]
    with override_settings(INSTALLED_APPS=without):
        assert guards._model_of_table("reminders_reminder") is None
    assert guards._model_of_table("reminders_reminder") is Reminder
