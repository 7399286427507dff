"""Statements about a database session itself: its settings, as set and as read."""

#: PostgreSQL: the server's TCP keepalives and user timeout for this session, so a client cut off (a host gone, a
#: partition) has its session ended and its locks freed within a bound. Parameters: idle seconds, interval
#: seconds, probes, milliseconds of unacknowledged data.
POSTGRESQL_BOUND_DEAD_CLIENTS = (
    "SELECT set_config('tcp_keepalives_idle', %s, false), set_config('tcp_keepalives_interval', %s, false), "
    "set_config('tcp_keepalives_count', %s, false), set_config('tcp_user_timeout', %s, false)"
)

#: MariaDB: end a transaction left idle this many seconds (%s), so a frozen holder never blocks a takeover for long.
MARIADB_BOUND_IDLE_TRANSACTIONS = "SET SESSION idle_transaction_timeout = %s"
#: The session's value of a server variable (``{variable}``: a fixed name, never a value).
SESSION_VARIABLE = "SELECT @@SESSION.{variable}"
