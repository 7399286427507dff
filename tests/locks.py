"""Waiting for a row lock made an error after a short while, on each database that has row locks."""

from contextlib import contextmanager

from django.db import connection

#: What the error of a lock wait that timed out says, on PostgreSQL and on MariaDB/MySQL.
LOCK_TIMEOUT = r"lock timeout|Lock wait timeout exceeded"


def fail_lock_waits(cursor):
    """From here, a statement on ``cursor``'s connection that waits for a row lock fails (300 ms, InnoDB 1 s)."""
    if connection.vendor == "postgresql":
        cursor.execute("SET lock_timeout = '300ms'")
    else:
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")  # whole seconds on MariaDB and MySQL


def reset_lock_waits(cursor):
    if connection.vendor == "postgresql":
        cursor.execute("RESET lock_timeout")
    else:
        cursor.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")


@contextmanager
def failing_lock_waits(conn=None):
    """The block's lock waits on ``conn`` (this thread's connection by default) fail instead of waiting."""
    conn = conn or connection
    with conn.cursor() as cursor:
        fail_lock_waits(cursor)
    try:
        yield
    finally:
        with conn.cursor() as cursor:
            reset_lock_waits(cursor)
