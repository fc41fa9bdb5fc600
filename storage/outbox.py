"""Slack messages waiting to be delivered, written in the same transaction as the change
they report, and delivered by the notifier afterwards.

Delivery is at least once: a message is claimed for a lease, posted, then marked sent; if
the notifier dies between posting and marking, the lease runs out and the message is
claimed again. What keeps Slack free of duplicates is upstream: `enqueue` with a
`dedupe_key` (e.g. `run-9b01de/step-41/done`) stores the message once, however often the
engine repeats the transition that produced it.

Order within a conversation is kept: a message is not claimed while an earlier message
to the same channel and thread is still pending (claimed, waiting for a retry, or not yet
tried). A message given up on (`mark_failed(retry_at=None)`) stops holding the others back.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

from storage import codec
from storage.codec import JsonInput, JsonValue
from storage.database import Database
from storage.ids import OutboxId

MessageKind = Literal["post", "update", "ephemeral", "dm"]
MessageState = Literal["pending", "sent", "failed"]
DEFAULT_LEASE = dt.timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    id: OutboxId
    created_at: dt.datetime
    channel: str
    thread_ts: str | None
    kind: MessageKind
    payload: JsonValue
    dedupe_key: str | None
    state: MessageState
    attempts: int
    last_error: str | None
    next_attempt_at: dt.datetime
    claimed_until: dt.datetime | None
    sent_at: dt.datetime | None
    message_ts: str | None


def enqueue(
    db: Database,
    *,
    channel: str,
    kind: MessageKind,
    payload: JsonInput,
    at: dt.datetime,
    thread_ts: str | None = None,
    dedupe_key: str | None = None,
) -> OutboxMessage | None:
    """Queue a message, due at once; None if a message with `dedupe_key` already exists.
    Call it inside the transaction that makes the change the message reports."""
    stamp = codec.time_to_text(at)
    with db.transaction():
        cursor = db.execute(
            "INSERT INTO outbox (created_at, channel, thread_ts, kind, payload, dedupe_key,"
            " next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id",
            (stamp, channel, thread_ts, kind, codec.json_to_text(payload), dedupe_key, stamp),
        )
        inserted = cursor.fetchone()
        if inserted is None:
            return None
        message = get(db, id=OutboxId(int(inserted[0])))
    assert message is not None
    return message


def get(db: Database, *, id: OutboxId) -> OutboxMessage | None:
    row = db.query_one("SELECT * FROM outbox WHERE id = ?", (id,))
    return None if row is None else _from_row(row)


def claim_pending(
    db: Database, *, limit: int, now: dt.datetime, lease: dt.timedelta = DEFAULT_LEASE
) -> list[OutboxMessage]:
    """Claim up to `limit` due messages, oldest first, for `lease`; each claim counts an
    attempt. Two notifiers never hold the same message at once."""
    stamp = codec.time_to_text(now)
    with db.transaction():
        rows = db.query(
            "SELECT id FROM outbox AS o"
            " WHERE o.state = 'pending' AND o.next_attempt_at <= :now"
            "   AND (o.claimed_until IS NULL OR o.claimed_until <= :now)"
            "   AND NOT EXISTS (SELECT 1 FROM outbox AS earlier"
            "     WHERE earlier.state = 'pending' AND earlier.channel = o.channel"
            "       AND earlier.thread_ts IS NOT DISTINCT FROM o.thread_ts AND earlier.id < o.id)"
            " ORDER BY o.id LIMIT :limit",
            {"now": stamp, "limit": limit},
        )
        ids = [r["id"] for r in rows]
        if not ids:
            return []
        db.execute(
            "UPDATE outbox SET claimed_until = ?, attempts = attempts + 1"
            f" WHERE id IN ({codec.placeholders(ids)})",
            (codec.time_to_text(now + lease), *ids),
        )
        claimed = db.query(
            f"SELECT * FROM outbox WHERE id IN ({codec.placeholders(ids)}) ORDER BY id", ids
        )
    return [_from_row(r) for r in claimed]


def mark_sent(db: Database, *, id: OutboxId, message_ts: str | None, at: dt.datetime) -> bool:
    """Slack accepted the message (`message_ts` is its ts, if it has one). False if it was
    already marked sent or given up on."""
    cursor = db.execute(
        "UPDATE outbox SET state = 'sent', sent_at = ?, message_ts = ?, claimed_until = NULL"
        " WHERE id = ? AND state = 'pending'",
        (codec.time_to_text(at), message_ts, id),
    )
    return cursor.rowcount == 1


def mark_failed(db: Database, *, id: OutboxId, error: str, retry_at: dt.datetime | None) -> bool:
    """Delivery failed: try again at `retry_at` (e.g. Slack's Retry-After), or give up
    for good when `retry_at` is None. False if the message is no longer pending."""
    if retry_at is None:
        cursor = db.execute(
            "UPDATE outbox SET state = 'failed', last_error = ?, claimed_until = NULL"
            " WHERE id = ? AND state = 'pending'",
            (error, id),
        )
    else:
        cursor = db.execute(
            "UPDATE outbox SET last_error = ?, next_attempt_at = ?, claimed_until = NULL"
            " WHERE id = ? AND state = 'pending'",
            (error, codec.time_to_text(retry_at), id),
        )
    return cursor.rowcount == 1


def prune_sent(db: Database, *, older_than: dt.datetime) -> int:
    """Forget messages sent before `older_than`; their dedupe keys become free again."""
    cursor = db.execute(
        "DELETE FROM outbox WHERE state = 'sent' AND sent_at < ?",
        (codec.time_to_text(older_than),),
    )
    return cursor.rowcount


def _from_row(row: dict[str, Any]) -> OutboxMessage:
    return OutboxMessage(
        id=OutboxId(row["id"]),
        created_at=codec.time_from_text(row["created_at"]),
        channel=row["channel"],
        thread_ts=row["thread_ts"],
        kind=row["kind"],
        payload=codec.json_from_text(row["payload"]),
        dedupe_key=row["dedupe_key"],
        state=row["state"],
        attempts=row["attempts"],
        last_error=row["last_error"],
        next_attempt_at=codec.time_from_text(row["next_attempt_at"]),
        claimed_until=codec.optional_time_from_text(row["claimed_until"]),
        sent_at=codec.optional_time_from_text(row["sent_at"]),
        message_ts=row["message_ts"],
    )
