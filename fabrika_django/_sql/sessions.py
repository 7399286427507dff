"""Statements about a database session itself (MariaDB and MySQL): its settings, as set and as read."""

#: MariaDB: end a transaction left idle this many seconds (%s), so a frozen holder never blocks a takeover for long.
MARIADB_BOUND_IDLE_TRANSACTIONS = "SET SESSION idle_transaction_timeout = %s"
#: The session's value of a server variable (``{variable}``: a fixed name, never a value).
SESSION_VARIABLE = "SELECT @@SESSION.{variable}"
