"""Opening the gpuops database, and the `Database` handle the repositories take.

`open_database(target)` takes a SQLite file path (the default: embedded, one replica, the
demo) or a `postgresql://` URL (several replicas on the database a team already runs),
makes it ready or refuses it, and returns a `Database`. Either way a schema newer than
this code knows raises `SchemaTooNew` and another program's database raises
`NotAGpuopsDatabase`, both before anything is written; pending migrations are then
applied, each atomically and once even with several openers at the same time.

Why one neutral connection layer but migrations per database. The repositories' SQL is
plain DML that both databases run the same way once written in their common subset: `?`
placeholders (PostgreSQL's backend rewrites them to psycopg's `%s`), `ON CONFLICT ... DO
NOTHING / DO UPDATE`, `RETURNING id` instead of `cursor.lastrowid`, `IS NOT DISTINCT FROM`
for NULL-safe comparison, no `INSERT OR REPLACE/IGNORE`. Writing it twice would let the
two drift where it matters most (the two-person rule, the audit chain). The schema is
the opposite: SQLite's STRICT tables, `json_valid` CHECKs, `RAISE(ABORT, ...)` triggers
and table rebuilds have no PostgreSQL spelling, and PostgreSQL's PL/pgSQL trigger
functions and identity columns none in SQLite; a DDL translator would be a second
database engine to test. So `storage.migrations` holds SQLite's list and
`storage.migrations_pg` PostgreSQL's (its first migration is a baseline equal to SQLite's
schema at that version); every later migration comes in both, and a test holds the two
schemas to the same tables, columns, NOT NULLs, unique keys and reference rows.

Writers are serialised in the database, as SQLite's `BEGIN IMMEDIATE` does: on PostgreSQL
the outermost `transaction()` runs `BEGIN` then takes a transaction-scoped advisory lock
(one fixed gpuops key), so the audit chain's read-the-head-then-append and every
read-then-write check keep their meaning with several processes or replicas on one
database. gpuops writes a few transactions a second; one writer at a time costs nothing.

Thread model: one connection per thread. A `Database` belongs to the thread that opened
it; each worker thread opens its own, or takes one from a shared `PerThreadDatabase`.
Statements outside `transaction()` commit by themselves (driver autocommit), and only
`transaction()` opens transactions, so there is never an implicit one left open.

Errors are storage's own on both (`storage.errors`): `ConstraintViolated` for a broken
constraint or a refusing trigger, `DatabaseUnavailable` for a database that cannot answer.
A PostgreSQL URL's password never reaches a log line, a `repr` or an exception:
`Database.target` is the path or the URL with the password replaced by `***`.
The SQLite specifics (file modes, the open lock, WAL, PRAGMAs) are in
`storage.sqlite_backend`, PostgreSQL's in `storage.postgres_backend`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from storage import postgres_backend, sqlite_backend
from storage.errors import DatabaseFileGone, StorageError
from storage.migrations import MIGRATIONS, Migration
from storage.migrations_pg import MIGRATIONS_PG, PostgresMigration

Params = Sequence[Any] | Mapping[str, Any]
_M = TypeVar("_M")
Dialect = Literal["sqlite", "postgresql"]
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
# Version bookkeeping, not data: each database keeps its own (see `Database.tables`).
BOOKKEEPING_TABLES = frozenset({"schema_migrations", "gpuops_schema"})


class Cursor(Protocol):
    """What a statement answers, on both backends: rows are tuples in `description` order."""

    @property
    def rowcount(self) -> int: ...

    @property
    def description(self) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Backend(Protocol):
    """One open connection of one database kind (`storage.sqlite_backend`,
    `storage.postgres_backend`), in autocommit mode, raising storage's errors."""

    dialect: Dialect
    target: str
    path: Path | None

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, params: Params = ()) -> Cursor: ...

    def revive(self) -> None: ...

    def begin(self) -> None: ...

    def schema_version(self) -> int: ...

    def pragma(self, name: str) -> Any: ...

    def references(self) -> dict[str, set[str]]: ...

    def self_references(self, table: str) -> list[tuple[str, str]]: ...

    def restart_identities(self) -> None: ...

    def close(self) -> None: ...


def default_database_path(in_container: bool) -> Path:
    """`/var/lib/gpuops/gpuops.db` in a container (mount a volume there), else
    `./.gpuops/gpuops.db` beside the demo checkout."""
    if in_container:
        return Path("/var/lib/gpuops/gpuops.db")
    return Path(".gpuops") / "gpuops.db"


def is_postgres_url(target: Path | str) -> bool:
    return isinstance(target, str) and target.startswith(POSTGRES_SCHEMES)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Database:
    """One open connection to the gpuops database, used by one thread.

    Repositories take it as their first argument and speak the common SQL subset (see the
    module docstring) through `execute`, `query` and `query_one`.
    """

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._savepoints = itertools.count(1)
        self._in_block = False  # inside `transaction()`: a lost connection is not replaced there

    def _between_transactions(self) -> Backend:
        """The backend, its connection replaced first if the server dropped it (PostgreSQL),
        unless a transaction is open: one lost mid-way must fail as a whole."""
        if not self._in_block:
            self._backend.revive()
        return self._backend

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def dialect(self) -> Dialect:
        return self._backend.dialect

    @property
    def target(self) -> str:
        """The file's path, or the URL with its password replaced by `***`: safe to show."""
        return self._backend.target

    @property
    def path(self) -> Path:
        """The SQLite file (a PostgreSQL database has none: use `target`)."""
        if self._backend.path is None:
            raise StorageError(f"{self.target} is not a file; it has no path")
        return self._backend.path

    @property
    def in_transaction(self) -> bool:
        return self._backend.in_transaction

    @property
    def schema_version(self) -> int:
        return self._backend.schema_version()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Database]:
        """Everything in the block commits together or not at all.

        The outermost block takes the database's write lock (SQLite: `BEGIN IMMEDIATE`,
        waiting up to the busy timeout; PostgreSQL: `BEGIN` and the gpuops advisory lock).
        A block inside another becomes a savepoint: if it raises, only its own changes are
        undone and the exception propagates to the outer block, so repository functions
        can open their own block and still join the caller's transaction (a step
        transition, its audit row and its outbox message).
        """
        backend = self._backend
        if backend.in_transaction or self._in_block:  # NB: a connection lost mid-way is in none
            name = f"gpuops_{next(self._savepoints)}"
            backend.execute(f'SAVEPOINT "{name}"')
            try:
                yield self
            except BaseException:
                # A RAISE(ROLLBACK) or a failed COMMIT can end the whole transaction,
                # savepoint included; then there is nothing left to undo here.
                if backend.in_transaction:
                    backend.execute(f'ROLLBACK TO "{name}"')
                    backend.execute(f'RELEASE "{name}"')
                raise
            else:
                backend.execute(f'RELEASE "{name}"')
            return
        backend.revive()
        backend.begin()
        self._in_block = True
        try:
            yield self
        except BaseException:
            if backend.in_transaction:
                backend.execute("ROLLBACK")
            raise
        else:
            try:
                backend.execute("COMMIT")
            except BaseException:
                if backend.in_transaction:
                    backend.execute("ROLLBACK")
                raise
        finally:
            self._in_block = False

    def execute(self, sql: str, params: Params = ()) -> Cursor:
        return self._between_transactions().execute(sql, params)

    def insert(self, table: str, row: Mapping[str, Any]) -> None:
        """Insert one row given as {column: value}; names come from code, never from input."""
        names = ", ".join(f'"{name}"' for name in row)
        marks = ", ".join("?" for _ in row)
        self._between_transactions().execute(f'INSERT INTO "{table}" ({names}) VALUES ({marks})', list(row.values()))

    def query(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        """Rows as dicts, fetched eagerly (the cursor must not outlive a transaction)."""
        cursor = self._between_transactions().execute(sql, params)
        names = [d[0] for d in cursor.description or ()]
        return [dict(zip(names, values)) for values in cursor.fetchall()]

    def rows(self, sql: str, params: Params = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The column names and the rows as tuples: for a reader that compares whole rows
        with ones it read before (`storage.steps.RunStepReads`)."""
        cursor = self._between_transactions().execute(sql, params)
        return [d[0] for d in cursor.description or ()], [tuple(values) for values in cursor.fetchall()]

    def query_one(self, sql: str, params: Params = ()) -> dict[str, Any] | None:
        rows = self.query(sql, params)
        return rows[0] if rows else None

    def pragma(self, name: str) -> Any:
        """SQLite only: the current value of a read-only PRAGMA, e.g. `pragma("journal_mode")`."""
        return self._backend.pragma(name)

    def tables(self) -> list[str]:
        """The data tables, each after every table it references (the order to copy rows
        in). Version bookkeeping (`schema_migrations`, `gpuops_schema`) is left out: each
        database keeps its own."""
        references = {t: refs for t, refs in self._backend.references().items() if t not in BOOKKEEPING_TABLES}
        ordered: list[str] = []
        placed: set[str] = set()

        def place(table: str, path: tuple[str, ...]) -> None:
            if table in placed or table in path:  # a table may reference itself (freezes)
                return
            for referenced in sorted(references.get(table, set())):
                if referenced in references:
                    place(referenced, (*path, table))
            placed.add(table)
            ordered.append(table)

        for table in sorted(references):
            place(table, ())
        return ordered

    def self_references(self, table: str) -> list[tuple[str, str]]:
        """(column, referenced column) of `table`'s foreign keys to itself (a freeze names
        the later one that replaced it): a copy sets them once every row is in."""
        return self._backend.self_references(table)

    def restart_identities(self) -> None:
        """After rows were inserted with explicit ids: PostgreSQL sets each identity column's
        sequence past the table's largest id (SQLite needs nothing)."""
        self._backend.restart_identities()

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<gpuops Database {self.target}>"


def open_database(
    target: Path | str,
    *,
    migrations: Sequence[Migration] | Sequence[PostgresMigration] | None = None,
    now: Callable[[], dt.datetime] = _utc_now,
    request_kinds: Sequence[str] = (),
    step_kinds: Sequence[str] = (),
    create: bool = True,
) -> Database:
    """Open (creating if needed) and migrate the database at `target`, a SQLite path or a
    `postgresql://` URL; see the module doc. With `create` false a SQLite file that is not
    there raises DatabaseFileGone instead of being made anew.

    `now` stamps `schema_migrations.applied_at` and is the one clock read in storage.
    `migrations` is for tests (the target's own kind); production uses the released list.
    `request_kinds` and `step_kinds` are the kinds the caller knows (workflows/kinds.py):
    their reference rows are written if missing, so requests and steps of those kinds can
    be stored (the database refuses any other kind).
    """
    if is_postgres_url(target):
        return Database(postgres_backend.open_postgres(
            str(target), migrations=MIGRATIONS_PG if migrations is None else _only(PostgresMigration, migrations),
            now=now, request_kinds=request_kinds, step_kinds=step_kinds))
    return Database(sqlite_backend.open_sqlite(
        Path(target), migrations=MIGRATIONS if migrations is None else _only(Migration, migrations), now=now,
        request_kinds=request_kinds, step_kinds=step_kinds, create=create))


def _only(kind: type[_M], migrations: Sequence[object]) -> list[_M]:
    """The migrations, each of the target's kind (SQLite's list for a path, PostgreSQL's for a URL)."""
    wrong = [m for m in migrations if not isinstance(m, kind)]
    if wrong:
        raise TypeError(f"{len(wrong)} migrations are not {kind.__name__}s, the kind this database takes")
    return [m for m in migrations if isinstance(m, kind)]


class PerThreadDatabase:
    """Hands each thread its own `Database` on the same target, opened on first use.

    Share one of these between the bot's worker threads and the engine; each calls
    `get()`. Migrations run on the first open only (later opens find nothing to do).
    A thread should `close()` its connection when it ends; a connection left behind
    is closed when its thread's locals are freed.
    """

    def __init__(self, target: Path | str, *, now: Callable[[], dt.datetime] = _utc_now,
                 request_kinds: Sequence[str] = (), step_kinds: Sequence[str] = ()) -> None:
        self._target: Path | str = target if is_postgres_url(target) else Path(target)
        self._now = now
        self._request_kinds = tuple(request_kinds)
        self._step_kinds = tuple(step_kinds)
        self._local = threading.local()
        # Set once a connection opened: a SQLite file that then disappears (its volume
        # gone, the file deleted) is not created again, empty, by the next thread's open.
        self._opened = False

    @property
    def path(self) -> Path:
        """The SQLite file (a PostgreSQL database has none)."""
        if not isinstance(self._target, Path):
            raise StorageError("a PostgreSQL database has no path")
        return self._target

    @property
    def target(self) -> str:
        """The path, or the URL with its password replaced by `***`: safe to show."""
        if isinstance(self._target, Path):
            return str(self._target)
        return postgres_backend.redacted(self._target)

    def get(self) -> Database:
        db: Database | None = getattr(self._local, "db", None)
        if db is None:
            target = self._target
            if self._opened and isinstance(target, Path) and not (target.is_file() and target.stat().st_size > 0):
                raise DatabaseFileGone(target)
            # Once opened, a file that goes between the check above and the open is not
            # made again either (the open itself refuses to create it).
            db = open_database(target, now=self._now, request_kinds=self._request_kinds,
                               step_kinds=self._step_kinds, create=not self._opened)
            self._local.db = db
            self._opened = True
        return db

    def close(self) -> None:
        """Close the calling thread's connection, if it has one."""
        db: Database | None = getattr(self._local, "db", None)
        if db is not None:
            self._local.db = None
            db.close()

    def __repr__(self) -> str:
        return f"<gpuops PerThreadDatabase {self.target}>"
