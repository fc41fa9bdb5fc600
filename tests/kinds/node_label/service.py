"""The node label's service, on the one `ChangeService` protocol (workflows/kinds.py):
`preview` plans without storing, `request` stores a request waiting for the pool's
approvals, `rollback` asks to put back each label a halted run touched."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from tests.kinds.node_label import KIND
from tests.kinds.node_label.plan import LabelAsk, LabelPlan, LabelRefused, plan_label
from workflows.access import Actor, Role, require
from workflows.engine.runs import RunView, step_intent
from workflows.fleet.summary import Fleet
from workflows.kinds import ServiceInputs
from workflows.pools.config import PoolConfig
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView


@dataclass(frozen=True, slots=True)
class LabelRequested:
    planned: LabelPlan
    view: RequestView


class LabelService:
    kind = KIND.name

    def __init__(self, requests: RequestService, *, pools: Mapping[str, PoolConfig]) -> None:
        self._requests, self._pools = requests, pools

    @classmethod
    def built(cls, inputs: ServiceInputs) -> LabelService:
        """For an entry point, as the kind's registry line names it."""
        return cls(inputs.requests, pools=inputs.config.pools)

    def preview(self, actor: Actor, ask: LabelAsk, *, fleet: Fleet, now: dt.datetime) -> LabelPlan:
        planned = plan_label(ask, fleet=fleet, policy_of=self._pools, now=now, requested_by=actor.user_id)
        require(actor, Role.OPERATOR, action="Labelling nodes", pool=planned.pool)
        return planned

    def request(self, actor: Actor, ask: LabelAsk, *, fleet: Fleet, now: dt.datetime,
                channel: str | None = None) -> LabelRequested:
        return self._submit(actor, self.preview(actor, ask, fleet=fleet, now=now), ask, channel=channel, now=now)

    def rollback(self, actor: Actor, run: RunView, *, fleet: Fleet, now: dt.datetime,
                 channel: str | None = None) -> LabelRequested:
        require(actor, Role.OPERATOR, action="Rolling back a node label", pool=run.pool)
        blocked = self._requests.rollback_blocked(run.id, state=run.state, pool=run.pool)
        if blocked is not None:
            raise LabelRefused(blocked[1], code=blocked[0])
        touched = [s for s in run.steps if s.kind == "set-label" and s.state in ("done", "failed", "running")]
        if not touched:
            raise LabelRefused(f"run {run.id} set no label", code="nothing-to-roll-back")
        key = str(step_intent(touched[0])["key"])
        values = {str(s.node): step_intent(s).get("prior") for s in touched}
        ask = LabelAsk(targets=tuple(values), key=key, value=None, reason=f"rollback of {run.id}", values=values,
                       takes_over=run.id)
        return self._submit(actor, self.preview(actor, ask, fleet=fleet, now=now), ask, channel=channel, now=now)

    def _submit(self, actor: Actor, planned: LabelPlan, ask: LabelAsk, *, channel: str | None,
                now: dt.datetime) -> LabelRequested:
        view = self._requests.submit(actor, kind=KIND.name, pool=planned.pool, targets=list(planned.plan.nodes),
                                     plan=planned.plan, window_start=planned.window_start,
                                     window_end=planned.window_end, reason=ask.reason, channel=channel, now=now)
        return LabelRequested(planned, view)
