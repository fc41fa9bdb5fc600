"""Requests: a drain window, driver upgrade or MIG change, bound to one plan by its hash.

Storage records the state and makes each change a compare-and-set; which transitions
are legal (and who may make them) is `workflows/` policy.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from storage import codec
from storage.codec import JsonValue
from storage.database import Database
from storage.ids import RequestId, new_request_id

# The kind of change a request asks for ("drain", ...). Storage keeps the names as data: the
# `request_kinds` reference rows the opener writes (workflows/kinds.py says which there are);
# the database refuses a request of a kind without a row.
RequestKind = str
RequestState = Literal[
    "pending",
    "approved",
    "denied",
    "cancelled",
    "expired",
    "scheduled",
    "running",
    "done",
    "failed",
    "missed",
]
FINISHED_STATES: frozenset[RequestState] = frozenset(
    {"denied", "cancelled", "expired", "done", "failed", "missed"}
)


@dataclass(frozen=True, slots=True)
class PendingExtension:
    """A later window end asked for a running drain, bound to the plan that carries it
    (`plan_hash`); it waits for approvals on that hash until `expires_at`."""

    window_end: dt.datetime
    plan: JsonValue
    plan_hash: str
    asked_by: str
    asked_at: dt.datetime
    expires_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Request:
    id: RequestId
    kind: RequestKind
    pool: str
    targets: JsonValue
    window_start: dt.datetime | None
    window_end: dt.datetime | None
    reason: str
    requester: str
    requester_name: str
    state: RequestState
    plan: JsonValue
    plan_hash: str
    approvals_required: int
    expires_at: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime
    channel: str | None
    thread_ts: str | None
    # The cluster whose nodes it changes, with several clusters (None: one cluster).
    cluster: str | None = None
    # A later window end waiting for approval while the request runs (a drain), if any.
    extension: PendingExtension | None = None
    # The Slack delivery that filed it (storage.inbox's key), if one did: a delivery run
    # again after its replica died finds the request it filed instead of filing another.
    delivery: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES


def create(
    db: Database,
    *,
    kind: RequestKind,
    pool: str,
    targets: JsonValue,
    window_start: dt.datetime | None,
    window_end: dt.datetime | None,
    reason: str,
    requester: str,
    requester_name: str,
    plan: JsonValue,
    plan_hash: str,
    approvals_required: int,
    expires_at: dt.datetime,
    at: dt.datetime,
    channel: str | None = None,
    thread_ts: str | None = None,
    id: RequestId | None = None,
    cluster: str | None = None,
    delivery: str | None = None,
) -> Request:
    """A new `pending` request. Without `id`, a fresh `req-xxxxxx` is chosen. `delivery`
    (unique) is the Slack delivery that files it, found again by `filed_by`."""
    row = {
        "kind": kind,
        "pool": pool,
        "targets": codec.json_to_text(targets),
        "window_start": codec.optional_time_to_text(window_start),
        "window_end": codec.optional_time_to_text(window_end),
        "reason": reason,
        "requester": requester,
        "requester_name": requester_name,
        "state": "pending",
        "plan": codec.json_to_text(plan),
        "plan_hash": plan_hash,
        "approvals_required": approvals_required,
        "expires_at": codec.time_to_text(expires_at),
        "created_at": codec.time_to_text(at),
        "updated_at": codec.time_to_text(at),
        "channel": channel,
        "thread_ts": thread_ts,
        # NB: only when there is one: the column is migration 8's (older files lack it).
        **({"cluster": cluster} if cluster is not None else {}),
        **({"delivery": delivery} if delivery is not None else {}),
    }
    with db.transaction():
        row["id"] = id if id is not None else _free_id(db)
        db.insert("requests", row)
    return _from_row(row)


def get(db: Database, *, id: RequestId) -> Request | None:
    row = db.query_one("SELECT * FROM requests WHERE id = ?", (id,))
    return None if row is None else _from_row(row)


def plan_version(db: Database, *, id: RequestId) -> tuple[dt.datetime | None, str] | None:
    """The request's window end and plan hash, which a running drain's extension moves: read
    without the plan itself (the engine asks on every pass, and a 200-node plan is large)."""
    row = db.query_one("SELECT window_end, plan_hash FROM requests WHERE id = ?", (id,))
    return None if row is None else (codec.optional_time_from_text(row["window_end"]), row["plan_hash"])


def filed_by(db: Database, *, delivery: str) -> Request | None:
    """The request the Slack delivery `delivery` filed, if it filed one."""
    row = db.query_one("SELECT * FROM requests WHERE delivery = ?", (delivery,))
    return None if row is None else _from_row(row)


def transition(
    db: Database,
    *,
    id: RequestId,
    expected: RequestState | Collection[RequestState],
    new: RequestState,
    at: dt.datetime,
) -> bool:
    """Move the request to `new` only if it is in `expected` now; True if this call won."""
    states = codec.state_set(expected)
    cursor = db.execute(
        f"UPDATE requests SET state = ?, updated_at = ? "
        f"WHERE id = ? AND state IN ({codec.placeholders(states)})",
        (new, codec.time_to_text(at), id, *states),
    )
    return cursor.rowcount == 1


def replace_plan(
    db: Database,
    *,
    id: RequestId,
    expected_plan_hash: str,
    plan: JsonValue,
    plan_hash: str,
    at: dt.datetime,
) -> bool:
    """Bind a still-pending request to a new plan. Approvals are per plan hash, so the
    ones given for the old plan stop counting. False if the request moved on or the plan
    changed under the caller."""
    cursor = db.execute(
        "UPDATE requests SET plan = ?, plan_hash = ?, updated_at = ? "
        "WHERE id = ? AND state = 'pending' AND plan_hash = ?",
        (codec.json_to_text(plan), plan_hash, codec.time_to_text(at), id, expected_plan_hash),
    )
    return cursor.rowcount == 1


def replace_window_end(
    db: Database,
    *,
    id: RequestId,
    expected_plan_hash: str,
    plan: JsonValue,
    plan_hash: str,
    window_end: dt.datetime | None,
    expires_at: dt.datetime,
    at: dt.datetime,
) -> bool:
    """Bind a not-yet-running request to a new plan with a new window end; it is
    `pending` again (approvals are per plan hash). False if it moved on meanwhile."""
    cursor = db.execute(
        "UPDATE requests SET plan = ?, plan_hash = ?, window_end = ?, expires_at = ?, "
        "state = 'pending', updated_at = ? "
        "WHERE id = ? AND state IN ('pending', 'approved', 'scheduled') AND plan_hash = ?",
        (codec.json_to_text(plan), plan_hash, codec.optional_time_to_text(window_end),
         codec.time_to_text(expires_at), codec.time_to_text(at), id, expected_plan_hash),
    )
    return cursor.rowcount == 1


def ask_extension(
    db: Database,
    *,
    id: RequestId,
    expected_plan_hash: str,
    window_end: dt.datetime,
    plan: JsonValue,
    plan_hash: str,
    asked_by: str,
    expires_at: dt.datetime,
    at: dt.datetime,
) -> bool:
    """Store a later window end for a running request, waiting for approval (it replaces
    one asked before). The request's own window end and plan stay as they are until
    `apply_extension`. False if it is not running on `expected_plan_hash` any more."""
    cursor = db.execute(
        "UPDATE requests SET extension_window_end = ?, extension_plan = ?, extension_plan_hash = ?, "
        "extension_asked_by = ?, extension_asked_at = ?, extension_expires_at = ?, updated_at = ? "
        "WHERE id = ? AND state = 'running' AND plan_hash = ?",
        (codec.time_to_text(window_end), codec.json_to_text(plan), plan_hash, asked_by, codec.time_to_text(at),
         codec.time_to_text(expires_at), codec.time_to_text(at), id, expected_plan_hash),
    )
    return cursor.rowcount == 1


def apply_extension(db: Database, *, id: RequestId, expected_extension_hash: str, at: dt.datetime) -> bool:
    """The pending extension becomes the request's window end and plan (still `running`).
    False if the request stopped running or its extension changed meanwhile."""
    cursor = db.execute(
        "UPDATE requests SET window_end = extension_window_end, plan = extension_plan, "
        f"plan_hash = extension_plan_hash, {_NO_EXTENSION}, updated_at = ? "
        "WHERE id = ? AND state = 'running' AND extension_plan_hash = ?",
        (codec.time_to_text(at), id, expected_extension_hash),
    )
    return cursor.rowcount == 1


def drop_extension(db: Database, *, id: RequestId, expected_extension_hash: str, at: dt.datetime) -> bool:
    """Forget the pending extension (it lapsed). False if it changed meanwhile."""
    cursor = db.execute(
        f"UPDATE requests SET {_NO_EXTENSION}, updated_at = ? WHERE id = ? AND extension_plan_hash = ?",
        (codec.time_to_text(at), id, expected_extension_hash),
    )
    return cursor.rowcount == 1


def extensions_lapsed(db: Database, *, now: dt.datetime, cluster: str | None = None) -> list[Request]:
    """Requests of `cluster` whose pending extension's deadline has come, oldest first."""
    rows = db.query(
        "SELECT * FROM requests WHERE extension_plan_hash IS NOT NULL AND extension_expires_at <= ? "
        "AND cluster IS NOT DISTINCT FROM ? ORDER BY extension_expires_at, id",
        (codec.time_to_text(now), cluster),
    )
    return [_from_row(r) for r in rows]


_NO_EXTENSION = ("extension_window_end = NULL, extension_plan = NULL, extension_plan_hash = NULL, "
                 "extension_asked_by = NULL, extension_asked_at = NULL, extension_expires_at = NULL")


def set_thread(db: Database, *, id: RequestId, channel: str, thread_ts: str) -> bool:
    """Remember the Slack thread that tells this request's story (first one wins)."""
    cursor = db.execute(
        "UPDATE requests SET channel = ?, thread_ts = ? WHERE id = ? AND thread_ts IS NULL",
        (channel, thread_ts, id),
    )
    return cursor.rowcount == 1


def in_states(
    db: Database,
    *,
    states: Collection[RequestState],
    pool: str | None = None,
    limit: int = 100,
    cluster: tuple[str | None] | None = None,
) -> list[Request]:
    """Requests in any of `states` (optionally one pool; with `cluster`, `(name,)`, one
    cluster's, `(None,)` those that name none), newest first."""
    wanted = codec.state_set(states)
    sql = f"SELECT * FROM requests WHERE state IN ({codec.placeholders(wanted)})"
    params: list[Any] = list(wanted)
    if pool is not None:
        sql += " AND pool = ?"
        params.append(pool)
    if cluster is not None:
        sql += " AND cluster IS NOT DISTINCT FROM ?"
        params.append(cluster[0])
    sql += " ORDER BY created_at DESC, id LIMIT ?"
    params.append(limit)
    return [_from_row(r) for r in db.query(sql, params)]


def known_ids(db: Database, *, limit: int = 1000) -> list[RequestId]:
    """The ids of the newest `limit` requests, newest first (for "did you mean")."""
    rows = db.query("SELECT id FROM requests ORDER BY created_at DESC, id LIMIT ?", (limit,))
    return [RequestId(r["id"]) for r in rows]


def pending_expired(db: Database, *, now: dt.datetime, cluster: str | None = None) -> list[Request]:
    """Pending requests of `cluster` whose approval deadline has passed, oldest deadline first."""
    rows = db.query(
        "SELECT * FROM requests WHERE state = 'pending' AND expires_at <= ? AND cluster IS NOT DISTINCT FROM ?"
        " ORDER BY expires_at, id",
        (codec.time_to_text(now), cluster),
    )
    return [_from_row(r) for r in rows]


def name_unnamed_cluster(db: Database, *, cluster: str) -> int:
    """Give requests and freezes that name no cluster (made while gpuops served one) the
    home cluster's name, once `clusters:` is configured; how many rows changed."""
    with db.transaction():
        changed = db.execute("UPDATE requests SET cluster = ? WHERE cluster IS NULL", (cluster,)).rowcount
        changed += db.execute("UPDATE freezes SET cluster = ? WHERE cluster IS NULL", (cluster,)).rowcount
    return changed


def _free_id(db: Database) -> RequestId:
    # Called under the write lock, so the id stays free until the insert.
    while True:
        candidate = new_request_id()
        if db.query_one("SELECT 1 AS taken FROM requests WHERE id = ?", (candidate,)) is None:
            return candidate


def _from_row(row: dict[str, Any]) -> Request:
    return Request(
        id=RequestId(row["id"]),
        kind=row["kind"],
        pool=row["pool"],
        targets=codec.json_from_text(row["targets"]),
        window_start=codec.optional_time_from_text(row["window_start"]),
        window_end=codec.optional_time_from_text(row["window_end"]),
        reason=row["reason"],
        requester=row["requester"],
        requester_name=row["requester_name"],
        state=row["state"],
        plan=codec.json_from_text(row["plan"]),
        plan_hash=row["plan_hash"],
        approvals_required=row["approvals_required"],
        expires_at=codec.time_from_text(row["expires_at"]),
        created_at=codec.time_from_text(row["created_at"]),
        updated_at=codec.time_from_text(row["updated_at"]),
        channel=row["channel"],
        thread_ts=row["thread_ts"],
        cluster=row.get("cluster"),
        extension=_extension_from_row(row),
        delivery=row.get("delivery"),  # NB: .get: the column is migration 15's
    )


def _extension_from_row(row: dict[str, Any]) -> PendingExtension | None:
    # NB: .get: the columns are migration 9's.
    if row.get("extension_plan_hash") is None:
        return None
    return PendingExtension(
        window_end=codec.time_from_text(row["extension_window_end"]),
        plan=codec.json_from_text(row["extension_plan"]),
        plan_hash=row["extension_plan_hash"],
        asked_by=row["extension_asked_by"],
        asked_at=codec.time_from_text(row["extension_asked_at"]),
        expires_at=codec.time_from_text(row["extension_expires_at"]),
    )
