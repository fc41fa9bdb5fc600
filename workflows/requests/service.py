"""Requests and their approvals: submit, approve, deny, cancel, re-plan (also of a
drain's window end, `extend_window`), expire, and mark a missed window (`mark_missed`).
A running drain's later window end (`extend_running`) waits as a pending extension on
its own plan hash, approved by the same rules (`policy.as_extension`), applied to the
run's holds when the count is reached (`workflows.requests.extension`), and lapses at
its deadline (`expire_due`, or an approval that comes too late).

`RequestService` applies `workflows.requests.policy` to what storage holds and records each
outcome. Every state change writes, in ONE transaction:

- the request's transition, as a storage compare-and-set (`expected=` state, or the
  expected plan hash for a re-plan);
- the approver's decision row, if there is one;
- an audit row (actor = Slack user id, or `gpuops` for expiry; `k8s_identity` is None,
  because nothing here touches the cluster; target = the pool; before/after = states);
- an outbox message for the request's thread, if the request has a channel.

Why this is safe under concurrency: `Database.transaction()` begins with `BEGIN
IMMEDIATE`, so the request and its approvals are read under the write lock and the
policy decides on rows no one else can change before commit; two approvals arriving at
once are counted one after the other, never both against the same count, and an
approval racing a deny finds the request already decided. The compare-and-set on the
transition is a second, independent guard: if it ever loses, the whole transaction is
rolled back and the caller is told the request changed meanwhile.

A change freeze on the pool (or the cluster) refuses `submit`, read under the same write
lock (workflows.pools.freezes); requests filed before it are left as they are.

Expiry is applied by `expire_due(now)` (the scheduler's sweep) and lazily whenever an
action touches a pending request whose deadline has passed: the expiry is committed,
then the action is refused saying when it expired.

Outbox payloads are JSON objects with `event` (the audit action), `request_id`, `pool`,
`kind`, `state` and `text` (a sentence from `workflows.requests.messages`). They are
posted to the request's channel and thread; messages queued before the thread exists
carry `thread_ts` None and the notifier may look the thread up by `request_id`.

Refusals raise `RequestRefused` whose message is shown to the user verbatim; refusals
about roles raise `RequestAccessDenied`, which is also an `access.AccessDenied`. An id
that names no request raises `UnknownRequest` with the closest ids. Programming errors
(a plan for another pool, a naive datetime) raise `ValueError`.
"""

from __future__ import annotations

import datetime as dt
import difflib
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from storage import approvals as stored_approvals
from storage import audit, codec, outbox
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage.approvals import Approval, Decision
from storage.database import Database
from storage.ids import RequestId
from storage.requests import Request, RequestKind, RequestState
from workflows.access import AccessDenied, Actor, Role, public_name
from workflows.plans import Plan, PlanSummary, plan_from_json, plan_hash, plan_to_json, short_hash
from workflows.pools import freezes
from workflows.pools import messages as pool_say
from workflows.pools.config import PoolConfig
from workflows.requests import messages as say
from workflows.requests import policy
from workflows.requests.extension import RunningHold, extend_holds, running_hold
from workflows.requests.policy import ApproverNow, Refusal, RefusalCode

# How many open requests the list views read at most.
LIST_LIMIT = 500

# A continuation in these states has continued its halted run (open, or run already).
CONTINUED_STATES: tuple[RequestState, ...] = ("pending", "approved", "scheduled", "running", "done", "failed")
# The step param that marks a plan as continuing a halted run (`/gpu continue`).
CONTINUES = "continues"


def continues(plan: Plan) -> str | None:
    """The halted run `plan` continues (its steps carry the mark), if it is a continuation."""
    return next((str(step.params[CONTINUES]) for wave in plan.waves for step in wave.steps
                 if step.params.get(CONTINUES)), None)

# Who a user is now, by user id: their roles from the configuration and, where the bot
# knows them, from their Slack user groups. Earlier approvals are re-checked against it
# every time they are counted (`policy` rule 2).
RoleLookup = Callable[[str], Actor]


# ------------------------------------------------------------------ errors


class RequestRefused(Exception):
    """The action was refused; `reason` is one sentence to show the user verbatim."""

    def __init__(self, reason: str, *, code: RefusalCode | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class RequestAccessDenied(RequestRefused, AccessDenied):
    """Refused because of who the actor is (a missing role, not the requester)."""


class UnknownRequest(RequestRefused):
    """No request has this id; `closest` are ids that look like it."""

    def __init__(self, request_id: str, *, closest: Sequence[str]) -> None:
        super().__init__(say.unknown_request(request_id, closest=closest),
                         code=RefusalCode.UNKNOWN_REQUEST)
        self.request_id = request_id
        self.closest = tuple(closest)


def _refused(refusal: Refusal) -> RequestRefused:
    if refusal.code in policy.ROLE_REFUSALS:
        return RequestAccessDenied(refusal.reason, code=refusal.code)
    return RequestRefused(refusal.reason, code=refusal.code)


class _ChangedMeanwhile(RequestRefused):
    def __init__(self, request_id: str) -> None:
        super().__init__(say.changed_meanwhile(request_id), code=RefusalCode.CHANGED_MEANWHILE)


# ------------------------------------------------------------------ views


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


# ------------------------------------------------------------------ the service


def _wakes_when_approved(method: Callable[..., RequestView]) -> Callable[..., RequestView]:
    """After the transaction: a request that is now approved may be due to run (its
    window open already), so whoever starts runs hears of it at once."""

    @functools.wraps(method)
    def wrapper(self: RequestService, *args: Any, **kwargs: Any) -> RequestView:
        view = method(self, *args, **kwargs)
        if view.state == "approved" and self._on_approved is not None:
            self._on_approved()
        return view

    return wrapper


class RequestSettings(Protocol):
    """What the request service reads of the configuration (`workflows.config.GpuopsConfig`,
    which sits above every package and is imported by none)."""

    @property
    def pools(self) -> Mapping[str, PoolConfig]: ...

    @property
    def names(self) -> Mapping[str, str]: ...

    @property
    def cluster_name(self) -> str | None: ...

    def actor(self, user_id: str) -> Actor: ...


class RequestService:
    """Requests on one database connection (one per thread, see `storage.database`).
    `on_approved` is called after any change that leaves a request approved."""

    def __init__(self, db: Database, config: RequestSettings, *, roles: RoleLookup | None = None,
                 on_approved: Callable[[], None] | None = None) -> None:
        self._db = db
        self._config = config
        self._roles: RoleLookup = roles or (lambda user_id: config.actor(user_id))
        self._on_approved = on_approved

    # -------------------------------------------------------------- actions

    @_wakes_when_approved
    def submit(
        self,
        actor: Actor,
        *,
        kind: RequestKind,
        pool: str,
        targets: Sequence[str],
        plan: Plan,
        window_start: dt.datetime | None,
        window_end: dt.datetime | None,
        reason: str,
        channel: str | None = None,
        now: dt.datetime,
    ) -> RequestView:
        """Store a request bound to `plan`. It waits for the pool's approvals until
        `now + request_ttl`, or is approved at once if the pool needs none."""
        verdict = policy.check_submit(actor=actor, kind=kind, pool=pool, reason=reason,
                                      pools=self._config.pools)
        if verdict.refusal is not None:
            raise _refused(verdict.refusal)
        _check_plan_fits(plan, kind=kind, pool=pool, created_for=actor.user_id,
                         window_start=window_start, window_end=window_end)
        pool_policy = self._config.pools[pool]
        required = pool_policy.approvals_required(kind)
        digest = plan_hash(plan)
        expires_at = now + pool_policy.request_ttl
        with self._db.transaction():
            # A change freeze refuses new requests; read under the write lock, so a freeze
            # committed a moment before is seen (workflows.pools.freezes).
            freeze = freezes.holding_requests(self._db, pool=pool, now=now, cluster=self._config.cluster_name)
            if freeze is not None:
                raise RequestRefused(pool_say.frozen_refuses_request(
                    kind=kind, pool=pool, target=freeze.target, by=freeze.set_by_name, until=freeze.until,
                    reason=freeze.reason, cluster=freeze.cluster), code=RefusalCode.FROZEN)
            row = stored_requests.create(
                self._db,
                kind=kind,
                pool=pool,
                targets=list(targets),
                window_start=window_start,
                window_end=window_end,
                reason=reason.strip(),
                requester=actor.user_id,
                requester_name=self._public(actor),
                plan=plan_to_json(plan),
                plan_hash=digest,
                approvals_required=required,
                expires_at=expires_at,
                at=now,
                channel=channel,
                cluster=self._config.cluster_name,
            )
            self._audit(row, actor=actor.user_id, action="request.created", before=None,
                        after="pending", now=now,
                        detail={"kind": kind, "plan_hash": digest, "approvals_required": required,
                                **({"cluster": row.cluster} if row.cluster else {}),
                                "targets": list(targets), "reason": row.reason,
                                "window_start": _time(window_start),
                                "window_end": _time(window_end), "expires_at": _time(expires_at)})
            self._notify(row, event="request.created", state=policy.state_at_creation(required),
                         now=now, dedupe="created",
                         text=say.thread_created(
                             request_id=row.id, requester_name=self._public(actor), kind=kind, pool=pool,
                             nodes=len(plan.nodes), waves=len(plan.waves), reason=row.reason,
                             plan_hash=digest, approvals_required=required, expires_at=expires_at))
            if policy.state_at_creation(required) == "approved":
                self._transition(row, expected="pending", new="approved", now=now)
                self._audit(row, actor=audit.GPUOPS_ACTOR, action="request.approved",
                            before="pending", after="approved", now=now,
                            detail={"plan_hash": digest, "approvals_required": 0,
                                    "why": "pool policy needs no approval"})
            return self._view(self._load(row.id))

    @_wakes_when_approved
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
                approver_now=approver_now, names=self._names)
            if decision.refusal is None and extending:
                return self._approve_extension(actor, request, decision, approver_now=approver_now, now=now)
            if decision.refusal is not None and extending and decision.refusal.code == RefusalCode.EXPIRED:
                self._lapse_extension(request, now=now)  # committed; the refusal says it lapsed
            if decision.refusal is None:
                recorded = stored_approvals.record(
                    self._db, request_id=request.id, approver=actor.user_id,
                    decision="approve", plan_hash=request.plan_hash, at=now)
                if recorded is None:
                    raise _ChangedMeanwhile(request.id)
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
        raise _refused(decision.refusal)

    def deny(self, actor: Actor, request_id: str, *, reason: str, now: dt.datetime) -> RequestView:
        """End a pending request: an approver (not the requester) says no, and why."""
        with self._db.transaction():
            request = self._touch(request_id, now=now)
            decisions = self._decisions(request)
            verdict = policy.check_deny(request=request, approvals_so_far=decisions,
                                        approver=actor, reason=reason, now=now,
                                        names=self._names)
            if verdict.refusal is None:
                why = reason.strip()
                recorded = stored_approvals.record(
                    self._db, request_id=request.id, approver=actor.user_id, decision="deny",
                    plan_hash=request.plan_hash, reason=why, at=now,
                ) or stored_approvals.change_to_deny(
                    self._db, request_id=request.id, approver=actor.user_id,
                    plan_hash=request.plan_hash, reason=why, at=now)
                if recorded is None:
                    raise _ChangedMeanwhile(request.id)
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
        raise _refused(verdict.refusal)

    def check_may_deny(self, actor: Actor, request_id: str, *, now: dt.datetime) -> None:
        """Raise the refusal `deny` would give `actor` now, whatever reason they type;
        return if they may deny. Asked when Deny is pressed, before the reason form opens,
        so someone who may not decide hears it at the click. Reads only: a request past its
        deadline is refused as expired here and expired by the next action that writes."""
        request = self._load(request_id)
        verdict = policy.check_deny(request=request, approvals_so_far=self._decisions(request), approver=actor,
                                    reason="(asked before the reason form)", now=now, names=self._names)
        if verdict.refusal is not None:
            raise _refused(verdict.refusal)

    def cancel(self, actor: Actor, request_id: str, *, now: dt.datetime) -> RequestView:
        """Withdraw a request before it runs (the requester or an admin)."""
        with self._db.transaction():
            request = self._touch(request_id, now=now)
            verdict = policy.check_cancel(request=request, actor=actor, now=now,
                                          approvals_so_far=self._decisions(request),
                                          names=self._names)
            if verdict.refusal is None:
                self._transition(request, expected=policy.CANCELLABLE_STATES, new="cancelled",
                                 now=now)
                self._audit(request, actor=actor.user_id, action="request.cancelled",
                            before=request.state, after="cancelled", now=now,
                            detail={"plan_hash": request.plan_hash})
                self._notify(request, event="request.cancelled", state="cancelled", now=now,
                             dedupe="cancelled", people=(actor.user_id,),
                             text=say.thread_cancelled(request_id=request.id, actor=self._public(actor)))
                return self._view(self._load(request.id))
        assert verdict.refusal is not None
        raise _refused(verdict.refusal)

    def replan(
        self, request_id: str, new_plan: Plan, *, now: dt.datetime, actor: Actor
    ) -> RequestView:
        """Bind a pending request to a new plan. Approvals given so far were for the old
        plan's hash, so they stop counting; approvers must review the new plan. A plan
        equal to the current one changes nothing."""
        with self._db.transaction():
            request = self._touch(request_id, now=now)
            decisions = self._decisions(request)
            verdict = policy.check_replan(request=request, actor=actor, now=now,
                                          approvals_so_far=decisions, names=self._names)
            if verdict.refusal is None:
                _check_plan_fits(new_plan, kind=request.kind, pool=request.pool,
                                 created_for=request.requester,
                                 window_start=request.window_start, window_end=request.window_end)
                digest = plan_hash(new_plan)
                if digest == request.plan_hash:
                    return self._view(request)
                replaced = stored_requests.replace_plan(
                    self._db, id=request.id, expected_plan_hash=request.plan_hash,
                    plan=plan_to_json(new_plan), plan_hash=digest, at=now)
                if not replaced:
                    raise _ChangedMeanwhile(request.id)
                voided = len(policy.counted_approvers(request, decisions,
                                                      approver_now=self._approver_now(request)))
                self._audit(request, actor=actor.user_id, action="request.replanned",
                            before="pending", after="pending", now=now,
                            detail={"old_plan_hash": request.plan_hash, "new_plan_hash": digest,
                                    "approvals_voided": voided})
                self._notify(request, event="request.replanned", state="pending", now=now,
                             dedupe=f"replanned/{digest}", people=(actor.user_id,),
                             text=say.thread_replanned(request_id=request.id, actor=self._public(actor),
                                                       plan_hash=digest, voided=voided))
                return self._view(self._load(request.id))
        assert verdict.refusal is not None
        raise _refused(verdict.refusal)

    @_wakes_when_approved
    def extend_window(
        self, actor: Actor, request_id: str, new_plan: Plan, *, window_end: dt.datetime | None,
        now: dt.datetime,
    ) -> RequestView:
        """A re-plan of the window end: the request is bound to `new_plan` (built for the
        longer window) and is pending again, so the pool's approvals apply anew. Only
        before it runs, by the requester or an admin."""
        with self._db.transaction():
            request = self._touch(request_id, now=now)
            if request.state not in ("pending", "approved", "scheduled"):
                raise RequestRefused(say.not_extendable(request.id, state=request.state))
            if not policy.may_act_for_requester(request, actor):
                raise RequestAccessDenied(
                    say.not_requester_or_admin(request.id, requester_name=self._requester(request),
                                               verb="extend"),
                    code=RefusalCode.NOT_REQUESTER_OR_ADMIN)
            _check_plan_fits(new_plan, kind=request.kind, pool=request.pool,
                             created_for=request.requester,
                             window_start=request.window_start, window_end=window_end)
            digest = plan_hash(new_plan)
            decisions = self._decisions(request)
            voided = len(policy.counted_approvers(request, decisions,
                                                  approver_now=self._approver_now(request)))
            pool_policy = self._config.pools[request.pool]
            if not stored_requests.replace_window_end(
                    self._db, id=request.id, expected_plan_hash=request.plan_hash,
                    plan=plan_to_json(new_plan), plan_hash=digest, window_end=window_end,
                    expires_at=now + pool_policy.request_ttl, at=now):
                raise _ChangedMeanwhile(request.id)
            self._audit(request, actor=actor.user_id, action="request.replanned",
                        before=request.state, after="pending", now=now,
                        detail={"old_plan_hash": request.plan_hash, "new_plan_hash": digest,
                                "approvals_voided": voided,
                                "old_window_end": _time(request.window_end),
                                "window_end": _time(window_end)})
            required = policy.approvals_required(request, pool_policy)
            self._notify(request, event="request.replanned", state=policy.state_at_creation(required), now=now,
                         dedupe=f"extended/{digest}", people=(actor.user_id,),
                         text=say.thread_extended(request_id=request.id, actor=self._public(actor),
                                                  window_end=window_end, plan_hash=digest,
                                                  voided=voided))
            if policy.state_at_creation(required) == "approved":
                # A pool that needs no approval for this kind approves the new plan at
                # once, as it did the first one: nobody is asked to approve "0 of 0".
                extended = self._load(request.id)
                self._transition(extended, expected="pending", new="approved", now=now)
                self._audit(extended, actor=audit.GPUOPS_ACTOR, action="request.approved",
                            before="pending", after="approved", now=now,
                            detail={"plan_hash": digest, "approvals_required": 0,
                                    "why": "pool policy needs no approval"})
            return self._view(self._load(request.id))

    def extend_running(
        self, actor: Actor, request_id: str, new_plan: Plan, *, window_end: dt.datetime, now: dt.datetime,
    ) -> RequestView:
        """A later window end for a running drain whose run still holds its nodes, bound
        to `new_plan` (the same waves, the later end: `DrainService.extend` checked the
        pool's windows and capacity). The requester or an admin asks; it is stored as
        pending on the request with its plan hash (a new ask replaces one before), and
        approved like a request: the pool's number of distinct approvers holding the role,
        never the requester, on that hash, before it lapses at the current window end (or
        the pool's request_ttl, if sooner). Meanwhile the run keeps holding to the current
        end. A pool that needs no approval for drains gets it at once. Applied, the
        request's window end and plan are replaced (it stays running) and the run's hold
        steps get the control (`workflows.requests.extension`)."""
        with self._db.transaction():
            request = self._touch(request_id, now=now)
            if request.state != "running":
                raise RequestRefused(say.not_extendable(request.id, state=request.state))
            if not policy.may_act_for_requester(request, actor):
                raise RequestAccessDenied(
                    say.not_requester_or_admin(request.id, requester_name=request.requester_name, verb="extend"),
                    code=RefusalCode.NOT_REQUESTER_OR_ADMIN)
            if request.window_end is None:
                raise RequestRefused(say.extend_open_ended(request.id), code=RefusalCode.NOT_HOLDING)
            if window_end <= request.window_end:
                raise RequestRefused(say.extend_not_later(request.id, window_end=request.window_end))
            hold = running_hold(self._db, request)
            if hold.refusal is not None:
                raise RequestRefused(hold.refusal, code=RefusalCode.NOT_HOLDING)
            _check_plan_fits(new_plan, kind=request.kind, pool=request.pool, created_for=request.requester,
                             window_start=request.window_start, window_end=window_end)
            digest = plan_hash(new_plan)
            pool_policy = self._config.pools[request.pool]
            required = policy.approvals_required(request, pool_policy)
            expires_at = min(now + pool_policy.request_ttl, request.window_end)
            if not stored_requests.ask_extension(
                    self._db, id=request.id, expected_plan_hash=request.plan_hash, window_end=window_end,
                    plan=plan_to_json(new_plan), plan_hash=digest, asked_by=actor.user_id,
                    expires_at=expires_at, at=now):
                raise _ChangedMeanwhile(request.id)
            self._audit(request, actor=actor.user_id, action="request.extension_asked", before="running",
                        after="running", now=now,
                        detail={"old_window_end": _time(request.window_end), "window_end": _time(window_end),
                                "plan_hash": digest, "approvals_required": required,
                                "expires_at": _time(expires_at)})
            asked = self._load(request.id)
            if required == 0:
                self._apply_extension(asked, hold, actor=actor.user_id, approvers=(), now=now)
            else:
                self._notify(request, event="request.extension_asked", state="running", now=now,
                             dedupe=f"extension/{digest}", people=(actor.user_id,),
                             text=say.thread_extension_asked(request_id=request.id, actor=self._public(actor),
                                                             window_end=request.window_end, extended_to=window_end,
                                                             plan_hash=digest, required=required))
            return self._view(self._load(request.id))

    def running_hold(self, request_id: str) -> RunningHold:
        """What the request's run holds now (a read; `extend_running` reads it again under
        the write lock)."""
        return running_hold(self._db, self._load(request_id))

    def mark_missed(self, request_id: str, *, now: dt.datetime) -> RequestView:
        """An approved request whose window passed before gpuops could start it: it is
        `missed`, never started late, and the requester is told in its thread."""
        with self._db.transaction():
            request = self._load(request_id)
            self._transition(request, expected=frozenset({"approved", "scheduled"}), new="missed",
                             now=now)
            self._audit(request, actor=audit.GPUOPS_ACTOR, action="request.missed",
                        before=request.state, after="missed", now=now,
                        detail={"window_start": _time(request.window_start),
                                "window_end": _time(request.window_end),
                                "plan_hash": request.plan_hash})
            self._notify(request, event="request.missed", state="missed", now=now, dedupe="missed",
                         text=say.thread_missed(request_id=request.id,
                                                requester_name=self._requester(request),
                                                window_start=request.window_start,
                                                window_end=request.window_end, now=now))
            return self._view(self._load(request.id))

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

    # -------------------------------------------------------------- reading

    def get(self, request_id: str) -> RequestView:
        """The request as stored (a read: a pending request past its deadline still says
        `pending` until it is touched or swept; `RequestView.is_expired(now)` tells)."""
        return self._view(self._load(request_id))

    def open_requests(self, pool: str | None = None, *, every_cluster: bool = False) -> list[RequestView]:
        """This cluster's requests not finished yet (pending, approved, scheduled,
        running), newest first; with `every_cluster`, every cluster's (several clusters)."""
        rows = stored_requests.in_states(self._db, states=policy.OPEN_STATES, pool=pool,
                                         limit=LIST_LIMIT, cluster=None if every_cluster else self._cluster())
        return [self._view(r) for r in rows]

    def runs_ending(self, pool: str) -> dict[str, dt.datetime | None]:
        """The pool's running requests' runs, each with when its window ends (None: held
        until `drain done` or with no end): when the nodes they hold come back."""
        ends: dict[str, dt.datetime | None] = {}
        for request in stored_requests.in_states(self._db, states=["running"], pool=pool, limit=LIST_LIMIT,
                                                 cluster=self._cluster()):
            for run in stored_runs.for_request(self._db, request_id=request.id):
                if not run.finished:
                    ends[str(run.id)] = request.window_end
        return ends

    def rollback_asked(self, run_id: str, *, pool: str) -> RequestView | None:
        """The open request that rolls back `run_id` (its cordons take over that run's), if any."""
        return next((view for view in self.open_requests(pool) if continues(view.plan) is None and any(
            step.kind == "cordon" and step.params.get("takes_over") == run_id
            for wave in view.plan.waves for step in wave.steps)), None)

    def continuation_of(self, run_id: str, *, pool: str) -> RequestView | None:
        """The request that continues the halted run `run_id` (`/gpu continue`), open or
        run already (done, or failed: then its own run is the one to continue), if any."""
        rows = stored_requests.in_states(self._db, states=CONTINUED_STATES, pool=pool, limit=LIST_LIMIT,
                                         cluster=self._cluster())
        return next((self._view(r) for r in rows if continues(plan_from_json(r.plan)) == run_id),
                    None)

    def rollback_blocked(self, run_id: str, *, state: str, pool: str) -> tuple[str, str] | None:
        """Why `run_id` cannot be rolled back now, as (code, reason): it has not finished,
        a rollback of it is already asked for, or a continuation of it is open; None when
        it can."""
        if state in ("pending", "running", "paused"):
            return "run-unfinished", say.rollback_unfinished(run_id, state)
        asked = self.rollback_asked(run_id, pool=pool)
        if asked is not None:
            return "rollback-asked", say.rollback_already_asked(run_id, asked.id)
        continuing = self.continuation_of(run_id, pool=pool)
        if continuing is not None and continuing.state in policy.OPEN_STATES:
            return "continuation-open", say.rollback_while_continued(run_id, continuing.id)
        return None

    def waiting_for(self, actor: Actor, *, now: dt.datetime) -> list[RequestView]:
        """Pending requests `actor` could approve now (their approval would count),
        soonest deadline first."""
        waiting: list[RequestView] = []
        for request in stored_requests.in_states(self._db, states=["pending"], limit=LIST_LIMIT,
                                                 cluster=self._cluster()):
            decision = policy.check_approval(
                request=request, approvals_so_far=self._decisions(request), approver=actor,
                plan_hash=request.plan_hash, pool_policy=self._pool(request), now=now,
                approver_now=self._approver_now(request))
            if decision.counted:
                waiting.append(self._view(request))
        return sorted(waiting, key=lambda v: (v.expires_at, v.created_at, v.id))

    # -------------------------------------------------------------- privately

    @property
    def _names(self) -> Mapping[str, str]:
        return self._config.names

    def _public(self, actor: Actor) -> str:
        return public_name(actor.user_id, names=self._names, fallback=actor.name)

    def _requester(self, request: Request) -> str:
        """The requester as anyone else reads them: the configured name or a mention
        (a row stored before names were kept this way holds a Slack display name)."""
        return public_name(request.requester, names=self._names, fallback=request.requester_name)

    def _approver_now(self, request: Request) -> ApproverNow:
        """Whether a user holds the approver role for the request's pool now; each user
        is looked up once per call of the service."""
        known: dict[str, bool] = {}

        def approver_now(user_id: str) -> bool:
            if user_id not in known:
                known[user_id] = self._roles(user_id).has(Role.APPROVER, pool=request.pool)
            return known[user_id]

        return approver_now

    def approvers_looked_up(self, request_id: str) -> ApproverNow:
        """Who holds the approver role for the request's pool now, everyone who decided on
        it looked up already (call it before a transaction: a lookup may ask Slack)."""
        return self._approvers_looked_up(request_id)

    def approvals_required_now(self, request: Request) -> int:
        """What `request` needs now: the stricter of its recorded number and its pool's
        rule as configured now (a tightened rule applies to requests in flight)."""
        return policy.approvals_required(request, self._pool(request))

    def reopen_for_approval(self, request: Request, *, counted: Sequence[str], required: int,
                            now: dt.datetime) -> None:
        """An approved request whose approvals no longer suffice (an approver lost the
        role, the pool's rule asks for more) goes back to pending, inside the caller's
        transaction: audited, and the thread says why and who must approve."""
        if not stored_requests.transition(self._db, id=request.id, expected=request.state, new="pending", at=now):
            raise _ChangedMeanwhile(request.id)
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

    def _approvers_looked_up(self, request_id: str) -> ApproverNow:
        """`_approver_now` with everyone who decided so far already looked up, before the
        write lock is taken: a lookup may ask Slack for a user group's members."""
        request = stored_requests.get(self._db, id=RequestId(request_id))
        if request is None:
            return lambda _user_id: False  # the transaction says there is no such request
        approver_now = self._approver_now(request)
        for decision in self._decisions(request):
            approver_now(decision.approver)
        return approver_now

    def _pool(self, request: Request) -> PoolConfig | None:
        return self._config.pools.get(request.pool)

    def _cluster(self) -> tuple[str | None]:
        """The cluster whose requests this service lists (its configuration's)."""
        return (self._config.cluster_name,)

    def _load(self, request_id: str) -> Request:
        request = stored_requests.get(self._db, id=RequestId(request_id))
        if request is None:
            known = stored_requests.known_ids(self._db)
            closest = difflib.get_close_matches(request_id, known, n=3, cutoff=0.6)
            raise UnknownRequest(request_id, closest=closest)
        return request

    def _touch(self, request_id: str, *, now: dt.datetime) -> Request:
        """Load the request for an action, expiring it first if its deadline has come."""
        request = self._load(request_id)
        if request.state == "pending" and policy.is_expired(request, now=now):
            request = self._expire(request, now=now)
        return request

    def _decisions(self, request: Request) -> list[Approval]:
        return stored_approvals.for_request(self._db, request_id=request.id)

    def _expire(self, request: Request, *, now: dt.datetime) -> Request:
        decisions = self._decisions(request)
        counted = len(policy.counted_approvers(request, decisions, approver_now=self._approver_now(request)))
        required = policy.approvals_required(request, self._pool(request))
        self._transition(request, expected="pending", new="expired", now=now)
        self._audit(request, actor=audit.GPUOPS_ACTOR, action="request.expired",
                    before="pending", after="expired", now=now,
                    detail={"expires_at": _time(request.expires_at), "plan_hash": request.plan_hash,
                            "approvals_counted": counted, "approvals_required": required})
        self._notify(request, event="request.expired", state="expired", now=now, dedupe="expired",
                     text=say.thread_expired(request_id=request.id, expires_at=request.expires_at,
                                             counted=counted, required=required))
        return self._load(request.id)

    def _approve_extension(self, actor: Actor, request: Request, decision: policy.ApprovalDecision, *,
                           approver_now: ApproverNow, now: dt.datetime) -> RequestView:
        """Record `actor`'s counted approval of the pending extension; apply it when the
        count is reached (refused, changing nothing, if the run no longer holds then)."""
        extension = request.extension
        assert extension is not None
        if stored_approvals.record(self._db, request_id=request.id, approver=actor.user_id, decision="approve",
                                   plan_hash=extension.plan_hash, at=now) is None:
            raise _ChangedMeanwhile(request.id)
        if decision.fully_approved:
            approvers = policy.counted_approvers(policy.as_extension(request), self._decisions(request),
                                                 approver_now=approver_now)
            self._apply_extension(request, running_hold(self._db, request), actor=actor.user_id,
                                  approvers=approvers, now=now)
        else:
            self._audit(request, actor=actor.user_id, action="request.extension_approval", before="running",
                        after="running", now=now,
                        detail={"plan_hash": extension.plan_hash, "window_end": _time(extension.window_end),
                                "approvals_counted": decision.approvals_counted,
                                "approvals_required": decision.approvals_required})
            self._notify(request, event="request.extension_approval", state="running", now=now,
                         dedupe=f"approval/{actor.user_id}/{extension.plan_hash}", people=(actor.user_id,),
                         text=say.thread_extension_approval(
                             request_id=request.id, approver=self._public(actor), extended_to=extension.window_end,
                             counted=decision.approvals_counted, required=decision.approvals_required))
        return self._view(self._load(request.id))

    def _apply_extension(self, request: Request, hold: RunningHold, *, actor: str, approvers: Sequence[str],
                         now: dt.datetime) -> None:
        """The pending extension becomes the request's window end and plan, the run's hold
        steps take the later end, audited (`request.extended`) and told in the thread."""
        extension = request.extension
        assert extension is not None and request.window_end is not None
        if hold.refusal is not None:
            raise RequestRefused(hold.refusal, code=RefusalCode.NOT_HOLDING)
        if not stored_requests.apply_extension(self._db, id=request.id, expected_extension_hash=extension.plan_hash,
                                               at=now):
            raise _ChangedMeanwhile(request.id)
        nodes = extend_holds(self._db, hold, until=extension.window_end, by=actor, at=now)
        self._audit(request, actor=actor, action="request.extended", before="running", after="running", now=now,
                    detail={"old_window_end": _time(request.window_end), "window_end": _time(extension.window_end),
                            "old_plan_hash": request.plan_hash, "plan_hash": extension.plan_hash,
                            "asked_by": extension.asked_by, "approvers": list(approvers),
                            "run_id": hold.run_id, "nodes": nodes})
        self._notify(request, event="request.extended", state="running", now=now,
                     dedupe=f"extended-running/{extension.plan_hash}", people=(extension.asked_by, *approvers),
                     text=say.thread_extended_running(
                         request_id=request.id, window_end=request.window_end, extended_to=extension.window_end,
                         approvers=[public_name(a, names=self._names, fallback=a) for a in approvers]))

    def _lapse_extension(self, request: Request, *, now: dt.datetime) -> Request:
        """The pending extension's deadline came before enough approvals: it is dropped,
        audited and told; the drain's window end stays as it was."""
        extension = request.extension
        assert extension is not None
        counted = len(policy.counted_approvers(policy.as_extension(request), self._decisions(request),
                                               approver_now=self._approver_now(request)))
        if not stored_requests.drop_extension(self._db, id=request.id, expected_extension_hash=extension.plan_hash,
                                              at=now):
            raise _ChangedMeanwhile(request.id)
        window_end = request.window_end or extension.expires_at
        self._audit(request, actor=audit.GPUOPS_ACTOR, action="request.extension_lapsed", before=request.state,
                    after=request.state, now=now,
                    detail={"window_end": _time(request.window_end), "extended_to": _time(extension.window_end),
                            "plan_hash": extension.plan_hash, "approvals_counted": counted,
                            "approvals_required": policy.approvals_required(request, self._pool(request))})
        self._notify(request, event="request.extension_lapsed", state=request.state, now=now,
                     dedupe=f"extension-lapsed/{extension.plan_hash}",
                     text=say.extension_lapsed(request.id, window_end=window_end, extended_to=extension.window_end))
        return self._load(request.id)

    def _transition(
        self, request: Request, *, expected: RequestState | frozenset[RequestState],
        new: RequestState, now: dt.datetime,
    ) -> None:
        if not stored_requests.transition(self._db, id=request.id, expected=expected, new=new,
                                          at=now):
            raise _ChangedMeanwhile(request.id)

    def _audit(
        self, request: Request, *, actor: str, action: str, before: str | None, after: str,
        now: dt.datetime, detail: dict[str, Any],
    ) -> None:
        audit.append(self._db, actor=actor, k8s_identity=None, action=action, target=request.pool,
                     at=now, request_id=request.id, before=before, after=after, detail=detail)

    def _notify(
        self, request: Request, *, event: str, state: str, text: str, now: dt.datetime,
        dedupe: str, people: Sequence[str] = (),
    ) -> None:
        if request.channel is None:
            return
        outbox.enqueue(
            self._db, channel=request.channel, thread_ts=request.thread_ts, kind="post", at=now,
            dedupe_key=f"{request.id}/{dedupe}",
            payload={"event": event, "request_id": request.id, "pool": request.pool,
                     "kind": request.kind, "state": state, "text": text,
                     # Whose `<@…>` in the text is a mention gpuops wrote (the notifier
                     # escapes all other markup).
                     "people": sorted({request.requester, *people})})

    def _view(self, request: Request) -> RequestView:
        decisions = self._decisions(request)
        counting = set(policy.counted_approvers(request, decisions, approver_now=self._approver_now(request)))
        extension = self._extension_view(request, decisions)
        return RequestView(
            id=request.id,
            kind=request.kind,
            pool=request.pool,
            state=request.state,
            requester=request.requester,
            requester_name=self._requester(request),
            reason=request.reason,
            targets=request.targets,
            window_start=request.window_start,
            window_end=request.window_end,
            plan=plan_from_json(request.plan),
            plan_hash=request.plan_hash,
            approvals=tuple(
                ApprovalView(
                    approver=d.approver,
                    approver_name=public_name(d.approver, names=self._names),
                    decision=d.decision,
                    plan_hash=d.plan_hash,
                    counts=d.decision == "approve" and (
                        (d.approver in counting and d.plan_hash == request.plan_hash)
                        # an approval of the pending extension counts towards it
                        or (extension is not None and d.plan_hash == extension.plan_hash
                            and d.approver in extension.approvers)),
                    reason=d.reason,
                    at=d.created_at,
                )
                for d in decisions
            ),
            approvals_required=policy.approvals_required(request, self._pool(request)),
            approvals_counted=len(counting),
            expires_at=request.expires_at,
            created_at=request.created_at,
            updated_at=request.updated_at,
            cluster=request.cluster,
            channel=request.channel,
            thread_ts=request.thread_ts,
            extension=extension,
        )

    def _extension_view(self, request: Request, decisions: Sequence[Approval]) -> ExtensionView | None:
        extension = request.extension
        if extension is None:
            return None
        approvers = policy.counted_approvers(policy.as_extension(request), decisions,
                                             approver_now=self._approver_now(request))
        return ExtensionView(window_end=extension.window_end, plan_hash=extension.plan_hash,
                             asked_by=extension.asked_by, asked_at=extension.asked_at,
                             expires_at=extension.expires_at, approvers=approvers)


def _check_plan_fits(
    plan: Plan, *, kind: str, pool: str, created_for: str,
    window_start: dt.datetime | None, window_end: dt.datetime | None,
) -> None:
    """A plan that disagrees with its request is a bug in the caller, not a refusal."""
    if plan.kind != kind or plan.pool != pool:
        raise ValueError(f"a {plan.kind} plan for pool {plan.pool} cannot back a {kind} "
                         f"request on pool {pool}")
    if plan.created_for != created_for:
        raise ValueError(f"the plan was built for {plan.created_for}, not {created_for}")
    if window_start is not None and window_end is not None and window_end <= window_start:
        raise ValueError("the request window must end after it starts")
    summary = plan.summary
    for name, ours, theirs in (("start", window_start, summary.window_start),
                               ("end", window_end, summary.window_end)):
        if theirs is not None and ours != theirs:
            raise ValueError(f"the plan's window {name} ({theirs}) differs from the request's "
                             f"({ours})")


def _time(at: dt.datetime | None) -> str | None:
    return codec.optional_time_to_text(at)
