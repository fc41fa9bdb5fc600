"""A driver upgrade of one pool, planned: the scope (`scope.upgrade_scope`: the one
object whose version changes and every refusal), the window it runs in, the canary and
waves, and the steps each node goes through. "gpuops drives" only (the pool's driver
object has autoUpgrade off); gating the operator's own upgrade is not built yet and is
refused with what to do instead.

Per node: cordon (a human's cordon is kept), wait for the pool's `wait_for` jobs, evict
GPU pods (PDB-respecting, the pool's drain timeout and action), restart the driver pod
into the new version (the engine waits until the operator has put it into the node's
DaemonSet), validate (Ready, driver, device plugin, validator, every GPU advertised),
uncordon. The canary's first step sets the version on the driver object; after the
canary the pool soaks for `upgrade_soak` before the next wave."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from workflows.fleet.assessment import NodeInventory
from workflows.fleet.summary import Fleet
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.pools.config import PoolConfig
from workflows.upgrade import messages as say
from workflows.upgrade.scope import UpgradeOrder, UpgradeRefused, UpgradeScope, upgrade_order, upgrade_scope

EVICT_SCOPE = "gpu"  # a driver change moves GPU pods; other pods keep running


@dataclass(frozen=True, slots=True)
class UpgradeAsk:
    pool: str
    version: str
    downgrade: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RollbackOf:
    """What a rollback undoes: the run, the nodes it changed (the failed one first) and
    the version its driver-version step replaced."""

    run: str
    nodes: tuple[str, ...]
    version: str


@dataclass(frozen=True, slots=True)
class UpgradePlan:
    scope: UpgradeScope
    order: UpgradeOrder
    plan: Plan
    window_start: dt.datetime
    window_end: dt.datetime | None


def plan_upgrade(ask: UpgradeAsk, *, fleet: Fleet, policy: PoolConfig | None, now: dt.datetime,
                 requested_by: str, allowed_versions: Sequence[str] = (),
                 rollback: RollbackOf | None = None) -> UpgradePlan:
    """Plan `ask` for `requested_by`, or raise UpgradeRefused saying why not. A `rollback`
    plans only the nodes that run changed, its failed node first, each taking over the
    cordon that run left; its version need not be in the allowed list."""
    if fleet.pool(ask.pool) is None:
        raise UpgradeRefused(say.unknown_pool(ask.pool, [p.name for p in fleet.pools]), code="unknown-pool")
    if policy is None:
        raise UpgradeRefused(say.pool_not_configured(ask.pool), code="pool-not-configured")
    scope = upgrade_scope(fleet, ask.pool, version=ask.version, downgrade=ask.downgrade or rollback is not None,
                          allowed_versions=allowed_versions if rollback is None else (),
                          broken_by_run=rollback.nodes if rollback is not None else ())
    if scope.mode == "gates-operator":
        raise UpgradeRefused(say.gating_not_built(scope.manager.ref), code="auto-upgrade-on")
    start, end = _window(policy, pool=ask.pool, now=now)
    pool = fleet.pool(ask.pool)
    assert pool is not None  # upgrade_scope refuses an unknown pool
    members = [fleet.nodes[n] for n in pool.nodes]
    nodes = [fleet.nodes[n] for n in scope.nodes if rollback is None or n in rollback.nodes]
    # A rollback starts with the node its run failed on (cordoned by that run, so out already).
    order = upgrade_order(nodes, pool=members, budget=policy.unavailable_budget,
                          canary=rollback.nodes[0] if rollback is not None else policy.canary,
                          min_ready_gpus=policy.min_ready_gpus)
    by_name = {n.name: n for n in nodes}
    takes_over = rollback.run if rollback is not None else None
    kind, name = scope.manager.kind, scope.manager.name
    set_version = NodeStep("driver-version", order.canary, {"object": kind, "name": name,
                                                            "version": scope.target.text})
    canary_steps = [set_version, *_node_steps(by_name[order.canary], policy=policy, version=scope.target.text,
                                              takes_over=takes_over),
                    NodeStep("hold", order.canary, {"seconds": int(policy.upgrade_soak.total_seconds())})]
    waves = [Wave(0, (order.canary,), tuple(canary_steps))]
    for index, wave in enumerate(order.waves, start=1):
        steps = [step for node in wave for step in _node_steps(by_name[node], policy=policy,
                                                                version=scope.target.text, takes_over=takes_over)]
        waves.append(Wave(index, wave, tuple(steps)))
    largest = max((sum(by_name[n].physical_gpus or 0 for n in w.nodes) for w in waves), default=0)
    notes = [say.plan_manager_note(scope.manager.ref, scope.current, scope.target.text),
             say.plan_canary_note(order.canary, policy.upgrade_soak)]
    if rollback is not None:
        notes.append(say.plan_rollback_note(rollback.run, scope.target.text, rollback.nodes))
    elif scope.downgrade:
        notes.append(say.plan_downgrade_note(scope.target.text))
    summary = PlanSummary(target_driver_version=scope.target.text, window_start=start, window_end=end,
                          evictions_expected=sum(1 for n in nodes if n.requested_gpus), max_gpus_unavailable=largest,
                          notes=tuple(notes))
    plan = Plan(kind="upgrade", pool=ask.pool, waves=tuple(waves), summary=summary, created_for=requested_by)
    return UpgradePlan(scope=scope, order=order, plan=plan, window_start=start, window_end=end)


def _node_steps(node: NodeInventory, *, policy: PoolConfig, version: str,
                takes_over: str | None = None) -> list[NodeStep]:
    cordon: dict[str, object] = {"was_cordoned": node.cordoned}
    if takes_over is not None:
        cordon["takes_over"] = takes_over
    steps = [NodeStep("cordon", node.name, cordon)]
    if policy.wait_for is not None:
        steps.append(NodeStep("wait-for-jobs", node.name, {
            "selector": policy.wait_for.selector, "timeout_s": int(policy.wait_for.timeout.total_seconds())}))
    steps += [
        NodeStep("evict", node.name, {"scope": EVICT_SCOPE,
                                      "pdb_timeout_s": int(policy.drain_timeout.total_seconds()),
                                      "pdb_timeout_action": policy.pdb_timeout_action}),
        NodeStep("driver", node.name, {"version": version, "timeout_s": int(policy.validate_timeout.total_seconds())}),
        NodeStep("validate", node.name, {"timeout_s": int(policy.validate_timeout.total_seconds())}),
        NodeStep("uncordon", node.name, {"leave_cordoned": node.cordoned}),
    ]
    return steps


def _window(policy: PoolConfig, *, pool: str, now: dt.datetime) -> tuple[dt.datetime, dt.datetime | None]:
    """Now, inside one of the pool's windows, else the next window; the run must start
    before that window ends (no end with `windows: always`)."""
    windows = policy.window_set
    if windows.never:
        raise UpgradeRefused(say.no_windows(pool), code="windows")
    if windows.always:
        return now, None
    found = windows.occurrence_containing(now)
    if found is None:
        start = windows.next_start(now)
        assert start is not None  # a pool with windows always has a next one
        found = windows.occurrence_containing(start)
        assert found is not None
        return start, found.end
    return now, found.end
