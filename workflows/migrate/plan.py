"""Moving nodes of a pool from a host-installed driver to the GPU Operator (or back),
planned.

A node moves to the operator when its driver is a host driver (or a host driver and the
operator's both: the move ends the conflict), and to the host when the operator's driver
is its driver; nodes already there are left out; a node with no driver or an owner
gpuops cannot tell is refused with its evidence. The plan names, per node, the owner and
its evidence, the label that changes (`nvidia.com/gpu.deploy.driver` -> true, or ->
pre-installed), the labels people set by hand (removed on the way in, for GFD to publish
its own), and the one step a person must do.

Per node, one at a time unless the pool's `migrate_at_once` says more (the first node
always alone): snapshot (labels, annotations, taints: what a rollback puts back), cordon
(a person's cordon is kept), wait for the pool's `wait_for` jobs, evict GPU pods, wait
for a person to remove the host driver and confirm it (or, with the pool's
`host_driver_evidence`, for the node to show it gone; audited), set the operator's deploy
label and remove the hand-set ones, wait for the operator's driver pod and the validator,
run the test pod (the pool's `gpu_check`, else the default: one GPU, `nvidia-smi`), wait
until every GPU is advertised, uncordon. To the host: the deploy label first, wait until
the operator's driver pod is gone, wait for a person to install the host driver and
confirm (or the node's evidence), wait for the driver and validator, the test pod, every
GPU, uncordon. A rollback restores each moved node's snapshot in one step (the hand-set
labels too) and leaves it cordoned for the host driver to go back on."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from storage.step_params import StepParams, WaitForParams
from workflows.engine.check_pod import burn_in_params
from workflows.engine.check_pod import params_for as check_params
from workflows.fleet.assessment import NodeInventory
from workflows.fleet.summary import Fleet
from workflows.kube.labels import LABEL_DEPLOY_DRIVER, LABEL_DEPLOY_PREFIX
from workflows.kube.objects import DisruptionBudget, PodObject
from workflows.migrate import messages as say
from workflows.migrate.step_logic import HostDriverParams, NodeLabelsParams, RestoreParams
from workflows.plans import NodeStep, Plan, PlanSummary
from workflows.pools import messages as pool_say
from workflows.pools import planning
from workflows.pools.capacity import MaxUnavailable, RollingOrder, gpu_pods_moved, ready_gpus
from workflows.pools.config import GpuCheck, PoolConfig
from workflows.pools.selectors import LabelSelector
from workflows.preflight.check import canary_refusal
from workflows.preflight.facts import Pace, PastRuns
from workflows.preflight.nodes import named_in_request, screen_nodes
from workflows.preflight.report import PlanFacts, checked

# The driver owners a node may have to move, by direction (both: the move ends the race).
MOVABLE = {"operator": ("host", "conflict"), "host": ("operator", "conflict")}
# What the operator's deploy label says in each direction.
DEPLOY_VALUE = {"operator": "true", "host": "pre-installed"}
DEFAULT_CHECK = GpuCheck()


class MigrateRefused(Exception):
    def __init__(self, reason: str, *, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class MigrateAsk:
    targets: tuple[str, ...]  # a pool's name, or nodes of one pool
    to: Literal["operator", "host"] = "operator"
    reason: str = ""
    start: dt.datetime | None = None
    next_window: bool = False
    # Nodes with open findings the move does not fix, moved anyway (`--include`).
    include: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MigrateRollbackOf:
    """What a rollback undoes: the run, and per node it changed the snapshot it took
    (labels and taints) and the labels it set."""

    run: str
    snapshots: tuple[tuple[str, Mapping[str, Any]], ...]  # (node, snapshot intent)
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MigratePlan:
    pool: str
    nodes: tuple[str, ...]
    order: RollingOrder
    plan: Plan
    window_start: dt.datetime
    window_end: dt.datetime | None


def plan_migrate(ask: MigrateAsk, *, fleet: Fleet, policy_of: Mapping[str, PoolConfig], now: dt.datetime,
                 requested_by: str, gpu_check: GpuCheck | None = None, gpu_pods: Sequence[PodObject] = (),
                 hand_set: Mapping[str, Mapping[str, tuple[str, str]]] | None = None,
                 rollback: MigrateRollbackOf | None = None,
                 budgets: Sequence[DisruptionBudget] = (), past_runs: PastRuns | None = None) -> MigratePlan:
    """Plan `ask` for `requested_by`, or raise MigrateRefused saying why not. `hand_set`:
    per node, the discovery labels people set (`kube.labels.hand_set_labels`); a move to
    the operator removes them so GFD publishes what it finds, and a rollback puts them back.
    `budgets`: the PodDisruptionBudgets of the GPU pods' namespaces. Nodes with open
    findings the move does not fix are left out unless the ask names them (a rollback's are not)."""
    targets = ask.targets if rollback is None else tuple(n for n, _ in rollback.snapshots)
    pool, nodes = planning.targets_in_one_pool(targets, fleet, what="move to the operator", refused=MigrateRefused)
    policy = planning.require_policy(pool, policy_of.get(pool), refused=MigrateRefused, rule=say.ONLY_CONFIGURED)
    moving: list[NodeInventory] = []
    already: list[str] = []
    for node in nodes:
        if rollback is not None or node.driver.owner in MOVABLE[ask.to]:
            moving.append(node)
        elif node.driver.owner == ask.to:
            already.append(node.name)
        else:
            raise MigrateRefused(say.cannot_move(node.name, node.driver.owner, node.driver.evidence, ask.to),
                                 code="not-movable")
    if not moving:
        raise MigrateRefused(say.nothing_to_move(already, ask.to), code="nothing-to-move")
    screened = None
    if rollback is None:
        screened = screen_nodes(moving, fleet=fleet, kind="migrate", pool=pool,
                                include=named_in_request(ask.include, ask.targets, fleet=fleet),
                                refused=MigrateRefused)
        moving = list(screened.kept)
    start, end = planning.window(policy, pool=pool, now=now, at=ask.start, next_window=ask.next_window,
                                 what="move to the operator", refused=MigrateRefused)
    members = planning.members(fleet, pool)
    first = rollback.snapshots[0][0] if rollback is not None else None
    # Each node needs a person at it: `migrate_at_once` (1 unless the pool says more),
    # never above max_unavailable.
    allowed = policy.unavailable_budget.allowed(len(members))
    budget = MaxUnavailable(count=min(policy.migrate_at_once, allowed)) if allowed else policy.unavailable_budget
    order = planning.rolling_order(moving, pool=members, budget=budget, canary=first,
                                   min_ready_gpus=policy.min_ready_gpus, what="move to the operator",
                                   refused=MigrateRefused)
    by_name = {n.name: n for n in moving}
    if rollback is not None:
        snapshots = dict(rollback.snapshots)
        steps_of = {n: _rollback_steps(by_name[n], snapshots[n], keys=rollback.keys, run=rollback.run)
                    for n in by_name}
    else:
        check = policy.gpu_check or gpu_check or DEFAULT_CHECK
        hand = {n: dict((hand_set or {}).get(n) or {}) if ask.to == "operator" else {} for n in by_name}
        steps_of = {n: _node_steps(by_name[n], policy=policy, check=check if check.enabled else DEFAULT_CHECK,
                                   to=ask.to, remove=sorted(hand[n])) for n in by_name}
    waves = planning.rolling_waves(order, steps_of.__getitem__)
    if rollback is None:
        # The test pod asks for a resource each moved node must advertise once it is back.
        in_force = policy.gpu_check or gpu_check
        refusal = canary_refusal(pool, waves, fleet=fleet, check=in_force,
                                 configured_at=f"pools.{pool}.gpu_check" if policy.gpu_check else "upgrades.gpu_check")
        if refusal is not None:
            raise MigrateRefused(refusal.reason, code=refusal.code)
    if rollback is not None:
        notes = [say.snapshots_back_note(rollback.run, [n for n, _ in rollback.snapshots])]
    else:
        notes = [say.node_note(n.name, n.driver.owner, n.driver.evidence, LABEL_DEPLOY_DRIVER,
                               n.deploy_driver, DEPLOY_VALUE[ask.to], hand_set=hand[n.name]) for n in moving]
        notes += [say.manual_step_note(install=ask.to == "host", evidence=policy.host_driver_evidence),
                  say.one_at_a_time_note(to=ask.to, at_once=budget.allowed(len(members)))]
        wait_for = LabelSelector.parse(policy.wait_for.selector).matches if policy.wait_for is not None else None
        notes += pool_say.pods_moved_note({n.name: gpu_pods_moved(gpu_pods, n.name, wait_for=wait_for)
                                           for n in moving})
        if already:
            notes.append(say.already_note(already, ask.to))
    largest = planning.largest_wave(waves, lambda n: ready_gpus(by_name[n]))
    summary = PlanSummary(window_start=planning.planned_start(start, now=now), window_end=end,
                          max_gpus_unavailable=largest,
                          evictions_expected=sum(1 for n in moving if n.requested_gpus), notes=tuple(notes))
    plan = planning.assemble("migrate", pool=pool, planned=waves, summary=summary, requested_by=requested_by)
    pace = past_runs(pool) if past_runs is not None else Pace()
    plan = checked(plan, PlanFacts(fleet=fleet, policy=policy, gpu_pods=gpu_pods, budgets=budgets,
                                   past=pace.steps, parallel=pace.parallel),
                   before=screened.notes if screened is not None else ())
    return MigratePlan(pool=pool, nodes=tuple(by_name), order=order, plan=plan, window_start=start, window_end=end)


Direction = Literal["operator", "host", "rollback"]


def direction_of(plan: Plan) -> Direction:
    """Which way a move's plan goes, read from its step kinds (a person removes the host
    driver on the way to the operator, installs it on the way back; a rollback restores
    the snapshots its run took)."""
    kinds = {step.kind for wave in plan.waves for step in wave.steps}
    if "restore" in kinds:
        return "rollback"
    return "host" if "host-driver-installed" in kinds else "operator"


def _node_steps(node: NodeInventory, *, policy: PoolConfig, check: GpuCheck,
                to: Literal["operator", "host"], remove: Sequence[str] = ()) -> list[NodeStep]:
    validate = int(policy.validate_timeout.total_seconds())
    by_hand = int(policy.host_driver_timeout.total_seconds())
    checked = check_params(check) or check_params(DEFAULT_CHECK)
    assert checked is not None  # an enabled check always has params
    steps = [NodeStep.of("snapshot", node.name, StepParams()), planning.cordon(node), *planning.wait_for_jobs(node, policy),
             planning.evict_gpu_pods(node, policy)]
    # The hand-set labels go with the deploy label: GFD publishes its own once the
    # operator's driver runs.
    deploy = NodeStep.of("node-labels", node.name, NodeLabelsParams(labels={LABEL_DEPLOY_DRIVER: DEPLOY_VALUE[to],
                                                                         **{key: None for key in remove}}))
    by_hand_params = HostDriverParams(timeout_s=by_hand, evidence=policy.host_driver_evidence)
    if to == "operator":
        # The host driver goes first; then the operator deploys its own.
        steps += [NodeStep.of("host-driver-removed", node.name, by_hand_params), deploy,
                  NodeStep.of("wait-for", node.name, WaitForParams(conditions=("operator-driver-ready", "validator-ready"),
                                                                   timeout_s=validate))]
    else:
        # The operator takes its driver off first; then a person installs the host's.
        steps += [deploy, NodeStep.of("wait-for", node.name,
                                      WaitForParams(conditions=("no-operator-driver",), timeout_s=validate)),
                  NodeStep.of("host-driver-installed", node.name, by_hand_params),
                  NodeStep.of("wait-for", node.name, WaitForParams(conditions=("driver-ready", "validator-ready"),
                                                                   timeout_s=validate))]
    steps += [
        NodeStep.of("gpu-check", node.name, checked),
        *([NodeStep.of("gpu-check", node.name, burn_in)] if (burn_in := burn_in_params(check)) else []),
        planning.validate(node, policy),
        planning.uncordon(node),
    ]
    return steps


def _rollback_steps(node: NodeInventory, snapshot: Mapping[str, Any], *, keys: Sequence[str],
                    run: str) -> list[NodeStep]:
    labels = dict(snapshot.get("labels") or {})
    restore_keys = sorted({*keys, *(k for k in labels if k.startswith(LABEL_DEPLOY_PREFIX))})
    return [planning.cordon(node, takes_over=run),
            NodeStep.of("restore", node.name, RestoreParams(labels=labels, keys=tuple(restore_keys),
                                                            taints=tuple(snapshot.get("taints") or ())))]
