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


@pytest.mark.row_locks
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


@pytest.mark.mysql
@pytest.mark.django_db
def test_on_mariadb_the_kind_is_read_from_the_error_number_in_the_servers_language_too():
    # A server whose messages are Spanish ("Base de datos ... desconocida") names no kind in English words.
    spanish = _wrapper(OPTIONS={**connection.settings_dict["OPTIONS"], "init_command": "SET lc_messages = 'es_ES'"})
    assert _db_failure.kind_of(_failure(spanish, "USE fabrika_no_such_database")) == "no_database"
    read_only = _wrapper(
        OPTIONS={**connection.settings_dict["OPTIONS"], "init_command": "SET SESSION TRANSACTION READ ONLY"}
    )
    assert _db_failure.kind_of(_failure(read_only, "CREATE TABLE fabrika_probe (n int)")) == "read_only"


@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_a_mariadb_session_the_server_killed_is_terminated_or_lost():
    wrapper = _wrapper()
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (session,) = cursor.fetchone()
    with connection.cursor() as cursor:
        cursor.execute(f"KILL {int(session)}")
    assert _db_failure.kind_of(_failure(wrapper)) in {"terminated", "connection_lost"}


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


@pytest.mark.row_locks
def test_a_refused_login_is_logged_as_auth_failed_without_the_password_or_the_servers_words():
    port = int(connection.settings_dict["PORT"] or (5432 if connection.vendor == "postgresql" else 3306))
    url = _url_with_port(port, user="fabrika_no_such_role:s3cret-never-logged")
    worker = WorkerProcess("--only", "lab_stamp", DATABASE_URL=url)
    try:
        wait_until(lambda: "Database unavailable" in worker.output(), workers=[worker], what="the failure's line")
        [line] = [line for line in worker.output().splitlines() if "Database unavailable" in line][:1]
        assert f"server=127.0.0.1:{port} kind=auth_failed error=OperationalError" in line
        output = worker.output()
        assert "s3cret-never-logged" not in output
        assert "does not exist" not in output and "access denied" not in output.lower()
    finally:
        worker.kill()


def _url_with_port(port: int, user: str | None = None) -> str:
    settings = connection.settings_dict
    scheme = "postgres" if connection.vendor == "postgresql" else "mysql"
    return f"{scheme}://{user or settings['USER']}@127.0.0.1:{port}/{settings['NAME']}"
