"""Which requests are still open (what `/gpu requests` lists and what a new drain's
capacity check counts against the pool): approved ones and those whose run is under way,
not cancelled ones."""

from __future__ import annotations

import datetime as dt

from storage import requests as stored_requests
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunService
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.requests.service import RequestService

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
CONFIG = GpuopsConfig.model_validate({
    "pools": {"train-a": {"kind": "training", "windows": "always", "approvals": {"drain": 0}}},
    "access": {"users": {"U0ADA": ["operator"]}, "names": {"U0ADA": "Ada"}},
})


def _submit(requests: RequestService, node: str):
    plan = Plan(kind="drain", pool="train-a", summary=PlanSummary(), created_for="U0ADA",
                waves=(Wave(0, (node,), (NodeStep("cordon", node, {}),)),))  # type: ignore[arg-type]
    return requests.submit(CONFIG.actor("U0ADA"), kind="drain", pool="train-a", targets=[node], plan=plan,
                           window_start=None, window_end=None, reason="rack move", channel="C0OPS", now=NOW)


def test_approved_scheduled_and_running_requests_are_open_and_a_cancelled_one_is_not(db):
    requests = RequestService(db, CONFIG)
    approved, scheduled, running, cancelled = (_submit(requests, node)
                                               for node in ("gpu-01", "gpu-02", "gpu-03", "gpu-04"))
    # Scheduled: a state stored requests may hold (nothing moves one there today); its nodes
    # are still spoken for.
    assert stored_requests.transition(db, id=scheduled.id, expected="approved", new="scheduled", at=NOW)
    RunService(db).start(running.id, dry_run=False, now=NOW, actor=CONFIG.actor("U0ADA"))
    requests.cancel(CONFIG.actor("U0ADA"), cancelled.id, now=NOW)

    open_ = {r.id: r.state for r in requests.open_requests("train-a")}

    assert open_ == {approved.id: "approved", scheduled.id: "scheduled", running.id: "running"}
