"""tests/unit/test_database_copy.py's tests again, copying the team's SQLite file into a
fresh PostgreSQL database on the test server (the move a team makes to run two replicas)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from storage.database import open_database
from storage.locations import database_location
from tests.unit.test_database_copy import *  # noqa: F403
from tests.unit.test_database_copy import Target, dump_of


@pytest.fixture
def empty_target(postgres_server, postgres_url: str) -> Iterator[Target]:  # noqa: F811 - PostgreSQL's, not SQLite's
    """A fresh database on the test server, migrated like any (the template's copy)."""

    def dump() -> dict[str, list[dict[str, Any]]]:
        with open_database(postgres_url) as db:
            return dump_of(db)

    yield Target(location=database_location(postgres_url), dump=dump, exists=lambda: True)
