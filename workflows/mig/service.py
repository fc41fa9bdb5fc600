"""The MIG change use case: `request` turns `/gpu mig <pool|node...> <layout>` into a
checked plan (the MIG manager's layouts read fresh from its config, the GPU pods read
fresh from the cluster) and a stored request that waits for the pool's approvals (two
people for a serving pool by default), bound to the plan's hash; `rollback` plans the
layouts a MIG run replaced back onto the nodes it changed. The run starts inside the
pool's window once approved, on the same engine as drains and upgrades. Nothing is
stored when anything refuses."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from workflows.access import Actor, Role, require
from workflows.kinds import ServiceInputs
from workflows.engine.runs import RunView, step_intent
from workflows.fleet.summary import Fleet
from workflows.kube.errors import KubeError
from workflows.kube.objects import CustomObject, PodObject
from workflows.mig import messages as say
from workflows.mig.layouts import MigLayouts, MigRefused
from workflows.mig.plan import DEFAULT_LAYOUT, MigAsk, MigPlan, MigRollbackOf, plan_mig
from workflows.pools import messages as pool_say
from workflows.pools.config import PoolConfig
from workflows.preflight.budgets import BudgetReader, budgets_of
from workflows.preflight.facts import QuotaLimits, quotas_of
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView

DEFAULT_CONFIG_MAP = "default-mig-parted-config"


@runtime_checkable
class MigReader(Protocol):
    """What a MIG plan reads of the cluster besides the fleet (`kube.gateway.KubeGateway`
    is one): the ClusterPolicy (which config the MIG manager uses), that ConfigMap, and
    every pod that asks for GPU resources."""

    def get_cluster_policy(self, name: str) -> CustomObject: ...

    def get_config_map_data(self, namespace: str, name: str) -> Mapping[str, str]: ...

    def list_gpu_pods(self) -> list[PodObject]: ...


@dataclass(frozen=True, slots=True)
class MigRequested:
    planned: MigPlan
    view: RequestView


class MigService:
    kind = "mig"  # its entry in workflows/kinds.py

    def __init__(self, requests: RequestService, *, pools: Mapping[str, PoolConfig],
                 reader: MigReader | None = None, budgets: BudgetReader | None = None,
                 quotas: QuotaLimits | None = None) -> None:
        self._requests = requests
        self._budgets = budgets
        self._quotas = quotas
        self._pools = pools
        self._reader = reader

    @classmethod
    def built(cls, inputs: ServiceInputs) -> MigService:
        """For an entry point (its registry line): the MIG reads from its readers (the
        quotas a change would no longer fit too, where the entry point reads them)."""
        return cls(inputs.requests, pools=inputs.config.pools, reader=inputs.reader(MigReader),
                   budgets=inputs.reader(BudgetReader), quotas=inputs.reader(QuotaLimits))

    def preview(self, actor: Actor, ask: MigAsk, *, fleet: Fleet, now: dt.datetime,
                rollback: MigRollbackOf | None = None) -> MigPlan:
        """The plan `request` would store, checked the same way; nothing is stored."""
        layouts, strategy, pods = self._read(fleet, ask)
        planned = plan_mig(ask, fleet=fleet, policy_of=self._pools, layouts=layouts, strategy=strategy, now=now,
                           requested_by=actor.user_id, gpu_pods=pods, rollback=rollback,
                           budgets=budgets_of(self._budgets, pods), past_runs=self._requests.pool_pace,
                           quotas=quotas_of(self._quotas, now))
        require(actor, Role.OPERATOR, action="Planning a MIG change", pool=planned.pool)
        return planned

    def request(self, actor: Actor, ask: MigAsk, *, fleet: Fleet, now: dt.datetime,
                channel: str | None = None) -> MigRequested:
        """Plan `ask`, check it and store it as a pending request. Raises MigRefused,
        AccessDenied or RequestRefused."""
        planned = self.preview(actor, ask, fleet=fleet, now=now)
        return self._submit(actor, planned, reason=ask.reason, channel=channel, now=now)

    def rollback(self, actor: Actor, run: RunView, *, fleet: Fleet, now: dt.datetime,
                 channel: str | None = None) -> MigRequested:
        """Plan the layouts `run` replaced back onto the nodes it changed (its failed node
        first), as a new request under the pool's approval rule."""
        if run.kind != "mig":
            raise MigRefused(say.rollback_not_mig(run.id, run.kind), code="not-a-mig-change")
        require(actor, Role.OPERATOR, action="Rolling back a MIG change", pool=run.pool)
        blocked = self._requests.rollback_blocked(run.id, state=run.state, pool=run.pool)
        if blocked is not None:
            raise MigRefused(blocked[1], code=blocked[0])
        touched = [s for s in run.steps if s.kind == "mig" and s.state in ("done", "failed", "running")]
        if not touched:
            raise MigRefused(pool_say.nothing_to_roll_back(run.id, changed=say.ROLLED_BACK),
                            code="nothing-to-roll-back")
        # The node that halted the run first, whatever step it halted in (see RunView.halted_on).
        touched.sort(key=lambda s: s.node not in run.halted_on)
        layouts = tuple((s.node, str(step_intent(s).get("prior_config") or DEFAULT_LAYOUT)) for s in touched)
        ask = MigAsk(targets=tuple(n for n, _ in layouts), layout="", reason=f"rollback of {run.id}")
        planned = self.preview(actor, ask, fleet=fleet, now=now, rollback=MigRollbackOf(run=run.id, layouts=layouts))
        return self._submit(actor, planned, reason=ask.reason, channel=channel, now=now)

    def _submit(self, actor: Actor, planned: MigPlan, *, reason: str, channel: str | None,
                now: dt.datetime) -> MigRequested:
        view = self._requests.submit(actor, kind="mig", pool=planned.pool, targets=list(planned.plan.nodes),
                                     plan=planned.plan, window_start=planned.window_start,
                                     window_end=planned.window_end, reason=reason, channel=channel, now=now)
        return MigRequested(planned, view)

    def _read(self, fleet: Fleet, ask: MigAsk) -> tuple[MigLayouts, str | None, Sequence[PodObject]]:
        """The MIG manager's layouts, the pool's MIG strategy and the cluster's GPU pods."""
        cluster = fleet.cluster
        if self._reader is None:
            raise MigRefused(say.config_missing("the cluster", "this gpuops reads no cluster"), code="mig-config")
        if cluster.cluster_policy is None or cluster.operator_namespace is None:
            raise MigRefused(say.no_cluster_policy(), code="no-cluster-policy")
        try:
            policy = self._reader.get_cluster_policy(cluster.cluster_policy)
            name = _config_name(policy.spec) or DEFAULT_CONFIG_MAP
            source = f"ConfigMap {cluster.operator_namespace}/{name}"
            data = self._reader.get_config_map_data(cluster.operator_namespace, name)
            pods = self._reader.list_gpu_pods()
        except KubeError as err:
            raise MigRefused(say.config_missing(f"ConfigMap {cluster.operator_namespace}", err.api_message),
                             code="mig-config") from None
        if "config.yaml" not in data:
            raise MigRefused(say.config_unreadable(source, "it has no config.yaml"), code="mig-config")
        strategy = _strategy(policy.spec)
        return MigLayouts.parse(data["config.yaml"], source=source), strategy, pods


def _config_name(spec: Mapping[str, Any]) -> str | None:
    manager = spec.get("migManager")
    config = manager.get("config") if isinstance(manager, Mapping) else None
    name = config.get("name") if isinstance(config, Mapping) else None
    return str(name) if name else None


def _strategy(spec: Mapping[str, Any]) -> str | None:
    mig = spec.get("mig")
    strategy = mig.get("strategy") if isinstance(mig, Mapping) else None
    return str(strategy) if strategy else "single"  # the operator's default
