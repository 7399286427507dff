"""Start real ``manage.py`` processes against the test database."""

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def test_database_url():
    """Return a DATABASE_URL naming the database this test runs against."""
    db = settings.DATABASES["default"]
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    if connection.vendor == "postgresql":
        user = db.get("USER") or "postgres"
        host = db.get("HOST") or "127.0.0.1"
        port = db.get("PORT") or 5432
        return f"postgres://{user}@{host}:{port}/{db['NAME']}"
    if connection.vendor == "mysql":
        user = db.get("USER") or "root"
        password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
        host = db.get("HOST") or "127.0.0.1"
        port = db.get("PORT") or 3306
        return f"mysql://{user}{password}@{host}:{port}/{db['NAME']}"
    raise NotImplementedError(connection.vendor)


def manage_env(**extra):
    # PYTHONFAULTHANDLER: a process that a test gives up on is sent SIGABRT and writes every thread's stack.
    env = dict(
        os.environ, DATABASE_URL=test_database_url(), FABRIKA_LAB="1", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1"
    )
    env.update({key: str(value) for key, value in extra.items()})
    return env


def start_manage(*args, **env):
    """Start ``python manage.py ARGS`` with the test database; the caller waits for or kills it."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=manage_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
