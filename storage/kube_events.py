"""Kubernetes Events waiting to be sent: queued in the transaction that audits the action
they report (workflows.engine.kube_events), sent afterwards by the Lease holder's sender.

One row is one Event in the API. Its `key` names the run, the object and the reason: the
same key queued again is a repeat, which bumps `count` and `last_at` instead of adding a
row, and the sender turns it into the Event's series (`series.count`,
`lastObservedTime`). `sent_count` is how many of `count` the API has seen: 0 until the
Event is created, and a row is due while `sent_count < count`.

The table stays small: rows the API has all of, and rows given up on, are pruned once
their last repeat is older than the Events' own lifetime in the API (an hour by default);
a repeat after that starts a new row, as the API server has deleted the old Event too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from storage import codec
from storage.codec import JsonInput, JsonValue
from storage.database import Database

# How long an Event lives in the API server (kube-apiserver --event-ttl, 1h by default):
# a row is kept that long after its last repeat, so a repeat still finds its Event.
KUBE_EVENT_TTL = dt.timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class KubeEventRow:
    id: int
    key: str
    cluster: str | None
    namespace: str
    name: str
    body: JsonValue
    first_at: dt.datetime
    last_at: dt.datetime
    count: int
    sent_count: int
    next_attempt_at: dt.datetime
    attempts: int
    last_error: str | None
    given_up: bool


def queue_kube_event(db: Database, *, key: str, cluster: str | None, namespace: str, name: str, body: JsonInput,
                     at: dt.datetime) -> KubeEventRow:
    """Queue the Event `key`, due at once; if it is queued already (sent or not), count a
    repeat instead. Call it inside the transaction that makes the change it reports."""
    stamp = codec.time_to_text(at)
    with db.transaction():
        db.execute(
            "INSERT INTO kube_events (key, cluster, namespace, name, body, first_at, last_at, next_attempt_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            # The stored row's columns named with the table: PostgreSQL would not know
            # them from `excluded`'s.
            " ON CONFLICT (key) DO UPDATE SET count = kube_events.count + 1, last_at = excluded.last_at,"
            "   next_attempt_at = CASE WHEN kube_events.given_up = 1 THEN kube_events.next_attempt_at"
            "   ELSE excluded.next_attempt_at END",
            (key, cluster, namespace, name, codec.json_to_text(body), stamp, stamp, stamp),
        )
        row = db.query_one("SELECT * FROM kube_events WHERE key = ?", (key,))
    assert row is not None
    return _from_row(row)


def kube_events_due(db: Database, *, now: dt.datetime, limit: int,
                    clusters: Sequence[str | None] = (None,)) -> list[KubeEventRow]:
    """Up to `limit` Events the API has not all of, due by `now`, oldest first: those of
    `clusters` (None: requests that name no cluster, the one or home cluster's)."""
    named = [c for c in clusters if c is not None]
    where = " OR ".join((["cluster IS NULL"] if None in clusters else [])
                        + ([f"cluster IN ({codec.placeholders(named)})"] if named else [])) or "0"
    rows = db.query(
        "SELECT * FROM kube_events WHERE given_up = 0 AND sent_count < count AND next_attempt_at <= ?"
        f" AND ({where}) ORDER BY id LIMIT ?",
        (codec.time_to_text(now), *named, limit),
    )
    return [_from_row(r) for r in rows]


def kube_event(db: Database, *, key: str) -> KubeEventRow | None:
    row = db.query_one("SELECT * FROM kube_events WHERE key = ?", (key,))
    return None if row is None else _from_row(row)


def mark_kube_event_sent(db: Database, *, id: int, count: int) -> None:
    """The API has the Event with `count` occurrences (a repeat queued meanwhile keeps the
    row due)."""
    db.execute("UPDATE kube_events SET sent_count = CASE WHEN sent_count > ? THEN sent_count ELSE ? END,"
               " last_error = NULL WHERE id = ?", (count, count, id))


def mark_kube_event_gone(db: Database, *, id: int) -> None:
    """The Event is not in the API any more (expired, deleted): create it again."""
    db.execute("UPDATE kube_events SET sent_count = 0 WHERE id = ?", (id,))


def mark_kube_event_failed(db: Database, *, id: int, error: str, retry_at: dt.datetime | None) -> None:
    """Sending failed: try again at `retry_at`, or give up on this Event (None)."""
    if retry_at is None:
        db.execute("UPDATE kube_events SET given_up = 1, attempts = attempts + 1, last_error = ? WHERE id = ?",
                   (error, id))
    else:
        db.execute("UPDATE kube_events SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? WHERE id = ?",
                   (error, codec.time_to_text(retry_at), id))


def prune_kube_events(db: Database, *, now: dt.datetime, ttl: dt.timedelta = KUBE_EVENT_TTL) -> int:
    """Forget Events whose last repeat is older than `ttl`: sent, given up on, or never
    sent (an API that has not answered for that long would show them too late to tell)."""
    cursor = db.execute("DELETE FROM kube_events WHERE last_at < ?", (codec.time_to_text(now - ttl),))
    return cursor.rowcount


def _from_row(row: dict[str, Any]) -> KubeEventRow:
    return KubeEventRow(
        id=row["id"], key=row["key"], cluster=row["cluster"], namespace=row["namespace"], name=row["name"],
        body=codec.json_from_text(row["body"]), first_at=codec.time_from_text(row["first_at"]),
        last_at=codec.time_from_text(row["last_at"]), count=row["count"], sent_count=row["sent_count"],
        next_attempt_at=codec.time_from_text(row["next_attempt_at"]), attempts=row["attempts"],
        last_error=row["last_error"], given_up=bool(row["given_up"]),
    )
