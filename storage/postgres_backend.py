"""The PostgreSQL backend (psycopg 3) behind `storage.database.Database`.

Opening (`open_postgres(url)`), all under the gpuops advisory lock so two openers (bot
replicas starting together) never interleave and apply each migration once:

1. a database holding `gpuops_schema` is ours; a version newer than this code knows raises
   `SchemaTooNew`; a database with other tables and no `gpuops_schema` raises
   `NotAGpuopsDatabase`; both are decided before anything is written, and the transaction
   that looked is rolled back;
2. the bookkeeping tables are made and pending migrations (`storage.migrations_pg`)
   applied, each in its own transaction with its version and `schema_migrations` row;
3. missing reference rows of kinds are written.

Statements: the repositories' `?` placeholders become psycopg's `%s` (and `:name`
becomes `%(name)s`) outside quoted text, every `%` is doubled (psycopg reads it even
inside quotes), and Python booleans
are stored as 0/1 as SQLite stores them. PostgreSQL ends a transaction at its first
failed statement where SQLite only undoes the statement; so that a caller may catch a
`ConstraintViolated` inside `transaction()` and carry on (as on SQLite), every write
inside a transaction runs under its own savepoint, undone when it fails.

Errors become storage's: a broken constraint or a refusing trigger `ConstraintViolated`,
prefixed with the constraint's kind in SQLite's words (`FOREIGN KEY constraint failed:
...`), so callers and tests read the same text on both; a lost or refused connection
`DatabaseUnavailable`. The URL's password never appears in a message: errors about
connecting are re-raised without the driver's exception chained, naming the redacted URL.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import psycopg
import psycopg.conninfo
import psycopg.errors
from psycopg.pq import TransactionStatus

from storage import codec
from storage.errors import (
    ConstraintViolated,
    DatabaseUnavailable,
    MigrationFailed,
    MigrationsOutOfOrder,
    NotAGpuopsDatabase,
    SchemaTooNew,
)
from storage.locations import redacted_url
from storage.migrations_pg import APPLICATION, BOOKKEEPING, PostgresMigration

log = logging.getLogger(__name__)

# The one advisory lock key every gpuops writer takes ("gpuo", as SQLite's application_id).
WRITER_LOCK_KEY = 0x6770756F
CONNECT_TIMEOUT = dt.timedelta(seconds=10)
# A server that falls silent (its node lost, a network cut) sends no reset: without these a
# statement on its connection waits for the kernel's retransmissions, a quarter of an hour.
# With them the connection is given up within about half a minute and the next statement
# connects afresh (`revive`). A URL that sets any of them keeps its own.
SILENCE_LIMITS = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
                  "keepalives_count": "3", "tcp_user_timeout": "20000"}
# How long a writer waits for the lock before `DatabaseUnavailable`, as SQLite's busy
# timeout; openers wait as long as another opener's migration takes, as SQLite's do.
WRITE_WAIT = dt.timedelta(seconds=5)

# SQLite's words for the kinds of constraint, by SQLSTATE.
_CONSTRAINT_WORDS = {
    "23503": "FOREIGN KEY constraint failed",
    "23505": "UNIQUE constraint failed",
    "23514": "CHECK constraint failed",
    "23502": "NOT NULL constraint failed",
}
_WRITES = ("INSERT", "UPDATE", "DELETE", "WITH")
_PLACEHOLDERS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?|(?<![:\w]):([A-Za-z_]\w*)|%")


def redacted(url: str) -> str:
    """The URL with any password (in the user part or the query) replaced by `***`."""
    return redacted_url(url)


@functools.lru_cache(maxsize=1024)
def to_psycopg(sql: str) -> str:
    """The common subset's placeholders in psycopg's words (see the module docstring)."""

    def replace(found: re.Match[str]) -> str:
        text = found.group(0)
        if text == "?":
            return "%s"
        if text == "%":
            return "%%"
        if found.group(1):
            return f"%({found.group(1)})s"
        return text.replace("%", "%%")  # quoted text or a quoted name: psycopg reads `%` even there

    return _PLACEHOLDERS.sub(replace, sql)


def _value(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


def _values(params: Sequence[Any] | Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
    if isinstance(params, Mapping):
        return {name: _value(v) for name, v in params.items()}
    return [_value(v) for v in params]


def _mapped(err: psycopg.Error) -> Exception:
    if isinstance(err, (psycopg.errors.IntegrityError, psycopg.errors.RaiseException)):
        message = err.diag.message_primary or str(err)
        words = _CONSTRAINT_WORDS.get(err.sqlstate or "")
        return ConstraintViolated(f"{words}: {message}" if words else message)
    if isinstance(err, psycopg.OperationalError):
        return DatabaseUnavailable(str(err))
    return err


class PostgresConnection:
    """One psycopg connection in autocommit mode, with errors mapped onto storage's."""

    dialect: Literal["sqlite", "postgresql"] = "postgresql"
    path: Path | None = None

    def __init__(self, conn: psycopg.Connection[Any], *, target: str,
                 reconnect: Callable[[], psycopg.Connection[Any]] | None = None) -> None:
        self._conn = conn
        self.target = target
        self._reconnect = reconnect

    def revive(self) -> None:
        """Between transactions: a connection the server dropped (its restart, a failover to
        a standby, an idle connection cut) is replaced by a new one, so one lost connection
        costs the statement that found it lost, not every statement after it. While the
        server is away this raises `DatabaseUnavailable` and the next call tries again."""
        if self._conn.closed and self._reconnect is not None:
            self._conn = self._reconnect()
            log.info("reconnected to %s", self.target)

    @property
    def in_transaction(self) -> bool:
        return self._conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR,
                                                      TransactionStatus.ACTIVE)

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> psycopg.Cursor[Any]:
        guarded = self.in_transaction and sql.lstrip()[:6].upper().startswith(_WRITES)
        try:
            if guarded:
                self._conn.execute("SAVEPOINT gpuops_statement")
            if params:
                cursor = self._conn.execute(to_psycopg(sql), _values(params))
            else:  # no parameters: psycopg sends the text as it is (several statements may be one text)
                cursor = self._conn.execute(sql.encode())
            if guarded:
                self._conn.execute("RELEASE gpuops_statement")
        except psycopg.Error as err:
            if guarded and self._conn.info.transaction_status == TransactionStatus.INERROR:
                try:
                    self._conn.execute("ROLLBACK TO gpuops_statement")
                    self._conn.execute("RELEASE gpuops_statement")
                except psycopg.Error:
                    pass  # the connection is gone; the error below says so
            mapped = _mapped(err)
            if mapped is err:
                raise
            raise mapped from err
        return cursor

    def begin(self, *, wait_forever: bool = False) -> None:
        """`BEGIN` and the writer lock, waited for up to the lock timeout (`WRITE_WAIT`,
        SQLite's busy timeout), or as long as it takes while opening."""
        self.execute("BEGIN")
        try:
            if wait_forever:
                self.execute("SET LOCAL lock_timeout = 0")
            self.execute("SELECT pg_advisory_xact_lock(?)", (WRITER_LOCK_KEY,))
        except BaseException:
            if self.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    def schema_version(self) -> int:
        row = self._conn.execute("SELECT version FROM gpuops_schema").fetchone()
        return int(row[0]) if row else 0

    def pragma(self, name: str) -> Any:
        raise NotImplementedError(f"PRAGMA {name} is SQLite's; this database is PostgreSQL")

    def references(self) -> dict[str, set[str]]:
        tables: dict[str, set[str]] = {row[0]: set() for row in self._conn.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'")}
        for child, parent in self._conn.execute(
                "SELECT c.conrelid::regclass::text, c.confrelid::regclass::text FROM pg_constraint c"
                " WHERE c.contype = 'f' AND c.connamespace = current_schema()::regnamespace"):
            tables.setdefault(child.strip('"'), set()).add(parent.strip('"'))
        return tables

    def self_references(self, table: str) -> list[tuple[str, str]]:
        rows = self._conn.execute(
            "SELECT a.attname, f.attname FROM pg_constraint c"
            " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]"
            " JOIN pg_attribute f ON f.attrelid = c.confrelid AND f.attnum = c.confkey[1]"
            " WHERE c.contype = 'f' AND c.conrelid = c.confrelid"
            " AND c.connamespace = current_schema()::regnamespace AND c.conrelid::regclass::text = quote_ident(%s)",
            (table,)).fetchall()
        return [(str(column), str(key)) for column, key in rows]

    def restart_identities(self) -> None:
        for table, column in self._conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND is_identity = 'YES'").fetchall():
            # Names come from the catalogue; quote_ident keeps them names.
            self._conn.execute(
                f'SELECT setval(pg_get_serial_sequence(quote_ident(%s), %s),'
                f' COALESCE((SELECT max("{column}") FROM "{table}"), 0) + 1, false)',
                (table, column))

    def close(self) -> None:
        self._conn.close()


def open_postgres(url: str, *, migrations: Sequence[PostgresMigration], now: Callable[[], dt.datetime],
                  request_kinds: Sequence[str], step_kinds: Sequence[str]) -> PostgresConnection:
    """Connect to `url` and make its database ready, or refuse it; see the module doc."""
    target = redacted(url)
    conn = _connect(url)
    connection = PostgresConnection(conn, target=target, reconnect=functools.partial(_connect, url))
    try:
        _migrate(connection, migrations=migrations, now=now)
        _register_kinds(connection, request_kinds=request_kinds, step_kinds=step_kinds)
    except BaseException:
        conn.close()
        raise
    return connection


def silence_limits(url: str) -> dict[str, Any]:
    """`SILENCE_LIMITS` the URL does not set itself."""
    given = psycopg.conninfo.conninfo_to_dict(url)
    return {name: value for name, value in SILENCE_LIMITS.items() if name not in given}


def _connect(url: str) -> psycopg.Connection[Any]:
    target = redacted(url)
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT.total_seconds()),
                               options=f"-c lock_timeout={int(WRITE_WAIT.total_seconds() * 1000)}",
                               **silence_limits(url))
    except psycopg.Error as err:
        message = str(err).replace(url, target)
        parsed = urllib.parse.urlsplit(url)
        if parsed.password:
            message = message.replace(parsed.password, "***")
        raise DatabaseUnavailable(f"cannot connect to {target}: {message}") from None


def _check_order(migrations: Sequence[PostgresMigration]) -> None:
    versions = [m.version for m in migrations]
    if versions and versions != list(range(versions[0], versions[0] + len(versions))):
        raise MigrationsOutOfOrder(versions=versions)


def _one(connection: PostgresConnection, sql: str) -> Any:
    row = connection.execute(sql).fetchone()
    return None if row is None else row[0]


def _found_version(connection: PostgresConnection, *, known: int) -> int:
    """The database's version, or a refusal; reads only (see the module docstring, 1.)."""
    marked = _one(connection, "SELECT to_regclass('gpuops_schema') IS NOT NULL")
    if not marked:
        tables = _one(connection, "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()")
        if tables:
            raise NotAGpuopsDatabase(path=connection.target, why=f"it has {tables} tables but no gpuops_schema mark")
        return 0
    row = connection.execute("SELECT application, version FROM gpuops_schema").fetchone()
    if row is None:
        return 0
    if row[0] != APPLICATION:
        raise NotAGpuopsDatabase(path=connection.target, why=f"its gpuops_schema names {row[0]!r}")
    found = int(row[1])
    if found > known:
        raise SchemaTooNew(path=connection.target, found=found, known=known)
    return found


def _migrate(connection: PostgresConnection, *, migrations: Sequence[PostgresMigration],
             now: Callable[[], dt.datetime]) -> None:
    _check_order(migrations)
    known = migrations[-1].version if migrations else 0
    connection.begin(wait_forever=True)
    try:
        found = _found_version(connection, known=known)
    finally:
        connection.execute("ROLLBACK")
    if found == known:
        return
    for migration in migrations:
        connection.begin(wait_forever=True)
        try:
            current = _found_version(connection, known=known)
            if current >= migration.version:
                connection.execute("ROLLBACK")
                continue
            connection.execute(BOOKKEEPING)
            connection.execute(migration.sql)
            connection.execute("DELETE FROM gpuops_schema")
            connection.execute("INSERT INTO gpuops_schema (application, version) VALUES (?, ?)",
                               (APPLICATION, migration.version))
            connection.execute("INSERT INTO schema_migrations (version, description, applied_at) VALUES (?, ?, ?)",
                               (migration.version, migration.description, codec.time_to_text(now())))
            connection.execute("COMMIT")
        except BaseException as err:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            if isinstance(err, (SchemaTooNew, NotAGpuopsDatabase)) or not isinstance(err, Exception):
                raise
            raise MigrationFailed(path=connection.target, version=migration.version,
                                  description=migration.description, cause=err) from err


def _register_kinds(connection: PostgresConnection, *, request_kinds: Sequence[str],
                    step_kinds: Sequence[str]) -> None:
    """`storage.migrations.register_kinds` for PostgreSQL: writes only when one is missing."""
    known_requests = {row[0] for row in connection.execute("SELECT name FROM request_kinds")}
    known_steps = {row[0] for row in connection.execute("SELECT name FROM step_kinds")}
    missing_requests = [k for k in dict.fromkeys(request_kinds) if k not in known_requests]
    missing_steps = [k for k in dict.fromkeys(step_kinds) if k not in known_steps]
    if not missing_requests and not missing_steps:
        return
    connection.begin(wait_forever=True)
    try:
        for kind in missing_requests:
            connection.execute("INSERT INTO request_kinds (name) VALUES (?) ON CONFLICT DO NOTHING", (kind,))
        for kind in missing_steps:
            connection.execute("INSERT INTO step_kinds (name) VALUES (?) ON CONFLICT DO NOTHING", (kind,))
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
