"""What every pre-flight check of a planned plan reads besides the plan (`PlanFacts`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workflows.fleet.summary import Fleet
from workflows.kube.objects import DisruptionBudget, PodObject
from workflows.pools.config import PoolConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanFacts:
    """What the checks of one plan read besides the plan: the fleet as the watch cache has
    it, the pool's policy, the cluster's GPU pods and the PodDisruptionBudgets of their
    namespaces; `by_operator`: the GPU Operator moves the pods (an upgrade it gates)."""

    fleet: Fleet
    policy: PoolConfig
    gpu_pods: Sequence[PodObject] = ()
    budgets: Sequence[DisruptionBudget] = ()
    by_operator: bool = False
