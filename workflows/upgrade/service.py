"""The upgrade use case: `request` turns what a person asked for (an `UpgradeAsk`, from
`/gpu upgrade`) into a checked plan and a stored request that waits for the pool's
approvals (two distinct people, neither the requester, for a serving pool by default),
bound to the plan's hash. The run starts inside the pool's window once approved, as a
drain's does, on the same engine. Nothing is stored when anything refuses."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workflows.access import Actor, Role, require
from workflows.engine.runs import RunView, step_intent
from workflows.fleet.summary import Fleet
from workflows.kinds import ServiceInputs
from workflows.kube.objects import PodObject
from workflows.pools import messages as pool_say
from workflows.pools.capacity import GpuPods
from workflows.pools.config import GpuCheck, PoolConfig
from workflows.preflight.budgets import BudgetReader, budgets_of
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView
from workflows.upgrade import messages as say
from workflows.upgrade.plan import RollbackOf, UpgradeAsk, UpgradePlan, plan_upgrade
from workflows.upgrade.scope import ClusterPolicyScope, UpgradeRefused


@dataclass(frozen=True, slots=True)
class UpgradeRequested:
    planned: UpgradePlan
    view: RequestView


class UpgradeService:
    kind = "upgrade"  # its entry in workflows/kinds.py

    def __init__(self, requests: RequestService, *, pools: Mapping[str, PoolConfig],
                 allowed_versions: Sequence[str] = (), cluster_policy_scope: ClusterPolicyScope = "pool",
                 gpu_check: GpuCheck | None = None, pods: GpuPods | None = None,
                 budgets: BudgetReader | None = None) -> None:
        self._requests = requests
        self._budgets = budgets
        self._pools = pools
        self._gpu_check = gpu_check
        self._pods = pods
        self._allowed_versions = tuple(allowed_versions)
        self._cluster_policy_scope: ClusterPolicyScope = cluster_policy_scope

    @classmethod
    def built(cls, inputs: ServiceInputs) -> UpgradeService:
        """For an entry point (its registry line): the configuration's upgrade settings, the
        GPU pods from its readers."""
        upgrades = inputs.config.upgrades
        return cls(inputs.requests, pools=inputs.config.pools, allowed_versions=upgrades.allowed_versions,
                   cluster_policy_scope=upgrades.cluster_policy_scope, gpu_check=upgrades.gpu_check,
                   pods=inputs.reader(GpuPods),
                   budgets=inputs.reader(BudgetReader))

    def preview(self, actor: Actor, ask: UpgradeAsk, *, fleet: Fleet, now: dt.datetime,
                reader: bool = False) -> UpgradePlan:
        """The plan `request` would store, checked the same way; nothing is stored.
        `reader`: a dry run of the command line, for whoever may read the fleet."""
        require(actor, Role.VIEWER if reader else Role.OPERATOR, action="Planning a driver upgrade", pool=ask.pool)
        pods = self._gpu_pods()
        return plan_upgrade(ask, fleet=fleet, policy=self._pools.get(ask.pool), now=now,
                            requested_by=actor.user_id, allowed_versions=self._allowed_versions,
                            cluster_policy_scope=self._cluster_policy_scope, gpu_check=self._gpu_check,
                            gpu_pods=pods, budgets=budgets_of(self._budgets, pods), past_runs=self._requests.pool_pace)

    def request(self, actor: Actor, ask: UpgradeAsk, *, fleet: Fleet, now: dt.datetime,
                channel: str | None = None) -> UpgradeRequested:
        """Plan `ask`, check it and store it as a pending request. Raises UpgradeRefused,
        AccessDenied or RequestRefused."""
        require(actor, Role.OPERATOR, action="Requesting a driver upgrade", pool=ask.pool)
        planned = self.preview(actor, ask, fleet=fleet, now=now)
        view = self._requests.submit(actor, kind="upgrade", pool=ask.pool, targets=list(planned.plan.nodes),
                                     plan=planned.plan, window_start=planned.window_start,
                                     window_end=planned.window_end, reason=ask.reason, channel=channel, now=now)
        return UpgradeRequested(planned, view)

    def rollback(self, actor: Actor, run: RunView, *, fleet: Fleet, now: dt.datetime,
                 channel: str | None = None) -> UpgradeRequested:
        """Plan the version `run` replaced back onto the nodes it changed (its failed node
        first) and onto its driver object, as a new request under the pool's approval rule."""
        if run.kind != "upgrade":
            raise UpgradeRefused(say.rollback_not_an_upgrade(run.id, run.kind), code="not-an-upgrade")
        require(actor, Role.OPERATOR, action="Rolling back a driver upgrade", pool=run.pool)
        blocked = self._requests.rollback_blocked(run.id, state=run.state, pool=run.pool)
        if blocked is not None:
            raise UpgradeRefused(blocked[1], code=blocked[0])
        set_version = next((s for s in run.steps if s.kind == "driver-version" and s.state in ("done", "failed")),
                           None)
        prior = step_intent(set_version).get("prior_version") if set_version is not None else None
        touched = [s for s in run.steps if s.kind in ("driver", "operator-upgrade")
                   and s.state in ("done", "failed", "running")]
        if not prior or not touched:
            raise UpgradeRefused(pool_say.nothing_to_roll_back(run.id, changed=say.ROLLED_BACK),
                                code="nothing-to-roll-back")
        # The node that halted the run goes first, whatever step it halted in (a driver
        # that never came up, a validation or a canary pod that failed after it did): it is
        # out already, cordoned by the run, and the rollback takes that cordon over.
        changed = {s.node for s in touched}
        nodes = tuple(dict.fromkeys([*(n for n in run.halted_on if n in changed), *(s.node for s in touched)]))
        # Nodes the run held back from the operator's upgrade and never let go of.
        held = [n for s in run.steps if s.kind == "operator-hold" and s.state == "done"
                for n in step_intent(s).get("targets") or ()]
        release = tuple(n for n in dict.fromkeys(held) if n not in nodes)
        ask = UpgradeAsk(pool=run.pool, version=str(prior), downgrade=True, reason=f"rollback of {run.id}")
        planned = plan_upgrade(ask, fleet=fleet, policy=self._pools.get(run.pool), now=now,
                               requested_by=actor.user_id, cluster_policy_scope=self._cluster_policy_scope,
                               gpu_check=self._gpu_check, gpu_pods=self._gpu_pods(), rollback=RollbackOf(run=run.id, nodes=nodes, version=str(prior), release=release),
                               past_runs=self._requests.pool_pace)
        view = self._requests.submit(actor, kind="upgrade", pool=run.pool, targets=list(planned.plan.nodes),
                                     plan=planned.plan, window_start=planned.window_start,
                                     window_end=planned.window_end, reason=ask.reason, channel=channel, now=now)
        return UpgradeRequested(planned, view)

    def _gpu_pods(self) -> list[PodObject]:
        """The cluster's GPU pods, read fresh; none without a cluster (a plan then names no pods)."""
        return self._pods.list_gpu_pods() if self._pods is not None else []
