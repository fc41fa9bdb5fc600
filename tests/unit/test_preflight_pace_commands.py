"""`/gpu upgrade --dry-run` times the run at the pool's pace: at the plan's timeouts until
the pool has run, then at what its last runs took, and says whether it fits the window."""

from __future__ import annotations

import datetime as dt

from bot.render_text import render_text
from storage import requests, runs, steps
from storage.steps import NewStep
from tests.unit import test_upgrade_commands as upgrades
from tests.unit.test_upgrade_commands import NEW, run

# The upgrade commands' fleet and clock (pytest finds fixtures by their name here).
services = upgrades.services
now = upgrades.now

MIN = dt.timedelta(minutes=1)


def _a_past_run(db, *, pool: str, at: dt.datetime, took: dict[str, int]) -> None:
    """A finished upgrade of `pool` whose steps on t1 and t2 took `took` minutes each."""
    request = requests.create(db, kind="upgrade", pool=pool, targets=["t1", "t2"], window_start=None,
                              window_end=None, reason="r", requester="U0ALICE", requester_name="alice", plan={},
                              plan_hash="h", approvals_required=0, expires_at=at + dt.timedelta(days=1), at=at)
    requests.transition(db, id=request.id, expected="pending", new="done", at=at)
    ran = runs.create(db, request_id=request.id, dry_run=False, at=at)
    assert ran is not None
    rows = [NewStep(wave=w, node=node, seq=i, kind=kind) for w, node in enumerate(("t1", "t2"))
            for i, kind in enumerate(took)]
    for step in steps.add(db, run_id=ran.id, steps=rows):
        steps.transition(db, id=step.id, expected="pending", new="running", at=at)
        steps.transition(db, id=step.id, expected="running", new="done", at=at + took[step.kind] * MIN)
    runs.transition(db, id=ran.id, expected="pending", new="running", at=at)
    runs.transition(db, id=ran.id, expected="running", new="succeeded", at=at + dt.timedelta(hours=1))


def test_a_dry_run_times_the_run_at_the_timeouts_first_and_at_the_pools_last_runs_once_it_has_some(services, now):
    first = render_text(run(services, "U0ALICE", f"upgrade train-a to {NEW} kernel --dry-run", now))
    # Two waves of one node: 30m drain timeout + 10m driver + 10m validate each, and the canary's 10m soak.
    assert ("The run takes at most 1h50m at the configured timeouts (2 waves, the slowest node t1 1h; no past "
            "run of train-a to learn its pace from); it fits the window (4h, 2h10m to spare)") in first

    _a_past_run(services.database, pool="train-a", at=now - dt.timedelta(days=7),
                took={"cordon": 0, "evict": 2, "driver": 6, "validate": 4, "uncordon": 0})
    _a_past_run(services.database, pool="serve-a", at=now - dt.timedelta(days=7),
                took={"cordon": 0, "evict": 60, "driver": 60, "validate": 60, "uncordon": 0})

    again = render_text(run(services, "U0ALICE", f"upgrade train-a to {NEW} kernel --dry-run", now))
    assert ("The run takes about 34m at the pace of train-a's last runs (2 waves, the slowest node t1 22m); "
            "it fits the window (4h, 3h26m to spare)") in again
