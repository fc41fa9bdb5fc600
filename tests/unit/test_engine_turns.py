"""The engine's decisions about a run, one pass at a time (workflows/engine/loop.py), on
plans written out here and run by the real engine over the in-memory cluster:

- a pass is counted, and says whether a run is left unfinished;
- a waiting step is looked at again when its time comes on the monotonic clock (a
  timer falls due at its very time, even when a later look set a later one; a time that
  comes while the pass runs counts), when its node is woken, or at once when `drain done`
  lands (also in the middle of a pass); never before, even when the wall clock has passed
  its end; and at most once a pass, even when another step of its run ends in it;
- a node's next step starts in the pass its step ended, also after the node was left out;
- a step of a run aborted elsewhere is no longer in flight after the next pass, and a run
  aborted in the middle of a pass gets nothing more;
- an engine drives its own cluster's runs, and the home cluster's also those that name
  none; never another cluster's;
- a run held by a change freeze before it starts stays pending, its thread told once, and
  the pass ends at once; a paused run (before or in its waves) starts nothing and its pass
  ends at once; a run whose last node is under way, or was left out, still finishes under
  a freeze; a run frozen before its first wave halts at its window's end naming that wave;
- a failed step keeps what its outcome found; after a wave's fallback ran, the halt names
  the failed step's own code; a step that reads an earlier step's intent as it starts (a
  driver version set back, as the next step or as the fallback) finds it;
- an audited action is gpuops' own (the gateway's identity, the replica, dry_run) and its
  Kubernetes Events are on the right objects (a node.* action's target, a node a step
  names, a ClusterPolicy) with a note in the display zone naming the approvers by name;
- log lines carry the ids of the run and the step they are about; the run's messages go
  to the request's thread; the Lease lost is said in words; a run whose request is gone
  stops the pass naming both ids.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from storage import approvals as stored_approvals
from storage import audit
from storage import freezes as stored_freezes
from storage import kube_events as queued
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import Database
from storage.steps import Step
from workflows import logfields
from workflows.engine.context import RunInfo
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine, EngineSettings
from workflows.engine.runs import RunService
from workflows.engine.steps.contract import LeaseLost
from workflows.kube.gateway.paths import CLUSTER_POLICIES
from workflows.plans import NodeStep, plan_from_json
from workflows.pools import messages as gate_say

from tests.unit.test_driver_set_back_step import BACK_POLICY
from tests.unit.test_driver_version_step import TO_POLICY, VersionCluster
from tests.unit.test_engine_records import posted
from tests.unit.test_engine_safety import Drain
from tests.unit.test_operator_upgrade_steps import OLD
from tests.unit.test_safety_rules import NOW, PlannedRun, hand_cordon, pool_config
from tests.unit.test_wave_course import unusable_hold_with_fallback
from tests.unit.test_safety_rules import cluster as cluster  # noqa: F401  (ten nodes of train-a)

ADA = "U0ADA"


def hold(seconds: int) -> Any:
    """One node's plan: a hold of `seconds`, nothing else."""
    return lambda node: (NodeStep("hold", node, {"seconds": seconds}),)  # type: ignore[arg-type]


def steps_of(run: PlannedRun) -> list[Step]:
    return sorted(stored_steps.for_run(run.db, run_id=run.run_id), key=lambda s: s.seq)


def at(run: PlannedRun, *, wall_s: float, mono_s: float) -> None:
    """Both clocks set: the wall clock `wall_s` after NOW, the monotonic one at `mono_s`."""
    run.now, run.mono = NOW + dt.timedelta(seconds=wall_s), mono_s


# ------------------------------------------------------------------ a pass


def test_each_pass_is_counted_and_says_whether_a_run_is_left_unfinished(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))

    assert [run.engine.run_pass(set()), run.engine.run_pass(set())] == [True, True]
    at(run, wall_s=60, mono_s=60)
    assert run.engine.run_pass(set()) is False  # the hold ended: the run finished in this pass

    assert run.state() == "succeeded"
    assert run.engine.passes == 3


# ------------------------------------------------------------------ which waiting steps are looked at


def test_a_waiting_step_is_not_looked_at_before_its_time_even_when_the_wall_clock_passed_its_end(
        db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))
    run.engine.run_pass(set())  # started: held until NOW + 60s, looked at again at 60 on the monotonic clock
    assert [s.state for s in steps_of(run)] == ["running"]

    at(run, wall_s=120, mono_s=30)
    run.engine.run_pass(set())
    assert [s.state for s in steps_of(run)] == ["running"]

    at(run, wall_s=120, mono_s=60)
    run.engine.run_pass(set())
    assert [s.state for s in steps_of(run)] == ["done"]


def test_a_timer_falls_due_at_its_very_time_even_when_a_later_look_set_a_later_one(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))
    run.engine.run_pass(set())  # a timer at 60
    at(run, wall_s=0, mono_s=10)
    run.engine.run_pass({"gpu-01"})  # woken: 60s still to go, a timer at 70

    at(run, wall_s=60, mono_s=60)
    run.engine.run_pass(set())

    assert [s.state for s in steps_of(run)] == ["done"]


class Ticking:
    """The monotonic clock of a pass that takes time: the first read of the pass gives
    `first`, every later one `then`."""

    def __init__(self) -> None:
        self.first: float = 0.0
        self.then: float | None = None

    def __call__(self) -> float:
        now, self.first = self.first, (self.then if self.then is not None else self.first)
        return now


def test_a_step_whose_time_comes_during_a_pass_is_looked_at_in_that_pass(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))
    mono = Ticking()
    run.engine = Engine(db=db, gateway=cluster, cache=cluster, lease=AlwaysHeld(), replica="engine-0",
                        clock=lambda: run.now, monotonic=mono)
    run.engine.run_pass(set())  # looked at again at 60

    run.now = NOW + dt.timedelta(seconds=60)
    mono.first, mono.then = 59.5, 60.0  # the timer is not due when the pass begins; the step's time is, later
    run.engine.run_pass(set())

    assert [s.state for s in steps_of(run)] == ["done"]


def test_a_woken_node_has_its_step_looked_at_at_once(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], steps=hold(60))
    run.engine.run_pass(set())

    at(run, wall_s=60, mono_s=10)
    run.engine.run_pass({"gpu-02"})

    assert [(s.node, s.state) for s in steps_of(run)] == [("gpu-01", "running"), ("gpu-02", "done")]


def test_drain_done_ends_a_hold_at_once_not_at_its_old_time(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(3600))
    run.engine.run_pass(set())
    request_id = RunService(db).get(run.run_id).request_id

    at(run, wall_s=10, mono_s=10)
    RunService(db).release_hold(run.cfg.actor(ADA), request_id, now=run.now)
    run.engine.run_pass(set())

    assert [s.state for s in steps_of(run)] == ["done"]
    assert run.state() == "succeeded"


def test_a_step_of_a_run_aborted_elsewhere_is_no_longer_in_flight_after_the_next_pass(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))
    run.engine.run_pass(set())
    (step,) = steps_of(run)
    assert run.engine.in_flight(step.id)

    RunService(db).abort(run.cfg.actor(ADA), run.run_id, now=run.now)
    assert run.engine.run_pass(set()) is False

    assert not run.engine.in_flight(step.id)


def hooked_engine(run: PlannedRun, after_commit: Any) -> Engine:
    """The run's engine, with `after_commit(count)` run after each of its commits: what
    another process does meanwhile."""
    run.engine = Engine(db=run.db, gateway=run.cluster, cache=run.cluster, lease=AlwaysHeld(), replica="engine-0",
                        clock=lambda: run.now, monotonic=lambda: run.mono, on_commit=after_commit)
    return run.engine


def test_drain_done_landing_while_a_hold_ends_is_looked_at_again_in_the_same_pass(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], steps=hold(60))
    request_id = RunService(db).get(run.run_id).request_id
    released: list[int] = []

    def drain_done_once_the_first_hold_ended(_: int) -> None:
        if not released and [s.state for s in steps_of(run)] == ["done", "running"]:
            released.append(1)
            RunService(db).release_hold(run.cfg.actor(ADA), request_id, now=run.now)

    engine = hooked_engine(run, drain_done_once_the_first_hold_ended)
    engine.run_pass(set())
    at(run, wall_s=60, mono_s=60)
    engine.run_pass(set())  # both holds end; gpu-02's read its params before `drain done` landed

    assert released and [s.state for s in steps_of(run)] == ["done", "done"]
    assert run.state() == "succeeded"


def test_a_run_aborted_by_another_process_in_the_middle_of_a_pass_gets_nothing_more(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))

    def abort_after_the_start(count: int) -> None:
        if count == 1:
            RunService(db).abort(run.cfg.actor(ADA), run.run_id, now=run.now)

    engine = hooked_engine(run, abort_after_the_start)
    assert engine.run_pass(set()) is False

    assert run.state() == "aborted"
    assert [e.action for e in audit.for_run(db, run.run_id)] == ["run.created", "run.started", "run.aborted"]
    assert cluster.writes == []


# ------------------------------------------------------------------ whose runs


@pytest.mark.parametrize(("request_cluster", "engine_cluster", "home", "driven"), [
    ("east", "east", False, True),  # its own cluster's run
    ("east", "east", True, True),
    ("west", "east", True, False),  # never another cluster's
    (None, "east", False, False),  # a run naming no cluster belongs to the home cluster
    (None, "east", True, True),
])
def test_an_engine_drives_its_own_clusters_runs_and_the_home_one_also_those_naming_none(
        db, cluster, request_cluster, engine_cluster, home, driven):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))
    request_id = RunService(db).get(run.run_id).request_id
    db.execute("UPDATE requests SET cluster = ? WHERE id = ?", (request_cluster, request_id))
    engine = Engine(db=db, gateway=cluster, cache=cluster, lease=AlwaysHeld(), replica="engine-0",
                    clock=lambda: run.now, monotonic=lambda: run.mono, cluster=engine_cluster, home=home)

    left = engine.run_pass(set())

    assert (left, run.state()) == ((True, "running") if driven else (False, "pending"))


# ------------------------------------------------------------------ freezes and pauses


class Counted:
    """The database as the engine sees it, counting what the engine asks of it: a pass
    that turns the same run over and over asks thousands of times."""

    def __init__(self, db: Database) -> None:
        self.db, self.asked = db, 0

    def __getattr__(self, name: str) -> Any:
        self.asked += 1
        return getattr(self.db, name)


def counted_engine(run: PlannedRun, *, gated: bool = False) -> tuple[Engine, Counted]:
    counted = Counted(run.db)
    run.engine = Engine(db=counted, gateway=run.cluster, cache=run.cluster,  # type: ignore[arg-type]
                        lease=AlwaysHeld(), replica="engine-0", clock=lambda: run.now, monotonic=lambda: run.mono,
                        pools=run.cfg.pools if gated else None)
    return run.engine, counted


def freeze(run: PlannedRun) -> None:
    stored_freezes.create(run.db, target="train-a", until=NOW + dt.timedelta(hours=6), reason="incident",
                          let_running_finish=False, set_by="U0BOB", set_by_name="Bob", at=run.now)


def test_a_run_frozen_before_it_starts_stays_pending_its_thread_told_once_and_the_pass_ends_at_once(
        db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))
    freeze(run)
    engine, counted = counted_engine(run)

    for _ in range(3):
        assert engine.run_pass(set()) is True

    assert run.state() == "pending" and cluster.writes == []
    text = gate_say.run_frozen(run_id=run.run_id, target="train-a", by="Bob", until=NOW + dt.timedelta(hours=6),
                               reason="incident", in_flight=[], zone=dt.timezone.utc)
    assert [m["payload"]["text"] for m in posted(db, "run.frozen")] == [text]
    assert counted.asked < 300  # a few reads a pass, not a run turned over and over


def test_a_paused_run_starts_nothing_and_its_pass_ends_at_once(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",), ("gpu-02",)], steps=hold(60))
    engine, counted = counted_engine(run)
    engine.run_pass(set())
    RunService(db).pause(run.cfg.actor(ADA), run.run_id, now=run.now)
    counted.asked = 0

    at(run, wall_s=30, mono_s=30)
    engine.run_pass(set())

    assert counted.asked < 100
    at(run, wall_s=60, mono_s=60)
    engine.run_pass(set())
    assert [(s.node, s.state) for s in steps_of(run)] == [("gpu-01", "done"), ("gpu-02", "pending")]
    assert run.state() == "paused"


def test_a_run_whose_last_node_is_under_way_still_finishes_under_a_freeze(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)])
    run.drive(lambda: [s.state for s in steps_of(run)] == ["done", "running", "pending"])
    freeze(run)
    engine, counted = counted_engine(run)
    engine.run_pass(set())  # the hold goes on: the pass ends at once
    assert counted.asked < 100

    run.drive(lambda: run.state() == "succeeded")

    assert [s.state for s in steps_of(run)] == ["done", "done", "done"]


def test_a_run_whose_last_node_was_left_out_still_finishes_under_a_freeze(db, cluster, make):  # noqa: F811
    cluster.add_pod(make.workload("gpu-01", gpus=8, name="job-01", labels={"app": "job-01"}), uid="uid-job-01")
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "skip", words="gpu-01 for 10m rack move")
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running")
    stored_freezes.create(db, target="train-a", until=NOW + dt.timedelta(hours=6), reason="incident",
                          let_running_finish=False, set_by="U0BOB", set_by_name="Bob", at=drain.clock.now)

    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert [(s.kind, s.state) for s in drain.view().steps] == [
        ("cordon", "done"), ("evict", "skipped"), ("hold", "skipped"), ("validate", "skipped"), ("uncordon", "done")]


def test_a_nodes_next_step_starts_in_the_pass_its_step_ended(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)])

    run.drive(lambda: run.state() == "succeeded")

    cordon, held, uncordon = steps_of(run)
    assert (held.started_at, uncordon.started_at) == (cordon.ended_at, held.ended_at)


def test_a_node_left_out_starts_its_uncordon_in_the_same_pass(db, cluster, make):  # noqa: F811
    cluster.add_pod(make.workload("gpu-01", gpus=8, name="job-01", labels={"app": "job-01"}), uid="uid-job-01")
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "skip", words="gpu-01 for 10m rack move")

    drain.drive(drain.finished)

    steps = {s.kind: s for s in stored_steps.for_run(db, run_id=drain.run_id)}
    assert steps["evict"].state == "skipped"
    assert steps["uncordon"].started_at == steps["evict"].ended_at


def test_a_waiting_step_is_looked_at_once_a_pass_even_when_another_step_of_its_run_ends_in_it(
        db, cluster, make):  # noqa: F811
    for node in ("gpu-01", "gpu-02"):
        job = f"job-{node[-2:]}"
        cluster.add_pod(make.workload(node, gpus=8, name=job, labels={"app": job}), uid=f"uid-{job}")
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "wait")
    tries: list[int] = []

    for _ in range(12):  # gpu-02 drains and is held while gpu-01's eviction is blocked
        before = cluster.did("evict").count(("evict", "ml/job-01"))
        drain.engine.run_pass({"gpu-01", "gpu-02"})
        tries.append(cluster.did("evict").count(("evict", "ml/job-01")) - before)
        drain.clock.advance(5)

    assert drain.step("gpu-02", "hold") == "running" and drain.step("gpu-01", "evict") == "running"
    assert max(tries) == 1


# ------------------------------------------------------------------ failures


def test_after_its_waves_fallback_ran_the_halt_names_the_failed_steps_own_code(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=unusable_hold_with_fallback)
    run.drive(lambda: run.state() == "failed")

    assert [s.state for s in steps_of(run)] == ["done", "failed", "skipped", "done"]
    (halt,) = audit.for_run(db, run.run_id, actions=["run.failed"])
    (told,) = posted(db, "run.failed")
    assert (halt.detail["code"], told["payload"]["halted_on"]) == ("bad-params", "bad-params")


def test_a_failed_step_keeps_what_its_outcome_found(db, cluster, make):  # noqa: F811
    cluster.add_pod(make.workload("gpu-01", gpus=8, name="job-01", labels={"app": "job-01"}), uid="uid-job-01")
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")

    drain.drive(drain.finished)

    evict = next(s for s in drain.view().steps if s.kind == "evict")
    budget = "Cannot evict pod as it would violate the pod's disruption budget."
    assert evict.state == "failed"
    assert evict.detail["result"]["blocked"] == {"ml/job-01": budget}
    assert evict.detail["halt_code"] == "eviction-blocked"


@pytest.fixture
def policy(make) -> VersionCluster:
    """gpu-01 of train-a, and the ClusterPolicy naming the driver version OLD."""
    versions = VersionCluster(make.snapshot)
    versions.add_node(make.node("gpu-01", pool="train-a"))
    versions.put(CLUSTER_POLICIES, make.cluster_policy(driver={"version": OLD}))
    return versions


def policy_version(versions: VersionCluster) -> Any:
    return versions.get_custom_object(CLUSTER_POLICIES, "cluster-policy").spec["driver"]["version"]


def test_a_step_that_reads_an_earlier_steps_intent_as_it_starts_sets_back_what_the_run_set(db, policy):
    run = PlannedRun(db, policy, [("gpu-01",)], steps=lambda node: (
        NodeStep("driver-version", node, TO_POLICY),  # type: ignore[arg-type]
        NodeStep("driver-version", node, BACK_POLICY)))  # type: ignore[arg-type]

    run.drive(lambda: run.state() == "succeeded")

    assert [s.state for s in steps_of(run)] == ["done", "done"] and policy_version(policy) == OLD
    assert [w.verb for w in policy.writes] == ["patch", "patch"]


def test_a_failed_step_sets_back_the_driver_version_by_its_waves_fallback_before_the_run_halts(db, policy):
    run = PlannedRun(db, policy, [("gpu-01",)], steps=lambda node: (
        NodeStep("driver-version", node, TO_POLICY),  # type: ignore[arg-type]
        NodeStep("hold", node, {"seconds": "soon"}),  # type: ignore[arg-type]
        NodeStep("driver-version", node, {**BACK_POLICY, "on_failure": True})))  # type: ignore[arg-type]

    run.drive(lambda: run.state() == "failed")

    assert [s.state for s in steps_of(run)] == ["done", "failed", "done"] and policy_version(policy) == OLD


# ------------------------------------------------------------------ log lines, the thread, the lease


class Fields(logging.Handler):
    """Each engine log line with the ids bound when it was written."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, dict[str, str]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.getMessage(), dict(logfields.current())))


@pytest.fixture
def engine_lines() -> Iterator[Fields]:
    fields, logger = Fields(), logging.getLogger("gpuops.engine")
    level = logger.level
    logger.addHandler(fields)
    logger.setLevel(logging.INFO)
    try:
        yield fields
    finally:
        logger.removeHandler(fields)
        logger.setLevel(level)


def test_log_lines_carry_the_ids_of_the_run_and_the_step_they_are_about(db, cluster, engine_lines):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))
    run.engine.run_pass(set())
    at(run, wall_s=60, mono_s=60)
    run.engine.run_pass(set())

    request_id = RunService(db).get(run.run_id).request_id
    (step,) = steps_of(run)
    (started,) = [m["payload"]["text"] for m in posted(db, "run.started")]
    (done,) = [m["payload"]["text"] for m in posted(db, "step.done")]
    lines = dict(engine_lines.lines)
    assert lines[f"engine-0: {started}"] == {"request_id": request_id, "run_id": run.run_id}
    assert lines[f"engine-0: {done}"] == {"request_id": request_id, "run_id": run.run_id, "step_id": str(step.id),
                                          "step": "hold", "node": "gpu-01"}


def test_the_runs_messages_go_to_the_requests_thread(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))
    request_id = RunService(db).get(run.run_id).request_id
    stored_requests.set_thread(db, id=request_id, channel="C0OPS", thread_ts="1749297600.000100")

    before = db.query("SELECT COALESCE(MAX(id), 0) AS id FROM outbox")[0]["id"]

    run.engine.run_pass(set())

    rows = db.query("SELECT channel, thread_ts, kind, dedupe_key FROM outbox WHERE id > ? ORDER BY id", (before,))
    assert rows[0] == {"channel": "C0OPS", "thread_ts": "1749297600.000100", "kind": "post",
                       "dedupe_key": f"{run.run_id}/started"}
    assert len(rows) > 1 and {r["thread_ts"] for r in rows} == {"1749297600.000100"}


class NotHeld:
    def held(self) -> bool:
        return False


def test_a_replica_without_the_lease_is_told_so_in_words(db, cluster):  # noqa: F811
    engine = Engine(db=db, gateway=cluster, cache=cluster, lease=NotHeld(), replica="engine-1")

    with pytest.raises(LeaseLost) as lost:
        engine.check_lease()

    assert str(lost.value) == "engine-1 does not hold the engine lease"


def test_a_run_whose_request_is_gone_stops_the_pass_naming_both(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))
    request_id = RunService(db).get(run.run_id).request_id
    db.execute("PRAGMA foreign_keys = OFF")
    db.execute("DELETE FROM requests WHERE id = ?", (request_id,))

    with pytest.raises(RuntimeError) as gone:
        run.engine.run_pass(set())

    assert str(gone.value) == f"run {run.run_id} names request {request_id}, which does not exist"


def test_a_run_paused_before_its_first_wave_starts_nothing_and_its_pass_ends_at_once(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60))
    RunService(db).pause(run.cfg.actor(ADA), run.run_id, now=run.now)
    engine, counted = counted_engine(run)

    assert engine.run_pass(set()) is True

    assert counted.asked < 100
    assert [s.state for s in steps_of(run)] == ["pending"] and run.state() == "paused"
    assert posted(db, "run.wave") == []  # not even its first wave is entered


def test_a_run_frozen_before_its_first_wave_halts_when_its_window_ends_naming_that_wave(db, cluster):  # noqa: F811
    hand_cordon(cluster, "gpu-05")  # the pool allows one node out: the first wave waits
    run = PlannedRun(db, cluster, [("gpu-01",)], cfg=pool_config(max_unavailable=1), gated=True,
                     window_end=NOW + dt.timedelta(minutes=10))
    engine, counted = counted_engine(run, gated=True)
    engine.run_pass(set())
    engine.run_pass(set())  # the wave still waits: the pass ends at once
    assert run.state() == "running" and [s.state for s in steps_of(run)] == ["pending"] * 3
    freeze(run)
    engine.run_pass(set())  # frozen, its window still open: the pass ends at once
    assert counted.asked < 400 and run.state() == "running"

    run.now = NOW + dt.timedelta(minutes=11)
    engine.run_pass(set())

    assert run.state() == "failed"
    (halt,) = audit.for_run(db, run.run_id, actions=["run.failed"])
    assert (halt.detail["wave"], halt.detail["code"]) == (0, "window-ended-while-frozen")


def test_a_next_wave_that_does_not_fit_waits_and_its_pass_ends_at_once(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",), ("gpu-02",)], cfg=pool_config(max_unavailable=1), gated=True,
                     steps=hold(10))
    run.drive(lambda: steps_of(run)[0].state == "running")
    hand_cordon(cluster, "gpu-05")  # the pool allows one node out: the second wave will wait
    engine, counted = counted_engine(run, gated=True)
    at(run, wall_s=60, mono_s=60)
    engine.run_pass(set())  # the first wave ends
    counted.asked = 0

    engine.run_pass(set())

    assert counted.asked < 200
    assert [s.state for s in steps_of(run)] == ["done", "pending"] and run.state() == "running"


# ------------------------------------------------------------------ the audit row and its Events


def test_an_audited_action_is_gpuops_own_and_queues_its_events_on_the_right_objects_in_the_display_zone(
        db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=hold(60), window_end=NOW + dt.timedelta(hours=2))
    request = stored_requests.get(db, id=RunService(db).get(run.run_id).request_id)
    assert request is not None
    stored_approvals.record(db, request_id=request.id, approver="U0BOB", decision="approve",
                            plan_hash=request.plan_hash, at=NOW)
    zone = dt.timezone(dt.timedelta(hours=2), "CEST")
    engine = Engine(db=db, gateway=cluster, cache=cluster, lease=AlwaysHeld(), replica="engine-0",
                    clock=lambda: NOW, settings=EngineSettings(display_zone=zone, people={"U0BOB": "Bob"}))
    stored = stored_runs.get(db, id=run.run_id)
    assert stored is not None
    info = RunInfo(request=request, plan=plan_from_json(request.plan))

    with db.transaction():
        entry = engine.audit(stored, info, action="node.left_out", target="gpu-01", before="running",
                             after="skipped", detail={"kind": "evict", "reason": "a budget blocks", "text": "left out"})
        engine.audit(stored, info, action="node.restore", target="node gpu-02", before=None, after=None,
                     detail={"kind": "host-driver"}, node="gpu-02")
        engine.audit(stored, info, action="driver-version.set", target="ClusterPolicy cluster-policy", before=None,
                     after=None, detail={"kind": "driver-version", "from": "550", "to": "570"})

    assert (entry.actor, entry.k8s_identity, entry.action, entry.target, entry.before, entry.after) == (
        "gpuops", cluster.identity, "node.left_out", "gpu-01", "running", "skipped")
    assert entry.detail == {"kind": "evict", "reason": "a budget blocks", "text": "left out", "replica": "engine-0",
                            "dry_run": False}
    events = [queued.kube_event(db, key=r["key"]).body for r in db.query("SELECT key FROM kube_events ORDER BY id")]
    tail = (f" Run {run.run_id} of request {request.id} (drain, pool train-a), approved by Bob, "
            "window approval to 2025-06-07 16:00 CEST.")
    assert [(e["reason"], e["regarding"], e["note"]) for e in events] == [  # type: ignore[index]
        ("NodeLeftOut", {"apiVersion": "v1", "kind": "Node", "name": "gpu-01", "uid": "gpu-01"},
         "Left out of the run: a budget blocks." + tail),
        ("NodeRestored", {"apiVersion": "v1", "kind": "Node", "name": "gpu-02", "uid": "gpu-02"},
         "Labels and taints restored." + tail),
        ("DriverVersionSet", {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy"},
         "Driver version set to 570 (was 550)." + tail)]
