"""The mail ledger's statements: reserve an idempotency key's ``SentMail`` row as ``sending`` in one statement."""

_COLUMNS = "(key_hash, content_hash, state, provider, message_id, created) VALUES (%s, %s, 'sending', %s, '', %s)"

#: PostgreSQL and SQLite: the returned row says the key had no row and now has one.
INSERT_SENDING_RETURNING = "INSERT INTO {table} " + _COLUMNS + " ON CONFLICT (key_hash) DO NOTHING RETURNING key_hash"

#: MariaDB and MySQL: a row count of 1 says the key had no row and now has one. IGNORE also turns a value too long
#: for its column into a warning: send it only when every value fits.
INSERT_SENDING_IGNORE = "INSERT IGNORE INTO {table} " + _COLUMNS
