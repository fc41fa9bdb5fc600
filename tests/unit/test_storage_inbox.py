"""The inbox: a delivery kept before its ack is run by one replica, closed when answered,
and taken over by exactly one survivor when the replica that claimed it falls silent.
(tests/postgres/test_storage_inbox_pg.py runs these again on PostgreSQL.)"""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from storage import inbox
from storage import requests as stored_requests
from storage.database import Database, open_database
from storage.errors import ConstraintViolated

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
SECOND = dt.timedelta(seconds=1)
COMMAND = {"command": "/gpu", "text": "drain serving-a", "user_id": "U0ALICE",
           "response_url": "https://hooks.slack.test/commands/1", "trigger_id": "13345.1"}


def keep(db: Database, key: str = "/gpu:U0ALICE:13345.1", *, replica: str = "gpuops-a/1", at: dt.datetime = NOW
         ) -> bool:
    return inbox.accept(db, key=key, kind="command", payload=COMMAND, replica=replica, at=at)


def test_a_delivery_kept_twice_runs_once_and_keeps_what_running_it_again_needs(db):
    assert keep(db)
    assert not keep(db, replica="gpuops-b/2", at=NOW + SECOND)  # Slack's retry, to the other replica

    kept = inbox.get(db, key="/gpu:U0ALICE:13345.1")
    assert kept is not None
    assert (kept.kind, kept.payload, kept.claimed_by, kept.state) == ("command", COMMAND, "gpuops-a/1", "claimed")
    assert kept.received_at == NOW


def test_an_answered_delivery_is_closed_once_and_never_taken_over(db):
    keep(db)
    assert inbox.answered(db, key="/gpu:U0ALICE:13345.1", at=NOW + SECOND)
    assert not inbox.answered(db, key="/gpu:U0ALICE:13345.1", at=NOW + 2 * SECOND)

    closed = inbox.get(db, key="/gpu:U0ALICE:13345.1")
    assert closed is not None and (closed.state, closed.ended_at) == ("answered", NOW + SECOND)
    assert inbox.stranded(db, silent_since=NOW + dt.timedelta(hours=1)) == []


def test_a_delivery_is_stranded_only_once_its_replica_fell_silent(db):
    inbox.beat(db, replica="gpuops-a/1", at=NOW)
    keep(db, at=NOW)
    inbox.beat(db, replica="gpuops-a/1", at=NOW + 3 * SECOND)

    assert inbox.stranded(db, silent_since=NOW + 2 * SECOND) == []  # it beat after: alive
    (stranded,) = inbox.stranded(db, silent_since=NOW + 4 * SECOND)
    assert stranded.claimed_by == "gpuops-a/1"
    beat = inbox.heartbeat(db, replica="gpuops-a/1")
    assert beat is not None and (beat.started_at, beat.seen_at) == (NOW, NOW + 3 * SECOND)


def test_a_delivery_whose_replica_never_beat_is_stranded(db):
    keep(db, replica="gpuops-gone/9")

    assert [d.key for d in inbox.stranded(db, silent_since=NOW)] == ["/gpu:U0ALICE:13345.1"]


def test_of_several_survivors_exactly_one_takes_a_stranded_delivery_over(db, db_path):
    keep(db, replica="gpuops-a/1")
    silent_since = NOW + 10 * SECOND
    survivors = [f"gpuops-{n}/2" for n in "bcde"]
    won: list[str] = []
    barrier = threading.Barrier(len(survivors))

    def survivor(name: str) -> None:
        with open_database(db_path) as own:
            inbox.beat(own, replica=name, at=NOW + 20 * SECOND)
            barrier.wait()
            if inbox.take_over(own, key="/gpu:U0ALICE:13345.1", claimed_by="gpuops-a/1", replica=name,
                               silent_since=silent_since, at=NOW + 20 * SECOND):
                won.append(name)

    threads = [threading.Thread(target=survivor, args=(name,)) for name in survivors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(won) == 1
    taken = inbox.get(db, key="/gpu:U0ALICE:13345.1")
    assert taken is not None and (taken.claimed_by, taken.takeovers, taken.state) == (won[0], 1, "claimed")
    # Its new claimant beats: it is no longer stranded.
    assert inbox.stranded(db, silent_since=silent_since) == []


def test_a_replica_still_beating_keeps_its_deliveries(db):
    keep(db, replica="gpuops-a/1")
    inbox.beat(db, replica="gpuops-a/1", at=NOW + 15 * SECOND)  # a beat after the survivor looked

    assert not inbox.take_over(db, key="/gpu:U0ALICE:13345.1", claimed_by="gpuops-a/1", replica="gpuops-b/2",
                               silent_since=NOW + 10 * SECOND, at=NOW + 16 * SECOND)
    assert not inbox.abandon(db, key="/gpu:U0ALICE:13345.1", claimed_by="gpuops-a/1",
                             silent_since=NOW + 10 * SECOND, at=NOW + 16 * SECOND)
    kept = inbox.get(db, key="/gpu:U0ALICE:13345.1")
    assert kept is not None and (kept.claimed_by, kept.state) == ("gpuops-a/1", "claimed")


def test_a_stranded_delivery_abandoned_is_closed_once_and_not_taken_over(db):
    keep(db, replica="gpuops-a/1")
    late = NOW + dt.timedelta(minutes=31)

    assert inbox.abandon(db, key="/gpu:U0ALICE:13345.1", claimed_by="gpuops-a/1", silent_since=late, at=late)
    assert not inbox.abandon(db, key="/gpu:U0ALICE:13345.1", claimed_by="gpuops-a/1", silent_since=late, at=late)
    assert not inbox.take_over(db, key="/gpu:U0ALICE:13345.1", claimed_by="gpuops-a/1", replica="gpuops-b/2",
                               silent_since=late, at=late)
    abandoned = inbox.get(db, key="/gpu:U0ALICE:13345.1")
    assert abandoned is not None and (abandoned.state, abandoned.ended_at) == ("abandoned", late)


def test_closed_deliveries_and_old_heartbeats_are_forgotten_open_ones_kept(db):
    old = NOW - dt.timedelta(days=8)
    keep(db, "answered-old", at=old)
    inbox.answered(db, key="answered-old", at=old)
    keep(db, "open-old", at=old)
    keep(db, "answered-new", at=NOW)
    inbox.answered(db, key="answered-new", at=NOW)
    inbox.beat(db, replica="gpuops-old/1", at=old)
    inbox.beat(db, replica="gpuops-a/1", at=NOW)

    assert inbox.forget_closed(db, older_than=NOW - dt.timedelta(days=7)) == 1

    assert inbox.get(db, key="answered-old") is None
    assert inbox.get(db, key="open-old") is not None and inbox.get(db, key="answered-new") is not None
    assert inbox.heartbeat(db, replica="gpuops-old/1") is None
    assert inbox.heartbeat(db, replica="gpuops-a/1") is not None


def test_a_request_carries_the_delivery_that_filed_it_and_a_delivery_files_one_request_at_most(db):
    def create(delivery: str | None) -> stored_requests.Request:
        return stored_requests.create(
            db, kind="drain", pool="serving-a", targets=["gpu-a-01"], window_start=None, window_end=None,
            reason="kernel patch", requester="U0ALICE", requester_name="alice", plan={"nodes": ["gpu-a-01"]},
            plan_hash="a" * 64, approvals_required=2, expires_at=NOW + dt.timedelta(hours=1), at=NOW,
            delivery=delivery)

    filed = create("/gpu:U0ALICE:13345.1")
    create(None), create(None)  # requests filed by no delivery (the console, the command line)

    found = stored_requests.filed_by(db, delivery="/gpu:U0ALICE:13345.1")
    assert found is not None and found.id == filed.id and found.delivery == "/gpu:U0ALICE:13345.1"
    assert stored_requests.filed_by(db, delivery="/gpu:U0ALICE:99999.9") is None
    with pytest.raises(ConstraintViolated, match="UNIQUE"):
        create("/gpu:U0ALICE:13345.1")
