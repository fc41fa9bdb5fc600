"""Pre-flight: the gates a run must pass, listed in the plan so the approver sees what will
hold the run and what will halt it: each node's GPU signals compared before and after its
change (or that they are not, where `signals` is not configured); the pool's service health
(`pools.<name>.analysis`: each query, its bound and how long it must hold after every
wave but the last). A plan of one wave says its queries are not asked.

Pure: the plan and its `PlanFacts` are the arguments."""

from __future__ import annotations

from workflows.plans import Plan, PreflightNote
from workflows.preflight import check_messages as say
from workflows.preflight.facts import PlanFacts

_CHECK = "gates"


def gate_notes(plan: Plan, facts: PlanFacts) -> tuple[PreflightNote, ...]:
    """The gates of the run: each node's GPU signals, service health between waves."""
    if facts.policy is None:
        return ()
    return (*_signal_notes(plan, facts), *_health_notes(plan, facts))


def _signal_notes(plan: Plan, facts: PlanFacts) -> tuple[PreflightNote, ...]:
    source = facts.policy.signals_source
    if source is None:
        return (PreflightNote(check=_CHECK, code="gpu-signals-off", severity="info",
                              sentence=say.gpu_signals_off()),)
    return (PreflightNote(check=_CHECK, code="gpu-signals-compared", severity="info",
                          sentence=say.gpu_signals_compared(source)),)


def _health_notes(plan: Plan, facts: PlanFacts) -> tuple[PreflightNote, ...]:
    policy = facts.policy
    queries = policy.analysis
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
