"""Approvals and the two-person rule, as `workflows.requests.policy` decides them: approve
(a running drain's pending extension by the same rules), deny, the check before the
deny form opens, an approved request whose approvals no longer suffice sent back to
pending, what each person could approve now, and the sweep of approval deadlines."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from storage import approvals as stored_approvals
from storage import audit
from storage import requests as stored_requests
from storage.requests import Request, RequestState
from workflows.access import Actor, public_name
from workflows.requests import messages as say
from workflows.requests import policy
from workflows.requests.drain_extensions import DrainExtensions
from workflows.requests.errors import ChangedMeanwhile, refusal_error
from workflows.requests.policy import RefusalCode
from workflows.requests.records import LIST_LIMIT, wakes_when_approved
from workflows.requests.views import RequestView


class Approving(DrainExtensions):
    """Approve, deny, reopen, what waits for whom, expiry."""

    @wakes_when_approved
    def approve(
        self, actor: Actor, request_id: str, *, plan_hash: str, now: dt.datetime
    ) -> RequestView:
        """Count `actor`'s approval of the plan with `plan_hash` (the full hash or the
        short one they were shown); the request is approved when enough have counted.
        Earlier approvers count only if they still hold the approver role."""
        approver_now = self._approvers_looked_up(request_id)
        with self._db.transaction():
            request = self._touch(request_id, now=now)
            decisions = self._decisions(request)
            # A running drain's pending extension is approved by the same rules, on its hash.
            extending = request.state == "running" and request.extension is not None
            check = policy.check_extension_approval if extending else policy.check_approval
            decision = check(
                request=request, approvals_so_far=decisions, approver=actor,
                plan_hash=plan_hash, pool_policy=self._pool(request), now=now,
                approver_now=approver_now, names=self._names, zone=self._zone)
            if decision.refusal is None and extending:
                return self._approve_extension(actor, request, decision, approver_now=approver_now, now=now)
            if decision.refusal is not None and extending and decision.refusal.code == RefusalCode.EXPIRED:
                self._lapse_extension(request, now=now)  # committed; the refusal says it lapsed
            if decision.refusal is None:
                recorded = stored_approvals.record(
                    self._db, request_id=request.id, approver=actor.user_id,
                    decision="approve", plan_hash=request.plan_hash, at=now)
                if recorded is None:
                    raise ChangedMeanwhile(request.id)
                new: RequestState = "approved" if decision.fully_approved else "pending"
                self._transition(request, expected="pending", new=new, now=now)
                self._audit(
                    request, actor=actor.user_id,
                    action="request.approved" if decision.fully_approved else "request.approval",
                    before="pending", after=new, now=now,
                    detail={"plan_hash": request.plan_hash,
                            "approvals_counted": decision.approvals_counted,
                            "approvals_required": decision.approvals_required})
                self._notify(
                    request, event="request.approval", state=new, now=now,
                    dedupe=f"approval/{actor.user_id}/{request.plan_hash}", people=(actor.user_id,),
                    text=say.thread_approval(request_id=request.id, approver=self._public(actor),
                                             counted=decision.approvals_counted,
                                             required=decision.approvals_required))
                return self._view(self._load(request.id))
        assert decision.refusal is not None
        raise refusal_error(decision.refusal)

    def deny(self, actor: Actor, request_id: str, *, reason: str, now: dt.datetime) -> RequestView:
        """End a pending request: an approver (not the requester) says no, and why."""
        with self._db.transaction():
            request = self._touch(request_id, now=now)
            decisions = self._decisions(request)
            verdict = policy.check_deny(request=request, approvals_so_far=decisions,
                                        approver=actor, reason=reason, now=now,
                                        names=self._names, zone=self._zone)
            if verdict.refusal is None:
                why = reason.strip()
                recorded = stored_approvals.record(
                    self._db, request_id=request.id, approver=actor.user_id, decision="deny",
                    plan_hash=request.plan_hash, reason=why, at=now,
                ) or stored_approvals.change_to_deny(
                    self._db, request_id=request.id, approver=actor.user_id,
                    plan_hash=request.plan_hash, reason=why, at=now)
                if recorded is None:
                    raise ChangedMeanwhile(request.id)
                self._transition(request, expected="pending", new="denied", now=now)
                self._audit(request, actor=actor.user_id, action="request.denied",
                            before="pending", after="denied", now=now,
                            detail={"plan_hash": request.plan_hash, "reason": why})
                self._notify(request, event="request.denied", state="denied", now=now,
                             dedupe="denied", people=(actor.user_id,),
                             text=say.thread_denied(request_id=request.id, approver=self._public(actor),
                                                    reason=why))
                return self._view(self._load(request.id))
        assert verdict.refusal is not None
        raise refusal_error(verdict.refusal)

    def check_may_deny(self, actor: Actor, request_id: str, *, now: dt.datetime) -> None:
        """Raise the refusal `deny` would give `actor` now, whatever reason they type;
        return if they may deny. Asked when Deny is pressed, before the reason form opens,
        so someone who may not decide hears it at the click. Reads only: a request past its
        deadline is refused as expired here and expired by the next action that writes."""
        request = self._load(request_id)
        verdict = policy.check_deny(request=request, approvals_so_far=self._decisions(request), approver=actor,
                                    reason="(asked before the reason form)", now=now, names=self._names, zone=self._zone)
        if verdict.refusal is not None:
            raise refusal_error(verdict.refusal)

    def decisions_open_to(self, actor: Actor, request_id: str, *, now: dt.datetime) -> frozenset[str]:
        """Which of approve, deny and cancel `actor` may do on the request now, by the same
        rules those actions check (a reply only `actor` sees offers only these buttons).
        Reads only; a running drain's pending extension is approved, never denied."""
        request = self._load(request_id)
        decisions = self._decisions(request)
        extending = request.state == "running" and request.extension is not None
        check = policy.check_extension_approval if extending else policy.check_approval
        open_to: set[str] = set()
        if check(request=request, approvals_so_far=decisions, approver=actor,
                 plan_hash=(request.extension.plan_hash if extending and request.extension else request.plan_hash),
                 pool_policy=self._pool(request), now=now, approver_now=self._approver_now(request),
                 names=self._names, zone=self._zone).counted:
            open_to.add("approve")
        if not extending and policy.check_deny(request=request, approvals_so_far=decisions, approver=actor,
                                               reason="(asked for the buttons)", now=now,
                                               names=self._names, zone=self._zone).allowed:
            open_to.add("deny")
        if policy.check_cancel(request=request, actor=actor, now=now, approvals_so_far=decisions,
                               names=self._names).allowed:
            open_to.add("cancel")
        return frozenset(open_to)

    def reopen_for_approval(self, request: Request, *, counted: Sequence[str], required: int,
                            now: dt.datetime) -> None:
        """An approved request whose approvals no longer suffice (an approver lost the
        role, the pool's rule asks for more) goes back to pending, inside the caller's
        transaction: audited, and the thread says why and who must approve."""
        if not stored_requests.transition(self._db, id=request.id, expected=request.state, new="pending", at=now):
            raise ChangedMeanwhile(request.id)
        lost = [d.approver for d in self._decisions(request)
                if d.decision == "approve" and d.plan_hash == request.plan_hash and d.approver not in counted]
        lost = list(dict.fromkeys(lost))
        lost_names = [public_name(u, names=self._names) for u in lost]
        self._audit(request, actor=audit.GPUOPS_ACTOR, action="request.reopened", before=request.state,
                    after="pending", now=now,
                    detail={"plan_hash": request.plan_hash, "approvals_counted": len(counted),
                            "approvals_required": required, "no_longer_approvers": lost})
        self._notify(request, event="request.reopened", state="pending", now=now, people=lost,
                     dedupe=f"reopened/{request.plan_hash}/{len(counted)}/{required}",
                     text=say.thread_reopened(request_id=request.id, counted=len(counted), required=required,
                                              lost=lost_names, plan_hash=request.plan_hash))

    def waiting_for(self, actor: Actor, *, now: dt.datetime) -> list[RequestView]:
        """Pending requests `actor` could approve now (their approval would count),
        soonest deadline first."""
        waiting: list[RequestView] = []
        for request in stored_requests.in_states(self._db, states=["pending"], limit=LIST_LIMIT,
                                                 cluster=self._cluster()):
            decision = policy.check_approval(
                request=request, approvals_so_far=self._decisions(request), approver=actor,
                plan_hash=request.plan_hash, pool_policy=self._pool(request), now=now,
                approver_now=self._approver_now(request), zone=self._zone)
            if decision.counted:
                waiting.append(self._view(request))
        return sorted(waiting, key=lambda v: (v.expires_at, v.created_at, v.id))

    def expire_due(self, now: dt.datetime) -> list[RequestView]:
        """Expire every pending request whose approval deadline has come; the expired
        ones, oldest deadline first. Each expiry is its own transaction."""
        expired: list[RequestView] = []
        for due in stored_requests.pending_expired(self._db, now=now, cluster=self._config.cluster_name):
            with self._db.transaction():
                request = self._load(due.id)
                if request.state == "pending" and policy.is_expired(request, now=now):
                    expired.append(self._view(self._expire(request, now=now)))
        # A running drain's extension not approved before its deadline lapses (told, not returned).
        for due in stored_requests.extensions_lapsed(self._db, now=now, cluster=self._config.cluster_name):
            with self._db.transaction():
                request = self._load(due.id)
                if request.extension is not None and request.extension.expires_at <= now:
                    self._lapse_extension(request, now=now)
        return expired
