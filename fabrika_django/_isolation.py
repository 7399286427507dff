"""The transaction isolation fabrika requires on MariaDB and MySQL, and the system check ``fabrika.W040``.

fabrika requires READ COMMITTED there, the level Django itself sets on every MySQL connection unless
``OPTIONS["isolation_level"]`` says otherwise. Its own decisions (claim, the fence, versioned finishes, starts
and ends of runs) are locking reads and conditional UPDATEs, which InnoDB runs against the latest committed
rows at any level; but at REPEATABLE READ and SERIALIZABLE the claim's locking read also locks the gaps
between the due rows it walks, so a request inserting a due row waits for a claim in progress, and plain reads
inside ``ctx.transaction()`` keep the snapshot of the transaction's first read, so the "re-read and decide
again" of a handler can decide on a stale row. READ UNCOMMITTED lets those reads see writes that are later
rolled back. PostgreSQL's and SQLite's levels need nothing: PostgreSQL's default is READ COMMITTED and SQLite
serializes writers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings as django_settings
from django.core import checks
from django.db import connections

from ._sql import sessions as sql

#: The level fabrika needs on MariaDB/MySQL, as Django's OPTIONS["isolation_level"] spells it.
REQUIRED = "read committed"
_DJANGO_DEFAULT = REQUIRED
_HINT = (
    "Remove OPTIONS['isolation_level'] from this DATABASES entry (Django then sets 'read committed' on every "
    "connection) or set it to 'read committed'; see the README's section on MariaDB and MySQL."
)


@checks.register("fabrika", checks.Tags.database)
def check_isolation(
    app_configs: Sequence[AppConfig] | None = None, databases: Iterable[str] | None = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """Warn for each MariaDB/MySQL database whose transactions would not run at READ COMMITTED.

    From the settings alone for every alias; when Django passes ``databases`` (``check --database``,
    ``migrate``), from the server's answer for those too, which sees an ``init_command`` or a server default.
    """
    return isolation_warnings(django_settings.DATABASES, asked=set(databases or ()))


def isolation_warnings(databases: dict[str, Any], *, asked: set[str]) -> list[checks.CheckMessage]:
    """The W040 warnings for ``databases`` (a DATABASES setting); the aliases in ``asked`` ask the server."""
    warnings: list[checks.CheckMessage] = []
    for alias, settings_dict in databases.items():
        if "mysql" not in settings_dict.get("ENGINE", ""):
            continue
        configured = (settings_dict.get("OPTIONS") or {}).get("isolation_level", _DJANGO_DEFAULT)
        level = str(configured).lower() if configured else None
        if alias in asked:
            level = session_isolation(alias) or level
        if level == REQUIRED:
            continue
        said = level.upper() if level else "the server's default level (REPEATABLE READ unless changed)"
        warnings.append(
            checks.Warning(
                f"Database {alias!r} runs transactions at {said}: fabrika needs READ COMMITTED on MariaDB and "
                "MySQL (a claim would lock the gaps between due rows, holding up requests that add rows, and "
                "reads inside ctx.transaction() would keep an old snapshot).",
                hint=_HINT,
                obj=alias,
                id="fabrika.W040",
            )
        )
    return warnings


def session_isolation(alias: str) -> str | None:
    """Return the connection's isolation level as Django spells it ("read committed"), asking the server."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        # MySQL 8 and MariaDB 11.1+ name it transaction_isolation; MariaDB 10.x tx_isolation.
        variable = "tx_isolation" if getattr(connection, "mysql_is_mariadb", False) else "transaction_isolation"
        if variable == "tx_isolation" and connection.mysql_version >= (11, 1):  # type: ignore[attr-defined]
            variable = "transaction_isolation"
        cursor.execute(sql.SESSION_VARIABLE.format(variable=variable))
        row = cursor.fetchone()
    return str(row[0]).replace("-", " ").lower() if row and row[0] else None
