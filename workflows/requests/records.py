"""What every task of the request service stands on (workflows.requests.service): the
connection and configuration it works on, reading requests and their views, and the
records each change writes in its transaction: the compare-and-set transition, the
audit row, the thread message. Expiry on touch lives here too: any action on a pending
request past its deadline expires it first."""

from __future__ import annotations

import datetime as dt
import difflib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from storage import approvals as stored_approvals
from storage import audit, codec, outbox
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage.approvals import Approval
from storage.database import Database
from storage.ids import RequestId
from storage.requests import Request, RequestState
from workflows.access import Actor, Role, public_name
from workflows.plans import Plan, plan_from_json
from workflows.pools.config import PoolConfig
from workflows.preflight.duration import past_steps
from workflows.preflight.facts import Pace
from workflows.requests import messages as say
from workflows.requests import policy
from workflows.requests.errors import ChangedMeanwhile, UnknownRequest
from workflows.requests.policy import ApproverNow
from workflows.requests.views import ApprovalView, ExtensionView, RequestView

# How many open requests the list views read at most.
LIST_LIMIT = 500

# Who a user is now, by user id: their roles from the configuration and, where the bot
# knows them, from their Slack user groups. Earlier approvals are re-checked against it
# every time they are counted (`policy` rule 2).
RoleLookup = Callable[[str], Actor]


class EngineLimits(Protocol):
    """What a plan's pre-flight reads of the engine's settings (`workflows.config.EngineConfig`)."""

    @property
    def max_parallel_nodes(self) -> int: ...


class RequestSettings(Protocol):
    """What the request service reads of the configuration (`workflows.config.GpuopsConfig`,
    which sits above every package and is imported by none)."""

    @property
    def pools(self) -> Mapping[str, PoolConfig]: ...

    @property
    def names(self) -> Mapping[str, str]: ...

    @property
    def cluster_name(self) -> str | None: ...

    @property
    def engine(self) -> EngineLimits: ...

    @property
    def display_zone(self) -> dt.tzinfo:
        """The zone request threads and refusals write times in (`display.timezone`)."""
        ...

    def actor(self, user_id: str) -> Actor: ...


def wakes_when_approved(method: Callable[..., RequestView]) -> Callable[..., RequestView]:
    """After the transaction: a request that is now approved may be due to run (its
    window open already), so whoever starts runs hears of it at once."""

    @functools.wraps(method)
    def wrapper(self: RequestRecords, *args: Any, **kwargs: Any) -> RequestView:
        view = method(self, *args, **kwargs)
        if view.state == "approved" and self._on_approved is not None:
            self._on_approved()
        return view

    return wrapper


class RequestRecords:
    """Requests on one database connection (one per thread, see `storage.database`):
    reading them, and the records every change writes. `on_approved` is called after any
    change that leaves a request approved. `delivery` is the Slack delivery these
    services answer (storage.inbox's key), if any: a request it files carries it, so the
    delivery run again after its replica died answers with that request (`submit`)."""

    def __init__(self, db: Database, config: RequestSettings, *, roles: RoleLookup | None = None,
                 on_approved: Callable[[], None] | None = None, delivery: str | None = None) -> None:
        self._db = db
        self._config = config
        self._roles: RoleLookup = roles or (lambda user_id: config.actor(user_id))
        self._on_approved = on_approved
        self._delivery = delivery

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

    def pool_pace(self, pool: str) -> Pace:
        """The steps this cluster's last runs of `pool` finished and the engine's nodes at
        once: the pace a plan's pre-flight times the next run at."""
        return Pace(steps=past_steps(self._db, pool=pool, cluster=self._config.cluster_name),
                    parallel=self._config.engine.max_parallel_nodes)

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

    @property
    def _names(self) -> Mapping[str, str]:
        return self._config.names

    @property
    def _zone(self) -> dt.tzinfo:
        return self._config.display_zone

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

    def approvals_required_now(self, request: Request) -> int:
        """What `request` needs now: the stricter of its recorded number and its pool's
        rule as configured now (a tightened rule applies to requests in flight)."""
        return policy.approvals_required(request, self._pool(request))

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
                    detail={"expires_at": time_text(request.expires_at), "plan_hash": request.plan_hash,
                            "approvals_counted": counted, "approvals_required": required})
        self._notify(request, event="request.expired", state="expired", now=now, dedupe="expired",
                     text=say.thread_expired(request_id=request.id, expires_at=request.expires_at,
                                             counted=counted, required=required, zone=self._zone))
        return self._load(request.id)

    def _transition(
        self, request: Request, *, expected: RequestState | frozenset[RequestState],
        new: RequestState, now: dt.datetime,
    ) -> None:
        if not stored_requests.transition(self._db, id=request.id, expected=expected, new=new,
                                          at=now):
            raise ChangedMeanwhile(request.id)

    def _already_by_this_delivery(self, request_id: str, action: str) -> RequestView | None:
        """The request as it is now, if the Slack delivery these services answer already did
        `action` to it: its first run, on a replica that died before answering (the audit
        row of `action` names the delivery, see `_delivery_detail`). None: not done yet."""
        if self.done_by_this_delivery(request_id, action) is None:
            return None
        return self._view(self._load(request_id))

    def done_by_this_delivery(self, request_id: str, action: str) -> dict[str, Any] | None:
        """The detail of the audit row of `action` on the request that the Slack delivery
        these services answer wrote (its first run did it), else None. A service that
        re-plans before it asks (a drain extended by a duration) reads what the first run
        started from here, so running the delivery again plans the same thing."""
        if self._delivery is None:
            return None
        request = self._load(request_id)
        return next((e.detail for e in audit.for_request(self._db, request.id)
                     if e.action == action and isinstance(e.detail, dict)
                     and e.detail.get("delivery") == self._delivery), None)

    def window_end_before_this_delivery(self, request_id: str, action: str) -> dt.datetime | None:
        """The request's window end before the Slack delivery these services answer moved
        it by `action` (its first run did, on a replica that died before answering), else
        None. A drain extended by a duration plans from it, so running the delivery again
        plans what the first run planned instead of extending twice."""
        detail = self.done_by_this_delivery(request_id, action)
        before = detail.get("old_window_end") if detail is not None else None
        return codec.time_from_text(before) if isinstance(before, str) else None

    def _delivery_detail(self) -> dict[str, str]:
        """What an audit row of a change that is not idempotent by itself (a window
        extended by a duration) adds: the delivery that made it, if a Slack one did."""
        return {"delivery": self._delivery} if self._delivery is not None else {}

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


def check_plan_fits(
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


def time_text(at: dt.datetime | None) -> str | None:
    return codec.optional_time_to_text(at)
