"""The drain use case: one call per verb. `request` turns what a person asked for (a
`DrainAsk`, from `/gpu drain` or the drain form) into a checked plan and a stored
request; `extend` re-plans a drain not started yet with a later end and asks for
approval again; `extend_running` gives a running drain whose run holds its nodes a later
window end (its waves are not re-planned), under the pool's approval rule.
Each reads the workloads it will move straight from the cluster (`PodsAndBudgets`: the
Kubernetes gateway in the bot, plain values in tests), checks the pool's policy and
the requester's role, and stores nothing when anything refuses."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from workflows.access import Actor, Role, require
from workflows.kinds import ServiceInputs
from workflows.drain import messages as say
from workflows.drain.plan import DrainAsk, DrainPlan, DrainRefused, drain_spec, extended_plan, plan_drain
from workflows.fleet.summary import Fleet
from workflows.kube.objects import DisruptionBudget, NodeName, PodObject
from workflows.pools.capacity import check_drain, concurrent_work, pool_nodes
from workflows.pools.config import PoolConfig
from workflows.pools.windows import UTC
from workflows.requests import messages as request_say
from workflows.requests.policy import RefusalCode
from workflows.requests.errors import RequestAccessDenied
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView
from workflows.preflight.budgets import budgets_of


@runtime_checkable
class PodsAndBudgets(Protocol):
    """What a drain reads of the cluster besides the fleet: every pod bound to a node (the
    watch cache keeps only GPU and operator pods; a preview names every pod it would
    evict) and the PodDisruptionBudgets of a namespace. `kube.gateway.KubeGateway` is one."""

    def list_pods_bound_to(self, node: str) -> Sequence[PodObject]: ...

    def list_disruption_budgets(self, namespace: str) -> Sequence[DisruptionBudget]: ...


@dataclass(frozen=True, slots=True)
class DrainRequested:
    """A drain planned and stored: the plan with its preview, and the request as stored."""

    planned: DrainPlan
    view: RequestView


class DrainService:
    """Drains on one request service (one database connection). Without `workloads` (no
    cluster: the console on a snapshot, unit tests) a plan lists no workloads. `zone` is
    the one its refusals of a running drain's extension write times in (the display zone,
    as the request's thread and the reply that grants it)."""

    kind = "drain"  # its entry in workflows/kinds.py

    def __init__(self, requests: RequestService, *, pools: Mapping[str, PoolConfig],
                 workloads: PodsAndBudgets | None = None, zone: dt.tzinfo = UTC) -> None:
        self._requests = requests
        self._zone = zone
        self._pools = pools
        self._workloads = workloads

    @classmethod
    def built(cls, inputs: ServiceInputs) -> DrainService:
        """For an entry point (its registry line): the pods and budgets from its readers."""
        return cls(inputs.requests, pools=inputs.config.pools, workloads=inputs.reader(PodsAndBudgets),
                   zone=inputs.config.display_zone)

    @property
    def reads_workloads(self) -> bool:
        return self._workloads is not None

    def request(self, actor: Actor, ask: DrainAsk, *, fleet: Fleet, now: dt.datetime,
                channel: str | None = None) -> DrainRequested:
        """Plan `ask`, check it and store it as a pending request. Raises
        `DrainRequestError`, `DrainRefused`, `AccessDenied` or `RequestRefused`."""
        planned = self._plan(actor, ask, fleet=fleet, now=now, requested_by=actor.user_id)
        spec = planned.spec
        view = self._requests.submit(actor, kind="drain", pool=spec.pool, targets=spec.targets,
                                     plan=planned.plan, window_start=spec.start, window_end=spec.end,
                                     reason=spec.reason, channel=channel, now=now)
        return DrainRequested(planned, view)

    def extend(self, actor: Actor, request: RequestView, more: dt.timedelta, *, fleet: Fleet,
               now: dt.datetime) -> DrainRequested:
        """Re-plan `request` (a drain with a window) to end `more` later; its approvals
        start again. The plan stays the requester's, whoever extends it."""
        if request.window_start is None or request.window_end is None:
            raise ValueError("only a drain with a window end can be extended")
        # Asked again by the Slack delivery that extended it: from where that began.
        end = self._requests.window_end_before_this_delivery(request.id, "request.replanned") or request.window_end
        ask = DrainAsk(targets=tuple(request.targets), start_from="at", at=request.window_start, zone=UTC,
                       duration=end - request.window_start + more, reason=request.reason)
        planned = self._plan(actor, ask, fleet=fleet, now=now, requested_by=request.requester, replacing=request.id)
        view = self._requests.extend_window(actor, request.id, planned.plan, window_end=planned.spec.end, now=now)
        return DrainRequested(planned, view)

    def extend_running(self, actor: Actor, request: RequestView, more: dt.timedelta, *, fleet: Fleet,
                       now: dt.datetime) -> RequestView:
        """Ask for `request` (a running drain with a window end) to hold its nodes `more`
        longer. The requester (while an operator of the pool) or an admin; the new end
        must lie in the pool's allowed window from now, and the nodes the run holds now
        must fit the pool's capacity rules from now to the new end beside the other open
        requests (its own nodes counted once, itself excluded). The plan's waves stay as
        they are: only its window end changes (`extended_plan`); later waves meet the
        engine's wave gate with the new end. Stored by `RequestService.extend_running`:
        applied at once on a pool that needs no approval for drains, else pending until
        approved. Raises `DrainRefused`, `AccessDenied` (`RequestAccessDenied` for someone
        else's request) or `RequestRefused`; stores nothing then."""
        if request.window_end is None:
            raise ValueError("only a drain with a window end can be extended")
        if actor.user_id != request.requester and not actor.has(Role.ADMIN):
            raise RequestAccessDenied(
                request_say.not_requester_or_admin(request.id, requester_name=request.requester_name, verb="extend"),
                code=RefusalCode.NOT_REQUESTER_OR_ADMIN)
        # The requester holds the pool's nodes longer only while they still operate it.
        require(actor, Role.OPERATOR, action=f"Holding {request.id} longer", pool=request.pool)
        before = self._requests.window_end_before_this_delivery(request.id, "request.extension_asked")
        if before is not None:  # asked by this Slack delivery already: answered with the request as it is
            return self._requests.extend_running(actor, request.id, extended_plan(request.plan, before + more),
                                                 window_end=before + more, now=now)
        end = request.window_end + more
        policy = self._pools[request.pool]
        hold = self._requests.running_hold(request.id)
        if hold.holding:  # else the request service refuses, saying why
            windows = policy.window_set
            start = max(now, request.window_start or now)
            occurrence = windows.occurrence_containing(start)
            if occurrence is None:
                raise DrainRefused(say.extend_outside_window(request.id, pool=request.pool, windows=windows, now=now,
                                                             zone=self._zone),
                                   code="outside-window")
            if not windows.fits(start, end - start):
                raise DrainRefused(say.extend_past_window(request.id, end=end, pool=request.pool,
                                                          window_end=occurrence.end, current_end=request.window_end,
                                                          zone=self._zone),
                                   code="window-too-short")
            check = check_drain(pool=request.pool, pool_nodes=pool_nodes(fleet, request.pool), nodes=hold.nodes,
                                start=now, end=end, max_unavailable=policy.unavailable_budget,
                                min_ready_gpus=policy.min_ready_gpus,
                                concurrent=concurrent_work(self._requests.open_requests(request.pool),
                                                           pool=request.pool, exclude=request.id))
            if not check.ok:
                raise DrainRefused(say.extend_capacity_refused(request.id, end=end, check=check,
                                                               zone=self._zone),
                                   code=check.refusals[0].rule, check=check)
        return self._requests.extend_running(actor, request.id, extended_plan(request.plan, end), window_end=end,
                                             now=now)

    def _plan(self, actor: Actor, ask: DrainAsk, *, fleet: Fleet, now: dt.datetime, requested_by: str,
              replacing: str | None = None) -> DrainPlan:
        """What `ask` means now, checked: the actor may drain its pool, and the plan of
        waves fits the pool's policy beside the other open requests."""
        spec = drain_spec(ask, fleet=fleet, pools=self._pools, now=now)
        require(actor, Role.OPERATOR, action="Requesting a drain", pool=spec.pool)
        pods, pdbs = self._read_workloads(spec.nodes)
        return plan_drain(spec, fleet=fleet, pods_by_node=pods, policy=self._pools[spec.pool],
                          open_requests=self._requests.open_requests(spec.pool), now=now,
                          requested_by=requested_by, pdbs=pdbs, replacing=replacing,
                          runs_ending=self._requests.runs_ending(spec.pool), past_runs=self._requests.pool_pace)

    def _read_workloads(self, nodes: Sequence[NodeName]) -> tuple[dict[NodeName, list[PodObject]],
                                                                   list[DisruptionBudget]]:
        if self._workloads is None:
            return {}, []
        pods = {node: list(self._workloads.list_pods_bound_to(node)) for node in nodes}
        return pods, budgets_of(self._workloads, [pod for node_pods in pods.values() for pod in node_pods])
