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

from workflows.plans import Plan, PreflightNote
from workflows.preflight.budgets import budget_notes
from workflows.preflight.duration import duration_notes
from workflows.preflight.facts import PlanFacts
from workflows.preflight.gates import gate_notes
from workflows.preflight.touches import touch_notes

__all__ = ["PLAN_CHECKS", "PlanCheck", "PlanFacts", "checked"]


PlanCheck = Callable[[Plan, PlanFacts], tuple[PreflightNote, ...]]

# Every check of a planned plan, in the order its notes appear.
PLAN_CHECKS: tuple[PlanCheck, ...] = (budget_notes, duration_notes, touch_notes, gate_notes)


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
