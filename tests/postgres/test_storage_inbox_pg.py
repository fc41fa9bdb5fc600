"""tests/unit/test_storage_inbox.py's tests again, on PostgreSQL (`db` and `db_path` from
tests/postgres/conftest.py)."""

from __future__ import annotations

from tests.unit.test_storage_inbox import *  # noqa: F403
