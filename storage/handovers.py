"""Shift-change handovers: the checklist posted for a rotation's shift, and its acks.

One handover per (rotation, shift start), so a scheduler that fires twice posts once.
An ack is recorded whoever gives it; `counted` says whether it satisfies the handover
(the workflow decides: e.g. only the incoming shift counts). The first counted ack
becomes the handover's `acked_by`/`acked_at`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from storage import codec
from storage.codec import JsonValue
from storage.database import Database
from storage.ids import HandoverAckId, HandoverId


@dataclass(frozen=True, slots=True)
class Handover:
    id: HandoverId
    rotation: str
    shift_start: dt.datetime
    posted_at: dt.datetime | None
    channel: str
    ts: str | None
    content: JsonValue
    late: bool
    acked_by: str | None
    acked_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class HandoverAck:
    id: HandoverAckId
    handover_id: HandoverId
    user: str
    at: dt.datetime
    counted: bool


def create(
    db: Database, *, rotation: str, shift_start: dt.datetime, channel: str, content: JsonValue
) -> Handover | None:
    """A handover not yet posted, or None if this rotation's shift already has one."""
    with db.transaction():
        cursor = db.execute(
            "INSERT INTO handovers (rotation, shift_start, channel, content) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING RETURNING id",
            (rotation, codec.time_to_text(shift_start), channel, codec.json_to_text(content)),
        )
        inserted = cursor.fetchone()
        if inserted is None:
            return None
        handover = get(db, id=HandoverId(int(inserted[0])))
    assert handover is not None
    return handover


def get(db: Database, *, id: HandoverId) -> Handover | None:
    row = db.query_one("SELECT * FROM handovers WHERE id = ?", (id,))
    return None if row is None else _handover(row)


def for_shift(db: Database, *, rotation: str, shift_start: dt.datetime) -> Handover | None:
    row = db.query_one(
        "SELECT * FROM handovers WHERE rotation = ? AND shift_start = ?",
        (rotation, codec.time_to_text(shift_start)),
    )
    return None if row is None else _handover(row)


def latest(db: Database, *, rotation: str) -> Handover | None:
    row = db.query_one(
        "SELECT * FROM handovers WHERE rotation = ? ORDER BY shift_start DESC LIMIT 1",
        (rotation,),
    )
    return None if row is None else _handover(row)


def recent(
    db: Database, *, rotation: str, limit: int, before: dt.datetime | None = None
) -> list[Handover]:
    """The rotation's newest `limit` handovers (with a shift start before `before`, if
    given), newest first."""
    sql = "SELECT * FROM handovers WHERE rotation = ?"
    params: list[Any] = [rotation]
    if before is not None:
        sql += " AND shift_start < ?"
        params.append(codec.time_to_text(before))
    rows = db.query(sql + " ORDER BY shift_start DESC LIMIT ?", [*params, limit])
    return [_handover(r) for r in rows]


def mark_posted(
    db: Database, *, id: HandoverId, ts: str, posted_at: dt.datetime, late: bool
) -> bool:
    """Record the Slack message that carries the handover; False if already posted."""
    cursor = db.execute(
        "UPDATE handovers SET ts = ?, posted_at = ?, late = ? WHERE id = ? AND ts IS NULL",
        (ts, codec.time_to_text(posted_at), int(late), id),
    )
    return cursor.rowcount == 1


def record_ack(
    db: Database, *, handover_id: HandoverId, user: str, at: dt.datetime, counted: bool
) -> HandoverAck:
    """Record an ack; a counted one acknowledges the handover if nobody has yet."""
    stamp = codec.time_to_text(at)
    with db.transaction():
        cursor = db.execute(
            "INSERT INTO handover_acks (handover_id, \"user\", at, counted) VALUES (?, ?, ?, ?) RETURNING id",
            (handover_id, user, stamp, int(counted)),
        )
        ack_id = HandoverAckId(int(cursor.fetchone()[0]))
        if counted:
            db.execute(
                "UPDATE handovers SET acked_by = ?, acked_at = ? WHERE id = ? AND acked_by IS NULL",
                (user, stamp, handover_id),
            )
    return HandoverAck(
        id=ack_id,
        handover_id=handover_id,
        user=user,
        at=codec.time_from_text(stamp),
        counted=counted,
    )


def acks(db: Database, *, handover_id: HandoverId) -> list[HandoverAck]:
    rows = db.query(
        "SELECT * FROM handover_acks WHERE handover_id = ? ORDER BY at, id", (handover_id,)
    )
    return [
        HandoverAck(
            id=HandoverAckId(r["id"]),
            handover_id=HandoverId(r["handover_id"]),
            user=r["user"],
            at=codec.time_from_text(r["at"]),
            counted=bool(r["counted"]),
        )
        for r in rows
    ]


def _handover(row: dict[str, Any]) -> Handover:
    return Handover(
        id=HandoverId(row["id"]),
        rotation=row["rotation"],
        shift_start=codec.time_from_text(row["shift_start"]),
        posted_at=codec.optional_time_from_text(row["posted_at"]),
        channel=row["channel"],
        ts=row["ts"],
        content=codec.json_from_text(row["content"]),
        late=bool(row["late"]),
        acked_by=row["acked_by"],
        acked_at=codec.optional_time_from_text(row["acked_at"]),
    )
