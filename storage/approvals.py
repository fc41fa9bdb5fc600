"""Approver decisions on a request, each bound to the plan hash the approver saw.

One decision per (request, approver, plan hash): a second click by the same person on
the same plan is a no-op, and a re-planned request needs fresh decisions. Whether a
decision counts (distinct approvers, not the requester, holding the role, before expiry)
is decided in `workflows/policy`, not here.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

from storage import codec
from storage.database import Database
from storage.ids import ApprovalId, RequestId

Decision = Literal["approve", "deny"]


@dataclass(frozen=True, slots=True)
class Approval:
    id: ApprovalId
    request_id: RequestId
    approver: str
    decision: Decision
    plan_hash: str
    reason: str | None
    created_at: dt.datetime


def record(
    db: Database,
    *,
    request_id: RequestId,
    approver: str,
    decision: Decision,
    plan_hash: str,
    at: dt.datetime,
    reason: str | None = None,
) -> Approval | None:
    """The new decision, or None if this approver already decided on this plan hash."""
    with db.transaction():
        cursor = db.execute(
            "INSERT INTO approvals (request_id, approver, decision, plan_hash, reason, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id",
            (request_id, approver, decision, plan_hash, reason, codec.time_to_text(at)),
        )
        inserted = cursor.fetchone()
        if inserted is None:
            return None
        row = db.query_one("SELECT * FROM approvals WHERE id = ?", (inserted[0],))
    assert row is not None
    return _from_row(row)


def change_to_deny(
    db: Database,
    *,
    request_id: RequestId,
    approver: str,
    plan_hash: str,
    reason: str,
    at: dt.datetime,
) -> Approval | None:
    """The approver changed their mind: their approval of this plan becomes a deny (the
    audit log keeps the earlier approval). None if they had not approved this plan."""
    with db.transaction():
        cursor = db.execute(
            "UPDATE approvals SET decision = 'deny', reason = ?, created_at = ?"
            " WHERE request_id = ? AND approver = ? AND plan_hash = ? AND decision = 'approve'",
            (reason, codec.time_to_text(at), request_id, approver, plan_hash),
        )
        if cursor.rowcount == 0:
            return None
        row = db.query_one(
            "SELECT * FROM approvals WHERE request_id = ? AND approver = ? AND plan_hash = ?",
            (request_id, approver, plan_hash),
        )
    assert row is not None
    return _from_row(row)


def for_request(
    db: Database, *, request_id: RequestId, plan_hash: str | None = None
) -> list[Approval]:
    """Decisions on the request (only those on `plan_hash` if given), oldest first."""
    sql = "SELECT * FROM approvals WHERE request_id = ?"
    params: list[Any] = [request_id]
    if plan_hash is not None:
        sql += " AND plan_hash = ?"
        params.append(plan_hash)
    return [_from_row(r) for r in db.query(sql + " ORDER BY created_at, id", params)]


def _from_row(row: dict[str, Any]) -> Approval:
    return Approval(
        id=ApprovalId(row["id"]),
        request_id=RequestId(row["request_id"]),
        approver=row["approver"],
        decision=row["decision"],
        plan_hash=row["plan_hash"],
        reason=row["reason"],
        created_at=codec.time_from_text(row["created_at"]),
    )
