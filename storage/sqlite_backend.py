"""The SQLite backend: one file, opened with care, behind `storage.database.Database`.

`open_sqlite(path)` makes the file ready or refuses it:

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

Thread model: one connection per thread (sqlite3 raises `ProgrammingError` if another
thread uses it). WAL lets readers run alongside the single writer; writers queue on
SQLite's lock, because a transaction starts with `BEGIN IMMEDIATE` and waits up to the
busy timeout. Taking the write lock at BEGIN (not at the first write) matters: a deferred
transaction that reads and then writes can fail with SQLITE_BUSY_SNAPSHOT straight away,
which no timeout would fix. No Python lock is needed.

Connections run in driver autocommit mode (`isolation_level=None`): a statement outside a
transaction commits by itself, so there is never an implicit one left open by accident.
sqlite-utils is used here only, to run the SQLite migrations.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import sqlite_utils

from storage import migrations as migrations_mod
from storage.errors import (ConstraintViolated, DatabaseFileGone, DatabaseUnavailable, NotAGpuopsDatabase, SchemaTooNew,
                            SQLiteTooOld)
from storage.migrations import APPLICATION_ID, Migration

BUSY_TIMEOUT = dt.timedelta(seconds=5)
# Beside the database file: held while a connection is opened and the schema migrated.
OPEN_LOCK_SUFFIX = ".open-lock"
# STRICT tables arrived in 3.37.0; IS NOT DISTINCT FROM (the repositories' NULL-safe
# comparison, which PostgreSQL shares) in 3.39.0.
MINIMUM_SQLITE = (3, 39, 0)

# SQLite's primary result codes that mean "cannot answer now", not "wrong SQL".
_UNAVAILABLE_CODES = frozenset({
    5,   # SQLITE_BUSY
    6,   # SQLITE_LOCKED
    8,   # SQLITE_READONLY
    10,  # SQLITE_IOERR
    13,  # SQLITE_FULL
    14,  # SQLITE_CANTOPEN
})


class SQLiteConnection:
    """One sqlite3 connection in autocommit mode, with errors mapped onto storage's."""

    dialect: Literal["sqlite", "postgresql"] = "sqlite"

    def __init__(self, conn: sqlite3.Connection, *, path: Path) -> None:
        self._conn = conn
        self.path: Path | None = path
        self.target = str(path)

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction

    def revive(self) -> None:
        """Nothing to do: a file does not drop its connections."""

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, params)
        except sqlite3.IntegrityError as err:
            raise ConstraintViolated(str(err)) from err
        except sqlite3.OperationalError as err:
            if (getattr(err, "sqlite_errorcode", 0) & 0xFF) in _UNAVAILABLE_CODES:
                raise DatabaseUnavailable(str(err)) from err
            raise

    def begin(self) -> None:
        self.execute("BEGIN IMMEDIATE")

    def schema_version(self) -> int:
        return migrations_mod.schema_version(self._conn)

    def pragma(self, name: str) -> Any:
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a pragma name: {name!r}")
        return self._conn.execute(f"PRAGMA {name}").fetchone()[0]

    def references(self) -> dict[str, set[str]]:
        tables = [row[0] for row in self._conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        # PRAGMA takes no parameters; the names come from sqlite_schema itself.
        return {table: {row[2] for row in self._conn.execute(f'PRAGMA foreign_key_list("{table}")')}
                for table in tables}

    def self_references(self, table: str) -> list[tuple[str, str]]:
        if table not in self.references():  # PRAGMA takes no parameters: only a table's own name
            return []
        return [(row[3], row[4]) for row in self._conn.execute(f'PRAGMA foreign_key_list("{table}")')
                if row[2] == table]

    def restart_identities(self) -> None:
        """Nothing to do: an INTEGER PRIMARY KEY always continues past max(id)."""

    def close(self) -> None:
        self._conn.close()


def open_sqlite(path: Path, *, migrations: Sequence[Migration], now: Callable[[], dt.datetime],
                request_kinds: Sequence[str], step_kinds: Sequence[str], create: bool = True) -> SQLiteConnection:
    """Open (creating if needed, unless `create` is false) and migrate the file at `path`;
    see the module doc."""
    if sqlite3.sqlite_version_info < MINIMUM_SQLITE:
        raise SQLiteTooOld(found=sqlite3.sqlite_version, needed=".".join(map(str, MINIMUM_SQLITE)))
    if str(path) == ":memory:" or str(path).startswith("file:"):
        raise ValueError("open_database takes a file path; each thread opens its own connection")
    known = migrations_mod.latest_version(migrations)
    _make_private_folders(path.parent)
    with _opening(path):
        return _open_and_migrate(path, known=known, migrations=migrations, now=now, request_kinds=request_kinds,
                                 step_kinds=step_kinds, create=create)


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
                      step_kinds: Sequence[str], create: bool) -> SQLiteConnection:
    if path.exists() and path.stat().st_size > 0:
        _probe_read_only(path, known=known)
    elif create:
        _create_private_file(path)
    else:
        raise DatabaseFileGone(path)

    try:
        # Not creating: read-write only, so a file that goes after the probe is not made
        # anew by the connect itself.
        conn = sqlite3.connect(
            str(path) if create else f"{path.absolute().as_uri()}?mode=rw",
            uri=not create,
            timeout=BUSY_TIMEOUT.total_seconds(),
            isolation_level=None,
            check_same_thread=True,
        )
    except sqlite3.OperationalError:
        if not create and not path.is_file():
            raise DatabaseFileGone(path) from None
        raise
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
    return SQLiteConnection(conn, path=path)


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
