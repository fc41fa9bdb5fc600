"""A request as its readers see it (`RequestView`): its plan, who approved which hash
and whether that counts now, and a running drain's pending extension."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from storage.approvals import Decision
from storage.ids import RequestId
from storage.requests import RequestKind, RequestState
from workflows.plans import Plan, PlanSummary, short_hash


@dataclass(frozen=True, slots=True)
class ApprovalView:
    approver: str
    approver_name: str
    decision: Decision
    plan_hash: str
    # An approval of the plan that is current now, by someone other than the requester.
    counts: bool
    reason: str | None
    at: dt.datetime


@dataclass(frozen=True, slots=True)
class ExtensionView:
    """A later window end asked for a running drain, waiting for approval on its own plan
    hash until `expires_at` (the drain's current window end at the latest)."""

    window_end: dt.datetime
    plan_hash: str
    asked_by: str
    asked_at: dt.datetime
    expires_at: dt.datetime
    # Who approved it so far (distinct approvers holding the role, never the requester).
    approvers: tuple[str, ...]

    @property
    def short_hash(self) -> str:
        return short_hash(self.plan_hash)


@dataclass(frozen=True, slots=True)
class RequestView:
    id: RequestId
    kind: RequestKind
    pool: str
    state: RequestState
    requester: str
    requester_name: str
    reason: str
    targets: Any
    window_start: dt.datetime | None
    window_end: dt.datetime | None
    plan: Plan
    plan_hash: str
    # Every decision, on any plan, oldest first; `counts` marks those that count now.
    approvals: tuple[ApprovalView, ...]
    approvals_required: int
    approvals_counted: int
    expires_at: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime
    channel: str | None
    thread_ts: str | None
    # The cluster whose nodes it changes, with several clusters (None: one cluster).
    cluster: str | None = None
    # A running drain's later window end waiting for approval, if one is asked for.
    extension: ExtensionView | None = None

    @property
    def summary(self) -> PlanSummary:
        return self.plan.summary

    @property
    def short_hash(self) -> str:
        return short_hash(self.plan_hash)

    @property
    def approvals_missing(self) -> int:
        return max(0, self.approvals_required - self.approvals_counted)

    @property
    def approvers(self) -> tuple[str, ...]:
        """Who approved the current plan, in order."""
        return tuple(a.approver for a in self.approvals if a.counts)

    @property
    def denial(self) -> ApprovalView | None:
        denies = [a for a in self.approvals if a.decision == "deny"]
        return denies[-1] if denies else None

    def is_expired(self, now: dt.datetime) -> bool:
        return self.state == "expired" or (self.state == "pending" and self.expires_at <= now)
