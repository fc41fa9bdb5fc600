"""What can go wrong when opening or migrating the database, in words an operator can act on.

Everything else surfaces as `sqlite3` exceptions (IntegrityError for a broken CHECK or
foreign key, OperationalError "database is locked" after the busy timeout).
"""

from __future__ import annotations

from pathlib import Path


class StorageError(Exception):
    """Base of the errors this package raises itself."""


class SchemaTooNew(StorageError):
    """The file was written by a newer gpuops; it is refused and left untouched."""

    def __init__(self, *, path: Path, found: int, known: int) -> None:
        self.path, self.found, self.known = path, found, known
        super().__init__(
            f"database {path} has schema version {found}, this gpuops knows up to {known}; "
            "upgrade gpuops or point it at another database"
        )


class NotAGpuopsDatabase(StorageError):
    """The file is some other program's database (or not a database at all)."""

    def __init__(self, *, path: Path, why: str) -> None:
        self.path, self.why = path, why
        super().__init__(f"{path} is not a gpuops database ({why}); point gpuops at another path")


class MigrationFailed(StorageError):
    """A migration raised; its transaction was rolled back and the schema version kept."""

    def __init__(self, *, path: Path, version: int, description: str, cause: BaseException) -> None:
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
