"""The seam every pre-flight check plugs into: what a check reads (`PlanFacts`), what it
answers (`PreflightNote`s, workflows.plans), and `checked`, which runs the checks a kind's
planned plan goes through and puts their notes into its summary, so the hash an approver
approves covers them.

A check of the planned plan is a function `(plan, facts) -> tuple[PreflightNote, ...]`;
`PLAN_CHECKS` lists them in the order their notes appear. A check that decides which nodes
a plan changes (`nodes.screen_nodes`) runs before the waves are built and hands its notes
to `checked` as `before`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workflows.fleet.summary import Fleet
from workflows.kube.objects import DisruptionBudget, PodObject
from workflows.plans import Plan, PreflightNote
from workflows.pools.config import PoolConfig
from workflows.preflight.budgets import budget_notes
from workflows.preflight.duration import PastStep, duration_notes
from workflows.preflight.touches import QuotaLimit, touch_notes


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
    # Namespaces' GPU quotas and the pools they land on (`QuotaReport.limits`).
    quotas: Sequence[QuotaLimit] = ()


PlanCheck = Callable[[Plan, PlanFacts], tuple[PreflightNote, ...]]

# Every check of a planned plan, in the order its notes appear.
PLAN_CHECKS: tuple[PlanCheck, ...] = (budget_notes, duration_notes, touch_notes)


def checked(plan: Plan, facts: PlanFacts, *, before: Sequence[PreflightNote] = (),
            checks: Sequence[PlanCheck] = PLAN_CHECKS) -> Plan:
    """`plan` with the notes of the checks that ran `before` it was built, then of `checks`."""
    found = [*before]
    for check in checks:
        found += check(plan, facts)
    if not found:
        return plan
    return Plan(kind=plan.kind, pool=plan.pool, waves=plan.waves, summary=plan.summary.with_preflight(*found),
                created_for=plan.created_for)
