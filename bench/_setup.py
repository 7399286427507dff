"""What the benches share: printing a line, making their PostgreSQL database, and setting Django up on it."""

from __future__ import annotations

import os
import sys


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def create_database(url: str) -> None:
    """Create the database ``url`` names, if it does not exist yet."""
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(url: str, *, lab: bool) -> None:
    """Set Django up on ``url`` as in production (DEBUG off) and migrate; ``lab`` installs the lab app."""
    os.environ["DATABASE_URL"] = url
    if lab:
        os.environ["FABRIKA_LAB"] = "1"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("FABRIKA_LOG_LEVEL", "WARNING")
    os.environ["DEBUG"] = "0"  # DEBUG keeps every statement in connection.queries
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
