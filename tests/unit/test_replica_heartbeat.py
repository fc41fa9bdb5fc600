"""A replica whose heartbeat cannot be written says so once, not once per beat, and once
more when it beats again (the log stays quiet while nothing changes)."""

from __future__ import annotations

import datetime as dt
import logging
import sqlite3
import threading
from pathlib import Path

from bot.heartbeat import HeartbeatSettings, ReplicaHeartbeat
from storage import inbox
from storage.database import PerThreadDatabase
from testenv.install import wait_until

UTC = dt.timezone.utc


def test_a_heartbeat_that_fails_for_many_beats_is_logged_once_and_once_more_when_it_beats_again(tmp_path: Path,
                                                                                               caplog):
    caplog.set_level(logging.INFO, logger="gpuops.bot.heartbeat")
    path = tmp_path / "gpuops.db"
    database = PerThreadDatabase(path)
    beats: list[dt.datetime] = []
    lock = threading.Lock()

    def clock() -> dt.datetime:
        with lock:
            beats.append(dt.datetime.now(UTC))
            return beats[-1]

    def beaten() -> int:
        with lock:
            return len(beats)

    heartbeat = ReplicaHeartbeat(database, name="gpuops-a/1", redo=None, clock=clock,
                                 settings=HeartbeatSettings(beat=0.02)).start()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        # The database refuses the heartbeat's row, as a full disk would, for many beats.
        for when in ("INSERT", "UPDATE"):
            other.execute(f"CREATE TRIGGER refuse_{when.lower()} BEFORE {when} ON replica_heartbeats"
                          " BEGIN SELECT RAISE(ABORT, 'no room'); END")
        failing_from = beaten()
        wait_until(lambda: beaten() >= failing_from + 10, timeout=30, what="ten beats refused")
        for when in ("insert", "update"):
            other.execute(f"DROP TRIGGER refuse_{when}")
        working_from = beaten()
        wait_until(lambda: beaten() >= working_from + 3, timeout=30, what="three beats after")
    finally:
        heartbeat.stop()
        other.close()

    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert "no room" in lines[0][1] and "said once" in lines[0][1]
    assert lines[1][1] == "gpuops-a/1 writes its heartbeat again"
    row = inbox.heartbeat(database.get(), replica="gpuops-a/1")
    assert row is not None and row.seen_at > beats[working_from]
    database.close()
