"""Settings of the demo and test project, read from the environment with django-environ.

``DATABASE_URL`` defaults to a SQLite file, so the demo needs no server; ``EMAIL_URL`` to the console.
"""

import json
import os
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

import django
import environ

from testproject.mailers import mailers_setting

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env(DEBUG=(bool, True))

DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY", default="fabrika-demo-only-not-a-secret")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "fabrika_django",
    "testproject.tasks",
    "testproject.outbox",
    "testproject.reminders",
    "testproject.reports",
]
# The lab app holds jobs and a table for the test suite's cross-process tests; it stays out of the demo.
if env.bool("FABRIKA_LAB", default=any("pytest" in arg for arg in sys.argv[:2])):
    INSTALLED_APPS.append("testproject.lab")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "testproject" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "testproject.wsgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Threads of one process share the file; wait for the write lock instead of failing at once.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 30
    # WAL: readers (the admin, a page) never hold up the worker's writes, and a commit appends to the log
    # instead of a rollback journal's several flushes. synchronous=NORMAL flushes the log at checkpoints:
    # a process crash loses nothing, a power cut may lose the last commits but never corrupts the file.
    DATABASES["default"]["OPTIONS"].setdefault("init_command", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
    # A file, not Django's shared in-memory database: its table locks ignore the busy timeout.
    DATABASES["default"]["TEST"] = {
        "NAME": env(
            "SQLITE_TEST_NAME",
            default=os.path.join(tempfile.gettempdir(), f"fabrika-test-{os.getpid()}.sqlite3"),
        )
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS: list = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = env("TIME_ZONE", default="Europe/Berlin")
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
STATICFILES_DIRS = [BASE_DIR / "testproject" / "static"]  # the demo pages' shared stylesheet
MEDIA_URL = "media/"
MEDIA_ROOT = env("MEDIA_ROOT", default=str(BASE_DIR / "var" / "media"))

_email = env.email_url("EMAIL_URL", default="consolemail://")
# EMAIL_BACKEND names a backend of one's own (a provider's, one that deduplicates) over EMAIL_URL's host and port.
_email["EMAIL_BACKEND"] = env("EMAIL_BACKEND", default=_email["EMAIL_BACKEND"])
if django.VERSION >= (6, 1):
    # Django 6.1 replaces the EMAIL_* settings with MAILERS.
    MAILERS = mailers_setting(_email)
else:
    vars().update(_email)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="Fabrika demo <demo@localhost>")

FABRIKA = {
    "ENVIRONMENT": env("FABRIKA_ENVIRONMENT", default="demo"),
    "BASE_URL": env("BASE_URL", default="http://127.0.0.1:8000"),
    "POLL_INTERVAL": env.float("FABRIKA_POLL_INTERVAL", default=1.0),
    "LEASE_SECONDS": env.int("FABRIKA_LEASE_SECONDS", default=30),
    # Empty: the worker polls (a database behind a transaction pooler, where LISTEN cannot work).
    "LISTEN_DATABASE": env("FABRIKA_LISTEN_DATABASE", default="default") or None,
    # The benches compare durable bookkeeping commits (the default) with the faster opt-in.
    "ASYNC_BOOKKEEPING_COMMITS": env.bool("FABRIKA_ASYNC_BOOKKEEPING_COMMITS", default=False),
}

# Django tasks on fabrika's worker: built into Django 6.0+, the django-tasks backport on 5.2 (the "tasks" extra).
if find_spec("django.tasks") or find_spec("django_tasks"):
    _task_options: dict[str, object] = {"max_attempts": 3, "timeout": 60}
    # tests/test_ratelimit.py: the emails queue at a shared rate, e.g. "5/s".
    if env("FABRIKA_LAB_EMAILS_RATE", default=""):
        _task_options["rate_limit"] = {"emails": env("FABRIKA_LAB_EMAILS_RATE")}
    # tests/test_periodic.py: periodic entries for the workers it starts, as JSON.
    if env("FABRIKA_LAB_PERIODIC", default=""):
        _task_options["periodic"] = json.loads(env("FABRIKA_LAB_PERIODIC"))
    TASKS = {
        "default": {
            "BACKEND": "fabrika_django.tasks.FabrikaBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": _task_options,
        }
    }
    # bench/tasks.py runs django-tasks-db beside it on the same database (installed by hand, not a dependency).
    if env.bool("FABRIKA_BENCH_TASKS_DB", default=False):
        INSTALLED_APPS.append("django_tasks_db")
        TASKS["db"] = {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"fabrika_django": {"handlers": ["console"], "level": env("FABRIKA_LOG_LEVEL", default="INFO")}},
}
