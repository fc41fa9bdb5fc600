"""A MIG layout change of a pool's nodes, planned as the capacity change it is.

The layout each node takes is checked against the MIG manager's own config (`layouts`:
the name, an entry for every GPU, the profiles the GPU model makes) and against the
pool's MIG strategy; the plan says per resource what each node and the pool advertise
before and after (`8x nvidia.com/gpu -> 56x nvidia.com/mig-1g.10gb`), which GPU pods are
evicted, and which workloads ask for resources no node will advertise afterwards (they
will not schedule). The capacity floor (`min_ready_gpus`) is checked in the units the
pool has at each point: a node counts with its new resources from the wave after its own,
and the pool must still meet the floor once every node has changed.

Per node: cordon (a person's cordon is kept), wait for the pool's `wait_for` jobs, evict GPU pods (PDB-respecting, the pool's
drain timeout and action), set `nvidia.com/mig.config` and wait for the MIG manager's
`success` and for the node to advertise what the layout makes (`mig`, within the pool's
`mig_timeout`; `failed` or the timeout halts the run, naming the operands still paused),
validate, uncordon. The first node goes alone, so a layout that fails halts the run
before more nodes go. A rollback plans each node's prior layout back, taking over the
cordon the run left."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from workflows.engine import check_pod
from workflows.fleet.assessment import NodeInventory
from workflows.fleet.summary import Fleet
from workflows.kube.objects import DisruptionBudget, NodeName, PodObject
from workflows.mig import messages as say
from workflows.mig.layouts import MigLayouts, MigRefused, resources
from workflows.mig.step_logic import MigParams
from workflows.plans import NodeStep, Plan, PlanSummary
from workflows.pools import messages as pool_say
from workflows.pools import planning
from workflows.pools.capacity import PodsMoved, RollingOrder, gpu_pods_moved, is_unavailable, ready_gpus
from workflows.pools.config import PoolConfig
from workflows.pools.selectors import LabelSelector
from workflows.preflight.nodes import named_in_request, screen_nodes
from workflows.preflight.facts import Pace, PastRuns, QuotaReading
from workflows.preflight.report import PlanFacts, checked

DEFAULT_LAYOUT = "all-disabled"  # the MIG manager's layout for a node without the label


@dataclass(frozen=True, slots=True)
class MigAsk:
    # A pool's name, or node names of one pool.
    targets: tuple[str, ...]
    layout: str
    reason: str = ""
    start: dt.datetime | None = None
    next_window: bool = False
    # Nodes with open findings the change does not fix, changed anyway (`--include`).
    include: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MigRollbackOf:
    """What a rollback undoes: the run, and each node it changed (the failed one first)
    with the layout it had before."""

    run: str
    layouts: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class NodeChange:
    node: NodeName
    layout: str
    before: Mapping[str, int]
    after: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Workload:
    """A pod that asks for a resource that goes away, and what owns it."""

    pod: str  # namespace/name
    owner: str | None  # "Deployment x", "Job y" (a ReplicaSet named as its Deployment)
    resources: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MigPlan:
    pool: str
    changes: tuple[NodeChange, ...]
    pool_before: Mapping[str, int]
    pool_after: Mapping[str, int]
    # Resources no GPU node of the cluster advertises once the change is done.
    vanishing: tuple[str, ...]
    stranded: tuple[Workload, ...]
    moved: Mapping[str, PodsMoved]  # node -> the GPU pods it waits for and evicts
    order: RollingOrder
    plan: Plan
    window_start: dt.datetime
    window_end: dt.datetime | None


def plan_mig(ask: MigAsk, *, fleet: Fleet, policy_of: Mapping[str, PoolConfig], layouts: MigLayouts,
             strategy: str | None, now: dt.datetime, requested_by: str, gpu_pods: Sequence[PodObject] = (),
             rollback: MigRollbackOf | None = None, budgets: Sequence[DisruptionBudget] = (),
             past_runs: PastRuns | None = None, quotas: QuotaReading = QuotaReading()) -> MigPlan:
    """Plan `ask` for `requested_by`, or raise MigRefused saying why not. `gpu_pods` are
    the cluster's pods that ask for GPU resources (to name what is evicted and what will
    not schedule afterwards), `budgets` the PodDisruptionBudgets of their namespaces;
    `strategy` the ClusterPolicy's `mig.strategy`. Nodes with open findings the change
    does not fix are left out unless the ask names them (a rollback's are not). `quotas`:
    the namespaces' GPU quotas, to name those the change would no longer fit."""
    targets = ask.targets if rollback is None else tuple(n for n, _ in rollback.layouts)
    pool, nodes = planning.targets_in_one_pool(targets, fleet, what="MIG change", refused=MigRefused)
    policy = planning.require_policy(pool, policy_of.get(pool), refused=MigRefused, rule=say.ONLY_CONFIGURED)
    wanted = dict(rollback.layouts) if rollback is not None else {n.name: ask.layout for n in nodes}
    changes: list[NodeChange] = []
    already: list[str] = []
    for node in nodes:
        layout = wanted[node.name]
        if not node.mig.capable:
            raise MigRefused(say.not_mig_capable(node.name, node.product), code="not-mig-capable")
        if node.mig.in_progress and rollback is None:  # a rollback may ask a wedged node back
            raise MigRefused(say.mig_change_under_way(node.name, node.mig.config, node.mig.config_state),
                             code="mig-in-progress")
        if rollback is None and node.mig.config == layout and node.mig.config_state == "success":
            already.append(node.name)
            continue
        gpus = _physical_gpus(node, layouts)
        applied = layouts.apply(layout, product=node.product, gpus=gpus)
        changes.append(NodeChange(node=node.name, layout=layout, before=_advertised(node),
                                  after=resources(applied, strategy=strategy, layout=layout)))
    if not changes:
        raise MigRefused(say.nothing_to_change(ask.layout, already), code="nothing-to-change")
    screened = None
    if rollback is None:
        screened = screen_nodes([fleet.nodes[c.node] for c in changes], fleet=fleet, kind="mig", pool=pool,
                                include=named_in_request(ask.include, ask.targets, fleet=fleet),
                                canary=policy.canary, refused=MigRefused)
        kept = {n.name for n in screened.kept}
        changes = [c for c in changes if c.node in kept]
    start, end = planning.window(policy, pool=pool, now=now, at=ask.start, next_window=ask.next_window,
                                 what="MIG change", refused=MigRefused)

    members = planning.members(fleet, pool)
    changing = {c.node: c for c in changes}
    after_ready: dict[str, int] = {c.node: sum(c.after.values()) for c in changes}
    first = rollback.layouts[0][0] if rollback is not None else (
        policy.canary if policy.canary in changing else None)
    order = planning.rolling_order([fleet.nodes[n] for n in changing], pool=members,
                                   budget=policy.unavailable_budget, canary=first,
                                   min_ready_gpus=policy.min_ready_gpus, what="MIG change", refused=MigRefused,
                                   ready_after=after_ready)
    ready_in_the_end = sum(after_ready.get(n.name, ready_gpus(n)) if not is_unavailable(n) else 0 for n in members)
    if ready_in_the_end < policy.min_ready_gpus:
        raise MigRefused(say.below_floor_after(pool, ready_in_the_end, policy.min_ready_gpus), code="min-ready-gpus")

    pool_before = _total(_advertised(n) for n in members)
    pool_after = _total(changing[n.name].after if n.name in changing else _advertised(n) for n in members)
    cluster_after = _total(changing[n.name].after if n.name in changing else _advertised(n)
                           for n in fleet.nodes.values())
    vanishing = tuple(sorted(r for r in _total(c.before for c in changes) if not cluster_after.get(r)))
    stranded = _stranded(gpu_pods, vanishing)
    wait_for = LabelSelector.parse(policy.wait_for.selector).matches if policy.wait_for is not None else None
    moved: dict[str, PodsMoved] = {c.node: gpu_pods_moved(gpu_pods, c.node, wait_for=wait_for) for c in changes}

    takes_over = rollback.run if rollback is not None else None
    by_name = {n.name: n for n in members}
    waves = planning.rolling_waves(order, lambda n: _node_steps(by_name[n], changing[n], policy=policy,
                                                                takes_over=takes_over))
    layouts_named = sorted({c.layout for c in changes})
    notes = [say.pool_change_note(pool, pool_before, pool_after), *say.node_change_notes(changes),
             say.first_alone_note(order.canary)]
    notes += pool_say.pods_moved_note(moved)
    if strategy == "single":
        notes.append(say.single_strategy_note())
    if vanishing:
        notes.append(say.vanishing_note(vanishing, stranded))
    if already:
        notes.append(say.already_there_note(already, ask.layout))
    if rollback is not None:
        notes.append(say.layouts_back_note(rollback.run, [(c.node, c.layout) for c in changes]))
    largest = planning.largest_wave(waves, lambda n: ready_gpus(by_name[n]))
    summary = PlanSummary(target_mig_config=layouts_named[0] if len(layouts_named) == 1 else None,
                          window_start=planning.planned_start(start, now=now), window_end=end,
                          evictions_expected=sum(len(m.evicted) for m in moved.values()),
                          max_gpus_unavailable=largest, notes=tuple(notes))
    plan = planning.assemble("mig", pool=pool, planned=waves, summary=summary, requested_by=requested_by)
    pace = past_runs(pool) if past_runs is not None else Pace()
    plan = checked(plan, PlanFacts(fleet=fleet, policy=policy, gpu_pods=gpu_pods, budgets=budgets,
                                   past=pace.steps, parallel=pace.parallel, quotas=quotas.limits,
                                   quotas_unread=quotas.unread),
                   before=screened.notes if screened is not None else ())
    return MigPlan(pool=pool, changes=tuple(changes), pool_before=pool_before, pool_after=pool_after,
                   vanishing=vanishing, stranded=stranded, moved=moved, order=order, plan=plan,
                   window_start=start, window_end=end)


def _physical_gpus(node: NodeInventory, layouts: MigLayouts) -> int:
    """The node's GPUs. Under the single strategy with MIG on, GFD counts MIG devices:
    the GPUs are then the count the node's current layout makes that many devices of."""
    if node.physical_gpus is not None:
        return node.physical_gpus
    devices = sum(_advertised(node).values())
    current = node.mig.config
    if current is not None and current in layouts.layouts and devices:
        for gpus in range(1, 17):
            try:
                made = layouts.apply(current, product=node.product, gpus=gpus)
            except MigRefused:
                break
            if sum(made.profiles.values()) == devices:
                return gpus
    raise MigRefused(say.gpu_count_unknown(node.name, current), code="gpu-count-unknown")


def _advertised(node: NodeInventory) -> dict[str, int]:
    return {r.resource: r.capacity for r in node.resources if r.capacity}


def _total(each: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for found in each:
        for resource, count in found.items():
            total[resource] = total.get(resource, 0) + count
    return total


def _stranded(pods: Sequence[PodObject], vanishing: Sequence[str]) -> tuple[Workload, ...]:
    found = []
    for pod in pods:
        asked = tuple(sorted(r for r in pod.gpu_requests if r in vanishing))
        if asked and not pod.deleting and pod.phase not in ("Succeeded", "Failed"):
            found.append(Workload(pod=f"{pod.namespace}/{pod.name}", owner=_owner(pod), resources=asked))
    return tuple(sorted(found, key=lambda w: w.pod))


def _owner(pod: PodObject) -> str | None:
    controller = pod.controller
    if controller is None:
        return None
    if controller.kind == "ReplicaSet" and "-" in controller.name:
        return f"Deployment {controller.name.rsplit('-', 1)[0]}"
    return f"{controller.kind} {controller.name}"


def _node_steps(node: NodeInventory, change: NodeChange, *, policy: PoolConfig,
                takes_over: str | None) -> list[NodeStep]:
    return [
        planning.cordon(node, takes_over=takes_over),
        *planning.wait_for_jobs(node, policy),
        planning.evict_gpu_pods(node, policy),
        NodeStep.of("mig", node.name, MigParams(config=change.layout, expect=dict(change.after),
                                                timeout_s=int(policy.mig_timeout.total_seconds()))),
        planning.validate(node, policy),
        # A pool's diag check (and burn-in) runs on the new devices, once every one is advertised.
        *check_pod.check_steps(node.name, policy.gpu_check, resources=change.after),
        planning.uncordon(node),
    ]
