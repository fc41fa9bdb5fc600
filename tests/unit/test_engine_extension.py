"""A running drain held longer, as the real engine runs it over an in-memory cluster with
a clock the test moves: the hold goes on past the old end and the node is given back
after the new one, the window-ending notice comes again once for the new end, an
extension that lands between the engine's look at a hold and its commit is not written
over, and a later wave's gate reads the new end (`drain done` after the old end lets the
next wave start instead of halting the run).

Each engine pass looks at every node; the pools' policies are checked before every wave.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

import pytest

from commands.drain_grammar import read_drain_words
from storage import runs as stored_runs
from storage.database import Database
from workflows.config import GpuopsConfig
from workflows.drain.plan import drain_spec, extended_plan, plan_drain
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine
from workflows.engine.runs import RunService, RunView
from workflows.fleet.pods import group_pods_by_node
from workflows.requests.service import RequestService

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
NODES = ("gpu-01", "gpu-02")
CONFIG = GpuopsConfig.model_validate({
    # One node out at a time: gpu-01 and gpu-02 go in two waves.
    "pools": {"train-a": {"kind": "training", "windows": "always", "max_unavailable": 1, "min_ready_gpus": 0,
                          "validate_timeout": "60s"}},
    "access": {"users": {"U0ADA": ["operator"]}, "names": {"U0ADA": "Ada"}},
})
ADA = CONFIG.actor("U0ADA")


class Clock:
    def __init__(self) -> None:
        self.now, self.mono = NOW, 0.0

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        self.mono += seconds


class TrapLease(AlwaysHeld):
    """Held; `trap` runs once, the first time the lease is checked while it says so (an
    engine checks it before every commit): another process writing meanwhile."""

    def __init__(self) -> None:
        self.trap: Callable[[], bool] | None = None

    def held(self) -> bool:
        if self.trap is not None and self.trap():
            self.trap = None
        return True


@pytest.fixture
def cluster(fake_cluster, make):
    for node in NODES:
        fake_cluster.add_node(make.node(node, pool="train-a"))
        for index, pod in enumerate(make.operands(node)):
            fake_cluster.add_pod(pod, uid=f"uid-{pod.name}-{index}")
    return fake_cluster


class Drain:
    """`/gpu drain <words>` on train-a (no approval needed), its run started, one engine
    driven pass by pass."""

    def __init__(self, db: Database, cluster, words: str) -> None:
        self.db, self.cluster, self.clock, self.lease = db, cluster, Clock(), TrapLease()
        fleet = cluster.fleet(NOW)
        spec = drain_spec(read_drain_words(words.split(), fleet=fleet, pools=CONFIG.pools, now=NOW),
                          fleet=fleet, pools=CONFIG.pools, now=NOW)
        self.plan = plan_drain(spec, fleet=fleet, pods_by_node=group_pods_by_node([]), policy=CONFIG.pools["train-a"],
                               open_requests=(), now=NOW, requested_by="U0ADA").plan
        self.requests = RequestService(db, CONFIG)
        self.request = self.requests.submit(ADA, kind="drain", pool="train-a", targets=list(spec.nodes),
                                            plan=self.plan, window_start=spec.start, window_end=spec.end,
                                            reason="rack move", channel="C0OPS", now=NOW)
        self.run_id = RunService(db).start(self.request.id, dry_run=False, now=NOW, actor=ADA).id
        self.engine = Engine(db=db, gateway=cluster, cache=cluster, lease=self.lease, replica="engine-0",
                             clock=lambda: self.clock.now, monotonic=lambda: self.clock.mono, pools=CONFIG.pools)

    def drive(self, until: Callable[[], bool], *, step_s: float = 5, passes: int = 400) -> None:
        for _ in range(passes):
            if until():
                return
            self.engine.run_pass(set(NODES))
            self.clock.advance(step_s)
        assert until(), self.view()

    def extend(self, minutes: int) -> None:
        """Ada's extension, applied at once (the pool needs no approval)."""
        current = self.requests.get(self.request.id)
        assert current.window_end is not None
        end = current.window_end + dt.timedelta(minutes=minutes)
        view = self.requests.extend_running(ADA, self.request.id, extended_plan(current.plan, end), window_end=end,
                                            now=self.clock.now)
        assert view.window_end == end and view.extension is None

    def view(self) -> RunView:
        return RunService(self.db).get(self.run_id)

    def step(self, node: str, kind: str) -> str:
        return next(s.state for s in self.view().steps if (s.node, s.kind) == (node, kind))

    def ended(self, node: str, kind: str) -> dt.datetime:
        step = next(s for s in self.view().steps if (s.node, s.kind) == (node, kind))
        assert step.ended_at is not None, step
        return step.ended_at

    def finished(self) -> bool:
        run = stored_runs.get(self.db, id=self.run_id)
        return run is not None and run.state in ("succeeded", "failed", "aborted")

    def thread(self, event: str) -> list[str]:
        rows = self.db.query("SELECT payload FROM outbox ORDER BY id")
        return [p["text"] for p in (json.loads(r["payload"]) for r in rows) if p["event"] == event]


def test_a_hold_extended_while_it_runs_keeps_the_node_cordoned_past_the_old_end_and_gives_it_back_after_the_new(
        db, cluster):
    drain = Drain(db, cluster, "gpu-01 for 30m firmware")
    drain.drive(lambda: drain.step("gpu-01", "hold") == "running")
    drain.drive(lambda: bool(drain.thread("step.window-ending")), step_s=60)  # 15 minutes before the old end
    drain.extend(30)

    drain.drive(lambda: drain.clock.now > NOW + dt.timedelta(minutes=35), step_s=60)
    assert drain.step("gpu-01", "hold") == "running" and cluster.node("gpu-01").unschedulable
    drain.drive(drain.finished, step_s=60)

    assert stored_runs.get(db, id=drain.run_id).state == "succeeded"  # type: ignore[union-attr]
    assert drain.ended("gpu-01", "hold") >= NOW + dt.timedelta(minutes=60)
    assert drain.ended("gpu-01", "uncordon") >= NOW + dt.timedelta(minutes=60)
    assert not cluster.node("gpu-01").unschedulable
    notices = drain.thread("step.window-ending")
    assert len(notices) == 2, notices
    assert "ends at 2025-06-07 12:30:00 UTC" in notices[0] and "ends at 2025-06-07 13:00:00 UTC" in notices[1]


def test_an_extension_landing_between_the_engines_look_at_the_hold_and_its_commit_is_not_written_over(db, cluster):
    drain = Drain(db, cluster, "gpu-01 for 30m firmware")
    drain.drive(lambda: drain.step("gpu-01", "hold") == "running")
    old_end = NOW + dt.timedelta(minutes=30)
    drain.drive(lambda: drain.clock.now >= old_end - dt.timedelta(seconds=30), step_s=60)

    def extend_once_past_the_old_end() -> bool:
        if drain.clock.now < old_end:
            return False
        drain.extend(30)  # as another process would, while this engine is about to commit
        return True

    drain.lease.trap = extend_once_past_the_old_end
    drain.drive(lambda: drain.lease.trap is None, step_s=60)
    drain.engine.run_pass(set(NODES))

    assert drain.step("gpu-01", "hold") == "running" and cluster.node("gpu-01").unschedulable
    drain.drive(drain.finished, step_s=60)
    assert drain.ended("gpu-01", "hold") >= NOW + dt.timedelta(minutes=60)


def test_a_later_wave_reads_the_extended_end_so_drain_done_after_the_old_end_lets_it_start(db, cluster):
    drain = Drain(db, cluster, "gpu-01 gpu-02 for 30m firmware")
    assert [w.nodes for w in drain.plan.waves] == [("gpu-01",), ("gpu-02",)]
    drain.drive(lambda: drain.step("gpu-01", "hold") == "running")
    drain.extend(30)
    drain.drive(lambda: drain.clock.now > NOW + dt.timedelta(minutes=35), step_s=60)
    assert drain.step("gpu-01", "hold") == "running"

    RunService(db).release_hold(ADA, drain.request.id, now=drain.clock.now)
    drain.drive(drain.finished)

    run = stored_runs.get(db, id=drain.run_id)
    assert run is not None and run.state == "succeeded", run.halted_reason
    assert drain.step("gpu-02", "uncordon") == "done"
    assert not cluster.node("gpu-01").unschedulable and not cluster.node("gpu-02").unschedulable
