"""Drains: what a person asked for (a `DrainAsk`: the words of `/gpu drain` read by
commands/drain_grammar.py, or the drain form's fields) made into a `DrainRequestSpec`,
then checked against the pool's policy and turned into a `Plan` of waves with a preview
an approver can read.

What the ask means (`drain_spec`): its targets are node or pool names (a pool: all its
GPU nodes; `pool=<name>` only a pool), all in one configured pool (`resolve_drain_targets`);
it starts now, at a time (not past), or at the start of the next window occurrence at or
after now (with a duration, the next one long enough); it lasts its duration, else until
its window occurrence ends, else (a pool whose windows are `always`) until someone says
`drain done`.

Planning (`plan_drain`) is a flat list of gates, each refusing with the rule, the
numbers and what would fit (`DrainRefused`): the start is not past; the pool has
windows; the drain starts inside one and fits before it ends; every node can be out
on its own without breaking `max_unavailable` or `min_ready_gpus` (counting nodes
already cordoned or NotReady and overlapping approved requests). Then nodes are put in
waves, in order, each as large as the two capacity rules allow. A wave runs
cordon -> wait-for-jobs (when the pool's `wait_for` selector matches pods there) ->
evict -> hold (until the window ends or someone says `drain done`) -> validate ->
uncordon, and the next wave starts when it is done. Its pre-flight (`DRAIN_CHECKS`):
nodes with open findings left out unless named, the run's time at the pool's pace with
the hold against the window, and what else it touches; the budgets it meets are its own
notes (every pod it moves, not only GPU pods).

Nothing here reads the clock or the cluster: `now`, the fleet, the pods and the PDBs are
arguments.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from storage.step_params import EvictParams, HoldParams, WaitForParams
from workflows.drain import messages as say
from workflows.engine import check_pod
from workflows.engine.steps.eviction import DRAIN_PLAN_SCOPE
from workflows.fleet.assessment import UNPOOLED, NodeInventory
from workflows.fleet.summary import Fleet
from workflows.kube.objects import DisruptionBudget, NodeName, PodObject, PoolName
from workflows.plans import NodeStep, Plan, PlanSummary, plan_hash
from workflows.pools import messages as pool_say
from workflows.pools import planning
from workflows.pools.capacity import (
    CapacityCheck,
    ConcurrentWork,
    OpenRequest,
    check_drain,
    concurrent_work,
    pool_nodes,
)
from workflows.pools.config import PoolConfig
from workflows.preflight.budgets import PdbImpact, budget_impacts, budget_notes
from workflows.preflight.duration import DURATION_CHECK
from workflows.preflight.facts import Pace, PastRuns
from workflows.preflight.nodes import named_in_request, screen_nodes
from workflows.preflight.report import PLAN_CHECKS, PlanFacts, checked
from workflows.pools.windows import (
    END_OF_TIME,
    UTC,
    Occurrence,
    WindowSet,
    as_utc,
)

# How far ahead "what would fit" looks, and how many candidate times it tries.
FIT_SEARCH_HORIZON = dt.timedelta(days=28)
FIT_SEARCH_LIMIT = 500

StartFrom = Literal["now", "at", "next-window"]
# The pre-flight checks of a drain's plan: every one but the budgets', which its own notes
# name already (every pod a drain moves, not only GPU pods).
DRAIN_CHECKS = tuple(check for check in PLAN_CHECKS if check is not budget_notes)
# "May these nodes be out together from start to end?"
_CapacityQuestion = Callable[[Sequence[NodeName], dt.datetime, dt.datetime | None], CapacityCheck]


# ------------------------------------------------------------------ errors


class DrainError(Exception):
    """A drain that cannot be requested; `reason` is shown to the user verbatim."""

    def __init__(self, reason: str, *, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class DrainRefused(DrainError):
    """The request is readable but breaks the pool's policy. `code` names the rule
    (`windows`, `outside-window`, `window-too-short`, `past-time`, `unknown-node`,
    `max_unavailable`, `min_ready_gpus`); `fits_at` is the first time the same drain would be allowed,
    when one was found."""

    def __init__(self, reason: str, *, code: str, fits_at: dt.datetime | None = None,
                 check: CapacityCheck | None = None) -> None:
        super().__init__(reason, code=code)
        self.fits_at = fits_at
        self.check = check


# ------------------------------------------------------------------ plain values




@dataclass(frozen=True, slots=True, kw_only=True)
class DrainRequestSpec:
    """A drain as asked for: which nodes of which pool, when, for how long and why.
    Times are aware UTC; `end` None means until someone says `drain done`."""

    pool: PoolName
    nodes: tuple[NodeName, ...]
    whole_pool: bool
    start: dt.datetime
    end: dt.datetime | None
    duration: dt.timedelta | None  # as asked with `for`; None when not given
    start_from: StartFrom
    zone: dt.tzinfo  # the zone times are shown in to the requester
    reason: str
    # Nodes the request names (by name or `--include`): drained whatever their findings.
    include: tuple[NodeName, ...] = ()

    @property
    def targets(self) -> list[str]:
        return list(self.nodes)


# ------------------------------------------------------------------ reading the request


def next_window_start(windows: WindowSet, *, pool: str, now: dt.datetime,
                       duration: dt.timedelta | None) -> dt.datetime:
    if windows.never:
        raise DrainRefused(say.no_windows(pool), code="windows")
    if windows.always:
        return now
    if duration is None:
        found = windows.next_start(now)
        assert found is not None  # a pool with windows always has a next one
        return found
    for occurrence in windows.occurrences(now):
        if occurrence.start > now + FIT_SEARCH_HORIZON:
            break
        if occurrence.start >= now and occurrence.start + duration <= occurrence.end:
            return occurrence.start
    raise DrainRefused(say.no_window_long_enough(pool, duration=duration,
                                                 longest=windows.longest(now)),
                       code="window-too-short")


# ------------------------------------------------------------------ what was asked for


class DrainRequestError(DrainError):
    """What was asked for cannot be read: an unknown node or pool, nodes of several
    pools, a time in the past."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainAsk:
    """A drain as a person asked for it, before it is checked: the words of `/gpu drain`
    read by its grammar (commands/), or the drain form's fields. `targets` are node or
    pool names (`pool=<name>` names a pool); `at` is aware (for `start_from == "at"`);
    `zone` is the zone the person wrote the time in, None for the pool's."""

    targets: tuple[str, ...]
    start_from: StartFrom = "now"
    at: dt.datetime | None = None
    zone: dt.tzinfo | None = None
    duration: dt.timedelta | None = None
    reason: str = ""
    # Nodes with open findings to drain anyway (`--include`).
    include: tuple[str, ...] = ()


# Similarity above which an unknown name is taken for a misspelt node or pool.
TARGET_LIKENESS = 0.75


def pool_names(fleet: Fleet, pools: Mapping[str, PoolConfig]) -> list[str]:
    return sorted({p.name for p in fleet.pools if p.name != UNPOOLED} | set(pools))


def target_kind(word: str, *, fleet: Fleet, pools: Mapping[str, PoolConfig]) -> Literal["node", "pool"] | None:
    """Whether `word` names a GPU node or a pool (`pool=<name>` only a pool), or neither."""
    explicit_pool = word.lower().startswith("pool=")
    name = word[len("pool="):] if explicit_pool else word
    is_pool = name != UNPOOLED and (name in pools or fleet.pool(name) is not None)
    if explicit_pool:
        return "pool" if is_pool else None
    if name in fleet.nodes:
        return "node"
    return "pool" if is_pool else None


def unknown_drain_target(word: str, *, fleet: Fleet, pools: Mapping[str, PoolConfig]) -> DrainRequestError:
    """The refusal for a word that names no node or pool, with the closest names."""
    explicit_pool = word.lower().startswith("pool=")
    name = word[len("pool="):] if explicit_pool else word
    candidates = pool_names(fleet, pools) if explicit_pool else sorted(set(fleet.nodes) | set(pool_names(fleet, pools)))
    closest = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    return DrainRequestError(say.no_node_or_pool_named(name, closest=closest, pool=explicit_pool), code="unknown-target")


def looks_like_a_target(word: str, *, fleet: Fleet, pools: Mapping[str, PoolConfig]) -> bool:
    """An unknown word close enough to a node or pool name to be a misspelling of one."""
    explicit_pool = word.lower().startswith("pool=")
    name = word[len("pool="):] if explicit_pool else word
    candidates = pool_names(fleet, pools) if explicit_pool else sorted(set(fleet.nodes) | set(pool_names(fleet, pools)))
    return explicit_pool or bool(difflib.get_close_matches(name, candidates, n=1, cutoff=TARGET_LIKENESS))


def resolve_drain_targets(targets: Sequence[str], *, fleet: Fleet,
                    pools: Mapping[str, PoolConfig]) -> tuple[PoolName, tuple[NodeName, ...], bool]:
    """The one configured pool the targets are in, their nodes (a pool's: all its GPU
    nodes) in order, and whether a whole pool was named. Raises `DrainRequestError`."""
    nodes: list[NodeName] = []
    pool_of: dict[NodeName, PoolName] = {}
    whole_pool = False
    for word in targets:
        kind = target_kind(word, fleet=fleet, pools=pools)
        if kind is None:
            raise unknown_drain_target(word, fleet=fleet, pools=pools)
        name = word[len("pool="):] if word.lower().startswith("pool=") else word
        if kind == "pool":
            whole_pool = True
            found = fleet.pool(name)
            members = found.nodes if found is not None else ()
            if not members:
                raise DrainRequestError(say.empty_pool(name), code="empty-pool")
            for node in members:
                pool_of[node] = PoolName(name)
                if node not in nodes:
                    nodes.append(node)
        else:
            node = NodeName(name)
            pool_of[node] = fleet.nodes[node].pool
            if node not in nodes:
                nodes.append(node)
    if not nodes:
        raise DrainRequestError(say.nothing_named_to_drain(), code="missing-target")
    by_pool: dict[PoolName, list[NodeName]] = {}
    for node in nodes:
        by_pool.setdefault(pool_of[node], []).append(node)
    if len(by_pool) > 1:
        raise DrainRequestError(say.mixed_pools(by_pool), code="mixed-pools")
    (pool,) = by_pool
    if pool == UNPOOLED:
        raise DrainRequestError(say.node_in_no_pool(by_pool[pool]), code="unconfigured-pool")
    if pool not in pools:
        raise DrainRequestError(pool_say.no_drain_policy(pool), code="unconfigured-pool")
    return pool, tuple(nodes), whole_pool


def drain_spec(ask: DrainAsk, *, fleet: Fleet, pools: Mapping[str, PoolConfig], now: dt.datetime) -> DrainRequestSpec:
    """What `ask` means now: its pool and nodes, when it starts and ends. Raises
    `DrainRequestError` (unknown target, mixed pools, a time in the past) or
    `DrainRefused` (`next-window` finds no window long enough)."""
    now = as_utc(now, asker="drains")
    pool, nodes, whole_pool = resolve_drain_targets(ask.targets, fleet=fleet, pools=pools)
    windows = pools[pool].window_set
    zone: dt.tzinfo = ask.zone or windows.zone or UTC
    if ask.start_from == "next-window":
        start = next_window_start(windows, pool=pool, now=now, duration=ask.duration)
    elif ask.start_from == "at":
        if ask.at is None:
            raise ValueError("a drain asked for `at` a time needs that time")
        start = as_utc(ask.at, asker="drains")
        if start < now:
            raise DrainRequestError(say.time_in_past(start, zone=zone, now=now), code="past-time")
    else:
        start = now
    if ask.duration is not None:
        end: dt.datetime | None = start + ask.duration
    else:
        occurrence = windows.occurrence_containing(start)
        end = None if occurrence is None or occurrence.end == END_OF_TIME else occurrence.end
    return DrainRequestSpec(pool=pool, nodes=nodes, whole_pool=whole_pool, start=start, end=end,
                            duration=ask.duration, start_from=ask.start_from, zone=zone, reason=ask.reason,
                            include=tuple(NodeName(n) for n in named_in_request(ask.include, ask.targets,
                                                                                 fleet=fleet)))


# ------------------------------------------------------------------ the plan


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """A pod the drain will move off a node."""

    namespace: str
    name: str
    gpus: int
    owner: str | None  # the controller's kind, e.g. Job, StatefulSet; None for a bare pod
    waited_for: bool  # matches the pool's wait_for selector: waited for before eviction
    pdbs: tuple[str, ...]  # namespace/name of the PDBs that select it

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class NodePreview:
    node: NodeName
    wave: int
    gpus: int  # advertised now
    already_cordoned: bool  # stays cordoned after the drain: gpuops did not cordon it
    workloads: tuple[WorkloadView, ...]


@dataclass(frozen=True, slots=True)
class WaveCapacity:
    """The pool while one wave is out (counting overlapping requests at their worst)."""

    index: int
    nodes: tuple[NodeName, ...]
    gpus_out: int  # advertised GPUs of the wave's nodes
    unavailable_nodes: int
    ready_gpus: int
    advertised_gpus: int


@dataclass(frozen=True, slots=True)
class DrainPreview:
    pool: str
    window: Occurrence | None  # the window occurrence the drain runs in; None for `always`
    pool_nodes: int
    allowed_unavailable: int
    ready_gpus_now: int
    advertised_gpus_now: int
    min_ready_gpus: int
    nodes: tuple[NodePreview, ...]
    pdbs: tuple[PdbImpact, ...]
    waves: tuple[WaveCapacity, ...]

    @property
    def workloads(self) -> tuple[WorkloadView, ...]:
        return tuple(w for n in self.nodes for w in n.workloads)


@dataclass(frozen=True, slots=True)
class DrainPlan:
    spec: DrainRequestSpec
    plan: Plan
    preview: DrainPreview

    @property
    def plan_hash(self) -> str:
        return plan_hash(self.plan)


def evicted_pods(pods: Sequence[PodObject]) -> tuple[PodObject, ...]:
    """The pods `all-non-daemonset` eviction moves: not DaemonSet pods, not mirror
    (static) pods, not finished and not already being deleted."""
    return tuple(
        pod for pod in sorted(pods, key=lambda p: (p.namespace, p.name))
        if not pod.deleting
        and pod.phase not in ("Succeeded", "Failed")
        and (pod.controller is None or pod.controller.kind not in ("DaemonSet", "Node"))
        and "kubernetes.io/config.mirror" not in pod.annotations
    )


def plan_drain(
    spec: DrainRequestSpec,
    *,
    fleet: Fleet,
    pods_by_node: Mapping[NodeName, Sequence[PodObject]],
    policy: PoolConfig,
    open_requests: Sequence[OpenRequest],
    now: dt.datetime,
    requested_by: str,
    pdbs: Sequence[DisruptionBudget] = (),
    replacing: str | None = None,
    runs_ending: Mapping[str, dt.datetime | None] | None = None,
    past_runs: PastRuns | None = None,
) -> DrainPlan:
    """Check `spec` against the pool's policy and plan it in waves. Raises
    `DrainRefused` naming the rule that fails and what would fit. `replacing` is the id
    of a request this plan replaces (it does not count against itself). `runs_ending`:
    the pool's running runs and when their windows end (None: not before `drain done`);
    a node one of them cordoned counts as back in service from its run's end on, so a
    drain asked for later is not refused for a cordon that will be gone by then (the
    engine checks the pool again when the drain starts, and waits if it is not).
    `past_runs` reads the pool's pace, which the pre-flight times the run at."""
    now = as_utc(now, asker="drains")
    windows = policy.window_set
    members = pool_nodes(fleet, spec.pool)
    concurrent = concurrent_work(open_requests, pool=spec.pool, exclude=replacing)
    budget = policy.unavailable_budget
    ending = runs_ending or {}

    def back_by(start: dt.datetime) -> frozenset[NodeName]:
        """Nodes out now only because a run holds them that will have ended by `start`."""
        return frozenset(
            n.name for n in members
            if n.cordoned and n.ready is True and n.cordon_run is not None and not n.cordoned_before_run
            and (end := ending.get(n.cordon_run)) is not None and end <= start)

    def capacity(nodes: Sequence[NodeName], start: dt.datetime, end: dt.datetime | None) -> CapacityCheck:
        return check_drain(pool=spec.pool, pool_nodes=members, nodes=nodes, start=start, end=end,
                           max_unavailable=budget, min_ready_gpus=policy.min_ready_gpus,
                           concurrent=concurrent, back_in_service=back_by(start))

    def first_fit() -> dt.datetime | None:
        return _first_fit(spec, windows=windows, concurrent=concurrent, capacity=capacity)

    # Gate: an asked-for time is not in the past ("now" drains start when they can).
    if spec.start_from != "now" and spec.start < now:
        raise DrainRefused(say.time_in_past(spec.start, zone=spec.zone, now=now), code="past-time")
    # Gate: every node is still in the inventory and in the pool.
    strays = [n for n in spec.nodes if n not in fleet.nodes or fleet.nodes[n].pool != spec.pool]
    if strays:
        raise DrainRefused(say.nodes_left_pool(strays, pool=spec.pool), code="unknown-node")
    # Pre-flight: a node with open findings is drained only when the request names it.
    screened = screen_nodes([fleet.nodes[n] for n in spec.nodes], fleet=fleet, kind="drain", pool=spec.pool,
                            include=spec.include, refused=DrainRefused)
    spec = dataclasses.replace(spec, nodes=tuple(n.name for n in screened.kept))
    # Gate: the pool allows drains at some time.
    if windows.never:
        raise DrainRefused(say.no_windows(spec.pool), code="windows")
    # Gate: the drain starts inside a window and ends before it does.
    occurrence = windows.occurrence_containing(spec.start)
    if occurrence is None:
        fits_at = first_fit()
        raise DrainRefused(say.outside_window(spec.start, pool=spec.pool, windows=windows,
                                              zone=spec.zone, fits_at=fits_at,
                                              duration=spec.duration),
                           code="outside-window", fits_at=fits_at)
    if spec.end is not None and not windows.fits(spec.start, spec.end - spec.start):
        fits_at = first_fit()
        raise DrainRefused(say.window_too_short(spec.start, spec.end, pool=spec.pool,
                                                window_end=occurrence.end, zone=spec.zone,
                                                fits_at=fits_at),
                           code="window-too-short", fits_at=fits_at)
    # Gate: every node can be out on its own (waves can always be one node).
    for node in spec.nodes:
        alone = capacity([node], spec.start, spec.end)
        if not alone.ok:
            fits_at = first_fit()
            raise DrainRefused(say.capacity_refused(alone, zone=spec.zone, fits_at=fits_at),
                               code=alone.refusals[0].rule, fits_at=fits_at, check=alone)

    # Waves: in order, each as large as both capacity rules allow.
    waves: list[list[NodeName]] = []
    checks: list[CapacityCheck] = []
    for node in spec.nodes:
        if waves:
            grown = capacity([*waves[-1], node], spec.start, spec.end)
            if grown.ok:
                waves[-1].append(node)
                checks[-1] = grown
                continue
        waves.append([node])
        checks.append(capacity([node], spec.start, spec.end))

    pods = {node: evicted_pods(pods_by_node.get(node, ())) for node in spec.nodes}
    wait_for = policy.wait_for_selector
    waited = {node: tuple(p for p in pods[node] if wait_for is not None and wait_for.matches(p.labels))
              for node in spec.nodes}
    window = None if occurrence.end == END_OF_TIME else occurrence
    plan_waves = planning.waves(waves, lambda node: _node_steps(fleet.nodes[node], policy=policy, end=spec.end,
                                                                waits=bool(waited[node])))
    wave_of = {node: index for index, nodes in enumerate(waves) for node in nodes}
    preview = _preview(spec, fleet=fleet, members=members, pods=pods, waited=waited, pdbs=pdbs,
                       waves=waves, checks=checks, wave_of=wave_of, window=window, policy=policy)
    summary = PlanSummary(
        window_start=planning.planned_start(spec.start, now=now),
        window_end=spec.end,
        evictions_expected=len(preview.workloads),
        max_gpus_unavailable=max((w.gpus_out for w in preview.waves), default=0),
        notes=_notes(spec, preview=preview, policy=policy),
    )
    plan = planning.assemble("drain", pool=spec.pool, planned=plan_waves, summary=summary,
                             requested_by=requested_by)
    pace = past_runs(spec.pool) if past_runs is not None else Pace()
    plan = checked(plan, PlanFacts(fleet=fleet, policy=policy, past=pace.steps, parallel=pace.parallel),
                   before=screened.notes, checks=DRAIN_CHECKS)
    return DrainPlan(spec=spec, plan=plan, preview=preview)


def extended_plan(plan: Plan, window_end: dt.datetime) -> Plan:
    """`plan` with a later window end for a running drain: the same waves and steps (the
    run's hold steps take the new end from their `extended_until` control), only the
    summary's end changes, and with it the plan's hash that approvers approve. The
    pre-flight's timing of the run, which named the old end, is left out (the run is under
    way: nothing reads its pace again)."""
    preflight = tuple(n for n in plan.summary.preflight if n.check != DURATION_CHECK)
    return dataclasses.replace(plan, summary=dataclasses.replace(plan.summary, window_end=window_end,
                                                                 preflight=preflight))


def _first_fit(spec: DrainRequestSpec, *, windows: WindowSet, concurrent: Sequence[ConcurrentWork],
               capacity: _CapacityQuestion) -> dt.datetime | None:
    """The first time at or after the requested start when this drain (same nodes, same
    length, or the rest of its window) would pass every gate: a window start, or the
    moment an overlapping request ends."""
    if windows.never:
        return None
    horizon = spec.start + FIT_SEARCH_HORIZON
    candidates: set[dt.datetime] = {spec.start}
    for occurrence in windows.occurrences(spec.start):
        if occurrence.start > horizon:
            break
        candidates.add(max(occurrence.start, spec.start))
        if occurrence.end == END_OF_TIME:
            break
    for work in concurrent:
        if work.end is not None and spec.start <= work.end <= horizon:
            candidates.add(work.end)
    for at in sorted(candidates)[:FIT_SEARCH_LIMIT]:
        containing = windows.occurrence_containing(at)
        if containing is None:
            continue
        if spec.duration is not None:
            if not windows.fits(at, spec.duration):
                continue
            end: dt.datetime | None = at + spec.duration
        else:
            end = None if containing.end == END_OF_TIME else containing.end
        if all(capacity([node], at, end).ok for node in spec.nodes):
            return at
    return None


def _node_steps(node: NodeInventory, *, policy: PoolConfig, end: dt.datetime | None,
                waits: bool) -> list[NodeStep]:
    steps = [planning.cordon(node), *(planning.wait_for_jobs(node, policy) if waits else ())]
    steps += [
        NodeStep.of("evict", node.name, EvictParams(
            scope=DRAIN_PLAN_SCOPE,
            pdb_timeout_s=int(policy.drain_timeout.total_seconds()),
            pdb_timeout_action=policy.pdb_timeout_action,
        )),
        NodeStep.of("hold", node.name, _hold_params(end, policy)),
        NodeStep.of("validate", node.name, WaitForParams(
            node_ready=True,
            device_plugin_ready=True,
            validator_ready=True,
            advertised_gpus=_gpus_to_expect(node),
            timeout_s=int(policy.validate_timeout.total_seconds()),
        )),
        # A pool's diag check (and burn-in) runs before the node is given back.
        *check_pod.check_steps(node.name, policy.gpu_check),
        # A node that was cordoned before (by a person) stays cordoned.
        planning.uncordon(node),
    ]
    return steps


def _hold_params(end: dt.datetime | None, policy: PoolConfig) -> HoldParams:
    """Until the window's (or `for`'s) end; with no end, until `drain done` (`until`
    None), at most the pool's `open_drain_max` when it sets one."""
    if end is not None:
        return HoldParams(until=end, released_by="drain done")
    at_most = int(policy.open_drain_max.total_seconds()) if policy.open_drain_max is not None else None
    return HoldParams(open_ended=True, at_most_s=at_most, released_by="drain done")


def _gpus_to_expect(node: NodeInventory) -> int:
    """Every physical GPU (times its replicas), as GFD's labels say; what the node
    advertises now when the labels say nothing."""
    expected = node.expected_advertised
    return expected if expected is not None else node.advertised_gpus


def _preview(spec: DrainRequestSpec, *, fleet: Fleet, members: Sequence[NodeInventory],
             pods: Mapping[NodeName, tuple[PodObject, ...]],
             waited: Mapping[NodeName, tuple[PodObject, ...]], pdbs: Sequence[DisruptionBudget],
             waves: list[list[NodeName]], checks: list[CapacityCheck], wave_of: Mapping[NodeName, int],
             window: Occurrence | None, policy: PoolConfig) -> DrainPreview:
    node_views = []
    for node in spec.nodes:
        inventory = fleet.nodes[node]
        workloads = tuple(
            WorkloadView(
                namespace=pod.namespace,
                name=pod.name,
                gpus=sum(pod.gpu_requests.values()),
                owner=pod.controller.kind if pod.controller else None,
                waited_for=pod in waited[node],
                pdbs=tuple(p.ref for p in pdbs if p.selects(pod)),
            )
            for pod in pods[node]
        )
        node_views.append(NodePreview(node=node, wave=wave_of[node], gpus=inventory.advertised_gpus,
                                      already_cordoned=inventory.cordoned, workloads=workloads))
    impacts = budget_impacts(waves, pods, pdbs)
    advertised_now = sum(n.advertised_gpus for n in members)
    wave_views = tuple(
        WaveCapacity(
            index=index,
            nodes=tuple(nodes),
            gpus_out=sum(fleet.nodes[n].advertised_gpus for n in nodes),
            unavailable_nodes=check.unavailable_during,
            ready_gpus=check.ready_gpus_during,
            advertised_gpus=advertised_now - sum(fleet.nodes[n].advertised_gpus for n in nodes),
        )
        for index, (nodes, check) in enumerate(zip(waves, checks))
    )
    first = checks[0]
    return DrainPreview(pool=spec.pool, window=window, pool_nodes=len(members),
                        allowed_unavailable=first.allowed_unavailable,
                        ready_gpus_now=first.ready_gpus_now, advertised_gpus_now=advertised_now,
                        min_ready_gpus=policy.min_ready_gpus, nodes=tuple(node_views),
                        pdbs=tuple(impacts), waves=wave_views)


def _notes(spec: DrainRequestSpec, *, preview: DrainPreview, policy: PoolConfig) -> tuple[str, ...]:
    notes = [say.note_waves(len(preview.waves), largest=max(len(w.nodes) for w in preview.waves),
                            end=spec.end, zone=spec.zone,
                            at_most=policy.open_drain_max if spec.end is None else None)]
    for node in preview.nodes:
        if node.already_cordoned:
            notes.append(say.note_stays_cordoned(node.node))
    for impact in preview.pdbs:
        if impact.may_block:
            notes.append(say.note_pdb_may_block(impact.ref, allowed=impact.disruptions_allowed,
                                                needed=impact.most_in_one_wave,
                                                timeout=policy.drain_timeout,
                                                action=policy.pdb_timeout_action))
    waiting = [w for w in preview.workloads if w.waited_for]
    if waiting and policy.wait_for is not None:
        notes.append(say.note_waits_for(len(waiting), selector=policy.wait_for.selector,
                                        timeout=policy.wait_for.timeout))
    return tuple(notes)


# ------------------------------------------------------------------ what has been drained


