"""The host-driver migration use case: `request` turns `/gpu migrate <pool|node...> to
operator` into a checked plan and a stored request that waits for the pool's approvals;
`rollback` plans each node a run moved back to the snapshot it took. Runs on the same
engine as drains, upgrades and MIG changes. Nothing is stored when anything refuses."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from workflows.access import Actor, Role, require
from workflows.kinds import ServiceInputs
from storage.step_params import StepParamsError, decode
from storage.steps import Step
from workflows.engine.runs import RunView, step_intent, step_params
from workflows.engine.steps.host_driver import NodeLabelsParams
from workflows.fleet.summary import Fleet
from workflows.migrate import messages as say
from workflows.migrate.plan import MOVABLE, MigrateAsk, MigratePlan, MigrateRefused, MigrateRollbackOf, plan_migrate
from workflows.kube.labels import hand_set_labels
from workflows.kube.objects import NodeName
from workflows.pools import messages as pool_say
from workflows.pools.capacity import GpuPods
from workflows.pools.config import GpuCheck, PoolConfig
from workflows.preflight.budgets import BudgetReader, budgets_of
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView


@runtime_checkable
class NodeLabels(Protocol):
    """Where a plan reads who set a node's labels (`kube.gateway.KubeGateway`)."""

    def labels_with_owners(self, name: str) -> dict[str, tuple[str, tuple[str, ...]]]: ...


@dataclass(frozen=True, slots=True)
class MigrateRequested:
    planned: MigratePlan
    view: RequestView


class MigrateService:
    kind = "migrate"  # its entry in workflows/kinds.py

    def __init__(self, requests: RequestService, *, pools: Mapping[str, PoolConfig], gpu_check: GpuCheck | None = None,
                 pods: GpuPods | None = None, labels: NodeLabels | None = None,
                 budgets: BudgetReader | None = None) -> None:
        self._requests = requests
        self._budgets = budgets
        self._pools = pools
        self._gpu_check = gpu_check
        self._pods = pods
        self._labels = labels

    @classmethod
    def built(cls, inputs: ServiceInputs) -> MigrateService:
        """For an entry point (its registry line): the canary from the configuration, GPU
        pods and who set a node's labels from its readers."""
        return cls(inputs.requests, pools=inputs.config.pools, gpu_check=inputs.config.upgrades.gpu_check,
                   pods=inputs.reader(GpuPods), labels=inputs.reader(NodeLabels), budgets=inputs.reader(BudgetReader))

    def preview(self, actor: Actor, ask: MigrateAsk, *, fleet: Fleet, now: dt.datetime,
                rollback: MigrateRollbackOf | None = None) -> MigratePlan:
        """The plan `request` would store, checked the same way; nothing is stored."""
        pods = self._pods.list_gpu_pods() if self._pods is not None and rollback is None else []
        hand_set: dict[str, Mapping[str, tuple[str, str]]] | None = None
        if self._labels is not None and rollback is None and ask.to == "operator":
            # Read per node (managedFields are not in the watch cache): the asked nodes, or the pool's.
            nodes = [n for t in ask.targets for n in _members(fleet, t)
                     if n in fleet.nodes and fleet.nodes[n].driver.owner in MOVABLE["operator"]]
            hand_set = {n: hand_set_labels(self._labels.labels_with_owners(n)) for n in nodes}
        planned = plan_migrate(ask, fleet=fleet, policy_of=self._pools, now=now, requested_by=actor.user_id,
                               gpu_check=self._gpu_check, gpu_pods=pods, hand_set=hand_set, rollback=rollback,
                               budgets=budgets_of(self._budgets, pods), past_runs=self._requests.pool_pace)
        require(actor, Role.OPERATOR, action="Planning a move to the operator", pool=planned.pool)
        return planned

    def request(self, actor: Actor, ask: MigrateAsk, *, fleet: Fleet, now: dt.datetime,
                channel: str | None = None) -> MigrateRequested:
        planned = self.preview(actor, ask, fleet=fleet, now=now)
        return self._submit(actor, planned, reason=ask.reason, channel=channel, now=now)

    def rollback(self, actor: Actor, run: RunView, *, fleet: Fleet, now: dt.datetime,
                 channel: str | None = None) -> MigrateRequested:
        """Restore the snapshot of every node `run` changed (the failed one first), leaving
        each cordoned; a new request under the pool's approval rule."""
        if run.kind != "migrate":
            raise MigrateRefused(say.rollback_not_migrate(run.id, run.kind), code="not-a-move")
        require(actor, Role.OPERATOR, action="Rolling back a move to the operator", pool=run.pool)
        blocked = self._requests.rollback_blocked(run.id, state=run.state, pool=run.pool)
        if blocked is not None:
            raise MigrateRefused(blocked[1], code=blocked[0])
        taken = {s.node: step_intent(s) for s in run.steps if s.kind == "snapshot" and s.state == "done"}
        changed = [s for s in run.steps if s.node in taken and s.state in ("done", "failed", "running")
                   and s.kind not in ("snapshot", "wait-for-jobs")]
        moved = {s.node for s in changed}
        nodes = list(dict.fromkeys([*(n for n in run.halted_on if n in moved), *(s.node for s in changed)]))
        if not nodes:
            raise MigrateRefused(pool_say.nothing_to_roll_back(run.id, changed=say.ROLLED_BACK),
                                code="nothing-to-roll-back")
        keys = sorted({k for s in run.steps if s.kind == "node-labels" for k in _labels_set(s)})
        back = MigrateRollbackOf(run=run.id, snapshots=tuple((n, taken[n]) for n in nodes), keys=tuple(keys))
        ask = MigrateAsk(targets=tuple(nodes), reason=f"rollback of {run.id}")
        planned = self.preview(actor, ask, fleet=fleet, now=now, rollback=back)
        return self._submit(actor, planned, reason=ask.reason, channel=channel, now=now)

    def _submit(self, actor: Actor, planned: MigratePlan, *, reason: str, channel: str | None,
                now: dt.datetime) -> MigrateRequested:
        view = self._requests.submit(actor, kind="migrate", pool=planned.pool, targets=list(planned.nodes),
                                     plan=planned.plan, window_start=planned.window_start,
                                     window_end=planned.window_end, reason=reason, channel=channel, now=now)
        return MigrateRequested(planned, view)


def _members(fleet: Fleet, target: str) -> tuple[NodeName, ...]:
    """A pool's nodes, or the node itself."""
    pool = fleet.pool(target)
    return pool.nodes if pool is not None else (NodeName(target),)


def _labels_set(step: Step) -> tuple[str, ...]:
    """The label keys a run's `node-labels` step sets (what a rollback puts back)."""
    try:
        labels = decode(NodeLabelsParams, step_params(step), kind=step.kind).labels
    except StepParamsError as err:
        raise MigrateRefused(str(err), code="unreadable-step") from None
    return tuple(labels or ())
