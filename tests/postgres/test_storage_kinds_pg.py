"""tests/unit/test_storage_kinds.py's tests again, on PostgreSQL, with its `db` opened with
the registry's kinds as there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storage.database import Database, open_database
from tests.unit.test_storage_kinds import *  # noqa: F403
from tests.unit.test_storage_kinds import KINDS


@pytest.fixture
def db_path(postgres_url: str) -> str:
    return postgres_url


@pytest.fixture
def db(db_path: str) -> Iterator[Database]:
    kinds = KINDS.storage_kinds()
    with open_database(db_path, request_kinds=kinds.request_kinds, step_kinds=kinds.step_kinds) as database:
        yield database

# About SQLite itself, left out here, each with why (PostgreSQL's counterparts, where it
# has them, are in tests/postgres/test_postgres_storage.py).
SQLITE_ONLY = {
    "test_a_new_kind_is_rows_written_when_the_database_opens_without_rebuilding_a_table":
        "reads sqlite_schema's text",
    "test_a_database_of_the_schema_before_keeps_its_requests_runs_and_steps_in_flight_and_they_go_on":
        "SQLite's own migration history (PostgreSQL starts at its baseline)",
}
for _name in SQLITE_ONLY:
    del globals()[_name]
