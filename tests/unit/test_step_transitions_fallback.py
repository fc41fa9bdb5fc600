"""A failed step and its wave's fallback (workflows/engine/transitions.py: `halt` and
`run_fallback`), as the real engine runs plans written out here over the in-memory
cluster, pass by pass, on clocks the test moves:

- a step that fails is kept `failed` with what it was given, what it meant to change,
  why it failed and its halt code, and its `step.failed` audit row says the same (from
  `pending` when it could not even start, from `running` when it failed under way);
- a step halted without a code of its own halts the run as `step-failed`; halting answers
  True only while the wave's fallback is still to run (the step alone fails then, and
  the fallback starts in that same pass), else False with the run failed;
- the fallback is looked at like any waiting step: when its time comes on the monotonic
  clock (also when it comes while the pass runs), never before, even when the wall clock
  has passed its end; a pass in which it waits ends at once, and the run halts in the
  pass in which it ends; it is never "resumed" by the process that started it;
- a fallback found running after a restart is resumed (on record, naming the replica),
  not started again, and run to its end before the run halts;
- while it waits, what it waits for is the request's card update, and its notice (a
  PodDisruptionBudget blocking it) is posted and audited once;
- a fallback that fails too, or leaves its node out, is kept failed with what its outcome
  found and its own code (`step-failed` for a node left out), and the run halts with the
  first step's reason and code, naming what the fallback did;
- a dry run's fallback answers from what the run's own steps found (an uncordon from its
  cordon's intent); the fallback's log lines carry its run's and its own ids.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

import pytest

from storage import audit
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.steps import Step
from workflows.engine import halt_messages, run_messages
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine
from workflows.engine.runs import RunService
from workflows.plans import NodeStep

from tests.unit.test_engine_records import BUDGET, ENGINE_LOG, GAVE_UP, IDENTITY, audited, logged, posted
from tests.unit.test_engine_turns import Ticking, at, counted_engine
from tests.unit.test_engine_turns import engine_lines as engine_lines  # noqa: F401  (log lines with their ids)
from tests.unit.test_safety_rules import NOW, PlannedRun, node_steps
from tests.unit.test_step_transitions_evaluate import run_and_info
from tests.unit.test_safety_rules import cluster as cluster  # noqa: F401  (ten nodes of train-a)
from tests.unit.test_wave_course import failing_with, with_fallback
from tests.unit.test_wave_course import validator_fails as validator_fails  # noqa: F401  (gpu-01's validator fails)

REFUSED = "the plan's parameters for this step cannot be used: hold step: params.seconds must be a number, not 'soon'"
LEFT_OUT = ("gpu-01 is left out of this run: eviction of ml/job-01 is blocked by a PodDisruptionBudget: "
            f"{BUDGET} still, after 60s. Its remaining pods keep running; it is uncordoned and the run goes on "
            "with the other nodes")


def refused_hold(fallback: str | None = None, **params: Any) -> Callable[[str], tuple[NodeStep, ...]]:
    """A node's cordon, a hold whose parameters cannot be used and its uncordon; then a
    `fallback` step of that kind with `params`, if any, run only when a step of the wave fails."""
    def plan(node: str) -> tuple[NodeStep, ...]:
        cordon, _, uncordon = node_steps(node)
        steps = (cordon, NodeStep("hold", node, {"seconds": "soon"}), uncordon)  # type: ignore[arg-type]
        if fallback is None:
            return steps
        return (*steps, NodeStep(fallback, node, {**params, "on_failure": True}))  # type: ignore[arg-type]
    return plan


def blocked_job(cluster, make) -> None:  # noqa: F811
    """gpu-01 runs ml/job-01 (8 GPUs), which a PodDisruptionBudget keeps from eviction."""
    cluster.add_pod(make.workload("gpu-01", gpus=8, name="job-01"), uid="uid-job-01")
    cluster.blocked.add("uid-job-01")


def steps_of(run: PlannedRun) -> dict[str, Step]:
    """The run's steps by kind (one node), the fallback under `fallback`."""
    found: dict[str, Step] = {}
    for step in sorted(stored_steps.for_run(run.db, run_id=run.run_id), key=lambda s: s.seq):
        found["fallback" if step.detail.get("params", {}).get("on_failure") else step.kind] = step
    return found


def halted_detail(run: PlannedRun) -> dict[str, Any]:
    (row,) = audit.for_run(run.db, run.run_id, actions=["run.failed"])
    return row.detail  # type: ignore[return-value]


def fallback_blocked_to_the_end(db: Any, cluster: Any, make: Any) -> PlannedRun:
    """gpu-01's hold is refused, and its fallback eviction is blocked by a budget until
    its 60 s run out: the run driven until it failed."""
    blocked_job(cluster, make)
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=refused_hold("evict", pdb_timeout_s=60))
    run.drive(lambda: run.state() == "failed")
    return run


def request_of(run: PlannedRun) -> str:
    return RunService(run.db).get(run.run_id).request_id


# ------------------------------------------------------------------ a failed step on record


@pytest.mark.timeout(10)
def test_a_step_whose_parameters_cannot_be_used_is_failed_on_record_with_what_it_was_given_and_why(
        db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=refused_hold())

    run.drive(lambda: run.state() == "failed")

    hold = steps_of(run)["hold"]
    assert (hold.state, hold.error, hold.detail) == ("failed", REFUSED, {
        "params": {"seconds": "soon"}, "intent": {}, "note": REFUSED, "result": {}, "halt_code": "bad-params"})
    assert audited(db, run, "step.failed") == [  # type: ignore[arg-type]
        ("gpuops", IDENTITY, "step.failed", "gpu-01", request_of(run), run.run_id, "pending", "failed",
         {"step": hold.id, "kind": "hold", "reason": REFUSED, "replica": "engine-0", "dry_run": False})]
    assert halted_detail(run)["code"] == "bad-params"


@pytest.mark.timeout(10)
def test_a_step_halted_without_a_code_of_its_own_halts_the_run_as_step_failed_and_halting_answers_false(
        db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)])
    run.drive(lambda: [s.state for s in steps_of(run).values()] == ["done", "running", "pending"])
    stored, info = run_and_info(run)
    hold = steps_of(run)["hold"]

    assert run.engine.transitions.halt(stored, info, hold, "stopped by the test") is False

    hold = steps_of(run)["hold"]
    assert (hold.state, hold.error, hold.detail["halt_code"]) == ("failed", "stopped by the test", "step-failed")
    assert audited(db, run, "step.failed") == [  # type: ignore[arg-type]
        ("gpuops", IDENTITY, "step.failed", "gpu-01", request_of(run), run.run_id, "running", "failed",
         {"step": hold.id, "kind": "hold", "reason": "stopped by the test", "replica": "engine-0",
          "dry_run": False})]
    assert run.state() == "failed"
    assert (halted_detail(run)["code"], posted(db, "run.failed")[0]["payload"]["halted_on"]) == (
        "step-failed", "step-failed")


@pytest.mark.timeout(10)
def test_a_step_halted_while_its_waves_fallback_is_still_to_run_fails_alone_and_halting_answers_true(
        db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=with_fallback)
    run.drive(lambda: steps_of(run)["hold"].state == "running")
    stored, info = run_and_info(run)

    assert run.engine.transitions.halt(stored, info, steps_of(run)["hold"], "stopped by the test",
                                       code="step-timed-out") is True

    assert [(s.state, s.error) for s in steps_of(run).values()] == [
        ("done", None), ("failed", "stopped by the test"), ("pending", None), ("pending", None)]
    assert run.state() == "running" and audit.for_run(db, run.run_id, actions=["run.failed"]) == []


# ------------------------------------------------------------------ the fallback's course


@pytest.mark.timeout(10)
def test_a_step_failing_under_way_starts_its_waves_fallback_in_that_pass_and_the_run_halts_in_the_pass_it_ends(
        db, validator_fails):  # noqa: F811
    run = PlannedRun(db, validator_fails, [("gpu-01",)], steps=failing_with({"seconds": 10}))

    run.drive(lambda: run.state() == "failed")

    steps = steps_of(run)
    wait, fallback = steps["wait-for"], steps["fallback"]
    assert wait.ended_at is not None and fallback.started_at == wait.ended_at  # not a pass (5s) later
    ended = stored_runs.get(db, id=run.run_id).ended_at  # type: ignore[union-attr]
    assert ended == fallback.ended_at == wait.ended_at + dt.timedelta(seconds=10)  # the pass the fallback ended
    # The process that started it never "resumes" it.
    assert [(e.action, e.target) for e in audit.for_run(db, run.run_id)] == [
        ("run.created", "train-a"), ("run.started", "train-a"), ("run.wave", "train-a"),
        ("step.running", "gpu-01"), ("step.done", "gpu-01"), ("step.running", "gpu-01"), ("step.failed", "gpu-01"),
        ("step.running", "gpu-01"), ("step.done", "gpu-01"), ("run.failed", "train-a")]
    (failed,) = audited(db, run, "step.failed")  # type: ignore[arg-type]
    assert failed[6:8] == ("running", "failed")


def fallback_waiting(run: PlannedRun) -> Step:
    """The run driven until its fallback (a hold of 10s, started with the failed step) waits."""
    run.engine.run_pass(set())
    fallback = steps_of(run)["fallback"]
    assert (steps_of(run)["hold"].state, fallback.state) == ("failed", "running")
    return fallback


@pytest.mark.timeout(10)
def test_a_waiting_fallback_is_not_looked_at_before_its_time_even_when_the_wall_clock_passed_its_end(
        db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=refused_hold("hold", seconds=10))
    fallback_waiting(run)  # looked at again at 10 on the monotonic clock

    at(run, wall_s=60, mono_s=5)
    run.engine.run_pass(set())
    assert (steps_of(run)["fallback"].state, run.state()) == ("running", "running")

    at(run, wall_s=60, mono_s=10)
    run.engine.run_pass(set())
    assert (steps_of(run)["fallback"].state, run.state()) == ("done", "failed")


@pytest.mark.timeout(10)
def test_a_fallback_whose_time_comes_during_a_pass_is_looked_at_in_that_pass(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=refused_hold("hold", seconds=10))
    mono = Ticking()
    run.engine = Engine(db=db, gateway=cluster, cache=cluster, lease=AlwaysHeld(), replica="engine-0",
                        clock=lambda: run.now, monotonic=mono)
    fallback_waiting(run)  # looked at again at 10

    run.now += dt.timedelta(seconds=10)
    mono.first, mono.then = 9.5, 10.0  # the timer is not due when the pass begins; the fallback's time is, later
    run.engine.run_pass(set())

    assert (steps_of(run)["fallback"].state, run.state()) == ("done", "failed")


@pytest.mark.timeout(10)
def test_a_pass_in_which_the_fallback_waits_ends_at_once(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=refused_hold("hold", seconds=10))
    engine, counted = counted_engine(run)
    fallback_waiting(run)
    counted.asked = 0

    at(run, wall_s=5, mono_s=5)
    engine.run_pass(set())

    assert counted.asked < 100  # a few reads, not the run turned over and over
    assert steps_of(run)["fallback"].state == "running"


@pytest.mark.timeout(10)
def test_a_fallback_running_when_the_engine_restarts_is_resumed_on_record_and_run_to_its_end_before_the_halt(
        db, cluster, caplog):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=refused_hold("hold", seconds=10))
    fallback = fallback_waiting(run)
    run.engine = Engine(db=db, gateway=cluster, cache=cluster, lease=AlwaysHeld(), replica="engine-1",
                        clock=lambda: run.now, monotonic=lambda: run.mono)

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        run.drive(lambda: run.state() == "failed")

    resumed = run_messages.step_resumed("hold", "gpu-01", "engine-1")
    assert audited(db, run, "step.resumed") == [  # type: ignore[arg-type]
        ("gpuops", IDENTITY, "step.resumed", "gpu-01", request_of(run), run.run_id, "running", "running",
         {"step": fallback.id, "kind": "hold", "attempt": 1, "text": resumed, "replica": "engine-1",
          "dry_run": False})]
    assert f"engine-1: resuming hold on gpu-01 (step {fallback.id})" in logged(caplog, logging.INFO)
    fallback = steps_of(run)["fallback"]
    assert (fallback.state, fallback.attempt, fallback.started_at, fallback.ended_at) == (
        "done", 1, NOW, NOW + dt.timedelta(seconds=10))  # not started again
    assert halted_detail(run)["after"] == fallback.detail["note"]


# ------------------------------------------------------------------ a fallback that waits, fails, or leaves out


@pytest.mark.timeout(10)
def test_a_fallback_that_fails_too_is_kept_with_what_it_found_and_the_halt_names_the_first_steps_reason_and_code(
        db, cluster, make):  # noqa: F811
    run = fallback_blocked_to_the_end(db, cluster, make)

    fallback = steps_of(run)["fallback"]
    intent = fallback.detail["intent"]
    assert (fallback.state, fallback.error, fallback.detail) == ("failed", GAVE_UP, {
        "params": {"pdb_timeout_s": 60, "on_failure": True}, "intent": intent, "note": GAVE_UP,
        "result": {"evicted": ["ml/job-01"], "skipped": intent["skipped"], "blocked": {"ml/job-01": BUDGET}},
        "halt_code": "eviction-blocked"})
    assert audited(db, run, "step.failed")[-1] == (  # type: ignore[arg-type]
        "gpuops", IDENTITY, "step.failed", "gpu-01", request_of(run), run.run_id, "running", "failed",
        {"step": fallback.id, "kind": "evict", "reason": GAVE_UP, "replica": "engine-0", "dry_run": False})
    after = halt_messages.fallback_failed("evict", GAVE_UP)
    said = halt_messages.halted("gpu-01", "hold", REFUSED, left_cordoned=["gpu-01"], after=after)
    assert halted_detail(run) == {"node": "gpu-01", "kind": "hold", "reason": REFUSED, "code": "bad-params",
                                  "after": after, "left_cordoned": ["gpu-01"], "text": said,
                                  "replica": "engine-0", "dry_run": False}


@pytest.mark.timeout(10)
def test_a_waiting_fallback_updates_the_card_with_what_it_waits_for_and_tells_its_notice_once(
        db, cluster, make):  # noqa: F811
    run = fallback_blocked_to_the_end(db, cluster, make)

    fallback, request_id = steps_of(run)["fallback"], request_of(run)
    waiting = f"eviction of ml/job-01 is blocked by a PodDisruptionBudget: {BUDGET}"
    assert posted(db, "step.waiting") == [
        {"channel": "C0OPS", "thread_ts": None, "kind": "update", "dedupe_key": None,
         "payload": {"event": "step.waiting", "request_id": request_id, "run_id": run.run_id, "pool": "train-a",
                     "kind": "drain", "state": "running", "text": waiting, "dry_run": False, "node": "gpu-01"}}]
    notice = (f"gpu-01: eviction of ml/job-01 is blocked by a PodDisruptionBudget: {BUDGET}. Retrying until "
              "2025-06-07 12:01:00 UTC; then the run halts with the node cordoned, for a person to decide. "
              "Scaling the workload up elsewhere frees the budget")
    assert posted(db, "step.pdb-blocked") == [
        {"channel": "C0OPS", "thread_ts": None, "kind": "post",
         "dedupe_key": f"{run.run_id}/step/{fallback.id}/pdb-blocked",
         "payload": {"event": "step.pdb-blocked", "request_id": request_id, "run_id": run.run_id,
                     "pool": "train-a", "kind": "drain", "state": "running", "text": notice, "dry_run": False,
                     "node": "gpu-01"}}]
    assert audited(db, run, "step.pdb-blocked") == [  # type: ignore[arg-type]
        ("gpuops", IDENTITY, "step.pdb-blocked", "gpu-01", request_id, run.run_id, None, None,
         {"step": fallback.id, "kind": "evict", "notice": "pdb-blocked", "text": notice, "replica": "engine-0",
          "dry_run": False})]


@pytest.mark.timeout(10)
def test_a_fallback_that_leaves_its_node_out_fails_as_a_step_without_a_code_of_its_own(db, cluster, make):  # noqa: F811
    blocked_job(cluster, make)
    leaving_out = refused_hold("evict", pdb_timeout_s=60, pdb_timeout_action="skip")
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=leaving_out)

    run.drive(lambda: run.state() == "failed")

    fallback = steps_of(run)["fallback"]
    intent = fallback.detail["intent"]
    assert (fallback.state, fallback.error, fallback.detail) == ("failed", LEFT_OUT, {
        "params": {"pdb_timeout_s": 60, "pdb_timeout_action": "skip", "on_failure": True}, "intent": intent,
        "note": LEFT_OUT,
        "result": {"evicted": ["ml/job-01"], "skipped": intent["skipped"], "blocked": {"ml/job-01": BUDGET}},
        "halt_code": "step-failed"})
    assert halted_detail(run)["code"] == "bad-params"


# ------------------------------------------------------------------ a dry run, log lines


@pytest.mark.timeout(10)
def test_a_dry_runs_fallback_answers_from_what_the_runs_own_steps_found(db, cluster):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=refused_hold("uncordon"), dry_run=True)

    run.drive(lambda: run.state() == "failed")

    fallback = steps_of(run)["fallback"]
    assert (fallback.state, fallback.detail["note"]) == ("done", "would uncordon it")
    assert [(w.verb, w.target, w.args["dry_run"]) for w in cluster.writes] == [
        ("cordon", "gpu-01", True), ("uncordon", "gpu-01", True)]
    assert halted_detail(run)["after"] == "would uncordon it"


@pytest.mark.timeout(10)
def test_the_fallbacks_log_lines_carry_its_runs_and_its_own_ids(db, cluster, engine_lines):  # noqa: F811
    run = PlannedRun(db, cluster, [("gpu-01",)], steps=refused_hold("hold", seconds=10))

    run.drive(lambda: run.state() == "failed")

    fallback = steps_of(run)["fallback"]
    (done,) = [m["payload"]["text"] for m in posted(db, "step.done")
               if m["dedupe_key"] == f"{run.run_id}/step/{fallback.id}/done"]
    lines = dict(engine_lines.lines)
    assert lines[f"engine-0: {done}"] == {"request_id": request_of(run), "run_id": run.run_id,
                                          "step_id": str(fallback.id), "step": "hold", "node": "gpu-01"}
