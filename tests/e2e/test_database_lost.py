"""A replica that cannot reach its database is not ready, says why, and stops the leader's
work at once, giving the engine Lease up for a replica that can; when the database answers
again it is ready and claims the Lease again. Shown on the SQLite file: moved away (its
volume gone) and held by another connection in exclusive mode (locked). The bot's open
connections cannot tell either apart from a working file, so both probes look afresh."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bot.health import HealthServer, Readiness
from bot.slack_api import web_client
from storage.migrations import latest_version
from testenv.install import wait_until
from tests.e2e.harness import http_get
from tests.e2e.test_scheduler_leadership import TestLease


class MovedAway:
    """The database file gone from its path (as with its volume), and nothing able to make
    a new one there meanwhile (a folder in its place); `back()` puts it back."""

    def __init__(self, db_path: Path) -> None:
        self.db_path, self.away = db_path, db_path.with_name("elsewhere.db")
        db_path.rename(self.away)
        db_path.mkdir()

    def back(self) -> None:
        self.db_path.rmdir()
        self.away.rename(self.db_path)


def test_a_replica_whose_database_file_is_gone_is_not_ready_and_says_why_until_it_is_back(runtime, db_path):
    readiness = Readiness(database=runtime.database.get, reach=runtime.database_probe.check)
    server = HealthServer(readiness, host="127.0.0.1", port=0).start()
    try:
        assert http_get(server.base_url + "/readyz")[::2] == (200, "database: open\n")
        runtime.database.get().query_one("SELECT 1 AS one")  # this thread's connection, open and answering

        away = MovedAway(db_path)
        gone = f"database: cannot be used: FileNotFoundError: {db_path} is not there"
        assert readiness.check() == (False, [gone])  # on the thread whose connection still answers
        assert http_get(server.base_url + "/readyz")[::2] == (503, gone + "\n")

        away.back()
        assert http_get(server.base_url + "/readyz")[::2] == (200, "database: open\n")
    finally:
        server.stop()


def test_a_database_locked_by_another_is_not_ready(runtime, db_path):
    runtime.database.close()  # so that another may lock the file whole
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        ready, lines = Readiness(reach=runtime.database_probe.check).check()
    finally:
        holder.execute("ROLLBACK")
        holder.close()

    assert not ready and lines == ["database: cannot be used: OperationalError: database is locked"]
    assert Readiness(reach=runtime.database_probe.check).check() == (True, ["database: open"])


def test_the_leader_that_loses_its_database_stops_its_work_at_once_gives_the_lease_up_and_takes_it_again(
        slack, runtime, db_path):
    lease = TestLease(held=True)
    client = web_client(slack.bot_token, base_url=slack.base_url)
    leadership = runtime.start_background("replica-a", slack=client, lease=lease, check_every=0.02)
    try:
        leadership.wait_until(True, terms=1)
        first_term = leadership.workers

        away = MovedAway(db_path)
        leadership.wait_until(False)
        wait_until(lambda: lease.released, timeout=10, what="the lease given up")

        assert leadership.workers == []
        assert leadership.standing_down == f"FileNotFoundError: {db_path} is not there"
        assert all(not getattr(w, "scheduler", None) or not w.scheduler.running for w in first_term)
        assert all(not getattr(w, "notifier", None) or not w.notifier.running for w in first_term)
        checks = leadership.checks
        leadership.wait_until(False, checks=checks + 5)  # it keeps looking, and keeps out
        assert leadership.terms == 1

        away.back()
        leadership.wait_until(True, terms=2)
        assert leadership.standing_down is None
    finally:
        runtime.close()


def test_a_standby_that_cannot_reach_its_database_does_not_claim_the_lease(slack, runtime, db_path):
    lease = TestLease(held=False)
    leadership = runtime.start_background("replica-b", slack=None, lease=lease, check_every=0.02)
    try:
        MovedAway(db_path)
        leadership.wait_until(False, checks=3)
        lease._held = True  # the Lease is free for the taking: a replica without a database leaves it
        leadership.wait_until(False, checks=leadership.checks + 5)
        assert leadership.terms == 0
        wait_until(lambda: lease.released, timeout=10, what="the lease given up")
    finally:
        runtime.close()


def test_a_replica_whose_database_a_newer_gpuops_migrated_stands_down_and_is_not_ready(runtime, db_path):
    # The new pod of a rolling update migrated the shared database while this one still runs.
    newer = latest_version() + 1
    with sqlite3.connect(db_path, isolation_level=None) as raw:
        raw.execute("INSERT INTO schema_migrations (version, description, applied_at)"
                    " VALUES (?, 'from a newer gpuops', '2026-03-02T09:00:00.000000Z')", (newer,))
    lease = TestLease(held=True)
    leadership = runtime.start_background("replica-old", slack=None, lease=lease, check_every=0.02)
    try:
        leadership.wait_until(False, checks=3)
        says = f"a newer gpuops migrated it to schema version {newer}; this one knows up to {latest_version()}"
        assert leadership.terms == 0 and leadership.standing_down == says
        assert Readiness(reach=runtime.database_probe.check).check() == (False, [
            f"database: cannot be used: {says}"])
    finally:
        runtime.close()
