"""Pre-flight: the gates a run must pass between its waves, listed in the plan so the
approver sees what will hold the run and what will halt it: the pool's service health
(`pools.<name>.analysis`: each query, its bound and how long it must hold after every
wave but the last). A plan of one wave says its queries are not asked.

Pure: the plan and its `PlanFacts` are the arguments."""

from __future__ import annotations

from workflows.plans import Plan, PreflightNote
from workflows.preflight import check_messages as say
from workflows.preflight.facts import PlanFacts

_CHECK = "gates"


def gate_notes(plan: Plan, facts: PlanFacts) -> tuple[PreflightNote, ...]:
    """What holds the run between its waves (nothing to say for a pool without gates)."""
    policy = facts.policy
    queries = policy.analysis if policy is not None else ()
    if not queries:
        return ()
    shown = tuple(say.health_query(q.name, q.query, max_value=q.max, min_value=q.min, length=q.for_)
                  for q in queries)
    if len(plan.waves) < 2:
        return (PreflightNote(check=_CHECK, code="health-one-wave", severity="info",
                              sentence=say.health_one_wave(plan.pool), details=shown),)
    longest = max(q.for_ for q in queries)
    return (PreflightNote(check=_CHECK, code="health-between-waves", severity="info",
                          sentence=say.health_between_waves(plan.pool, waits=len(plan.waves) - 1, longest=longest),
                          details=shown),)
