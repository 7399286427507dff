"""What a database failure was, in words an operator can act on: which server, and a fixed kind.

``error=OperationalError`` reads the same for a dead host, a standby that refuses writes and a wrong password. The
worker's and the listener's logs name the server the connection was for (its settings' host and port, never the
password) and one of the kinds below, read from the driver's SQLSTATE or, on MariaDB/MySQL, its error number,
where it has one. psycopg has neither for a failure to connect (libpq reports those in words alone), so then the
kind is read from the message, which is itself never logged (it may quote a query or a value).
"""

from __future__ import annotations

from typing import Any

#: SQLSTATE (PostgreSQL's and the ones MariaDB/MySQL share) -> kind.
_BY_SQLSTATE = {
    "28P01": "auth_failed",
    "28000": "auth_failed",
    "3D000": "no_database",
    "57P03": "starting_up",
    "57P01": "terminated",
    "57P02": "terminated",
    "25006": "read_only",
    "08006": "connection_lost",
    "08001": "unreachable",
    "08004": "refused",
}

#: MariaDB/MySQL error number (mysqlclient's ``args[0]``) -> kind. "Can't connect" (2002, 2003) is left to the
#: words: its number is the same for a refusal and a timeout.
_BY_MYSQL_ERROR = {
    1044: "auth_failed",  # access denied to the database
    1045: "auth_failed",  # access denied (a wrong password)
    1698: "auth_failed",  # access denied (an unknown user)
    1049: "no_database",
    1053: "shutting_down",
    1290: "read_only",  # the server runs with --read-only
    1792: "read_only",  # a READ ONLY transaction
    1836: "read_only",  # read-only mode
    1927: "terminated",  # the session was KILLed
    2005: "unknown_host",
    2006: "connection_lost",  # the server has gone away
    2013: "connection_lost",  # lost connection during a query
}

#: Words of a driver's message -> kind, where it gives no SQLSTATE (most failures to connect): every fragment of
#: the entry must be in the message.
_BY_WORDS: tuple[tuple[tuple[str, ...], str], ...] = tuple(
    (words if isinstance(words, tuple) else (words,), kind)
    for words, kind in (
        ("password authentication failed", "auth_failed"),
        ("access denied", "auth_failed"),
        ("no pg_hba.conf entry", "auth_failed"),
        (("role", "does not exist"), "auth_failed"),
        (("database", "does not exist"), "no_database"),
        ("unknown database", "no_database"),
        ("read-only", "read_only"),
        ("read only", "read_only"),
        ("hot standby", "read_only"),
        ("is not accepting", "read_only"),
        ("connection refused", "refused"),
        ("can't connect", "refused"),
        ("timeout", "timeout"),
        ("timed out", "timeout"),
        ("could not translate host name", "unknown_host"),
        ("name or service not known", "unknown_host"),
        ("unknown mysql server host", "unknown_host"),
        ("starting up", "starting_up"),
        ("shutting down", "shutting_down"),
        ("terminating connection", "terminated"),
        ("server closed the connection", "connection_lost"),
        ("server has gone away", "connection_lost"),
        ("lost connection", "connection_lost"),
        ("connection is closed", "connection_lost"),
        ("consuming input failed", "connection_lost"),
        ("no route to host", "unreachable"),
        ("network is unreachable", "unreachable"),
    )
)


def kind_of(error: BaseException) -> str:
    """The failure's kind, e.g. ``refused``, ``read_only``, ``auth_failed``; ``sqlstate_42P01`` for a SQLSTATE
    without a name here (a missing table: migrations not run), ``other`` when nothing fits."""
    states = [
        state for exc in _chain(error) if (state := getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None))
    ]
    for state in states:
        if state in _BY_SQLSTATE:
            return _BY_SQLSTATE[state]
    for number in _mysql_errors(error):
        if number in _BY_MYSQL_ERROR:
            return _BY_MYSQL_ERROR[number]
    for exc in _chain(error):
        text = str(exc).lower()
        for words, kind in _BY_WORDS:
            if all(fragment in text for fragment in words):
                return kind
    return f"sqlstate_{states[0]}" if states else "other"


def server_of(settings: dict[str, Any]) -> str:
    """``host:port`` of a connection's settings (comma-separated for a multi-host setting), never a password."""
    hosts = str(settings.get("HOST") or "local socket")
    ports = str(settings.get("PORT") or "")
    if not ports:
        return hosts
    pairs = zip(hosts.split(","), ports.split(","), strict=False) if "," in hosts + ports else [(hosts, ports)]
    return ",".join(f"{host}:{port}" for host, port in pairs)


def _mysql_errors(error: BaseException) -> list[int]:
    """The error numbers of mysqlclient's exceptions in the chain (Django's own wrapper raises from them)."""
    return [
        exc.args[0]
        for exc in _chain(error)
        if type(exc).__module__.startswith("MySQLdb") and exc.args and isinstance(exc.args[0], int)
    ]


def _chain(error: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in found:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found
