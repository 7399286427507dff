"""A database failure is logged with its server and a fixed kind, never its message or a password.

``Database unavailable error=OperationalError`` read the same for a dead host, a standby that refuses writes and a
wrong password. The failures here are real ones, made against the real servers the suite runs on.
"""

import socket

import pytest
from django.db import DatabaseError, connection, connections

from fabrika_django import _db_failure

from .workers import WorkerProcess, wait_until


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again at once: nothing listens there


def _wrapper(**changes):
    """A second connection of this database's kind, with other settings (the same backend's class)."""
    settings = {**connection.settings_dict, **changes}
    return type(connections["default"])(settings)  # a DatabaseWrapper not registered in django.db.connections


def _failure(wrapper, sql="SELECT 1"):
    with pytest.raises(DatabaseError) as failed:
        try:
            with wrapper.cursor() as cursor:
                cursor.execute(sql)
        finally:
            wrapper.close()
    return failed.value


@pytest.mark.row_locks
@pytest.mark.django_db
def test_a_server_that_is_not_there_is_refused():
    assert _db_failure.kind_of(_failure(_wrapper(HOST="127.0.0.1", PORT=_closed_port()))) == "refused"


@pytest.mark.postgresql
@pytest.mark.django_db
def test_a_database_that_does_not_exist_and_an_unknown_role_are_told_apart():
    assert _db_failure.kind_of(_failure(_wrapper(NAME="fabrika_no_such_database"))) == "no_database"
    assert _db_failure.kind_of(_failure(_wrapper(USER="fabrika_no_such_role"))) == "auth_failed"


@pytest.mark.postgresql
@pytest.mark.django_db
def test_a_write_a_read_only_server_refuses_is_read_only_and_a_missing_table_names_its_sqlstate():
    wrapper = _wrapper(
        OPTIONS={**connection.settings_dict["OPTIONS"], "options": "-c default_transaction_read_only=on"}
    )
    assert _db_failure.kind_of(_failure(wrapper, "CREATE TABLE fabrika_probe (n int)")) == "read_only"
    assert _db_failure.kind_of(_failure(_wrapper(), "SELECT * FROM fabrika_no_such_table")) == "sqlstate_42P01"


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_session_the_server_ended_is_terminated():
    wrapper = _wrapper()
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    assert _db_failure.kind_of(_failure(wrapper)) in {"terminated", "connection_lost"}


def test_the_server_of_a_multi_host_setting_names_each_host_with_its_port():
    pair = {**connection.settings_dict, "HOST": "db1,db2", "PORT": "5432,5433", "PASSWORD": "s3cret"}
    assert _db_failure.server_of(pair) == "db1:5432,db2:5433"
    assert _db_failure.server_of({"HOST": "", "PORT": ""}) == "local socket"


@pytest.mark.row_locks
def test_the_worker_logs_which_server_and_what_kind_of_failure_never_the_message():
    port = _closed_port()
    worker = WorkerProcess("--only", "lab_stamp", DATABASE_URL=_url_with_port(port))
    try:
        wait_until(lambda: "Database unavailable" in worker.output(), workers=[worker], what="the failure's line")
        [line] = [line for line in worker.output().splitlines() if "Database unavailable" in line][:1]
        assert f"server=127.0.0.1:{port} kind=refused error=OperationalError" in line
        assert "Connection refused" not in worker.output() and "connection failed" not in worker.output().lower()
    finally:
        worker.kill()


def _url_with_port(port: int) -> str:
    settings = connection.settings_dict
    scheme = "postgres" if connection.vendor == "postgresql" else "mysql"
    return f"{scheme}://{settings['USER']}@127.0.0.1:{port}/{settings['NAME']}"
