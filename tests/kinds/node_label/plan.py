"""A node label's plan, in the shape every plan of a pool's nodes takes
(workflows/pools/planning.py): targets -> policy -> window -> one node per wave, each
node's one `set-label` step."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from tests.kinds.node_label import KIND
from tests.kinds.node_label.step_logic import SetLabelParams
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary
from workflows.pools import planning
from workflows.pools.config import PoolConfig


class LabelRefused(Exception):
    def __init__(self, reason: str, *, code: str) -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


@dataclass(frozen=True, slots=True)
class LabelAsk:
    targets: tuple[str, ...]
    key: str
    # None: remove the label.
    value: str | None
    reason: str = ""
    # A rollback: the value each node gets instead of `value` ({node: value}), and the run
    # it undoes (each step says it takes over that run's label).
    values: Mapping[str, str | None] | None = None
    takes_over: str | None = None


@dataclass(frozen=True, slots=True)
class LabelPlan:
    pool: str
    plan: Plan
    window_start: dt.datetime
    window_end: dt.datetime | None


def plan_label(ask: LabelAsk, *, fleet: Fleet, policy_of: Mapping[str, PoolConfig], now: dt.datetime,
               requested_by: str) -> LabelPlan:
    what = "a node label"
    pool, nodes = planning.targets_in_one_pool(ask.targets, fleet, what=what, refused=LabelRefused)
    policy = planning.require_policy(pool, policy_of.get(pool), refused=LabelRefused, rule="labels nodes")
    start, end = planning.window(policy, pool=pool, now=now, at=None, next_window=False, what=what,
                                 refused=LabelRefused)

    def steps_of(node: str) -> list[NodeStep]:
        value = ask.values[node] if ask.values is not None else ask.value
        return [NodeStep.of("set-label", NodeName(node), SetLabelParams(key=ask.key, value=value,
                                                                        takes_over=ask.takes_over))]

    waves = planning.waves([(n.name,) for n in nodes], steps_of)
    summary = PlanSummary(window_start=start, window_end=end, notes=(f"label {ask.key}",))
    return LabelPlan(pool, planning.assemble(KIND.name, pool=pool, planned=waves, summary=summary,
                                             requested_by=requested_by), start, end)
