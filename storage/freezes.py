"""Change freezes: a pool (or the whole cluster) where no new request is filed and no
run starts or moves to its next node, until a time or until someone lifts it.

A freeze expires by itself: it is in force while `now < until` and it was not lifted, so
nothing has to run at `until` to end it. Setting a freeze on a target that already has one
in force lifts that one in the same transaction (`replaced_by` names the new row), so a
target has at most one freeze in force. Rows are never deleted: they are the history.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, NewType

from storage import codec
from storage.database import Database

FreezeId = NewType("FreezeId", int)

# The target that freezes every pool.
CLUSTER = "cluster"


@dataclass(frozen=True, slots=True)
class StoredFreeze:
    id: FreezeId
    target: str  # "cluster" or a pool name
    until: dt.datetime
    reason: str
    # Runs already going when the freeze landed go on to their end (else they stop at
    # their next node boundary).
    let_running_finish: bool
    set_by: str
    set_by_name: str
    created_at: dt.datetime
    lifted_at: dt.datetime | None
    lifted_by: str | None
    lifted_by_name: str | None
    lift_reason: str | None
    replaced_by: FreezeId | None
    # The cluster it freezes (its pool, or all of it), with several clusters; None: one cluster.
    cluster: str | None = None

    def in_force(self, now: dt.datetime) -> bool:
        return self.lifted_at is None and now < self.until


def create(db: Database, *, target: str, until: dt.datetime, reason: str, let_running_finish: bool,
           set_by: str, set_by_name: str, at: dt.datetime,
           cluster: str | None = None, delivery: str | None = None) -> tuple[StoredFreeze, StoredFreeze | None]:
    """A new freeze on `target` (of `cluster`), and the one in force there that it
    replaces (lifted now, by the same person), if any. `delivery` (unique): the Slack
    delivery that sets it, found again by `set_by_delivery`."""
    with db.transaction():
        replaced = in_force_on(db, target=target, now=at, cluster=cluster)
        cursor = db.execute(
            "INSERT INTO freezes (target, until, reason, let_running_finish, set_by, set_by_name, created_at,"
            " cluster, delivery) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (target, codec.time_to_text(until), reason, int(let_running_finish), set_by, set_by_name,
             codec.time_to_text(at), cluster, delivery),
        )
        new_id = FreezeId(int(cursor.fetchone()[0]))
        if replaced is not None:
            db.execute(
                "UPDATE freezes SET lifted_at = ?, lifted_by = ?, lifted_by_name = ?, lift_reason = ?,"
                " replaced_by = ? WHERE id = ? AND lifted_at IS NULL",
                (codec.time_to_text(at), set_by, set_by_name, "replaced by a new freeze", new_id, replaced.id),
            )
        row = get(db, id=new_id)
    assert row is not None
    return row, replaced


def lift(db: Database, *, id: FreezeId, by: str, by_name: str, reason: str, at: dt.datetime) -> bool:
    """End the freeze now if it is still in force; True if this call lifted it."""
    cursor = db.execute(
        "UPDATE freezes SET lifted_at = ?, lifted_by = ?, lifted_by_name = ?, lift_reason = ?"
        " WHERE id = ? AND lifted_at IS NULL AND until > ?",
        (codec.time_to_text(at), by, by_name, reason, id, codec.time_to_text(at)),
    )
    return cursor.rowcount == 1


def get(db: Database, *, id: FreezeId) -> StoredFreeze | None:
    row = db.query_one("SELECT * FROM freezes WHERE id = ?", (id,))
    return None if row is None else _from_row(row)


def set_by_delivery(db: Database, *, delivery: str) -> tuple[StoredFreeze, StoredFreeze | None] | None:
    """The freeze the Slack delivery `delivery` set and the one it replaced, if it set one."""
    row = db.query_one("SELECT * FROM freezes WHERE delivery = ?", (delivery,))
    if row is None:
        return None
    replaced = db.query_one("SELECT * FROM freezes WHERE replaced_by = ?", (row["id"],))
    return _from_row(row), None if replaced is None else _from_row(replaced)


def in_force(db: Database, *, now: dt.datetime) -> list[StoredFreeze]:
    """Every freeze in force at `now`, the cluster's first, then by target."""
    rows = db.query(
        "SELECT * FROM freezes WHERE lifted_at IS NULL AND until > ?"
        " ORDER BY target != 'cluster', cluster, target, id",
        (codec.time_to_text(now),),
    )
    return [_from_row(r) for r in rows]


def in_force_on(db: Database, *, target: str, now: dt.datetime, cluster: str | None = None) -> StoredFreeze | None:
    """The freeze in force on exactly `target` ("cluster" or a pool) of `cluster`, if any."""
    row = db.query_one(
        "SELECT * FROM freezes WHERE target = ? AND cluster IS NOT DISTINCT FROM ? AND lifted_at IS NULL AND until > ?"
        " ORDER BY id DESC LIMIT 1",
        (target, cluster, codec.time_to_text(now)),
    )
    return None if row is None else _from_row(row)


def _from_row(row: dict[str, Any]) -> StoredFreeze:
    return StoredFreeze(
        id=FreezeId(row["id"]),
        target=row["target"],
        cluster=row.get("cluster"),
        until=codec.time_from_text(row["until"]),
        reason=row["reason"],
        let_running_finish=bool(row["let_running_finish"]),
        set_by=row["set_by"],
        set_by_name=row["set_by_name"],
        created_at=codec.time_from_text(row["created_at"]),
        lifted_at=codec.optional_time_from_text(row["lifted_at"]),
        lifted_by=row["lifted_by"],
        lifted_by_name=row["lifted_by_name"],
        lift_reason=row["lift_reason"],
        replaced_by=None if row["replaced_by"] is None else FreezeId(row["replaced_by"]),
    )
