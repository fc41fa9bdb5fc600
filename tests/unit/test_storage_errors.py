"""SQLite's errors as storage's own (storage/errors.py), the words callers handle on both
databases: a locked database is `DatabaseUnavailable` (the engine waits for its next
pass), a broken constraint `ConstraintViolated` with SQLite's message."""

from __future__ import annotations

import sqlite3

import pytest

from storage import kv
from storage.errors import ConstraintViolated, DatabaseUnavailable


def test_a_database_locked_by_another_writer_is_unavailable_not_a_driver_error(db, db_path):
    db.execute("PRAGMA busy_timeout = 0")  # no need to wait five seconds to see it
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(DatabaseUnavailable, match="database is locked"), db.transaction():
            kv.put(db, key="k", value="v")
    finally:
        other.execute("ROLLBACK")
        other.close()

    assert not db.in_transaction
    kv.put(db, key="k", value="v")
    assert kv.get(db, key="k") == "v"


def test_a_broken_not_null_is_a_constraint_violated_with_sqlites_words(db):
    with pytest.raises(ConstraintViolated, match="NOT NULL constraint failed: kv.value"):
        db.execute("INSERT INTO kv (key, value) VALUES (?, ?)", ("k", None))
