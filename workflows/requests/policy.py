"""The two-person rule, as pure functions over plain values.

Each check reads like kured's loop: a flat list of gates, and the first gate that does
not pass returns a `Refusal` whose `reason` is one precise sentence for the person who
tried (from `workflows.requests.messages`). Gates fail closed: an unknown pool, a missing
role or a hash that does not match refuses; nothing is let through by default.

An approval counts only if all hold:

1. the request is still `pending`, and its approval deadline (`expires_at`) is in the
   future (a pending request whose deadline has passed is expired, whether or not the
   sweep has marked it yet);
2. the approver holds the approver role for the request's pool (a global approver or
   admin, or an approver for that pool only), when they approve AND whenever the
   approvals are counted later: someone who lost the role (left the user group, was
   taken out of the configuration) no longer counts towards the request;
3. the approver is not the requester;
4. the approver approves the plan that is current now (by its hash, or a prefix of at
   least `SHORT_HASH_LENGTH` digits as shown to them): approvals are per plan hash, so a
   re-planned request needs fresh approvals;
5. the approver has not already approved this plan.

The request is fully approved when the distinct approvers of the current plan (never the
requester) reach the number required. That number is the larger of what the request
recorded at creation and what the pool's policy says now, so tightening the
configuration applies to requests in flight and loosening it approves nothing by itself.

No function here reads the clock or the database: time is `now`, and the caller passes
the request and its decisions (`storage.requests.Request`, `storage.approvals.Approval`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import enum
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from storage.approvals import Approval
from storage.requests import FINISHED_STATES, Request, RequestKind, RequestState
from workflows.access import Actor, Role, effective_roles, public_name
from workflows.plans import SHORT_HASH_LENGTH
from workflows.pools.config import PoolConfig
from workflows.requests import messages as say

# States a request can still be cancelled in (a running request needs an abort).
CANCELLABLE_STATES: frozenset[RequestState] = frozenset({"pending", "approved", "scheduled"})
# States a request is still "open" in: something may yet happen to the fleet.
OPEN_STATES: frozenset[RequestState] = frozenset({"pending", "approved", "scheduled", "running"})


class RefusalCode(enum.StrEnum):
    UNKNOWN_POOL = "unknown-pool"
    NOT_AN_OPERATOR = "not-an-operator"
    NO_REASON = "no-reason"
    NOT_AN_APPROVER = "not-an-approver"
    OWN_REQUEST = "own-request"
    ALREADY_APPROVED = "already-approved"
    STALE_PLAN = "stale-plan"
    EXPIRED = "expired"
    NOT_PENDING = "not-pending"
    NOT_REQUESTER_OR_ADMIN = "not-requester-or-admin"
    RUNNING = "running"
    FINISHED = "finished"
    CHANGED_MEANWHILE = "changed-meanwhile"
    UNKNOWN_REQUEST = "unknown-request"
    FROZEN = "frozen"  # a change freeze covers the pool (workflows.pools.freezes)
    DIAG_OUTGROWS_WINDOW = "diag-outgrows-window"  # a plan whose DCGM diagnostics cannot fit its window
    NOT_HOLDING = "not-holding"  # a running drain whose nodes are no longer held cannot be extended


# Refusals about who the actor is (rather than the request's state).
ROLE_REFUSALS = frozenset(
    {RefusalCode.NOT_AN_OPERATOR, RefusalCode.NOT_AN_APPROVER, RefusalCode.NOT_REQUESTER_OR_ADMIN}
)


@dataclass(frozen=True, slots=True)
class Refusal:
    code: RefusalCode
    reason: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of a gate list: allowed, or refused with one sentence."""

    refusal: Refusal | None = None

    @property
    def allowed(self) -> bool:
        return self.refusal is None


ALLOWED = Verdict()
_NO_NAMES: Mapping[str, str] = types.MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """Whether an approval counts; if it does, where the count stands with it included."""

    refusal: Refusal | None
    approvals_counted: int
    approvals_required: int

    @property
    def counted(self) -> bool:
        return self.refusal is None

    @property
    def fully_approved(self) -> bool:
        return self.counted and self.approvals_counted >= self.approvals_required


# ------------------------------------------------------------------ plain facts


def is_expired(request: Request, *, now: dt.datetime) -> bool:
    """A pending request is expired once its approval deadline has come. Approved and
    later states do not expire (a missed window is the scheduler's `missed`)."""
    return request.state == "expired" or (request.state == "pending" and request.expires_at <= now)


def approvals_required(request: Request, pool_policy: PoolConfig | None) -> int:
    """What the request needs now: the stricter of its recorded number and the pool's."""
    if pool_policy is None:
        return request.approvals_required
    return max(request.approvals_required, pool_policy.approvals_required(request.kind))


def state_at_creation(required: int) -> RequestState:
    """Requests that need no approval are approved as they are created."""
    return "approved" if required == 0 else "pending"


# Whether a user holds the approver role for the request's pool now (rule 2, re-checked).
ApproverNow = Callable[[str], bool]


def counted_approvers(request: Request, decisions: Sequence[Approval], *,
                      approver_now: ApproverNow) -> tuple[str, ...]:
    """Distinct approvers of the current plan who still hold the approver role, in the
    order they approved; never the requester (storage would not hold such a row, but the
    rule does not rely on it)."""
    seen: list[str] = []
    for d in decisions:
        if (
            d.decision == "approve"
            and d.plan_hash == request.plan_hash
            and d.approver != request.requester
            and d.approver not in seen
            and approver_now(d.approver)
        ):
            seen.append(d.approver)
    return tuple(seen)


def deny_decision(decisions: Sequence[Approval]) -> Approval | None:
    """The deny that ended the request, if one did."""
    denies = [d for d in decisions if d.decision == "deny"]
    return denies[-1] if denies else None


def matches_current_plan(request: Request, plan_hash: str) -> bool:
    """The full hash, or a prefix of at least `SHORT_HASH_LENGTH` digits as shown."""
    given = plan_hash.strip().rstrip("…").lower()
    if given == request.plan_hash:
        return True
    return len(given) >= SHORT_HASH_LENGTH and request.plan_hash.startswith(given)


def may_act_for_requester(request: Request, actor: Actor) -> bool:
    """The requester themself, or an admin."""
    return actor.user_id == request.requester or actor.has(Role.ADMIN)


def _held(actor: Actor, pool: str) -> frozenset[str]:
    return effective_roles(actor.roles) | effective_roles(actor.pool_roles.get(pool, frozenset()))


def _name(user_id: str, names: Mapping[str, str], *, fallback: str | None = None) -> str:
    return public_name(user_id, names=names, fallback=fallback)


def _not_pending(
    request: Request, decisions: Sequence[Approval], *, verb: str, names: Mapping[str, str], zone: dt.tzinfo
) -> Refusal:
    if request.state == "expired":
        return Refusal(RefusalCode.EXPIRED, say.expired(request.id, expires_at=request.expires_at, zone=zone))
    deny = deny_decision(decisions) if request.state == "denied" else None
    return Refusal(
        RefusalCode.NOT_PENDING,
        say.not_pending(
            request.id,
            state=request.state,
            verb=verb,
            denied_by=_name(deny.approver, names) if deny else None,
            deny_reason=deny.reason if deny else None,
        ),
    )


def _gate_pending_and_in_time(
    request: Request, decisions: Sequence[Approval], *, verb: str, now: dt.datetime,
    names: Mapping[str, str], zone: dt.tzinfo,
) -> Refusal | None:
    if request.state != "pending":
        return _not_pending(request, decisions, verb=verb, names=names, zone=zone)
    if is_expired(request, now=now):
        return Refusal(RefusalCode.EXPIRED, say.expired(request.id, expires_at=request.expires_at, zone=zone))
    return None


# ------------------------------------------------------------------ the checks


def check_submit(
    *,
    actor: Actor,
    kind: RequestKind,
    pool: str,
    reason: str,
    pools: Mapping[str, PoolConfig],
) -> Verdict:
    """May `actor` request a change of `kind` on `pool`?"""
    if pool not in pools:
        closest = difflib.get_close_matches(pool, list(pools), n=2, cutoff=0.6)
        return Verdict(Refusal(RefusalCode.UNKNOWN_POOL,
                               say.unknown_pool(pool, closest=closest, known=list(pools))))
    if not actor.has(Role.OPERATOR, pool=pool):
        return Verdict(Refusal(
            RefusalCode.NOT_AN_OPERATOR,
            say.not_an_operator(pool=pool, kind=kind, name=actor.name, held=_held(actor, pool)),
        ))
    if not reason.strip():
        return Verdict(Refusal(RefusalCode.NO_REASON, say.no_request_reason(pool=pool, kind=kind)))
    return ALLOWED


def check_approval(
    *,
    request: Request,
    approvals_so_far: Sequence[Approval],
    approver: Actor,
    plan_hash: str,
    pool_policy: PoolConfig | None,
    now: dt.datetime,
    approver_now: ApproverNow,
    names: Mapping[str, str] = _NO_NAMES,
    zone: dt.tzinfo = dt.timezone.utc,
) -> ApprovalDecision:
    """Does `approver`'s approval of `plan_hash` count, and does it complete the request?

    `approvals_so_far` are all decisions on the request (any plan hash); `approver_now`
    tells whether an earlier approver still holds the role; `names` maps Slack user ids
    to display names for the sentences, and `zone` is the one their times are written in."""
    required = approvals_required(request, pool_policy)
    counted = counted_approvers(request, approvals_so_far, approver_now=approver_now)

    def refuse(code: RefusalCode, reason: str) -> ApprovalDecision:
        return ApprovalDecision(Refusal(code, reason), len(counted), required)

    gate = _gate_pending_and_in_time(request, approvals_so_far, verb="approved", now=now,
                                     names=names, zone=zone)
    if gate is not None:
        return ApprovalDecision(gate, len(counted), required)
    if pool_policy is None:
        return refuse(RefusalCode.UNKNOWN_POOL, say.pool_not_configured(request.id, request.pool))
    if not approver.has(Role.APPROVER, pool=request.pool):
        return refuse(
            RefusalCode.NOT_AN_APPROVER,
            say.not_an_approver(request_id=request.id, pool=request.pool, verb="approve",
                                held=_held(approver, request.pool)),
        )
    if approver.user_id == request.requester:
        return refuse(RefusalCode.OWN_REQUEST, say.own_request_approval(request.id))
    if not matches_current_plan(request, plan_hash):
        return refuse(RefusalCode.STALE_PLAN,
                      say.stale_plan(request.id, current_hash=request.plan_hash))
    if approver.user_id in counted:
        return refuse(
            RefusalCode.ALREADY_APPROVED,
            say.already_approved_by_you(request.id, plan_hash=request.plan_hash,
                                        still_needed=max(0, required - len(counted))),
        )
    return ApprovalDecision(None, len(counted) + 1, required)


def as_extension(request: Request) -> Request:
    """A running drain with a pending extension, as its approvers decide on it: pending on
    the extension's plan hash until the extension's deadline. Rules 1-5 apply to it
    unchanged (`check_approval`, `counted_approvers`): distinct approvers holding the role
    for the pool, never the requester, on the extension's hash, before it lapses."""
    extension = request.extension
    if extension is None:
        raise ValueError(f"{request.id} has no extension waiting for approval")
    return dataclasses.replace(request, state="pending", plan_hash=extension.plan_hash,
                               expires_at=extension.expires_at)


def check_extension_approval(
    *,
    request: Request,
    approvals_so_far: Sequence[Approval],
    approver: Actor,
    plan_hash: str,
    pool_policy: PoolConfig | None,
    now: dt.datetime,
    approver_now: ApproverNow,
    names: Mapping[str, str] = _NO_NAMES,
    zone: dt.tzinfo = dt.timezone.utc,
) -> ApprovalDecision:
    """`check_approval` of a running drain's pending extension (see `as_extension`); past
    its deadline the extension has lapsed, and the refusal says so."""
    extension = as_extension(request)
    decision = check_approval(request=extension, approvals_so_far=approvals_so_far, approver=approver,
                              plan_hash=plan_hash, pool_policy=pool_policy, now=now,
                              approver_now=approver_now, names=names, zone=zone)
    if decision.refusal is not None and decision.refusal.code == RefusalCode.EXPIRED:
        assert request.extension is not None and request.window_end is not None
        return ApprovalDecision(
            Refusal(RefusalCode.EXPIRED, say.extension_lapsed(request.id, window_end=request.window_end,
                                                              extended_to=request.extension.window_end,
                                                              zone=zone)),
            decision.approvals_counted, decision.approvals_required)
    return decision


def check_deny(
    *,
    request: Request,
    approvals_so_far: Sequence[Approval],
    approver: Actor,
    reason: str,
    now: dt.datetime,
    names: Mapping[str, str] = _NO_NAMES,
    zone: dt.tzinfo = dt.timezone.utc,
) -> Verdict:
    """May `approver` deny the request? A deny by an approver ends it, on any plan:
    someone who approved earlier may still change their mind while it is pending."""
    gate = _gate_pending_and_in_time(request, approvals_so_far, verb="denied", now=now,
                                     names=names, zone=zone)
    if gate is not None:
        return Verdict(gate)
    if not approver.has(Role.APPROVER, pool=request.pool):
        return Verdict(Refusal(
            RefusalCode.NOT_AN_APPROVER,
            say.not_an_approver(request_id=request.id, pool=request.pool, verb="deny",
                                held=_held(approver, request.pool)),
        ))
    if approver.user_id == request.requester:
        return Verdict(Refusal(RefusalCode.OWN_REQUEST, say.own_request_deny(request.id)))
    if not reason.strip():
        return Verdict(Refusal(RefusalCode.NO_REASON, say.no_deny_reason(request.id)))
    return ALLOWED


def check_cancel(
    *,
    request: Request,
    actor: Actor,
    now: dt.datetime,
    approvals_so_far: Sequence[Approval] = (),
    names: Mapping[str, str] = _NO_NAMES,
) -> Verdict:
    """May `actor` cancel the request? Only the requester or an admin, and only before
    it runs (a running request is stopped by aborting its run)."""
    if request.state in FINISHED_STATES or is_expired(request, now=now):
        state = "expired" if is_expired(request, now=now) else request.state
        deny = deny_decision(approvals_so_far) if state == "denied" else None
        return Verdict(Refusal(
            RefusalCode.FINISHED,
            say.already_finished(request.id, state=state,
                                 denied_by=_name(deny.approver, names) if deny else None,
                                 deny_reason=deny.reason if deny else None),
        ))
    if not may_act_for_requester(request, actor):
        return Verdict(Refusal(
            RefusalCode.NOT_REQUESTER_OR_ADMIN,
            say.not_requester_or_admin(request.id, requester_name=_name(request.requester, names,
                                                                    fallback=request.requester_name),
                                       verb="cancel"),
        ))
    if request.state not in CANCELLABLE_STATES:
        return Verdict(Refusal(RefusalCode.RUNNING, say.cancel_while_running(request.id)))
    return ALLOWED


def check_replan(
    *,
    request: Request,
    actor: Actor,
    now: dt.datetime,
    approvals_so_far: Sequence[Approval] = (),
    names: Mapping[str, str] = _NO_NAMES,
    zone: dt.tzinfo = dt.timezone.utc,
) -> Verdict:
    """May `actor` bind the request to a new plan? Only while pending, and only the
    requester or an admin (approvals given so far stop counting)."""
    gate = _gate_pending_and_in_time(request, approvals_so_far, verb="replanned", now=now,
                                     names=names, zone=zone)
    if gate is not None:
        return Verdict(gate)
    if not may_act_for_requester(request, actor):
        return Verdict(Refusal(
            RefusalCode.NOT_REQUESTER_OR_ADMIN,
            say.not_requester_or_admin(request.id, requester_name=_name(request.requester, names,
                                                                    fallback=request.requester_name),
                                       verb="change the plan of"),
        ))
    return ALLOWED
