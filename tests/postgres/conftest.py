"""The storage tests on PostgreSQL (tests/postgres/README in tests/README.md): `db` is a
fresh PostgreSQL database (a copy of the migrated template, tests/fixtures/postgres.py)
and `db_path` its URL, so a test that opens a second connection with
`open_database(db_path)` opens one on the same database; `tamper` is a raw connection
to it with the audit's triggers disabled, as tests/unit/test_storage_audit.py's is."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storage.database import Database, open_database
from tests.postgres.raw import RawPostgres


@pytest.fixture
def db_path(postgres_url: str) -> str:
    return postgres_url


@pytest.fixture
def db(postgres_url: str) -> Iterator[Database]:
    database = open_database(postgres_url)
    yield database
    database.close()


@pytest.fixture
def tamper(postgres_url: str) -> Iterator[RawPostgres]:
    raw = RawPostgres(postgres_url)
    raw.execute("ALTER TABLE audit DISABLE TRIGGER USER")
    yield raw
    raw.close()
