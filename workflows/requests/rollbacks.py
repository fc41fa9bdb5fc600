"""Requests that undo or go on with a finished run: the open rollback of a run (its cordons
take over that run's), the request continuing a halted run (`/gpu continue`, its steps
marked `continues`), and why a run cannot be rolled back now."""

from __future__ import annotations

from storage import requests as stored_requests
from storage.requests import RequestState
from storage.step_params import ContinuesMark, TakesOverMark
from workflows.plans import Plan, plan_from_json
from workflows.requests import messages as say
from workflows.requests import policy
from workflows.requests.records import LIST_LIMIT, RequestRecords
from workflows.requests.views import RequestView

# A continuation in these states has continued its halted run (open, or run already).
CONTINUED_STATES: tuple[RequestState, ...] = ("pending", "approved", "scheduled", "running", "done", "failed")


def continues(plan: Plan) -> str | None:
    """The halted run `plan` continues (its steps carry `ContinuesMark`), if it is a continuation."""
    return next((mark.continues for wave in plan.waves for step in wave.steps
                 if (mark := ContinuesMark.read_from(step.params, kind=step.kind)) is not None), None)


def plan_takes_over(plan: Plan, run_id: str) -> bool:
    """Whether a step of `plan` takes over what run `run_id` left (`TakesOverMark`)."""
    return any(mark.takes_over == run_id for wave in plan.waves for step in wave.steps
               if (mark := TakesOverMark.read_from(step.params, kind=step.kind)) is not None)


class RollbackLookups(RequestRecords):
    """Rollbacks and continuations of runs, as requests."""

    def rollback_asked(self, run_id: str, *, pool: str) -> RequestView | None:
        """The open request that rolls back `run_id` (a step of its plan takes over that
        run's: its cordons, or a kind's own step for a kind that cordons nothing), if any."""
        return next((view for view in self.open_requests(pool)
                     if continues(view.plan) is None and plan_takes_over(view.plan, run_id)), None)

    def continuation_of(self, run_id: str, *, pool: str) -> RequestView | None:
        """The request that continues the halted run `run_id` (`/gpu continue`), open or
        run already (done, or failed: then its own run is the one to continue), if any."""
        rows = stored_requests.in_states(self._db, states=CONTINUED_STATES, pool=pool, limit=LIST_LIMIT,
                                         cluster=self._cluster())
        return next((self._view(r) for r in rows if continues(plan_from_json(r.plan)) == run_id),
                    None)

    def rollback_blocked(self, run_id: str, *, state: str, pool: str) -> tuple[str, str] | None:
        """Why `run_id` cannot be rolled back now, as (code, reason): it has not finished,
        a rollback of it is already asked for, or a continuation of it is open; None when
        it can."""
        if state in ("pending", "running", "paused"):
            return "run-unfinished", say.rollback_unfinished(run_id, state)
        asked = self.rollback_asked(run_id, pool=pool)
        if asked is not None:
            return "rollback-asked", say.rollback_already_asked(run_id, asked.id)
        continuing = self.continuation_of(run_id, pool=pool)
        if continuing is not None and continuing.state in policy.OPEN_STATES:
            return "continuation-open", say.rollback_while_continued(run_id, continuing.id)
        return None
