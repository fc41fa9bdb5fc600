"""Why a request or its run waits now, in one sentence: for approvals, for its window,
for a change freeze, for the pool's capacity or window before a wave, for a person to
resume it, or for a step on a node (a PodDisruptionBudget, `drain done`, a person at the
host driver). `/gpu request`, the console and App Home show this sentence, the same words
everywhere; the request's thread hears the longer story as it happens.

A pure function of what storage holds (the request, its runs with the run's `waiting`
and each running step's `waiting` note, both kept current by the engine) and the freeze
covering the pool now; nothing here reads the clock or decides anything.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from storage.steps import Step
from workflows.engine import wait_messages as say
from workflows.engine.runs import RunView, step_note
from workflows.pools import messages as pool_say
from workflows.pools.freezes import Freeze
from workflows.requests.views import RequestView

# The request states before a run: approved and waiting for its window or its start.
_BEFORE_RUN = ("approved", "scheduled")


def why_waiting(request: RequestView, runs: Sequence[RunView], *, now: dt.datetime,
                freeze: Freeze | None = None, approvers: Sequence[str] = (),
                zone: dt.tzinfo = dt.timezone.utc) -> str | None:
    """What `request` waits for at `now`, or None when it waits for nothing a person
    should know (it is under way, or finished). `freeze`: the change freeze that holds
    a run of its pool now, if any; `approvers`: the names of those whose approval would
    count; `zone`: the zone a time is written in (the display zone)."""
    if request.state == "pending":
        if request.is_expired(now):
            return None
        return say.waits_for_approvals(missing=request.approvals_missing, counted=request.approvals_counted,
                                       required=request.approvals_required, approvers=approvers,
                                       pool=request.pool)
    if request.state in _BEFORE_RUN:
        if freeze is not None:
            return _frozen(freeze, zone)
        if request.window_start is not None and request.window_start > now:
            return say.waits_for_window(request.window_start, zone)
        return None
    if request.state != "running":
        return None
    run = next((r for r in reversed(runs) if not r.run.finished), None)
    if run is None:
        return None
    if run.state == "paused":
        return say.waits_paused(run.id)
    if run.run.waiting:
        return run.run.waiting
    if run.state == "pending" and freeze is not None:
        return _frozen(freeze, zone)  # not yet told by the engine (it may not be running)
    return _step_waits(run.steps)


def _frozen(freeze: Freeze, zone: dt.tzinfo) -> str:
    return pool_say.run_waits_for_freeze(target=freeze.target, by=freeze.set_by_name, until=freeze.until,
                                         reason=freeze.reason, cluster=freeze.cluster, zone=zone)


def _step_waits(steps: Sequence[Step]) -> str | None:
    """The running step a person most needs to hear of: a hold (which waits for the
    time or `drain done`, as planned) only when nothing else waits; else the one waiting
    longest (a blocked eviction outlasts the steps that move on)."""
    waiting = [(s, note) for s in steps if s.state == "running" and (note := step_note(s))]
    if not waiting:
        return None
    far_past = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    step, note = min(waiting, key=lambda w: (w[0].kind == "hold", w[0].started_at or far_past, w[0].wave, w[0].seq))
    others = len({s.node for s, _ in waiting} - {step.node})
    return say.waits_on_step(step.node, step.kind, note, others=others)
