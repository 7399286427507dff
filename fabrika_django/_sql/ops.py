"""Statements of the operations pages and jobs: a queue table's counts, PostgreSQL's health views, the file sweep.

Each is a template: ``{name}`` stands for a quoted identifier or an ORM-compiled condition, never for a value;
values go as parameters.
"""

# -- a queue table's counts by state, in one statement --------------------------------------------------------------

#: Waiting, due now, dead, the oldest due-now ``due``, and the done count (``{done_count}``: ``DONE_COUNT`` or 0),
#: over the rows the partial index holds (``{indexed}``).
QUEUE_COUNTS = (
    "SELECT COUNT(CASE WHEN {waiting} THEN 1 END), "
    "COUNT(CASE WHEN {due_now} THEN 1 END), "
    "COUNT(CASE WHEN {dead} THEN 1 END), "
    "MIN(CASE WHEN {due_now} THEN {due} END), "
    "{done_count} "
    "FROM {table} WHERE {indexed}"
)
#: The done rows, counted up to ``{limit}`` (`` LIMIT %s`` or nothing): done rows are outside the partial index.
DONE_COUNT = "(SELECT COUNT(*) FROM (SELECT 1 FROM {table} WHERE {done}{limit}) fabrika_done)"

# -- PostgreSQL's health views ----------------------------------------------------------------------------------------

#: Dead and live tuples of the named tables, and the seconds since their last vacuum (NULL: never).
POSTGRESQL_TABLE_BLOAT = (
    "SELECT relname, n_dead_tup, n_live_tup, "
    "extract(epoch FROM now() - greatest(last_vacuum, last_autovacuum)) "
    "FROM pg_stat_user_tables WHERE schemaname = ANY(current_schemas(false)) AND relname = ANY(%s) "
    "ORDER BY relname"
)
#: Sessions of this database whose transaction, open longer than %s seconds, holds back vacuum's horizon (an xid
#: or a snapshot): their pid, state and age, never their query text.
POSTGRESQL_OLD_TRANSACTIONS = (
    "SELECT pid, state, extract(epoch FROM now() - xact_start) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL "
    "AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) "
    "AND now() - xact_start > %s * interval '1 second' "
    "ORDER BY xact_start LIMIT 5"
)

# -- the file sweep ---------------------------------------------------------------------------------------------------

#: PostgreSQL: the values among an array of names that a file column holds (one parameter, not one per name: a
#: query of 500 placeholders costs more to bind on the client than to run).
SWEEP_VALUES_HELD = "SELECT {column} FROM {table} WHERE {column} = ANY(%s)"
#: PostgreSQL: stop the referencing tables' writers until the transaction ends; NOWAIT: never queue behind a
#: writer (and so never join a deadlock), fail with lock_not_available instead.
SWEEP_STOP_WRITERS = "LOCK TABLE {tables} IN SHARE MODE NOWAIT"
#: SQLite: take the database's one write lock (and with it the newest snapshot) without changing a row.
SWEEP_TAKE_WRITE_LOCK = "UPDATE {table} SET {column} = {column} WHERE 1 = 0"
