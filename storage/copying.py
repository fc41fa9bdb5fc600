"""Copying a team's gpuops database into another one (`gpuops database copy`), e.g. the
SQLite file of a single replica into the PostgreSQL database several replicas share.

1. Both are opened: the source as it is (one written by a newer gpuops is refused by
   `open_database`, untouched), the target created or migrated to this gpuops's schema;
   the two must then be at the same schema version.
2. A target holding data is refused, naming the first table with rows: a copy never
   merges two histories (two audit chains cannot become one). The reference rows that
   migrations and the kinds registry write (`REFERENCE_TABLES`) do not count.
3. In ONE target transaction: every table in dependency order (a request before its
   approvals and runs, a run before its steps), each row with its own id, the audit rows
   with their seq, prev_hash and hash as they are; the kinds the target lacks; a table's
   references to itself (a freeze replaced by a later one) set once its rows are in.
   Then the target's identities are restarted past the copied ids (PostgreSQL sequences;
   nothing to do on SQLite).
4. Still inside that transaction, the target's audit chain is verified and its head
   compared with the source's: any difference rolls the whole copy back, so a target is
   either an exact copy whose `gpuops audit verify` passes with the source's head, or
   unchanged.

The source is only read (after `open_database` brought an older file up to date, as any
gpuops opening it would).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage import audit
from storage.database import Database, open_database
from storage.errors import ConstraintViolated, StorageError
from storage.locations import DatabaseLocation

# Rows the opener writes itself (the kinds registry): present in any new database, so they
# neither count as data nor are copied over the target's own. The version bookkeeping
# (`schema_migrations`) is each database's own and not among `Database.tables()` at all.
REFERENCE_TABLES = ("request_kinds", "step_kinds")
# The kinds' rows are the source's too (a stored request may name a kind no code
# registers any more): copied where the target lacks them.
_MERGED_REFERENCES = ("request_kinds", "step_kinds")
# Parameters per INSERT: under SQLite's and PostgreSQL's limits with room to spare.
_PARAMETERS_PER_INSERT = 900


class CopyRefused(StorageError):
    """The copy was not made (the target is left as it was); the message says why."""


@dataclass(frozen=True)
class CopyResult:
    """What was copied: rows per table (in the order copied) and the audit head both share."""

    rows: dict[str, int]
    head: audit.AuditHead
    checked: int


def copy_database(source: DatabaseLocation, target: DatabaseLocation, *,
                  opener: Callable[[str | Path], Database] = open_database) -> CopyResult:
    """Copy everything in `source` into the empty database `target`; see the module doc."""
    if source.dialect == "sqlite" and not Path(source.target).is_file():
        raise CopyRefused(f"there is no gpuops database at {source.shown}")
    if source.shown == target.shown or (source.dialect == target.dialect == "sqlite"
                                        and Path(source.target).resolve() == Path(target.target).resolve()):
        raise CopyRefused(f"{source.shown} is both the source and the target")
    source_db = opener(source.target)
    try:
        target_db = opener(target.target)
        try:
            return _copy(source_db, target_db, source=source, target=target)
        finally:
            target_db.close()
    finally:
        source_db.close()


def _copy(source_db: Database, target_db: Database, *, source: DatabaseLocation,
          target: DatabaseLocation) -> CopyResult:
    if source_db.schema_version != target_db.schema_version:
        raise CopyRefused(f"{source.shown} is at schema version {source_db.schema_version} and {target.shown} at "
                          f"{target_db.schema_version}: run the same gpuops version on both")
    source_tables, target_tables = tables_in_order(source_db), tables_in_order(target_db)
    missing = [t for t in source_tables if t not in target_tables]
    if missing:
        raise CopyRefused(f"{target.shown} has no table {missing[0]}, which {source.shown} has")
    for table in target_tables:
        if table not in REFERENCE_TABLES and target_db.query_one(f'SELECT 1 AS found FROM "{table}" LIMIT 1'):
            raise CopyRefused(f"{target.shown} already holds data (table {table} has rows): gpuops copies only "
                              "into an empty database, never merging two histories")
    source_head = audit.head_of(source_db)
    copied: dict[str, int] = {}
    with target_db.transaction():
        for table in (t for t in target_tables if t in source_tables and t not in REFERENCE_TABLES):
            copied[table] = _refused_if_failing(table, _copy_table, source_db, target_db)
        for table in _MERGED_REFERENCES:
            if table in source_tables:
                copied[table] = _refused_if_failing(table, _merge_references, source_db, target_db)
        target_db.restart_identities()
        result = audit.verify(target_db, expected=source_head)
        head = audit.head_of(target_db)
        if not result.ok:
            raise CopyRefused(f"the copy's audit chain does not verify ({result.problem}); nothing was written")
        if head != source_head:
            raise CopyRefused(f"the copy's audit head {head.text} is not the source's {source_head.text}; "
                              "nothing was written")
    return CopyResult(rows=copied, head=head, checked=result.checked)


def _refused_if_failing(table: str, copy: Callable[[Database, Database, str], int], source_db: Database,
                        target_db: Database) -> int:
    """A table the target will not take (a constraint, a type) ends the copy, named."""
    try:
        return copy(source_db, target_db, table)
    except ConstraintViolated as err:
        raise CopyRefused(f"the target refused a row of table {table} ({err}); nothing was written") from err
    except StorageError:
        raise
    except Exception as err:  # noqa: BLE001 - either driver's errors, said in one line; all is rolled back
        raise CopyRefused(f"the target refused a row of table {table} ({type(err).__name__}: {err}); "
                          "nothing was written") from err


def tables_in_order(db: Database) -> list[str]:
    """The database's data tables, each after the tables it references."""
    return db.tables()


def _copy_table(source_db: Database, target_db: Database, table: str) -> int:
    rows = source_db.query(f'SELECT * FROM "{table}" ORDER BY 1')
    if not rows:
        return 0
    later = source_db.self_references(table)
    deferred = {column for column, _ in later}
    columns = list(rows[0])
    _insert(target_db, table, columns, [[None if c in deferred else row[c] for c in columns] for row in rows])
    for column, key in later:
        for row in rows:
            if row[column] is not None:
                target_db.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE "{key}" = ?', (row[column], row[key]))
    return len(rows)


def _merge_references(source_db: Database, target_db: Database, table: str) -> int:
    have = {row["name"] for row in target_db.query(f'SELECT name FROM "{table}"')}
    missing = [row["name"] for row in source_db.query(f'SELECT name FROM "{table}" ORDER BY name')
               if row["name"] not in have]
    if missing:
        _insert(target_db, table, ["name"], [[name] for name in missing])
    return len(missing)


def _insert(db: Database, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    names = ", ".join(f'"{c}"' for c in columns)
    one = "(" + ", ".join("?" for _ in columns) + ")"
    per_insert = max(1, _PARAMETERS_PER_INSERT // len(columns))
    for start in range(0, len(rows), per_insert):
        chunk = rows[start:start + per_insert]
        db.execute(f'INSERT INTO "{table}" ({names}) VALUES {", ".join(one for _ in chunk)}',
                   [value for row in chunk for value in row])
