"""What can go wrong with the database, in words an operator can act on.

Both backends (SQLite, PostgreSQL) raise the same two errors for what callers handle:
`ConstraintViolated` for a broken CHECK, NOT NULL, UNIQUE, foreign key or a refusing
trigger (its text is the database's own message, prefixed with the kind of constraint in
SQLite's words, so `FOREIGN KEY`, `UNIQUE` and a trigger's sentence read the same on
both), and `DatabaseUnavailable` for a database that cannot answer now (SQLite's
"database is locked" after the busy timeout, a PostgreSQL connection lost). Anything else
(a programming error) surfaces as the driver's own exception.
"""

from __future__ import annotations

from pathlib import Path


class StorageError(Exception):
    """Base of the errors this package raises itself."""


class ConstraintViolated(StorageError):
    """A write broke a constraint or a trigger refused it; the statement changed nothing."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class DatabaseUnavailable(StorageError):
    """The database could not answer (locked past the busy timeout, connection lost)."""


class DatabaseFileGone(DatabaseUnavailable):
    """The SQLite file a process already opened is no longer at its path: it is not
    created again empty (that would start a second, empty history beside the first)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"the database file {path} is gone (its volume unmounted, or the file deleted or moved); "
                         "it is not created again empty: put it back, or restart gpuops to start a new one")


class SchemaTooNew(StorageError):
    """The file was written by a newer gpuops; it is refused and left untouched."""

    def __init__(self, *, path: Path | str, found: int, known: int) -> None:
        self.path, self.found, self.known = path, found, known
        super().__init__(
            f"database {path} has schema version {found}, this gpuops knows up to {known}; "
            "upgrade gpuops or point it at another database"
        )


class NotAGpuopsDatabase(StorageError):
    """The file is some other program's database (or not a database at all)."""

    def __init__(self, *, path: Path | str, why: str) -> None:
        self.path, self.why = path, why
        super().__init__(f"{path} is not a gpuops database ({why}); point gpuops at another path")


class MigrationFailed(StorageError):
    """A migration raised; its transaction was rolled back and the schema version kept."""

    def __init__(self, *, path: Path | str, version: int, description: str, cause: BaseException) -> None:
        self.path, self.version, self.description = path, version, description
        super().__init__(
            f"migrating {path} to schema version {version} ({description}) failed and was "
            f"rolled back, the database is unchanged at version {version - 1}: "
            f"{type(cause).__name__}: {cause}"
        )


class SQLiteTooOld(StorageError):
    def __init__(self, *, found: str, needed: str) -> None:
        super().__init__(
            f"gpuops needs SQLite {needed} or newer (STRICT tables, RETURNING); "
            f"this Python is linked against SQLite {found}"
        )


class MigrationsOutOfOrder(StorageError):
    def __init__(self, *, versions: list[int]) -> None:
        super().__init__(f"migrations must be numbered 1, 2, 3, ... without gaps; got {versions}")
