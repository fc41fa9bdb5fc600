"""A running drain's extension, as storage sees it: whether the request's run still holds
its nodes (only then can its window end move later), and the control its hold steps
read once an extension is applied.

The engine's `hold` step (workflows.engine.steps.waiting `Hold`) fixes its end when it starts;
an applied extension writes the `HoldExtension` control (storage.step_params: `extended_until`,
and who and when) into the params of the run's hold steps still pending or running, as
`drain done` writes `HoldRelease`. The
step takes the later of its own end and `extended_until`, so an extension never shortens
a hold; a hold not started yet takes the control as it starts.

Nothing here decides who may extend or whether the pool has room: that is
`RequestService.extend_running` (the two-person rule) and `DrainService.extend` (windows
and capacity). Every function takes the database inside the caller's transaction.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import Database
from storage.step_params import HoldExtension, HoldRelease, StepParamsError
from storage.ids import RunId
from storage.requests import Request
from storage.steps import Step
from workflows.kube.objects import NodeName
from workflows.requests import messages as say

_UNFINISHED_RUN = ("pending", "running", "paused")
_OPEN_STEP = ("pending", "running")


@dataclass(frozen=True, slots=True)
class RunningHold:
    """What a running drain's run holds now: its hold steps still pending or running, and
    the nodes out now (the lowest wave among them); `refusal` (one sentence) when no
    extension can apply: no unfinished run, `drain done` said, or the holds have ended."""

    run_id: RunId | None
    holds: tuple[Step, ...]
    nodes: tuple[NodeName, ...]
    refusal: str | None = None

    @property
    def holding(self) -> bool:
        return self.refusal is None


def running_hold(db: Database, request: Request) -> RunningHold:
    """Read the request's unfinished run and its hold steps."""
    runs = [r for r in stored_runs.for_request(db, request_id=request.id) if r.state in _UNFINISHED_RUN]
    if not runs:
        return RunningHold(None, (), (), say.extend_no_run(request.id))
    run = runs[-1]
    steps = stored_steps.for_run(db, run_id=run.id)
    holds = tuple(s for s in steps if s.kind == "hold" and s.state in _OPEN_STEP)
    if any(_released(s) for s in holds):
        return RunningHold(run.id, (), (), say.extend_released(request.id))
    if not holds:
        return RunningHold(run.id, (), (), say.extend_validating(request.id))
    wave = min(s.wave for s in holds)
    return RunningHold(run.id, holds, tuple(sorted({NodeName(s.node) for s in holds if s.wave == wave})))


def extend_holds(db: Database, hold: RunningHold, *, until: dt.datetime, by: str, at: dt.datetime) -> list[str]:
    """Write the extension control into each of `hold`'s steps; the nodes that took it."""
    extended: list[str] = []
    for step in hold.holds:
        detail = dict(step.detail) if isinstance(step.detail, dict) else {}
        params = HoldExtension(extended_until=until, extended_at=at, extended_by=by).written_into(_params(step))
        if stored_steps.replace_detail(db, id=step.id, expected=step.state, detail={**detail, "params": params}):
            extended.append(step.node)
    return sorted(set(extended))


def _released(step: Step) -> bool:
    """Whether `drain done` was said for the hold; a control that cannot be read counts as
    said (fail closed: no extension of a hold whose end is not known)."""
    try:
        return HoldRelease.read_from(_params(step), kind=step.kind) is not None
    except StepParamsError:
        return True


def _params(step: Step) -> dict[str, Any]:
    detail = step.detail if isinstance(step.detail, dict) else {}
    params = detail.get("params")
    return params if isinstance(params, dict) else {}
