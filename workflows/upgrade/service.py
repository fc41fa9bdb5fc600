"""The upgrade use case: `request` turns what a person asked for (an `UpgradeAsk`, from
`/gpu upgrade`) into a checked plan and a stored request that waits for the pool's
approvals (two distinct people, neither the requester, for a serving pool by default),
bound to the plan's hash. The run starts inside the pool's window once approved, as a
drain's does, on the same engine. Nothing is stored when anything refuses."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workflows.access import Actor, Role, require
from workflows.fleet.summary import Fleet
from workflows.pools.config import PoolConfig
from workflows.requests.service import RequestService, RequestView
from workflows.upgrade.plan import UpgradeAsk, UpgradePlan, plan_upgrade


@dataclass(frozen=True, slots=True)
class UpgradeRequested:
    planned: UpgradePlan
    view: RequestView


class UpgradeService:
    def __init__(self, requests: RequestService, *, pools: Mapping[str, PoolConfig],
                 allowed_versions: Sequence[str] = ()) -> None:
        self._requests = requests
        self._pools = pools
        self._allowed_versions = tuple(allowed_versions)

    def request(self, actor: Actor, ask: UpgradeAsk, *, fleet: Fleet, now: dt.datetime,
                channel: str | None = None) -> UpgradeRequested:
        """Plan `ask`, check it and store it as a pending request. Raises UpgradeRefused,
        AccessDenied or RequestRefused."""
        require(actor, Role.OPERATOR, action="Requesting a driver upgrade", pool=ask.pool)
        planned = plan_upgrade(ask, fleet=fleet, policy=self._pools.get(ask.pool), now=now,
                               requested_by=actor.user_id, allowed_versions=self._allowed_versions)
        view = self._requests.submit(actor, kind="upgrade", pool=ask.pool, targets=list(planned.plan.nodes),
                                     plan=planned.plan, window_start=planned.window_start,
                                     window_end=planned.window_end, reason=ask.reason, channel=channel, now=now)
        return UpgradeRequested(planned, view)
