"""The inbox: every command, click and form Slack delivered and a replica acknowledged,
kept until it is answered, so a replica that dies in between loses nothing.

Why: Slack sends a delivery once it has its ack (HTTP 200 or the Socket Mode envelope's
ack) and never again; the work runs afterwards, so a replica killed between its ack and
its answer took the delivery with it. So the ack is given only after the delivery is a
row here (`accept`): its key (the dedupe key the bot always used), its kind, what is
needed to run it again (the command's fields, the click's body with its response_url, the
form's view) and the replica that claimed it. The same insert is the duplicate check: a
Slack retry, or a redelivery to another replica, finds the key taken and runs nothing.

Answered (`answered`), a delivery is closed by a small write of its own, after the answer
went out: never in the transaction of what the delivery changed, which may have no
transaction at all (a read) or several.

Each replica writes a heartbeat row (`beat`) every few seconds. A delivery still claimed by
a replica whose heartbeat is older than the dead-after (`stranded`) is taken over by one
conditional UPDATE (`take_over`): it changes the claimant only while the old one is still
the claimant and still silent, so of several survivors exactly one wins, and that one runs
it again. A delivery too old to be answered any more (its response_url lives 30 minutes)
is closed as `abandoned` instead (`abandon`), by the same kind of UPDATE, so it is logged
once by one replica.

Replica names carry a token of the process (`bot.heartbeat`): a pod restarted under the
same name is a new replica, and the dead process's deliveries are still taken over.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

from storage import codec
from storage.codec import JsonValue
from storage.database import Database

DeliveryState = Literal["claimed", "answered", "abandoned"]

# A claimant is silent when it has no heartbeat at or after the given time (or none at all).
_SILENT = "NOT EXISTS (SELECT 1 FROM replica_heartbeats h WHERE h.name = inbox.claimed_by AND h.seen_at >= ?)"


@dataclass(frozen=True, slots=True)
class Delivery:
    key: str
    kind: str  # command, click, deny, form
    payload: JsonValue  # what running it again needs (bot.slack_app writes and reads it)
    claimed_by: str
    received_at: dt.datetime
    claimed_at: dt.datetime
    takeovers: int
    state: DeliveryState
    ended_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    name: str
    started_at: dt.datetime
    seen_at: dt.datetime


def accept(db: Database, *, key: str, kind: str, payload: JsonValue, replica: str, at: dt.datetime) -> bool:
    """Keep the delivery `key`, claimed by `replica`; True if it is new (run it), False if
    it was kept before (a retry or a redelivery: run nothing). One insert that does
    nothing on conflict, so exactly one caller anywhere gets True."""
    when = codec.time_to_text(at)
    cursor = db.execute(
        "INSERT INTO inbox (key, kind, payload, claimed_by, received_at, claimed_at) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (key, kind, codec.json_to_text(payload), replica, when, when),
    )
    return cursor.rowcount == 1


def answered(db: Database, *, key: str, at: dt.datetime) -> bool:
    """Close the delivery: it was answered. False if it was not open (already closed)."""
    cursor = db.execute(
        "UPDATE inbox SET state = 'answered', ended_at = ? WHERE key = ? AND state = 'claimed'",
        (codec.time_to_text(at), key),
    )
    return cursor.rowcount == 1


def get(db: Database, *, key: str) -> Delivery | None:
    row = db.query_one("SELECT * FROM inbox WHERE key = ?", (key,))
    return None if row is None else _from_row(row)


def beat(db: Database, *, replica: str, at: dt.datetime) -> None:
    """`replica` is alive at `at` (its first beat also says when it started)."""
    when = codec.time_to_text(at)
    db.execute(
        "INSERT INTO replica_heartbeats (name, started_at, seen_at) VALUES (?, ?, ?)"
        " ON CONFLICT (name) DO UPDATE SET seen_at = excluded.seen_at",
        (replica, when, when),
    )


def heartbeat(db: Database, *, replica: str) -> Heartbeat | None:
    row = db.query_one("SELECT * FROM replica_heartbeats WHERE name = ?", (replica,))
    if row is None:
        return None
    return Heartbeat(name=row["name"], started_at=codec.time_from_text(row["started_at"]),
                     seen_at=codec.time_from_text(row["seen_at"]))


def stranded(db: Database, *, silent_since: dt.datetime, limit: int = 50) -> list[Delivery]:
    """Open deliveries whose claimant has not beaten since `silent_since`, oldest first."""
    rows = db.query(
        f"SELECT * FROM inbox WHERE state = 'claimed' AND {_SILENT} ORDER BY received_at, key LIMIT ?",
        (codec.time_to_text(silent_since), limit),
    )
    return [_from_row(row) for row in rows]


def take_over(db: Database, *, key: str, claimed_by: str, replica: str, silent_since: dt.datetime,
              at: dt.datetime) -> bool:
    """Claim the open delivery `key` for `replica`, if `claimed_by` still claims it and has
    not beaten since `silent_since`. True for exactly one of several replicas trying."""
    cursor = db.execute(
        "UPDATE inbox SET claimed_by = ?, claimed_at = ?, takeovers = takeovers + 1"
        f" WHERE key = ? AND state = 'claimed' AND claimed_by = ? AND {_SILENT}",
        (replica, codec.time_to_text(at), key, claimed_by, codec.time_to_text(silent_since)),
    )
    return cursor.rowcount == 1


def abandon(db: Database, *, key: str, claimed_by: str, silent_since: dt.datetime, at: dt.datetime) -> bool:
    """Close the open delivery `key` unanswered, on the same condition as `take_over`:
    True for exactly one replica, which says so."""
    cursor = db.execute(
        "UPDATE inbox SET state = 'abandoned', ended_at = ?"
        f" WHERE key = ? AND state = 'claimed' AND claimed_by = ? AND {_SILENT}",
        (codec.time_to_text(at), key, claimed_by, codec.time_to_text(silent_since)),
    )
    return cursor.rowcount == 1


def forget_closed(db: Database, *, older_than: dt.datetime) -> int:
    """Forget closed deliveries received before `older_than` and heartbeats not seen since;
    returns how many deliveries. Open ones stay: the replicas close them."""
    when = codec.time_to_text(older_than)
    db.execute("DELETE FROM replica_heartbeats WHERE seen_at < ?", (when,))
    cursor = db.execute("DELETE FROM inbox WHERE state <> 'claimed' AND received_at < ?", (when,))
    return cursor.rowcount


def _from_row(row: dict[str, Any]) -> Delivery:
    return Delivery(
        key=row["key"],
        kind=row["kind"],
        payload=codec.json_from_text(row["payload"]),
        claimed_by=row["claimed_by"],
        received_at=codec.time_from_text(row["received_at"]),
        claimed_at=codec.time_from_text(row["claimed_at"]),
        takeovers=int(row["takeovers"]),
        state=row["state"],
        ended_at=codec.optional_time_from_text(row["ended_at"]),
    )
