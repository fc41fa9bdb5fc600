"""When an approved request's run starts: at its window, never late. The leader's
scheduler (bot/scheduler.py) asks at every tick, for each request it finds approved;
this module decides and acts.

1. A request whose window has not begun waits for it (`next_start`: the scheduler looks
   again then).
2. One whose window ended, or began more than `START_GRACE` before a replica could start
   it (the bot was down, no replica led, a change freeze held it), is marked `missed`,
   never started late, and its requester is told in its thread. The grace is for a
   request approved before (or as) its window began; one approved inside its window may
   start at any time before the window ends (its approvers chose that window knowing
   it was under way).
3. A change freeze on its pool (or the cluster) holds it; it is looked at again at the
   next tick, and starts then if its window is still open within the grace.
4. Otherwise its run starts (`RunService.start` with no actor: the scheduler's right, see
   workflows.engine.runs) on the plan hash read by the caller: a re-plan (`drain extend`)
   committed since refuses the start, and the next tick decides on the new plan.

No clock inside: `now` is an argument.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from storage.database import Database
from workflows.engine.runs import RUNNABLE_STATES, RunRefused, RunService, RunView
from workflows.pools import freezes
from workflows.requests.errors import RequestRefused
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView

# How late after its window starts a run may still begin (the scheduler looks every few
# seconds; a leader change takes seconds). Later than this the window is missed, not used late.
START_GRACE = dt.timedelta(minutes=5)

WindowOutcome = Literal["not runnable", "waits for its window", "missed", "not marked missed", "frozen",
                        "started", "not started"]


@dataclass(frozen=True)
class WindowStart:
    """What became of one approved request at one tick: `next_start` when it waits for its
    window, `run` when its run started, `refusal` when a missed mark or a start was refused
    (e.g. it was cancelled or started meanwhile)."""

    outcome: WindowOutcome
    next_start: dt.datetime | None = None
    run: RunView | None = None
    refusal: str | None = None

    @property
    def changed(self) -> bool:
        """Whether something was written that has a message to send."""
        return self.outcome in ("missed", "started")


def window_missed(*, start: dt.datetime | None, end: dt.datetime | None, approved_at: dt.datetime,
                  now: dt.datetime) -> bool:
    """The window ended, or began more than START_GRACE ago with the request approved
    before (or as) it began. A request approved inside its window may start until the
    window ends."""
    if end is not None and now >= end:
        return True
    return start is not None and now - start > START_GRACE and approved_at <= start


def start_at_window(db: Database, view: RequestView, *, requests: RequestService, runs: RunService,
                    now: dt.datetime) -> WindowStart:
    """Apply the rule above to `view` (as the caller read it) at `now`."""
    if view.state not in RUNNABLE_STATES:
        return WindowStart("not runnable")
    if view.window_start is not None and now < view.window_start:
        return WindowStart("waits for its window", next_start=view.window_start)
    if window_missed(start=view.window_start, end=view.window_end, approved_at=view.updated_at, now=now):
        try:
            requests.mark_missed(view.id, now=now)
        except RequestRefused as err:  # e.g. cancelled or started meanwhile
            return WindowStart("not marked missed", refusal=str(err))
        return WindowStart("missed")
    if freezes.holding_run(db, pool=view.pool, started=False, now=now, cluster=view.cluster) is not None:
        return WindowStart("frozen")  # RunService.start refuses it too
    try:
        # NB: the plan hash read by the caller: a re-plan committed since refuses the start.
        run = runs.start(view.id, dry_run=False, now=now, plan_hash=view.plan_hash)
    except RunRefused as err:  # e.g. cancelled or started meanwhile
        return WindowStart("not started", refusal=str(err))
    return WindowStart("started", run=run)
