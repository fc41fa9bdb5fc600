"""What every pre-flight check of a planned plan reads besides the plan (`PlanFacts`), and
the values it holds of the pool's past runs (`PastStep`) and its namespaces' quotas
(`QuotaLimit`, read through a `QuotaLimits`: the kinds cannot import workflows/quotas, a
sibling, so the entry point hands one in among its readers)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from workflows.fleet.summary import Fleet
from workflows.kube.objects import DisruptionBudget, PodObject
from workflows.pools.config import PoolConfig


@dataclass(frozen=True, slots=True)
class PastStep:
    """One step a past run of the pool finished: on which node, of which kind, how long."""

    node: str
    kind: str
    took: dt.timedelta


@dataclass(frozen=True, slots=True)
class Pace:
    """A pool's pace: the steps its last runs finished, and how many nodes of a wave the
    engine changes at once (`engine.max_parallel_nodes`; None: all of them)."""

    steps: Sequence[PastStep] = ()
    parallel: int | None = None


# What reads a pool's pace (the request service's `pool_pace`), by the pool's name (a MIG
# change or a move knows its pool once it is planned).
PastRuns = Callable[[str], Pace]


@dataclass(frozen=True, slots=True)
class QuotaLimit:
    """One namespace's enforced quota on one GPU resource and the pools its pods can land on."""

    namespace: str
    resource: str
    hard: int
    pools: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class QuotaReading:
    """The namespaces' enforced GPU quotas as read for a plan; `unread` says why none could
    be read (the plan then says it names none), None when they were."""

    limits: tuple[QuotaLimit, ...] = ()
    unread: str | None = None


@runtime_checkable
class QuotaLimits(Protocol):
    """Where a plan reads the namespaces' enforced GPU quotas and the pools each can land on
    (`workflows.quotas.service.QuotaService`, among an entry point's readers)."""

    def quota_limits(self, now: dt.datetime) -> QuotaReading: ...


def quotas_of(reader: QuotaLimits | None, now: dt.datetime) -> QuotaReading:
    """The quotas `reader` reads now; none without a reader (no cluster: nothing to say)."""
    return reader.quota_limits(now) if reader is not None else QuotaReading()


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
    # The steps the pool's last runs finished (`duration.past_steps`): the pool's pace.
    past: Sequence[PastStep] = ()
    # Nodes of a wave under way at once (`engine.max_parallel_nodes`; None: all).
    parallel: int | None = None
    # Namespaces' GPU quotas and the pools they land on.
    quotas: Sequence[QuotaLimit] = ()
    # Why the quotas could not be read (None: they were, or there is no cluster to read).
    quotas_unread: str | None = None
