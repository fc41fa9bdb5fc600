"""Opening the gpuops database, and the `Database` handle the repositories take.

`open_database(path)` makes the file ready or refuses it:

1. creates missing parent folders with mode 0o700 and the file with 0o600 (the audit log
   says who changed what; other local users have no business reading it);
2. probes an existing file read-only: a schema newer than this code knows raises
   `SchemaTooNew`, another program's database raises `NotAGpuopsDatabase`, and in both
   cases nothing is written (a read-only connection cannot even checkpoint a WAL);
3. sets the connection up: WAL journal, `foreign_keys=ON`, a 5 s busy timeout and
   `synchronous=FULL`;
4. applies pending migrations (`storage.migrations`), each atomically.

Steps 2 to 4 run under an exclusive `flock` on `<file>.open-lock` beside the database, so
two openers (threads or processes) never interleave them. Without it, six threads
opening one new file at once failed 2 times in 1,200 tries with three such races side
by side on 2 cores (none in 3,300 with it): one opener's switch to WAL answered
"database is locked" at once (SQLite does not wait on its busy timeout there), or its
read-only probe caught another opener's half-made file ("11 tables and schema version 0
but no gpuops mark") and refused it.
Connections already open are not held up: the lock is taken only while opening.

Why `synchronous=FULL` and not NORMAL: in WAL mode NORMAL never corrupts the file, but
a commit can be lost on power failure or a kernel crash. The engine persists a step
transition *before* acting on the cluster, and a lost "evict started" row would make a
restarted bot believe it never began. gpuops writes a few transactions per second at most,
so one extra fsync per commit is cheap insurance.

Thread model: one connection per thread. A `Database` belongs to the thread that opened
it (sqlite3 raises `ProgrammingError` if another thread uses it); each worker thread opens
its own, or takes one from a shared `PerThreadDatabase`. WAL lets readers run alongside
the single writer; writers queue on SQLite's lock, because `transaction()` starts with
`BEGIN IMMEDIATE` and waits up to the busy timeout. Taking the write lock at BEGIN (not at
the first write) matters: a deferred transaction that reads and then writes can fail with
SQLITE_BUSY_SNAPSHOT straight away, which no timeout would fix. No Python lock is needed.

Connections run in driver autocommit mode (`isolation_level=None`): a statement outside
`transaction()` commits by itself, and only `transaction()` opens transactions, so there is
never an implicit one left open by accident.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import itertools
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlite_utils

from storage import migrations as migrations_mod
from storage.errors import NotAGpuopsDatabase, SchemaTooNew, SQLiteTooOld
from storage.migrations import APPLICATION_ID, MIGRATIONS, Migration

BUSY_TIMEOUT = dt.timedelta(seconds=5)
# Beside the database file: held while a connection is opened and the schema migrated.
OPEN_LOCK_SUFFIX = ".open-lock"
# STRICT tables arrived in 3.37.0.
MINIMUM_SQLITE = (3, 37, 0)

Params = Sequence[Any] | dict[str, Any]


def default_database_path(in_container: bool) -> Path:
    """`/var/lib/gpuops/gpuops.db` in a container (mount a volume there), else
    `./.gpuops/gpuops.db` beside the demo checkout."""
    if in_container:
        return Path("/var/lib/gpuops/gpuops.db")
    return Path(".gpuops") / "gpuops.db"


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Database:
    """One open connection to the gpuops database, used by one thread.

    Repositories take it as their first argument. `sqlite` is the underlying
    `sqlite_utils.Database` for table helpers (`insert`, `rows_where`, `get`).
    """

    def __init__(self, *, sqlite: sqlite_utils.Database, path: Path) -> None:
        self._sqlite = sqlite
        self._path = path
        self._savepoints = itertools.count(1)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def sqlite(self) -> sqlite_utils.Database:
        return self._sqlite

    @property
    def in_transaction(self) -> bool:
        return self._sqlite.conn.in_transaction

    @property
    def schema_version(self) -> int:
        return migrations_mod.schema_version(self._sqlite.conn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Database]:
        """Everything in the block commits together or not at all.

        The outermost block starts with `BEGIN IMMEDIATE` (takes the write lock, waiting up
        to the busy timeout). A block inside another becomes a savepoint: if it raises, only
        its own changes are undone and the exception propagates to the outer block, so
        repository functions can open their own block and still join the caller's
        transaction (a step transition, its audit row and its outbox message).
        """
        conn = self._sqlite.conn
        if conn.in_transaction:
            name = f"gpuops_{next(self._savepoints)}"
            conn.execute(f'SAVEPOINT "{name}"')
            try:
                yield self
            except BaseException:
                # A RAISE(ROLLBACK) or a failed COMMIT can end the whole transaction,
                # savepoint included; then there is nothing left to undo here.
                if conn.in_transaction:
                    conn.execute(f'ROLLBACK TO "{name}"')
                    conn.execute(f'RELEASE "{name}"')
                raise
            else:
                conn.execute(f'RELEASE "{name}"')
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        else:
            try:
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def execute(self, sql: str, params: Params = ()) -> sqlite3.Cursor:
        return self._sqlite.execute(sql, params)

    def query(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        """Rows as dicts, fetched eagerly (the cursor must not outlive a transaction)."""
        return list(self._sqlite.query(sql, params))

    def query_one(self, sql: str, params: Params = ()) -> dict[str, Any] | None:
        rows = self.query(sql, params)
        return rows[0] if rows else None

    def pragma(self, name: str) -> Any:
        """The current value of a read-only PRAGMA query, e.g. `pragma("journal_mode")`."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a pragma name: {name!r}")
        return self._sqlite.conn.execute(f"PRAGMA {name}").fetchone()[0]

    def close(self) -> None:
        self._sqlite.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<gpuops Database {self._path}>"


def open_database(
    path: Path | str,
    *,
    migrations: Sequence[Migration] = MIGRATIONS,
    now: Callable[[], dt.datetime] = _utc_now,
    request_kinds: Sequence[str] = (),
    step_kinds: Sequence[str] = (),
) -> Database:
    """Open (creating if needed) and migrate the database at `path`; see the module doc.

    `now` stamps `schema_migrations.applied_at` and is the one clock read in storage.
    `migrations` is for tests; production uses the released list. `request_kinds` and
    `step_kinds` are the kinds the caller knows (workflows/kinds.py): their reference rows
    are written if missing, so requests and steps of those kinds can be stored (the
    database refuses any other kind).
    """
    if sqlite3.sqlite_version_info < MINIMUM_SQLITE:
        raise SQLiteTooOld(found=sqlite3.sqlite_version, needed=".".join(map(str, MINIMUM_SQLITE)))
    path = Path(path)
    if str(path) == ":memory:" or str(path).startswith("file:"):
        raise ValueError("open_database takes a file path; each thread opens its own connection")
    known = migrations_mod.latest_version(migrations)
    _make_private_folders(path.parent)
    with _opening(path):
        return _open_and_migrate(path, known=known, migrations=migrations, now=now, request_kinds=request_kinds,
                                 step_kinds=step_kinds)


@contextlib.contextmanager
def _opening(path: Path) -> Iterator[None]:
    """Hold the exclusive lock for opening `path` (see the module docstring). The lock
    file belongs to its open file description, so threads of one process exclude each
    other as processes do, and a process that dies lets go of it."""
    fd = os.open(path.with_name(path.name + OPEN_LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _open_and_migrate(path: Path, *, known: int, migrations: Sequence[Migration],
                      now: Callable[[], dt.datetime], request_kinds: Sequence[str],
                      step_kinds: Sequence[str]) -> Database:
    if path.exists() and path.stat().st_size > 0:
        _probe_read_only(path, known=known)
    else:
        _create_private_file(path)

    conn = sqlite3.connect(
        str(path),
        timeout=BUSY_TIMEOUT.total_seconds(),
        isolation_level=None,
        check_same_thread=True,
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT.total_seconds() * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA synchronous = FULL")
        # Re-check on the read-write connection before the first write: the probe can race
        # a newer gpuops migrating the same file.
        found = migrations_mod.schema_version(conn)
        if found > known:
            raise SchemaTooNew(path=path, found=found, known=known)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise NotAGpuopsDatabase(path=path, why=f"cannot use WAL journal here (got {mode!r})")
        sqlite = sqlite_utils.Database(conn, recursive_triggers=False, execute_plugins=False)
        migrations_mod.apply_pending(sqlite, path=path, migrations=migrations, now=now)
        migrations_mod.register_kinds(sqlite, request_kinds=request_kinds, step_kinds=step_kinds)
    except BaseException:
        conn.close()
        raise
    return Database(sqlite=sqlite, path=path)


class PerThreadDatabase:
    """Hands each thread its own `Database` on the same file, opened on first use.

    Share one of these between the bot's worker threads and the engine; each calls
    `get()`. Migrations run on the first open only (later opens find nothing to do).
    A thread should `close()` its connection when it ends; a connection left behind
    is closed when its thread's locals are freed.
    """

    def __init__(self, path: Path | str, *, now: Callable[[], dt.datetime] = _utc_now,
                 request_kinds: Sequence[str] = (), step_kinds: Sequence[str] = ()) -> None:
        self.path = Path(path)
        self._now = now
        self._request_kinds = tuple(request_kinds)
        self._step_kinds = tuple(step_kinds)
        self._local = threading.local()

    def get(self) -> Database:
        db: Database | None = getattr(self._local, "db", None)
        if db is None:
            db = open_database(self.path, now=self._now, request_kinds=self._request_kinds,
                               step_kinds=self._step_kinds)
            self._local.db = db
        return db

    def close(self) -> None:
        """Close the calling thread's connection, if it has one."""
        db: Database | None = getattr(self._local, "db", None)
        if db is not None:
            self._local.db = None
            db.close()


# ------------------------------------------------------------------ opening, privately


def _make_private_folders(folder: Path) -> None:
    missing: list[Path] = []
    current = folder
    while not current.exists():
        missing.append(current)
        current = current.parent
    for each in reversed(missing):
        try:
            each.mkdir(mode=0o700)
        except FileExistsError:
            continue  # another process made it first; its mode is its business
        os.chmod(each, 0o700)  # mkdir's mode is filtered by the umask


def _create_private_file(path: Path) -> None:
    # SQLite creates -wal and -shm with the main file's permissions.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)


def _probe_read_only(path: Path, *, known: int) -> None:
    """Refuse a file that is too new or not ours, without writing a byte to it."""
    try:
        probe = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as err:
        raise NotAGpuopsDatabase(path=path, why=str(err)) from err
    try:
        application_id = probe.execute("PRAGMA application_id").fetchone()[0]
        found = probe.execute("PRAGMA user_version").fetchone()[0]
        tables = probe.execute(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        ).fetchone()[0]
    except sqlite3.DatabaseError as err:
        raise NotAGpuopsDatabase(path=path, why=str(err)) from err
    finally:
        probe.close()
    if application_id == APPLICATION_ID:
        if found > known:
            raise SchemaTooNew(path=path, found=found, known=known)
        return
    if application_id != 0:
        raise NotAGpuopsDatabase(path=path, why=f"its application_id is {application_id:#x}")
    if found != 0 or tables != 0:
        raise NotAGpuopsDatabase(
            path=path, why=f"it has {tables} tables and schema version {found} but no gpuops mark"
        )
