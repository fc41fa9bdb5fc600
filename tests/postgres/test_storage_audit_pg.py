"""tests/unit/test_storage_audit.py's tests again, on PostgreSQL (`db`, `db_path` and `tamper` from
tests/postgres/conftest.py); those about SQLite's file itself are left out, each with why."""

from __future__ import annotations

from tests.unit.test_storage_audit import *  # noqa: F403
from tests.postgres.conftest import tamper  # noqa: F401  (the module above has its own)

# About SQLite itself, left out here, each with why (PostgreSQL's counterparts, where it
# has them, are in tests/postgres/test_postgres_storage.py).
SQLITE_ONLY = {
    "test_updating_an_audit_row_through_sql_is_refused":
        "a raw sqlite3 connection",
    "test_deleting_an_audit_row_through_sql_is_refused":
        "a raw sqlite3 connection",
    "test_a_row_that_cannot_be_read_is_broken_at_its_entry_not_a_crash":
        "PRAGMA ignore_check_constraints",
}
for _name in SQLITE_ONLY:
    del globals()[_name]
