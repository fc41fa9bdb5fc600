"""Capacity gates for taking GPU nodes of a pool out of service (a drain, or any plan).

Pure checks over the pool's `NodeInventory` values and the other open requests on the
pool; time is an argument. Two rules, both failing closed:

- **max_unavailable**: nodes out at once may not exceed the pool's budget. A node is
  *unavailable* when it is cordoned (by anyone: a human's cordon counts), not Ready, or
  its Ready state is unknown. The budget is a count, or a percent of the pool's nodes
  rounded down but at least 1 when the percent is above 0 (so "25%" of a three-node pool
  still lets one node go, one at a time); 0 or "0%" freezes the pool. A node being
  drained that is already unavailable is counted once.
- **min_ready_gpus**: the pool's *Ready GPUs* (GPUs advertised by nodes that are Ready
  and schedulable, `NodeInventory.advertised_gpus`) may not fall below the floor.

Other open requests on the pool (approved, scheduled or running) whose time span
overlaps the proposed one count together with it. A request runs one wave at a time, so
at any instant it holds at most one wave out; which one is not known, so its worst wave
counts (the most nodes not already counted, and separately the most Ready GPUs). A
request without a start counts from the beginning of time, one without an end forever.
The check is made for every stretch of the proposed span in which the set of
overlapping requests is constant, and the worst stretch decides.

Nodes named in a request that the inventory does not know count as unavailable and
contribute no Ready GPUs.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from storage.requests import RequestState
from workflows.fleet.assessment import NodeInventory
from workflows.fleet.summary import Fleet
from workflows.kube.labels import ANNOTATION_MIRROR
from workflows.kube.objects import NodeName, PodObject
from workflows.plans import Plan
from workflows.pools import messages as say
from workflows.pools.windows import BEGINNING_OF_TIME, END_OF_TIME

# Request states in which a request may hold nodes out during its window.
HOLDING_STATES: frozenset[RequestState] = frozenset({"approved", "scheduled", "running"})

Rule = Literal["max_unavailable", "min_ready_gpus"]

_PERCENT = re.compile(r"^\s*(\d{1,3})\s*%\s*$", re.ASCII)
_COUNT = re.compile(r"^\s*(\d+)\s*$", re.ASCII)


@dataclass(frozen=True, slots=True)
class MaxUnavailable:
    """A pool's budget of nodes out at once: `count` nodes, or `percent` of the pool."""

    count: int | None = None
    percent: int | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.percent is None):
            raise ValueError("max_unavailable is a count or a percent, exactly one")
        if self.count is not None and self.count < 0:
            raise ValueError(say.bad_max_unavailable(self.count))
        if self.percent is not None and not 0 <= self.percent <= 100:
            raise ValueError(say.bad_max_unavailable(f"{self.percent}%"))

    @classmethod
    def parse(cls, value: object) -> MaxUnavailable:
        """2 -> two nodes; "25%" -> a quarter of the pool. Raises ValueError saying how
        to write it."""
        if isinstance(value, MaxUnavailable):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(count=value)
        if isinstance(value, str):
            if match := _PERCENT.match(value):
                return cls(percent=int(match.group(1)))
            if match := _COUNT.match(value):
                return cls(count=int(match.group(1)))
        raise ValueError(say.bad_max_unavailable(value))

    def allowed(self, pool_size: int) -> int:
        """How many nodes of a pool of `pool_size` may be out at once."""
        if self.count is not None:
            return self.count
        assert self.percent is not None
        if self.percent == 0 or pool_size == 0:
            return 0
        return max(1, pool_size * self.percent // 100)

    def __str__(self) -> str:
        return f"{self.percent}%" if self.percent is not None else str(self.count)


class OpenRequest(Protocol):
    """What the capacity check reads of another request (`requests.RequestView` fits)."""

    @property
    def id(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def window_start(self) -> dt.datetime | None: ...
    @property
    def window_end(self) -> dt.datetime | None: ...
    @property
    def plan(self) -> Plan: ...


@dataclass(frozen=True, slots=True)
class ConcurrentWork:
    """Another request that may hold nodes of the pool out between `start` and `end`
    (None: unbounded on that side), one of its `waves` at a time."""

    label: str
    start: dt.datetime | None
    end: dt.datetime | None
    waves: tuple[tuple[NodeName, ...], ...]

    @property
    def span(self) -> tuple[dt.datetime, dt.datetime]:
        return (self.start or BEGINNING_OF_TIME, self.end or END_OF_TIME)

    def overlaps(self, start: dt.datetime, end: dt.datetime) -> bool:
        mine_start, mine_end = self.span
        return mine_start < end and start < mine_end


def concurrent_work(open_requests: Iterable[OpenRequest], *, pool: str,
                    exclude: str | None = None) -> tuple[ConcurrentWork, ...]:
    """The requests on `pool` that may hold nodes out (see `HOLDING_STATES`). Pending
    requests do not count yet: each is checked again when it is approved and scheduled."""
    return tuple(
        ConcurrentWork(
            label=str(request.id),
            start=request.window_start,
            end=request.window_end,
            waves=tuple(tuple(wave.nodes) for wave in request.plan.waves),
        )
        for request in open_requests
        if request.pool == pool and request.state in HOLDING_STATES and request.id != exclude
    )


# ------------------------------------------------------------------ node facts


def pool_nodes(fleet: Fleet, pool: str) -> tuple[NodeInventory, ...]:
    """The inventories of the pool's GPU nodes, by name."""
    found = fleet.pool(pool)
    if found is None:
        return ()
    return tuple(fleet.nodes[name] for name in found.nodes if name in fleet.nodes)


def is_unavailable(node: NodeInventory) -> bool:
    """Cordoned, not Ready, or Ready unknown: the node takes no new work."""
    return node.cordoned or node.ready is not True


def ready_gpus(node: NodeInventory) -> int:
    """The GPUs this node contributes to the pool's Ready GPUs."""
    return 0 if is_unavailable(node) else node.advertised_gpus


# ------------------------------------------------------------------ the check


@dataclass(frozen=True, slots=True)
class CapacityRefusal:
    rule: Rule
    reason: str  # one sentence from pools.messages: the rule, the numbers, what would fit


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityCheck:
    """The verdict on taking `nodes` out together during [start, end)."""

    pool: str
    nodes: tuple[NodeName, ...]
    start: dt.datetime
    end: dt.datetime | None
    pool_size: int
    max_unavailable: MaxUnavailable
    allowed_unavailable: int
    # Unavailable before anything is drained (cordoned, NotReady or unknown).
    already_unavailable: tuple[NodeName, ...]
    # Other requests overlapping the span, and the most nodes they hold out at once in
    # the worst stretch.
    concurrent: tuple[ConcurrentWork, ...]
    concurrent_nodes: int
    # The start of the worst stretch.
    worst_at: dt.datetime
    unavailable_during: int
    ready_gpus_now: int
    ready_gpus_during: int
    min_ready_gpus: int
    # How many of `nodes`, taken in order, could go out together without breaking a rule.
    most_at_once: int
    refusals: tuple[CapacityRefusal, ...]

    @property
    def ok(self) -> bool:
        return not self.refusals


@dataclass(frozen=True, slots=True)
class _Tally:
    unavailable: int
    ready_gpus: int
    concurrent_nodes: int
    at: dt.datetime


class _Pool:
    """The pool's facts, computed once for many questions about subsets of nodes."""

    def __init__(self, pool_nodes: Sequence[NodeInventory], *,
                 back_in_service: Collection[NodeName] = frozenset()) -> None:
        self.by_name: Mapping[NodeName, NodeInventory] = {n.name: n for n in pool_nodes}
        # Out only for a cordon that is not this check's to count (see check_drain): in
        # service, with the GPUs the node advertises. A node not Ready still counts.
        self._own = frozenset(n.name for n in pool_nodes
                              if n.name in back_in_service and n.cordoned and n.ready is True)
        self.unavailable = frozenset(n.name for n in pool_nodes if is_unavailable(n) and n.name not in self._own)
        self.ready_gpus = sum(self._ready(n) for n in pool_nodes)

    def _ready(self, node: NodeInventory) -> int:
        return node.advertised_gpus if node.name in self._own else ready_gpus(node)

    def gpus(self, names: Iterable[NodeName]) -> int:
        return sum(self._ready(self.by_name[n]) for n in names if n in self.by_name)

    def tally(self, nodes: Iterable[NodeName], stretches: Sequence[tuple[dt.datetime, Sequence[ConcurrentWork]]]) -> _Tally:
        counted = self.unavailable | frozenset(nodes)
        base_gpus_out = self.gpus(counted - self.unavailable)
        worst: _Tally | None = None
        for at, active in stretches:
            extra_nodes = sum(max((len(set(w) - counted) for w in c.waves), default=0) for c in active)
            extra_gpus = sum(max((self.gpus(set(w) - counted) for w in c.waves), default=0) for c in active)
            tally = _Tally(unavailable=len(counted) + extra_nodes,
                           ready_gpus=self.ready_gpus - base_gpus_out - extra_gpus,
                           concurrent_nodes=extra_nodes, at=at)
            if worst is None or (tally.unavailable, -tally.ready_gpus) > (worst.unavailable, -worst.ready_gpus):
                worst = tally
        assert worst is not None
        return worst


def _stretches(start: dt.datetime, end: dt.datetime,
               concurrent: Sequence[ConcurrentWork]) -> list[tuple[dt.datetime, list[ConcurrentWork]]]:
    """[start, end) cut where an overlapping request starts or ends, with the requests
    active in each stretch."""
    cuts = {start}
    for work in concurrent:
        for edge in work.span:
            if start < edge < end:
                cuts.add(edge)
    ordered = sorted(cuts)
    return [(at, [w for w in concurrent if w.span[0] <= at < w.span[1]]) for at in ordered]


def check_drain(
    *,
    pool: str,
    pool_nodes: Sequence[NodeInventory],
    nodes: Sequence[NodeName],
    start: dt.datetime,
    end: dt.datetime | None,
    max_unavailable: MaxUnavailable,
    min_ready_gpus: int,
    concurrent: Sequence[ConcurrentWork] = (),
    back_in_service: Collection[NodeName] = frozenset(),
) -> CapacityCheck:
    """May `nodes` of `pool` be out together during [start, end) (end None: until
    released)? See the module docstring for the rules. `back_in_service`: nodes out now
    that count as in service for this check, with the GPUs they advertise: cordons the
    change takes over from the run it undoes or continues (a rollback must not wait on
    the cordons of the very run it puts right), or cordons of a run that will have ended
    by `start`."""
    facts = _Pool(pool_nodes, back_in_service=back_in_service)
    span_end = end or END_OF_TIME
    overlapping = tuple(w for w in concurrent if w.overlaps(start, span_end))
    stretches = _stretches(start, span_end, overlapping)
    allowed = max_unavailable.allowed(len(pool_nodes))

    def passes(tally: _Tally) -> bool:
        return tally.unavailable <= allowed and tally.ready_gpus >= min_ready_gpus

    chosen: list[NodeName] = []
    for node in nodes:
        if passes(facts.tally([*chosen, node], stretches)):
            chosen.append(node)
    tally = facts.tally(nodes, stretches)
    numbers: dict[str, Any] = dict(pool=pool, nodes=tuple(nodes), pool_size=len(pool_nodes),
                   already=tuple(sorted(facts.unavailable)),
                   concurrent=tuple(work.label for work in overlapping),
                   concurrent_nodes=tally.concurrent_nodes, most_at_once=len(chosen))
    refusals: list[CapacityRefusal] = []
    if tally.unavailable > allowed:
        refusals.append(CapacityRefusal("max_unavailable", say.too_many_unavailable(
            **numbers, unavailable=tally.unavailable, allowed=allowed,
            max_unavailable=str(max_unavailable))))
    if tally.ready_gpus < min_ready_gpus:
        refusals.append(CapacityRefusal("min_ready_gpus", say.below_gpu_floor(
            **numbers, ready_now=facts.ready_gpus, ready_during=tally.ready_gpus,
            floor=min_ready_gpus)))
    return CapacityCheck(
        pool=pool,
        nodes=tuple(nodes),
        start=start,
        end=end,
        pool_size=len(pool_nodes),
        max_unavailable=max_unavailable,
        allowed_unavailable=allowed,
        already_unavailable=tuple(sorted(facts.unavailable)),
        concurrent=overlapping,
        concurrent_nodes=tally.concurrent_nodes,
        worst_at=tally.at,
        unavailable_during=tally.unavailable,
        ready_gpus_now=facts.ready_gpus,
        ready_gpus_during=tally.ready_gpus,
        min_ready_gpus=min_ready_gpus,
        most_at_once=len(chosen),
        refusals=tuple(refusals),
    )


# ------------------------------------------------------------------ before a wave


@dataclass(frozen=True, slots=True)
class WaveGate:
    """May a run's next wave start now? A request was checked against the pool when it
    was made; the engine asks again when the run starts and before every wave, since
    people cordon nodes, other runs start and windows close in between.

    `rule` names what blocks it ("window", "busy", "max_unavailable", "min_ready_gpus")
    and `reason` says it in one sentence; `over` means it never will in this window (the
    window ended), so the run halts instead of waiting."""

    rule: str | None = None
    reason: str | None = None
    over: bool = False

    @property
    def fits(self) -> bool:
        return self.rule is None


def check_wave(
    *,
    pool: str,
    wave: int,
    nodes: Sequence[NodeName],
    pool_nodes: Sequence[NodeInventory],
    now: dt.datetime,
    window_end: dt.datetime | None,
    allowed_now: bool,
    max_unavailable: MaxUnavailable,
    min_ready_gpus: int,
    concurrent: Sequence[ConcurrentWork] = (),
    busy: Mapping[NodeName, str] | None = None,
    taken_over: Collection[NodeName] = frozenset(),
    zone: dt.tzinfo = dt.timezone.utc,
) -> WaveGate:
    """Whether wave `wave` (its `nodes`) may be taken out of `pool` at `now`, until
    `window_end` (None: until released): inside the request's window and one of the
    pool's (`allowed_now`), none of its nodes in another unfinished run (`busy`: node ->
    run id), and both capacity rules as `check_drain` reads them, on the pool as it is
    now; the cordons it `taken_over` from the run it undoes or continues count as in
    service (`check_drain`'s `back_in_service`). Its reasons write times in `zone` (the
    display zone: the run's thread reads them)."""
    if window_end is not None and now >= window_end:
        return WaveGate("window", say.wave_window_over(wave, window_end, zone=zone), over=True)
    if not allowed_now:
        return WaveGate("window", say.wave_outside_windows(wave, pool))
    taken: dict[str, str] = {node: run for node, run in (busy or {}).items() if node in nodes}
    if taken:
        return WaveGate("busy", say.wave_nodes_busy(wave, taken))
    verdict = check_drain(pool=pool, pool_nodes=pool_nodes, nodes=nodes, start=now, end=window_end,
                          max_unavailable=max_unavailable, min_ready_gpus=min_ready_gpus,
                          concurrent=concurrent, back_in_service=taken_over)
    if not verdict.ok:
        first = verdict.refusals[0]
        return WaveGate(first.rule, say.wave_does_not_fit(wave, first.reason))
    return WaveGate()


# ------------------------------------------------------------------ rolling changes


class OrderRefused(Exception):
    """No order of the nodes keeps the pool within its rules; `code` names the rule."""

    def __init__(self, reason: str, *, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class RollingOrder:
    """The canary node first (alone, then a soak), then waves no larger than the pool's
    `max_unavailable` budget leaves after the nodes already out."""

    canary: NodeName
    waves: tuple[tuple[NodeName, ...], ...]


def waves_within_budget(nodes: Sequence[NodeInventory], *, pool: Sequence[NodeInventory], budget: MaxUnavailable,
                  canary: str | None = None, min_ready_gpus: int = 0, what: str = "change",
                  ready_after: Mapping[str, int] | None = None) -> RollingOrder:
    """The order a rolling change (a driver upgrade, a MIG layout) takes `nodes`, all of
    them in `pool`: `canary` (the pool's configured canary node) first, else the node
    running the fewest GPU pods (then by name), then waves by name. The pool's nodes
    already unavailable count against the budget; a budget they use up leaves waves of
    one, as one node must move for the change to move.

    No wave takes the pool's Ready GPUs below `min_ready_gpus`, counted as the pool has
    them at that point: a node a change gives another count when it comes back
    (`ready_after`, e.g. 8 GPUs that come back as 56 MIG slices) counts that way from the
    wave after its own. A node that alone would break the floor is refused."""
    by_name = {n.name: n for n in nodes}
    if canary is not None and canary not in by_name:
        raise OrderRefused(say.canary_not_in_scope(canary, sorted(by_name), what), code="canary-not-in-scope")
    first = by_name[NodeName(canary)] if canary else min(nodes, key=lambda n: (n.requested_gpus, n.name))
    rest = sorted((n for n in nodes if n.name != first.name), key=lambda n: n.name)
    out_already = sum(1 for n in pool if is_unavailable(n))
    size = max(1, budget.allowed(len(pool)) - out_already)
    ready = sum(ready_gpus(n) for n in pool)

    def back(wave: Sequence[NodeInventory]) -> int:
        """How the pool's Ready GPUs change once `wave` is done."""
        if ready_after is None:
            return 0
        return sum(ready_after.get(n.name, ready_gpus(n)) - ready_gpus(n) for n in wave if not is_unavailable(n))

    def fits(node: NodeInventory, ready: int) -> None:
        if ready - ready_gpus(node) < min_ready_gpus:
            raise OrderRefused(say.node_below_gpu_floor(node.name, ready, ready_gpus(node), min_ready_gpus),
                               code="min-ready-gpus")

    if ready_after is None:  # every node alone must fit, whatever the order
        for node in [first, *rest]:
            fits(node, ready)
    fits(first, ready)
    ready += back([first])
    waves: list[tuple[NodeName, ...]] = []
    current: list[NodeInventory] = []
    for node in rest:
        out = sum(ready_gpus(n) for n in current) + ready_gpus(node)
        if current and (len(current) == size or ready - out < min_ready_gpus):
            waves.append(tuple(n.name for n in current))
            ready += back(current)
            current = []
        fits(node, ready)
        current.append(node)
    if current:
        waves.append(tuple(n.name for n in current))
    return RollingOrder(canary=first.name, waves=tuple(waves))


@runtime_checkable
class GpuPods(Protocol):
    """Where a plan reads the cluster's GPU pods (`kube.gateway.KubeGateway`)."""

    def list_gpu_pods(self) -> list[PodObject]: ...


@dataclass(frozen=True, slots=True)
class PodsMoved:
    """The GPU pods a change of one node moves off it: those it waits for (the pool's
    `wait_for` jobs) and those it evicts."""

    waited: tuple[str, ...]  # namespace/name
    evicted: tuple[str, ...]


def gpu_pods_moved(pods: Iterable[PodObject], node: str, *,
                   wait_for: Callable[[Mapping[str, str]], bool] | None = None) -> PodsMoved:
    """Of `pods` (the cluster's GPU pods), those on `node` that hold GPUs (not finished,
    not being deleted, not DaemonSet or static pods), split by the pool's `wait_for`
    selector (its `matches`)."""
    waited: list[str] = []
    evicted: list[str] = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        controller = pod.controller
        if (pod.node_name != node or not pod.gpu_requests or pod.deleting or pod.phase in ("Succeeded", "Failed")
                or (controller is not None and controller.kind in ("DaemonSet", "Node"))
                or ANNOTATION_MIRROR in pod.annotations):
            continue
        (waited if wait_for is not None and wait_for(pod.labels) else evicted).append(f"{pod.namespace}/{pod.name}")
    return PodsMoved(waited=tuple(waited), evicted=tuple(evicted))

