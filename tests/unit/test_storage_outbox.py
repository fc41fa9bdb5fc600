"""The outbox: Slack messages stored with the change they report, delivered at least once,
deduplicated by key, in order within a conversation."""

from __future__ import annotations

import datetime as dt
import threading

from storage import outbox
from storage.database import Database, open_database

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
SECOND = dt.timedelta(seconds=1)


def post(
    db: Database,
    text: str,
    *,
    channel: str = "C0OPS",
    thread_ts: str | None = "1717.1",
    dedupe_key: str | None = None,
    at: dt.datetime = NOW,
) -> outbox.OutboxMessage | None:
    return outbox.enqueue(
        db,
        channel=channel,
        thread_ts=thread_ts,
        kind="post",
        payload={"text": text},
        dedupe_key=dedupe_key,
        at=at,
    )


def test_a_message_enqueued_twice_with_the_same_dedupe_key_is_stored_and_delivered_once(db):
    first = post(db, "wave 1 done", dedupe_key="run-9b01de/wave-1/done")
    again = post(db, "wave 1 done", dedupe_key="run-9b01de/wave-1/done", at=NOW + SECOND)

    assert first is not None and again is None
    claimed = outbox.claim_pending(db, limit=10, now=NOW + SECOND)
    assert [m.id for m in claimed] == [first.id]
    assert claimed[0].payload == {"text": "wave 1 done"}


def test_the_same_dedupe_key_enqueued_from_two_threads_is_stored_once(db, db_path):
    barrier = threading.Barrier(4)
    results: list[object] = []

    def work() -> None:
        with open_database(db_path) as own:
            barrier.wait()
            results.append(post(own, "approved", dedupe_key="req-7f3a2c/approved"))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sum(r is not None for r in results) == 1


def test_messages_without_a_dedupe_key_are_never_deduplicated(db):
    assert post(db, "same text", thread_ts="1") is not None
    assert post(db, "same text", thread_ts="2") is not None

    assert len(outbox.claim_pending(db, limit=10, now=NOW)) == 2


def test_a_message_is_not_due_before_it_was_enqueued(db):
    post(db, "later", at=NOW + SECOND)

    assert outbox.claim_pending(db, limit=10, now=NOW) == []


def test_a_claimed_message_is_offered_again_only_after_its_lease_runs_out(db):
    message = post(db, "cordoned gpu-h100-01")
    assert message is not None

    first = outbox.claim_pending(db, limit=10, now=NOW, lease=30 * SECOND)
    assert [(m.id, m.attempts, m.claimed_until) for m in first] == [
        (message.id, 1, NOW + 30 * SECOND)
    ]
    assert outbox.claim_pending(db, limit=10, now=NOW + 29 * SECOND) == []

    # The notifier died after posting and before marking: delivered again (at least once).
    second = outbox.claim_pending(db, limit=10, now=NOW + 30 * SECOND)
    assert [(m.id, m.attempts) for m in second] == [(message.id, 2)]


def test_a_sent_message_is_never_claimed_again(db):
    message = post(db, "done")
    assert message is not None
    outbox.claim_pending(db, limit=10, now=NOW)

    assert outbox.mark_sent(db, id=message.id, message_ts="1717.99", at=NOW + SECOND)
    assert not outbox.mark_sent(db, id=message.id, message_ts="1717.99", at=NOW + 2 * SECOND)

    assert outbox.claim_pending(db, limit=10, now=NOW + 3600 * SECOND) == []
    sent = outbox.get(db, id=message.id)
    assert (sent.state, sent.message_ts, sent.sent_at, sent.claimed_until) == (
        "sent",
        "1717.99",
        NOW + SECOND,
        None,
    )


def test_a_failed_delivery_is_retried_no_earlier_than_retry_at(db):
    message = post(db, "rate limited")
    assert message is not None
    outbox.claim_pending(db, limit=10, now=NOW)

    assert outbox.mark_failed(
        db, id=message.id, error="ratelimited (Retry-After: 30)", retry_at=NOW + 30 * SECOND
    )

    assert outbox.claim_pending(db, limit=10, now=NOW + 29 * SECOND) == []
    (retry,) = outbox.claim_pending(db, limit=10, now=NOW + 30 * SECOND)
    assert (retry.attempts, retry.last_error) == (2, "ratelimited (Retry-After: 30)")


def test_a_message_given_up_on_is_failed_and_stops_holding_its_thread_back(db):
    doomed = post(db, "blocks too large")
    after = post(db, "next in thread")
    assert doomed is not None and after is not None
    outbox.claim_pending(db, limit=10, now=NOW)

    assert outbox.mark_failed(db, id=doomed.id, error="invalid_blocks", retry_at=None)

    assert outbox.get(db, id=doomed.id).state == "failed"
    assert [m.id for m in outbox.claim_pending(db, limit=10, now=NOW)] == [after.id]


def test_a_later_message_in_a_thread_waits_until_the_earlier_one_is_sent(db):
    first = post(db, "wave 1 started")
    second = post(db, "wave 1 done")
    assert first is not None and second is not None

    assert [m.id for m in outbox.claim_pending(db, limit=10, now=NOW)] == [first.id]
    assert outbox.claim_pending(db, limit=10, now=NOW) == []

    outbox.mark_sent(db, id=first.id, message_ts="1717.2", at=NOW)
    assert [m.id for m in outbox.claim_pending(db, limit=10, now=NOW)] == [second.id]


def test_messages_to_different_threads_are_claimed_together_oldest_first(db):
    a = post(db, "a", thread_ts="1717.1")
    b = post(db, "b", thread_ts="1717.2")
    c = post(db, "c", channel="C0OTHER", thread_ts="1717.1")

    claimed = outbox.claim_pending(db, limit=2, now=NOW)

    assert [m.id for m in claimed] == [a.id, b.id]
    assert [m.id for m in outbox.claim_pending(db, limit=2, now=NOW)] == [c.id]


def test_two_notifiers_claiming_at_once_never_hold_the_same_message(db, db_path):
    for n in range(30):
        post(db, f"m{n}", thread_ts=f"1717.{n}")
    barrier = threading.Barrier(3)
    claims: list[list[int]] = []
    lock = threading.Lock()

    def work() -> None:
        with open_database(db_path) as own:
            barrier.wait()
            while batch := outbox.claim_pending(own, limit=4, now=NOW):
                with lock:
                    claims.append([m.id for m in batch])

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    ids = [i for batch in claims for i in batch]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 30


def test_pruning_sent_messages_frees_their_dedupe_keys(db):
    message = post(db, "approved", dedupe_key="req-7f3a2c/approved")
    assert message is not None
    outbox.mark_sent(db, id=message.id, message_ts="1717.5", at=NOW)
    pending = post(db, "still pending", thread_ts="9")

    assert outbox.prune_sent(db, older_than=NOW + SECOND) == 1

    assert outbox.get(db, id=message.id) is None
    assert outbox.get(db, id=pending.id) is not None
    assert post(db, "approved", dedupe_key="req-7f3a2c/approved") is not None
