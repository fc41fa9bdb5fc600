"""How a wave's nodes go, and how a run ends (workflows/engine/waves.py), as the real engine
runs plans written out here over the in-memory cluster, pass by pass, on a clock the test
moves (the harness of test_safety_rules.py).

- A wave's nodes start in the plan's order, at most `max_parallel_nodes` under way at
  once; a node given back, or left out, frees its place at once, and a node still busy
  holds up none of the others.
- A node that did not start (the API would not answer for it) holds up none of the nodes
  after it: not under a change freeze, which starts no new node, and not when fewer nodes
  may be under way than already are.
- A wave's node with no steps of its own holds up nothing, and nor does a node whose GPU
  signals cannot be read yet after its change (the signal gate waits for it alone).
- A run that ends well: its text names the nodes that stay cordoned as they were before
  (never in a dry run), its audit row, its thread message and its log line say so, its
  request is done, and the steps that would have run on a failure are skipped then. A
  paused run with nothing to do ends too.
- A step that fails runs its wave's `on_failure` step before the run halts (at once when
  the step could not even start); the halt's text says what that step did, or that it
  failed too.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable

import pytest
from test_safety_rules import (PlannedRun, cluster, hand_cordon, node_steps, succeeded_text,  # noqa: F401
                               wait_for_validator_steps)

from storage import audit
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.steps import Step
from tests.unit.test_engine_signal_gate import StandInSignals
from workflows.engine import halt_messages
from workflows.engine import messages as step_say
from workflows.engine.loop import EngineSettings
from workflows.engine.runs import RunService
from workflows.kube.errors import Unavailable
from workflows.plans import NodeStep

UTC = dt.timezone.utc


def holds(seconds: dict[str, int]) -> Callable[[str], tuple[NodeStep, ...]]:
    """Each node's plan: cordon, hold (its `seconds`, else an hour), uncordon."""
    return lambda node: node_steps(node, hold_s=seconds.get(node, 3600))


def steps_of(run: PlannedRun, node: str) -> dict[str, Step]:
    return {s.kind: s for s in stored_steps.for_run(run.db, run_id=run.run_id) if s.node == node}


def given_back(run: PlannedRun) -> list[str]:
    return [target for _, target in run.cluster.did("uncordon")]


def unanswered(fake, node: str) -> list[bool]:
    """From now on the API does not answer reads of `node` until the returned flag is cleared."""
    read, down = fake.get_node, [True]

    def get_node(name: str):
        if name == node and down:
            raise Unavailable(f"GET /api/v1/nodes/{name}: connection refused")
        return read(name)

    fake.get_node = get_node
    return down


# ------------------------------------------------------------------ which nodes start, and when


def test_nodes_start_in_the_plans_order_at_most_four_at_once_and_a_node_back_frees_its_place_at_once(
        db, cluster):  # noqa: F811
    order = ("gpu-05", "gpu-01", "gpu-04", "gpu-02", "gpu-03")  # not the names' order
    run = PlannedRun(db, cluster, [order], steps=holds({"gpu-05": 10}))

    run.drive(lambda: len(run.cordoned()) == 4)
    assert sorted(run.cordoned()) == ["gpu-01", "gpu-02", "gpu-04", "gpu-05"]  # the first four of the plan

    run.drive(lambda: given_back(run) == ["gpu-05"])  # the others hold for an hour
    run.passes(3)

    assert run.cordoned()[4:] == ["gpu-03"]  # it took gpu-05's place; the others still hold
    assert given_back(run) == ["gpu-05"]
    assert all(cluster.node(n).unschedulable for n in ("gpu-01", "gpu-04", "gpu-02", "gpu-03"))


def test_a_node_left_out_frees_its_place_for_the_next_node_of_the_wave(db, cluster, make):  # noqa: F811
    cluster.add_pod(make.workload("gpu-01", gpus=8, name="job-01"), uid="uid-job-01")
    cluster.blocked.add("uid-job-01")  # a PodDisruptionBudget keeps it: gpu-01 is left out

    def plan(node: str) -> tuple[NodeStep, ...]:
        cordon, hold, uncordon = node_steps(node)
        evict = NodeStep("evict", node, {"pdb_timeout_s": 5, "pdb_timeout_action": "skip"})  # type: ignore[arg-type]
        return (cordon, evict, hold, uncordon)

    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], steps=plan)
    run.engine.settings = EngineSettings(max_parallel_nodes=1)

    run.drive(lambda: run.state() == "succeeded")

    assert run.cordoned() == ["gpu-01", "gpu-02"] and given_back(run) == ["gpu-01", "gpu-02"]
    assert succeeded_text(db, run.run_id) == (
        f"Run {run.run_id} finished without gpu-01 (left out, see the thread); every other step done")


def test_a_node_the_api_would_not_start_holds_up_no_node_under_way_after_it_under_a_freeze(db, cluster):  # noqa: F811
    from storage import freezes as stored_freezes

    down = unanswered(cluster, "gpu-01")
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")])
    run.drive(lambda: run.cordoned() == ["gpu-02"])
    stored_freezes.create(db, target="train-a", until=run.now + dt.timedelta(hours=6), reason="incident",
                          let_running_finish=False, set_by="U0BOB", set_by_name="Bob", at=run.now)
    down.clear()  # the API answers again: the freeze alone holds gpu-01 now

    run.passes(40)  # gpu-02's hold (60s) is long over

    assert given_back(run) == ["gpu-02"] and run.cordoned() == ["gpu-02"]
    assert run.state() == "running"


def test_with_fewer_nodes_allowed_than_are_under_way_those_under_way_go_on_and_the_rest_wait(db, cluster):  # noqa: F811
    down = unanswered(cluster, "gpu-01")
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02", "gpu-03")])
    run.engine.settings = EngineSettings(max_parallel_nodes=3)
    run.drive(lambda: run.cordoned() == ["gpu-02", "gpu-03"])
    run.engine.settings = EngineSettings(max_parallel_nodes=2)  # lowered while two are under way
    down.clear()

    run.drive(lambda: run.state() == "succeeded")

    assert cluster.did("cordon", "uncordon") == [("cordon", "gpu-02"), ("cordon", "gpu-03"), ("uncordon", "gpu-02"),
                                                 ("uncordon", "gpu-03"), ("cordon", "gpu-01"), ("uncordon", "gpu-01")]


def test_a_node_of_a_wave_with_no_steps_of_its_own_holds_up_nothing(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], steps=lambda n: () if n == "gpu-01" else node_steps(n))

    run.drive(lambda: run.state() == "succeeded")

    assert run.cordoned() == ["gpu-02"] and given_back(run) == ["gpu-02"]


def test_a_node_whose_signals_cannot_be_read_yet_after_its_change_holds_up_no_node_after_it(db, cluster):  # noqa: F811
    signals = StandInSignals()
    signals.later["gpu-01"] = None  # its exporter falls silent once it is changed
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], steps=holds({"gpu-01": 10, "gpu-02": 60}), signals=signals)

    run.drive(lambda: given_back(run) == ["gpu-02"])  # long before gpu-01's wait (10 minutes) ends

    assert run.state() == "running" and steps_of(run, "gpu-01")["uncordon"].state == "pending"
    assert cluster.node("gpu-01").unschedulable and not cluster.node("gpu-02").unschedulable


# ------------------------------------------------------------------ a run that ends well


def with_fallback(node: str) -> tuple[NodeStep, ...]:
    """cordon, hold 60s, uncordon; and a hold that runs only when a step of the wave fails."""
    return (*node_steps(node), NodeStep("hold", node, {"seconds": 10, "on_failure": True}))  # type: ignore[arg-type]


def test_a_run_that_ends_well_names_the_nodes_cordoned_before_it_and_is_on_record(db, cluster, caplog):  # noqa: F811
    hand_cordon(cluster, "gpu-02")
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], steps=with_fallback)

    with caplog.at_level(logging.INFO, logger="gpuops.engine"):
        run.drive(lambda: run.state() == "succeeded")

    text = f"Run {run.run_id} finished: every step done. Still cordoned, as they were before the run: gpu-02"
    ended = stored_runs.get(db, id=run.run_id).ended_at  # type: ignore[union-attr]
    (row,) = audit.for_run(db, run.run_id, actions=["run.succeeded"])
    assert (row.actor, row.target, row.before, row.after) == ("gpuops", "train-a", "running", "succeeded")
    assert row.detail == {"text": text, "replica": "engine-0", "dry_run": False}
    request_id = RunService(db).get(run.run_id).request_id
    (message,) = [m for m in db.query("SELECT * FROM outbox ORDER BY id") if '"run.succeeded"' in m["payload"]]
    assert (message["kind"], message["dedupe_key"]) == ("post", f"{run.run_id}/succeeded")
    assert json.loads(message["payload"]) == {
        "event": "run.succeeded", "request_id": request_id, "run_id": run.run_id, "pool": "train-a",
        "kind": "drain", "state": "succeeded", "text": text, "dry_run": False}
    assert f"engine-0: {text}" in [r.getMessage() for r in caplog.records]
    assert stored_requests.get(db, id=request_id).state == "done"  # type: ignore[union-attr]
    for node in ("gpu-01", "gpu-02"):  # no step failed: the fallbacks never ran
        fallback = [s for s in stored_steps.for_run(db, run_id=run.run_id) if s.node == node][-1]
        assert (fallback.kind, fallback.state, fallback.ended_at) == ("hold", "skipped", ended)


def test_a_node_cordoned_before_the_run_by_a_plan_that_never_gives_it_back_is_named_as_still_cordoned(
        db, cluster):  # noqa: F811
    hand_cordon(cluster, "gpu-02")
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], steps=lambda n: node_steps(n)[:2])  # cordon, hold

    run.drive(lambda: run.state() == "succeeded")

    assert succeeded_text(db, run.run_id) == (
        f"Run {run.run_id} finished: every step done. Still cordoned, as they were before the run: gpu-02")


def test_a_dry_run_that_ends_well_names_no_node_as_still_cordoned(db, cluster):  # noqa: F811
    hand_cordon(cluster, "gpu-02")
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], dry_run=True)

    run.drive(lambda: run.state() == "succeeded")

    assert succeeded_text(db, run.run_id) == f"Dry run {run.run_id} finished: every step done"


def test_a_paused_run_with_nothing_to_do_ends(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [()])
    RunService(db).pause(run.cfg.actor("U0ADA"), run.run_id, now=run.now)

    run.passes(1)

    assert run.state() == "succeeded"
    assert succeeded_text(db, run.run_id) == f"Run {run.run_id} finished: every step done"


# ------------------------------------------------------------------ a wave's step that runs on a failure


def failing_with(fallback: dict[str, object]) -> Callable[[str], tuple[NodeStep, ...]]:
    """cordon, a wait for the validator (30s), uncordon; and a hold with `fallback` that
    runs only when a step of the wave fails."""
    return lambda node: (*wait_for_validator_steps(node),
                         NodeStep("hold", node, {**fallback, "on_failure": True}))  # type: ignore[arg-type]


@pytest.fixture
def validator_fails(cluster, make):  # noqa: F811
    """gpu-01's validator never becomes ready: its wait-for step times out."""
    (uid,) = [u for u, p in cluster.pods.items()
              if p.pod.node_name == "gpu-01" and p.pod.name.startswith("nvidia-operator-validator")]
    cluster.terminate(uid)
    cluster.add_pod(make.validator_pod("gpu-01", ready=False), uid="uid-validator-failing")
    return cluster


def halted(db, run: PlannedRun) -> tuple[str, dict[str, object]]:
    """The halt's text, and its audit row's detail."""
    (row,) = audit.for_run(db, run.run_id, actions=["run.failed"])
    return stored_runs.get(db, id=run.run_id).halted_reason or "", row.detail  # type: ignore[union-attr,return-value]


def test_a_failed_step_runs_its_waves_fallback_to_its_end_before_the_run_halts_and_the_halt_says_what_it_did(
        db, validator_fails):
    run = PlannedRun(db, validator_fails, [("gpu-01",)], steps=failing_with({"seconds": 10}))

    run.drive(lambda: run.state() == "failed")

    steps = steps_of(run, "gpu-01")
    wait, fallback = steps["wait-for"], steps["hold"]
    assert (wait.state, fallback.state) == ("failed", "done")
    assert wait.error is not None and wait.error.startswith("timed out after 30s")
    assert fallback.started_at is not None and wait.ended_at is not None and fallback.started_at >= wait.ended_at
    note = step_say.held_until(fallback.started_at + dt.timedelta(seconds=10), dry_run=False, zone=UTC)
    text, detail = halted(db, run)
    assert text == halt_messages.halted("gpu-01", "wait-for", wait.error, left_cordoned=["gpu-01"], after=note)
    assert detail["after"] == note and detail["text"] == text


def test_a_fallback_that_fails_too_is_named_in_the_halt(db, validator_fails):
    run = PlannedRun(db, validator_fails, [("gpu-01",)], steps=failing_with({"seconds": "soon"}))

    run.drive(lambda: run.state() == "failed")

    steps = steps_of(run, "gpu-01")
    wait, fallback = steps["wait-for"], steps["hold"]
    assert (wait.state, fallback.state) == ("failed", "failed")
    assert fallback.error is not None
    assert fallback.error.startswith("the plan's parameters for this step cannot be used")
    after = halt_messages.fallback_failed("hold", fallback.error)
    text, detail = halted(db, run)
    assert text == halt_messages.halted("gpu-01", "wait-for", wait.error or "", left_cordoned=["gpu-01"], after=after)
    assert detail["after"] == after


def unusable_hold_with_fallback(node: str) -> tuple[NodeStep, ...]:
    """A node's cordon, a hold whose parameters cannot be used, its uncordon, and the
    wave's fallback (a hold of 10 s run only when a step of the wave fails)."""
    cordon, _, uncordon = node_steps(node)
    return (cordon, NodeStep("hold", node, {"seconds": "soon"}), uncordon,  # type: ignore[arg-type]
            NodeStep("hold", node, {"seconds": 10, "on_failure": True}))  # type: ignore[arg-type]


def test_a_step_whose_parameters_cannot_be_used_runs_its_waves_fallback_in_the_same_pass(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=unusable_hold_with_fallback)

    run.drive(lambda: run.state() == "failed")

    refused, fallback = sorted((s for s in stored_steps.for_run(db, run_id=run.run_id) if s.kind == "hold"),
                               key=lambda s: s.seq)
    assert (refused.state, fallback.state) == ("failed", "done")
    assert (refused.error or "").startswith("the plan's parameters for this step cannot be used")
    assert fallback.started_at == refused.ended_at  # not a pass (5s) later
