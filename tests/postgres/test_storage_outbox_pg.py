"""tests/unit/test_storage_outbox.py's tests again, on PostgreSQL (`db`, `db_path` and `tamper` from
tests/postgres/conftest.py); those about SQLite's file itself are left out, each with why."""

from __future__ import annotations

from tests.unit.test_storage_outbox import *  # noqa: F403
