"""What the ack's keeping of deliveries holds on to, over hours: an insert the ack stopped
waiting for is forgotten once it finished, and a kept key whose work never ran is
forgotten after a response_url's half hour. Neither grows for the life of the process.
(tests/e2e/test_inbox_keeping.py has the ack's deadline itself, through Bolt.)"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.inbox_keeper import InboxKeeper
from storage import inbox, sqlite_backend
from storage.database import PerThreadDatabase
from testenv.install import wait_until

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)
PAYLOAD = {"command": "/gpu", "text": "status", "user_id": "U0ALICE"}


@pytest.fixture
def database(tmp_path: Path, monkeypatch) -> Iterator[PerThreadDatabase]:
    # An insert waits for a writer's lock up to a second here, not SQLite's 5 s.
    monkeypatch.setattr(sqlite_backend, "BUSY_TIMEOUT", dt.timedelta(seconds=1))
    database = PerThreadDatabase(tmp_path / "gpuops.db")
    database.get()
    yield database
    database.close()


def keeper_of(database: PerThreadDatabase) -> InboxKeeper:
    return InboxKeeper(database, replica=lambda: "gpuops-a/1", clock=lambda: NOW,
                       deadline=dt.timedelta(milliseconds=50))


def held(database: PerThreadDatabase) -> sqlite3.Connection:
    other = sqlite3.connect(database.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


def test_a_late_insert_that_finished_is_not_held_once_another_delivery_is_late(database):
    keeper = keeper_of(database)
    other = held(database)
    assert keeper.keep(key="k1", kind="command", payload=PAYLOAD)  # past the deadline: run it here
    other.rollback()
    other.close()
    wait_until(lambda: keeper._late["k1"].done(), timeout=10, what="the late insert to finish")
    assert inbox.accept(database.get(), key="k1", kind="command", payload=PAYLOAD, replica="gpuops-b/1",
                        at=NOW) is False  # its row landed

    other = held(database)
    try:
        assert keeper.keep(key="k2", kind="command", payload=PAYLOAD)
        # k1's work never ran (never settled): its finished future is gone; k2's is waited for.
        assert set(keeper._late) == {"k2"}
    finally:
        other.rollback()
        other.close()
    keeper.settle("k2")
    assert keeper._late == {}


def test_settling_a_delivery_whose_finished_insert_was_forgotten_returns_at_once(database):
    keeper = keeper_of(database)
    other = held(database)
    keeper.keep(key="k1", kind="command", payload=PAYLOAD)
    other.rollback()
    other.close()
    wait_until(lambda: keeper._late["k1"].done(), timeout=10, what="the late insert to finish")
    other = held(database)
    keeper.keep(key="k2", kind="command", payload=PAYLOAD)
    other.rollback()
    other.close()
    keeper.settle("k1")  # nothing to wait for: its row is there
    inbox.answered(database.get(), key="k1", at=NOW)
    assert inbox.accept(database.get(), key="k1", kind="command", payload=PAYLOAD, replica="gpuops-b/1",
                        at=NOW) is False
