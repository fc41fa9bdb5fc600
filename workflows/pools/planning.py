"""The shape every plan of a pool's nodes takes, written once: targets -> policy -> window
-> rolling order -> waves -> the plan.

A kind of change (a drain, a driver upgrade, a MIG layout, a move to the operator)
supplies only what differs: which nodes its targets mean and which of them it changes,
the steps each node goes through, its refusals and its notes. Each stage here raises
the kind's own refusal (`refused(reason, code=...)`, e.g. `MigRefused`) with the
sentence and code the stage gives, so a person reads the same refusal whichever kind
asked.

- **targets** (`resolve_targets`, `targets_in_one_pool`): one pool's name, or GPU nodes
  of one pool; the pool's nodes (`members`).
- **policy** (`require_policy`): only a configured pool is changed.
- **window** (`window`): when the change may start and the end it must start before
  (`starts.start_window`).
- **rolling order** (`rolling_order`): the canary alone, then waves within
  `max_unavailable` and `min_ready_gpus` (`capacity.waves_within_budget`).
- **waves** (`waves`, `rolling_waves`): each wave's nodes in order, each node's steps in
  turn; the per-node steps every kind shares (`cordon`, `wait_for_jobs`,
  `evict_gpu_pods`, `validate`, `uncordon`).
- **the plan** (`assemble`, `largest_wave`): the waves, the summary and who asked.

A drain orders its own waves (each as large as the capacity checks allow, over the time
it asks for) and reads its own targets (`pool=<name>`, a node's misspelling): it shares
the waves, the steps and the plan. Nothing here reads the clock or the cluster."""

from __future__ import annotations

import datetime as dt
import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from storage.step_params import CordonParams, EvictParams, UncordonParams, WaitForJobsParams, WaitForParams
from workflows.fleet.assessment import NodeInventory
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.pools import messages as say
from workflows.pools.capacity import MaxUnavailable, OrderRefused, RollingOrder
from workflows.pools.capacity import waves_within_budget
from workflows.pools.config import PoolConfig
from workflows.pools.starts import WindowRefused, start_window

# A driver or MIG change and a move to the operator evict GPU pods only: other pods keep
# running (a drain moves every pod but DaemonSets').
EVICT_SCOPE = "gpu"


class Refuser(Protocol):
    """A kind's refusal: its exception, built from the sentence a person reads and a code."""

    def __call__(self, reason: str, *, code: str) -> Exception: ...


# ------------------------------------------------------------------ targets


def resolve_targets(targets: Sequence[str], fleet: Fleet, *, what: str) -> tuple[str, list[NodeInventory]]:
    """The pool and nodes a change of `targets` (one pool's name, or GPU nodes of one pool)
    moves; OrderRefused for none, an unknown name (with the closest) or several pools."""
    if not targets:
        raise OrderRefused(say.no_targets(what), code="no-targets")
    if len(targets) == 1 and fleet.pool(targets[0]) is not None:
        found = fleet.pool(targets[0])
        assert found is not None
        return found.name, [fleet.nodes[n] for n in found.nodes if n in fleet.nodes]
    unknown = [t for t in targets if t not in fleet.nodes]
    if unknown:
        known = [p.name for p in fleet.pools] + list(fleet.nodes)
        raise OrderRefused(say.unknown_target(unknown[0], difflib.get_close_matches(unknown[0], known, n=2)),
                           code="unknown-target")
    nodes = [fleet.nodes[NodeName(t)] for t in dict.fromkeys(targets)]
    pools = sorted({n.pool for n in nodes})
    if len(pools) > 1:
        raise OrderRefused(say.several_pools(pools, what), code="several-pools")
    return pools[0], nodes


def targets_in_one_pool(targets: Sequence[str], fleet: Fleet, *, what: str,
                        refused: Refuser) -> tuple[str, list[NodeInventory]]:
    """`resolve_targets`, refused as the kind refuses."""
    try:
        return resolve_targets(targets, fleet, what=what)
    except OrderRefused as refusal:
        raise refused(refusal.reason, code=refusal.code) from None


def members(fleet: Fleet, pool: str) -> list[NodeInventory]:
    """Every node of `pool` (one the targets were found in)."""
    found = fleet.pool(pool)
    assert found is not None  # the targets were resolved in it
    return [fleet.nodes[n] for n in found.nodes]


# ------------------------------------------------------------------ policy


def require_policy(pool: str, policy: PoolConfig | None, *, refused: Refuser, rule: str) -> PoolConfig:
    """The pool's policy; a pool without one is not changed (`rule` says what the kind
    does only in configured pools)."""
    if policy is None:
        raise refused(say.no_policy_for(pool, rule=rule), code="pool-not-configured")
    return policy


# ------------------------------------------------------------------ window


def window(policy: PoolConfig, *, pool: str, now: dt.datetime, at: dt.datetime | None, next_window: bool,
           what: str, refused: Refuser) -> tuple[dt.datetime, dt.datetime | None]:
    """When the change starts and the end it must start before (`starts.start_window`)."""
    try:
        return start_window(policy.window_set, pool=pool, now=now, at=at, next_window=next_window, what=what)
    except WindowRefused as refusal:
        raise refused(refusal.reason, code=refusal.code) from None


# ------------------------------------------------------------------ rolling order


def rolling_order(nodes: Sequence[NodeInventory], *, pool: Sequence[NodeInventory], budget: MaxUnavailable,
                  canary: str | None, min_ready_gpus: int, what: str, refused: Refuser,
                  ready_after: Mapping[str, int] | None = None) -> RollingOrder:
    """`capacity.waves_within_budget`, refused as the kind refuses."""
    try:
        return waves_within_budget(nodes, pool=pool, budget=budget, canary=canary, min_ready_gpus=min_ready_gpus,
                              what=what, ready_after=ready_after)
    except OrderRefused as refusal:
        raise refused(refusal.reason, code=refusal.code) from None


# ------------------------------------------------------------------ waves


def waves(groups: Iterable[Sequence[NodeName]], steps_of: Callable[[NodeName], Iterable[NodeStep]]) -> list[Wave]:
    """A wave per group of nodes, numbered from 0: each node's steps in turn."""
    return [Wave(index, tuple(nodes), tuple(step for node in nodes for step in steps_of(node)))
            for index, nodes in enumerate(groups)]


def rolling_waves(order: RollingOrder, steps_of: Callable[[NodeName], Iterable[NodeStep]]) -> list[Wave]:
    """The canary's wave (wave 0, alone), then the order's waves."""
    return waves([(order.canary,), *order.waves], steps_of)


def cordon(node: NodeInventory, *, takes_over: str | None = None) -> NodeStep:
    """Cordon, keeping a person's cordon (`was_cordoned`); a rollback takes over the cordon
    the run it undoes left (`takes_over`)."""
    return NodeStep.of("cordon", node.name, CordonParams(was_cordoned=node.cordoned, takes_over=takes_over))


def wait_for_jobs(node: NodeInventory, policy: PoolConfig) -> list[NodeStep]:
    """Wait for the pool's `wait_for` jobs to finish; nothing when the pool names none."""
    if policy.wait_for is None:
        return []
    return [NodeStep.of("wait-for-jobs", node.name, WaitForJobsParams(
        selector=policy.wait_for.selector, timeout_s=int(policy.wait_for.timeout.total_seconds())))]


def evict_gpu_pods(node: NodeInventory, policy: PoolConfig) -> NodeStep:
    """Evict the node's GPU pods, respecting PDBs for the pool's drain timeout, then its
    action; pods that come straight back are evicted again `evict_retries` times."""
    return NodeStep.of("evict", node.name, EvictParams(scope=EVICT_SCOPE,
                                                       pdb_timeout_s=int(policy.drain_timeout.total_seconds()),
                                                       pdb_timeout_action=policy.pdb_timeout_action,
                                                       evict_retries=policy.evict_retries))


def validate(node: NodeInventory, policy: PoolConfig) -> NodeStep:
    return NodeStep.of("validate", node.name, WaitForParams(timeout_s=int(policy.validate_timeout.total_seconds())))


def uncordon(node: NodeInventory) -> NodeStep:
    """Uncordon, unless a person had cordoned the node before: then it stays cordoned."""
    return NodeStep.of("uncordon", node.name, UncordonParams(leave_cordoned=node.cordoned))


# ------------------------------------------------------------------ the plan


def largest_wave(planned: Iterable[Wave], gpus: Callable[[NodeName], int]) -> int:
    """The most GPUs one wave takes out (`gpus` of each of its nodes)."""
    return max((sum(gpus(n) for n in wave.nodes) for wave in planned), default=0)


def assemble(kind: str, *, pool: str, planned: Iterable[Wave], summary: PlanSummary,
             requested_by: str) -> Plan:
    return Plan(kind=kind, pool=pool, waves=tuple(planned), summary=summary, created_for=requested_by)


def planned_start(start: dt.datetime, *, now: dt.datetime) -> dt.datetime | None:
    """The start a plan's summary carries: none for a change that starts as soon as it is
    approved (`start` is the moment it was planned). The moment someone asked is no fact an
    approver reviews, and a dry run a minute before the request must have the request's
    hash; the request itself keeps when it was asked to start."""
    return None if start <= now else start
