"""Notes on nodes: an operator's word on why a node is cordoned or tainted, until when.

A note is in force while `now < until`; nothing has to run at `until` to end it. A new
note on a node does not end an older one: every note in force is shown, newest first.
Rows are never deleted: they are the history. Each is written with its audit row
(`workflows.fleet.notes`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, NewType

from storage import codec
from storage.database import Database

NoteId = NewType("NoteId", int)


@dataclass(frozen=True, slots=True)
class StoredNote:
    id: NoteId
    node: str
    text: str
    until: dt.datetime
    set_by: str
    set_by_name: str
    created_at: dt.datetime
    # The cluster the node is in, with several clusters; None: one cluster.
    cluster: str | None = None

    def in_force(self, now: dt.datetime) -> bool:
        return self.created_at <= now < self.until


def create(db: Database, *, node: str, text: str, until: dt.datetime, set_by: str, set_by_name: str,
           at: dt.datetime, cluster: str | None = None, delivery: str | None = None) -> StoredNote:
    """A new note on `node` (of `cluster`); call it inside the transaction that audits it.
    `delivery` (unique): the Slack delivery that writes it, found again by `written_by_delivery`."""
    cursor = db.execute(
        "INSERT INTO node_notes (node, cluster, text, until, set_by, set_by_name, created_at, delivery)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (node, cluster, text, codec.time_to_text(until), set_by, set_by_name, codec.time_to_text(at), delivery),
    )
    row = db.query_one("SELECT * FROM node_notes WHERE id = ?", (int(cursor.fetchone()[0]),))
    assert row is not None
    return _from_row(row)


def written_by_delivery(db: Database, *, delivery: str) -> StoredNote | None:
    """The note the Slack delivery `delivery` wrote, if it wrote one."""
    row = db.query_one("SELECT * FROM node_notes WHERE delivery = ?", (delivery,))
    return None if row is None else _from_row(row)


def in_force(db: Database, *, now: dt.datetime, cluster: str | None = None,
             every_cluster: bool = False) -> list[StoredNote]:
    """Every note in force at `now` on the nodes of `cluster` (of every cluster with
    `every_cluster`), by node, newest first."""
    where = "" if every_cluster else "cluster IS NOT DISTINCT FROM ? AND "
    rows = db.query(
        f"SELECT * FROM node_notes WHERE {where}until > ? AND created_at <= ?"
        " ORDER BY node, created_at DESC, id DESC",
        ((() if every_cluster else (cluster,)) + (codec.time_to_text(now), codec.time_to_text(now))),
    )
    return [_from_row(r) for r in rows]


def _from_row(row: dict[str, Any]) -> StoredNote:
    return StoredNote(
        id=NoteId(row["id"]),
        node=row["node"],
        cluster=row.get("cluster"),
        text=row["text"],
        until=codec.time_from_text(row["until"]),
        set_by=row["set_by"],
        set_by_name=row["set_by_name"],
        created_at=codec.time_from_text(row["created_at"]),
    )
