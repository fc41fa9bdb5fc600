"""A driver upgrade of one pool, planned: the scope (`scope.upgrade_scope`: the one
object whose version changes and every refusal), the window it runs in, the canary and
waves, and the steps each node goes through. The canary's first change sets the version
on the driver object; after the canary the pool soaks for `upgrade_soak` before the next
wave. A canary that fails sets the object back to the version it replaced (only while it
still names the run's) before the run halts; the canary itself waits for a rollback.

"gpuops drives" (the driver object has autoUpgrade off), per node: cordon (a person's
cordon is kept), wait for the pool's `wait_for` jobs, evict GPU pods (PDB-respecting, the
pool's drain timeout and action), restart the driver pod into the new version (the
engine waits until the operator has put it into the node's DaemonSet), validate (Ready,
driver, device plugin, validator, every GPU advertised), run the canary pod where one is
configured (`gpu_check`: its exit code decides), uncordon.

"gpuops gates the operator" (autoUpgrade on): before the version changes, every node it
reaches is held back from the operator's upgrade (`operator-hold`: the skip label, with
gpuops's mark); per node, in its wave: cordon, let the operator upgrade it and follow its
states (`operator-upgrade`: its own wait-for-jobs, pod deletion and drain, per its
upgradePolicy), validate, the canary pod, uncordon. Nodes a person labelled skip are left
out (the plan says so); nodes of other pools the ClusterPolicy drives stay held after the
run."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from storage.step_params import GpuCheckParams, HoldParams
from workflows.engine import check_pod
from workflows.fleet.assessment import NodeInventory
from workflows.fleet.summary import Fleet
from workflows.fleet.version_owner import VERSION_FIELDS, VersionOwner
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.kube.objects import DisruptionBudget, PodObject
from workflows.pools import messages as pool_say
from workflows.pools import planning
from workflows.pools.capacity import gpu_pods_moved
from workflows.pools.config import GpuCheck, PoolConfig
from workflows.pools.selectors import LabelSelector
from workflows.preflight.check import canary_refusal
from workflows.preflight.facts import Pace, PastRuns
from workflows.preflight.nodes import screen_nodes
from workflows.preflight.report import PlanFacts, checked
from workflows.upgrade import messages as say
from workflows.upgrade.step_logic import DriverParams, DriverVersionParams, OperatorHoldParams, OperatorUpgradeParams
from workflows.upgrade.scope import (
    ClusterPolicyScope,
    UpgradeOrder,
    UpgradeRefused,
    UpgradeScope,
    upgrade_order,
    upgrade_scope,
)

@dataclass(frozen=True, slots=True)
class UpgradeAsk:
    pool: str
    version: str
    downgrade: bool = False
    reason: str = ""
    # When to start: now (neither), at `start` (inside one of the pool's windows), or at
    # the start of the pool's next window.
    start: dt.datetime | None = None
    next_window: bool = False
    # Other pools the request names as moving too (those the ClusterPolicy also drives).
    also: tuple[str, ...] = ()
    # Nodes with open findings the upgrade does not fix, changed anyway (`--include`).
    include: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RollbackOf:
    """What a rollback undoes: the run, the nodes it changed (the failed one first) and
    the version its driver-version step replaced; `release` are the nodes that run held
    back from the operator's upgrade and never moved (given back at the end)."""

    run: str
    nodes: tuple[str, ...]
    version: str
    release: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UpgradePlan:
    scope: UpgradeScope
    order: UpgradeOrder
    plan: Plan
    window_start: dt.datetime
    window_end: dt.datetime | None


def plan_upgrade(ask: UpgradeAsk, *, fleet: Fleet, policy: PoolConfig | None, now: dt.datetime,
                 requested_by: str, allowed_versions: Sequence[str] = (),
                 cluster_policy_scope: ClusterPolicyScope = "pool", gpu_check: GpuCheck | None = None,
                 gpu_pods: Sequence[PodObject] = (), rollback: RollbackOf | None = None,
                 budgets: Sequence[DisruptionBudget] = (), past_runs: PastRuns | None = None) -> UpgradePlan:
    """Plan `ask` for `requested_by`, or raise UpgradeRefused saying why not. A `rollback`
    plans only the nodes that run changed, its failed node first, each taking over the
    cordon that run left; its version need not be in the allowed list. `gpu_check` is the
    fleet's canary pod, which the pool's own `gpu_check` replaces; `gpu_pods` the cluster's
    pods that ask for GPUs (the plan names, per node, those it waits for and moves off),
    `budgets` the PodDisruptionBudgets of their namespaces (pre-flight names those that
    allow no disruption), `past_runs` what reads the pool's pace (pre-flight times the run
    at it). Nodes with open findings the upgrade does not fix are left out
    unless the ask includes them; a rollback changes the nodes its run changed, whatever
    their findings (the failed one has one)."""
    if fleet.pool(ask.pool) is None:
        raise UpgradeRefused(say.pool_not_in_fleet(ask.pool, [p.name for p in fleet.pools]), code="unknown-pool")
    policy = planning.require_policy(ask.pool, policy, refused=UpgradeRefused, rule=say.ONLY_CONFIGURED)
    # A rollback puts back what the run changed: the pools its change reached were
    # accepted when it was approved, so they need not be named again.
    scope = upgrade_scope(fleet, ask.pool, version=ask.version, downgrade=ask.downgrade or rollback is not None,
                          allowed_versions=allowed_versions if rollback is None else (),
                          cluster_policy_scope=cluster_policy_scope if rollback is None else "all-pools",
                          named_pools=ask.also,
                          broken_by_run=rollback.nodes if rollback is not None else ())
    gates = scope.mode == "gates-operator"
    start, end = planning.window(policy, pool=ask.pool, now=now, at=ask.start, next_window=ask.next_window,
                                 what="upgrade", refused=UpgradeRefused)
    members = planning.members(fleet, ask.pool)
    candidates = [fleet.nodes[n] for n in scope.nodes if rollback is None or n in rollback.nodes]
    # A skip label a person set keeps the operator off the node: gpuops leaves it out too.
    skipped_by_person = [n.name for n in candidates if gates and n.upgrade.skip and not n.upgrade.held_by]
    nodes = [n for n in candidates if n.name not in skipped_by_person]
    screened = (screen_nodes(nodes, fleet=fleet, kind="upgrade", pool=ask.pool, include=ask.include,
                             canary=policy.canary, refused=UpgradeRefused) if rollback is None else None)
    if screened is not None:
        nodes = list(screened.kept)
    # A rollback starts with the node its run failed on (cordoned by that run, so out already).
    order = upgrade_order(nodes, pool=members, budget=policy.unavailable_budget,
                          canary=rollback.nodes[0] if rollback is not None else policy.canary,
                          min_ready_gpus=policy.min_ready_gpus)
    by_name = {n.name: n for n in nodes}
    takes_over = rollback.run if rollback is not None else None
    kind, name = scope.manager.kind, scope.manager.name
    owner = scope.manager.version_owner
    by_git = version_from_git(policy, owner)
    git_owner = owner.by if by_git and owner is not None else None
    git = True if by_git else None
    set_version = NodeStep.of("driver-version", order.canary,
                              DriverVersionParams(object=kind, name=name, version=scope.target.text,
                                                                  git=git, owner=git_owner))
    check = _check_params(policy.gpu_check or gpu_check)
    burn_in = check_pod.burn_in_params(policy.gpu_check or gpu_check)
    steps_of = _gated_node_steps if gates else _node_steps

    def node_steps(node: NodeInventory) -> list[NodeStep]:
        steps = steps_of(node, policy=policy, version=scope.target.text, takes_over=takes_over)
        if check is not None:  # after validate (every GPU advertised), before the uncordon
            steps.insert(len(steps) - 1, NodeStep.of("gpu-check", node.name, check))
        if burn_in is not None:  # the pool's own, after its check
            steps.insert(len(steps) - 1, NodeStep.of("gpu-check", node.name, burn_in))
        return steps
    first: list[NodeStep] = []
    held_after: list[str] = []
    if gates:
        # Every node the new version reaches, held back before it changes; each wave's
        # operator-upgrade steps let go of their own nodes.
        held_after = [n for p in scope.also_moves for n in _driven(fleet, p)]
        first.append(NodeStep.of("operator-hold", order.canary,
                                 OperatorHoldParams(nodes=(*(n.name for n in nodes), *held_after))))
    canary_steps = [*first, set_version,
                    *node_steps(by_name[order.canary]),
                    NodeStep.of("hold", order.canary, HoldParams(seconds=int(policy.upgrade_soak.total_seconds())))]
    if rollback is None:
        # Runs only if the canary fails (the engine's `on_failure`): the object is set back
        # before the run halts, so no driver pod that restarts meanwhile takes the failed
        # version. A rollback has none: its version is the one the object had before.
        canary_steps.append(NodeStep.of("driver-version", order.canary, DriverVersionParams(
            object=kind, name=name, version=scope.target.text, set_back=True, on_failure=True, git=git, owner=git_owner)))
    # The canary's wave is its own: the version set first, the soak after.
    waves = planning.rolling_waves(order, lambda n: canary_steps if n == order.canary else node_steps(by_name[n]))
    if rollback is not None and rollback.release:
        last = waves[-1]
        release = NodeStep.of("operator-hold", last.nodes[-1],
                              OperatorHoldParams(nodes=tuple(rollback.release), release=True))
        waves[-1] = Wave(last.index, last.nodes, (*last.steps, release))
    # A canary pod asking for a resource the nodes do not advertise fails on the first node.
    refusal = canary_refusal(ask.pool, waves, fleet=fleet, check=policy.gpu_check or gpu_check,
                             configured_at=f"pools.{ask.pool}.gpu_check" if policy.gpu_check else "upgrades.gpu_check")
    if refusal is not None:
        raise UpgradeRefused(refusal.reason, code=refusal.code)
    largest = planning.largest_wave(waves, lambda n: by_name[n].physical_gpus or 0)
    notes = [say.plan_git_note(scope.manager.ref, _version_field(kind), scope.manager.version, scope.target.text,
                               owner=owner.by if owner is not None else None, rollback=rollback is not None)
             if by_git else say.plan_manager_note(scope.manager.ref, scope.current, scope.target.text),
             say.plan_canary_note(order.canary, policy.upgrade_soak, only_node=len(waves) == 1)]
    if rollback is None:
        notes.append(say.plan_set_back_note(scope.manager.ref, scope.manager.version, scope.target.text,
                                               order.canary))
    if gates:
        notes.insert(1, say.plan_gates_operator_note(scope.manager.ref))
    if owner is not None and owner.tool is not None and not by_git:
        notes.insert(1, say.plan_version_owner_note(owner.text(), owner.evidence, from_git=owner.from_git))
    # Gated, the operator waits and deletes per its own upgradePolicy, not the pool's wait_for.
    wait_for = (LabelSelector.parse(policy.wait_for.selector).matches
                if policy.wait_for is not None and not gates else None)
    notes += pool_say.pods_moved_note({n.name: gpu_pods_moved(gpu_pods, n.name, wait_for=wait_for) for n in
                                       [by_name[order.canary], *(by_name[m] for w in order.waves for m in w)]},
                                      by_operator=gates)
    if check is not None:
        notes.append(say.plan_diag_note(check.diag, check.image, check.resource, check.namespace)
                     if check.diag is not None else
                     say.plan_gpu_check_note(check.command, check.image, check.resource, check.namespace,
                                             check.count or 1))
    if burn_in is not None and burn_in.command is not None:
        notes.append(say.plan_burn_in_note(burn_in.command, burn_in.image, burn_in.resource))
    if skipped_by_person:
        notes.append(say.plan_skipped_by_person_note(skipped_by_person))
    if scope.also_moves:
        notes.append(say.plan_also_moves_note(scope.manager.ref, scope.also_moves, scope.target.text,
                                              held=gates, named=bool(ask.also),
                                              rollback_of=rollback.run if rollback is not None else None))
    if rollback is not None and rollback.release:
        notes.append(say.plan_release_note(rollback.run, rollback.release))
    if rollback is not None:
        notes.append(say.plan_rollback_note(rollback.run, scope.target.text, rollback.nodes))
    elif scope.downgrade:
        notes.append(say.plan_downgrade_note(scope.target.text))
    summary = PlanSummary(target_driver_version=scope.target.text, window_start=planning.planned_start(start, now=now),
                          window_end=end, evictions_expected=sum(1 for n in nodes if n.requested_gpus), max_gpus_unavailable=largest,
                          notes=tuple(notes))
    plan = planning.assemble("upgrade", pool=ask.pool, planned=waves, summary=summary, requested_by=requested_by)
    pace = past_runs(ask.pool) if past_runs is not None else Pace()
    plan = checked(plan, PlanFacts(fleet=fleet, policy=policy, gpu_pods=gpu_pods, budgets=budgets, by_operator=gates,
                                   past=pace.steps, parallel=pace.parallel),
                   before=screened.notes if screened is not None else ())
    return UpgradePlan(scope=scope, order=order, plan=plan, window_start=start, window_end=end)


def version_from_git(policy: PoolConfig, owner: VersionOwner | None) -> bool:
    """Git mode: the pool says so (`driver_version_source: git`), or leaves it to gpuops
    (`auto`) and Argo CD or Flux owns the version field."""
    if policy.driver_version_source == "auto":
        return owner is not None and owner.from_git
    return policy.driver_version_source == "git"


def _version_field(kind: str) -> str:
    return f"spec.{VERSION_FIELDS.get(kind, 'version')}"


def _check_params(check: GpuCheck | None) -> GpuCheckParams | None:
    """The gpu-check step's params for a configured (and enabled) canary pod."""
    return check_pod.params_for(check)


def _driven(fleet: Fleet, pool: str) -> list[str]:
    found = fleet.pool(pool)
    return [n for n in (found.nodes if found else ()) if fleet.nodes[n].deploy_driver == "true"]


def _gated_node_steps(node: NodeInventory, *, policy: PoolConfig, version: str,
                      takes_over: str | None = None) -> list[NodeStep]:
    """The operator upgrades the node (its own jobs wait, pod deletion and drain); gpuops
    cordons it first so the operator leaves the uncordon to gpuops's own validation."""
    validate = int(policy.validate_timeout.total_seconds())
    wait = int((policy.wait_for.timeout if policy.wait_for is not None else dt.timedelta(0)).total_seconds())
    return [
        planning.cordon(node, takes_over=takes_over),
        NodeStep.of("operator-upgrade", node.name, OperatorUpgradeParams(
            version=version, timeout_s=int(policy.drain_timeout.total_seconds()) + wait + validate)),
        planning.validate(node, policy),
        planning.uncordon(node),
    ]


def _node_steps(node: NodeInventory, *, policy: PoolConfig, version: str,
                takes_over: str | None = None) -> list[NodeStep]:
    return [
        planning.cordon(node, takes_over=takes_over),
        *planning.wait_for_jobs(node, policy),
        planning.evict_gpu_pods(node, policy),
        NodeStep.of("driver", node.name,
                    DriverParams(version=version, timeout_s=int(policy.validate_timeout.total_seconds()))),
        planning.validate(node, policy),
        planning.uncordon(node),
    ]
