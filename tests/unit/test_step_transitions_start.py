"""How a step starts and how a step found running is taken up again
(workflows.engine.transitions.StepTransitions), driven by the real engine over the
in-memory cluster (the drain of tests/unit/test_engine_safety.py):

- a step that starts goes `pending -> running` with a `step.running` audit row (from
  `pending` to `running`, naming the step, its kind and its intent), one update to the
  request's thread ("gpu-01: cordon started", deduplicated per step, naming the node) and
  a log line naming the replica; a dry run's step says "(dry run)"; the engine has it in
  flight;
- a step whose preparation the API refuses fails, and the run halts on the spot with the
  refusal in its words and the `api-refused` code: no other node is even read;
- a step whose preparation the API does not answer stays pending, the engine asking once
  a pass; the outage is logged once, not once a try, and when the API answers again that
  is logged once, when the step starts, even if the database then refused that start once;
- a step found running after a restart is resumed: a `step.resumed` audit row (naming the
  step, its kind, its attempt and the sentence with the replica) and a log line; its
  per-object intents come back from the audit log with when each was recorded, past rows
  of the run whose detail is not an object notwithstanding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from storage import audit
from storage import steps as stored_steps
from storage.errors import DatabaseUnavailable
from storage.steps import Step
from workflows.engine.context import LiveStep
from workflows.kube.errors import Forbidden, Unavailable

from tests.unit.test_engine_records import ENGINE_LOG, IDENTITY, audited, info_of, logged, posted
from tests.unit.test_engine_safety import NOW, Drain
from tests.unit.test_engine_safety import cluster as cluster  # noqa: F401  (the two-node drain's cluster fixture)
from tests.unit.test_wave_gate_checks import Locked

ONE_NODE = "gpu-01 for 10m rack move"
REFUSED = 'nodes "gpu-01" is forbidden: User "gpuops" cannot get resource "nodes"'
DOWN = "GET /api/v1/nodes/gpu-01: connection refused"


class NodeReads:
    """The cluster's node reads as the engine makes them: every name asked, in order; the
    next reads of a node answered by the errors queued for it in `errors`; `then_once`
    run once, right after the next read that answers."""

    def __init__(self, cluster: Any) -> None:
        self._read = cluster.get_node
        self.asked: list[str] = []
        self.errors: dict[str, list[Exception]] = {}
        self.then_once: Callable[[], None] | None = None
        cluster.get_node = self

    def __call__(self, name: str) -> Any:
        self.asked.append(name)
        errors = self.errors.get(name)
        if errors:
            raise errors.pop(0)
        node = self._read(name)
        then, self.then_once = self.then_once, None
        if then is not None:
            then()
        return node


def step_of(drain: Drain, node: str, kind: str) -> Step:
    return next(s for s in stored_steps.for_run(drain.db, run_id=drain.run_id) if (s.node, s.kind) == (node, kind))


# ------------------------------------------------------------------ a step starts


def test_a_started_step_is_running_on_record_in_the_audit_the_thread_and_the_log_and_in_flight(db, cluster, caplog):
    drain = Drain(db, cluster, "wait", words=ONE_NODE)
    request_id = drain.view().request_id

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        drain.engine.run_pass({"gpu-01"})

    cordon, evict = step_of(drain, "gpu-01", "cordon"), step_of(drain, "gpu-01", "evict")
    assert audited(db, drain, "step.running")[0] == (
        "gpuops", IDENTITY, "step.running", "gpu-01", request_id, drain.run_id, "pending", "running",
        {"step": cordon.id, "kind": "cordon", "intent": {"prior_unschedulable": False}, "replica": "engine-0",
         "dry_run": False})
    assert posted(db, "step.running") == [
        {"channel": "C0OPS", "thread_ts": None, "kind": "update", "dedupe_key": f"{drain.run_id}/step/{step.id}/running",
         "payload": {"event": "step.running", "request_id": request_id, "run_id": drain.run_id, "pool": "train-a",
                     "kind": "drain", "state": "running", "text": f"gpu-01: {step.kind} started", "dry_run": False,
                     "node": "gpu-01"}}
        for step in (cordon, evict)]
    assert logged(caplog, logging.INFO) == [
        f"engine-0: Run {drain.run_id} of {request_id} started: 1 node in 1 wave", "engine-0: gpu-01: cordon started",
        "engine-0: gpu-01: cordon done: cordoned (it was schedulable)", "engine-0: gpu-01: evict started"]
    assert evict.state == "running" and drain.engine.in_flight(evict.id)
    assert drain.engine.live[evict.id].step_id == evict.id


def test_a_dry_runs_step_says_it_is_a_dry_run_when_it_starts(db, cluster, caplog):
    drain = Drain(db, cluster, "wait", words=ONE_NODE, dry_run=True)

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        drain.engine.run_pass({"gpu-01"})

    assert [m["payload"]["text"] for m in posted(db, "step.running")] == [
        f"gpu-01: {kind} started (dry run)" for kind in ("cordon", "evict", "hold", "validate", "uncordon")]
    assert "engine-0: gpu-01: cordon started (dry run)" in logged(caplog, logging.INFO)


# ------------------------------------------------------------------ the API refuses or does not answer


def test_a_step_whose_preparation_the_api_refuses_halts_the_run_in_its_words_and_no_other_node_is_read(
        db, cluster, caplog):
    drain = Drain(db, cluster, "wait")
    request_id = drain.view().request_id
    reads = NodeReads(cluster)
    reads.errors["gpu-01"] = [Forbidden(REFUSED, status=403)]

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        drain.engine.run_pass({"gpu-01", "gpu-02"})

    reason = f"the Kubernetes API refused: {REFUSED}"
    said = (f"gpu-01: cordon failed: {reason}. The run stopped; no further steps or waves. No node is left cordoned "
            "by this run.")
    assert (drain.run().state, drain.run().halted_reason) == ("failed", said)
    cordon = step_of(drain, "gpu-01", "cordon")
    assert (cordon.state, cordon.error) == ("failed", reason)
    assert audited(db, drain, "step.failed") == [
        ("gpuops", IDENTITY, "step.failed", "gpu-01", request_id, drain.run_id, "pending", "failed",
         {"step": cordon.id, "kind": "cordon", "reason": reason, "replica": "engine-0", "dry_run": False})]
    assert audited(db, drain, "run.failed") == [
        ("gpuops", IDENTITY, "run.failed", "train-a", request_id, drain.run_id, "running", "failed",
         {"node": "gpu-01", "kind": "cordon", "reason": reason, "code": "api-refused", "left_cordoned": [],
          "text": said, "replica": "engine-0", "dry_run": False})]
    assert [m["payload"]["halted_on"] for m in posted(db, "run.failed")] == ["api-refused"]
    assert reads.asked == ["gpu-01"]  # the halt came first: gpu-02 was not even read
    assert cluster.writes == [] and not drain.engine.in_flight(cordon.id)


def test_a_step_the_api_does_not_answer_stays_pending_warned_once_and_starts_when_it_answers_again(
        db, cluster, caplog):
    drain = Drain(db, cluster, "wait", words=ONE_NODE)
    reads = NodeReads(cluster)
    reads.errors["gpu-01"] = [Unavailable(DOWN), Unavailable(DOWN)]
    down = f"engine-0: cannot start cordon on gpu-01 yet: {DOWN}"

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        for asked in (1, 2):  # one try a pass, not one per turn
            drain.engine.run_pass({"gpu-01"})
            assert (reads.asked, drain.step("gpu-01", "cordon")) == (["gpu-01"] * asked, "pending")
            assert logged(caplog, logging.WARNING) == [down]  # when it started failing, not on every try
        caplog.clear()
        drain.engine.run_pass({"gpu-01"})

    assert drain.step("gpu-01", "cordon") == "done"
    assert logged(caplog, logging.INFO) == [
        "engine-0: the API answers again; starting cordon on gpu-01", "engine-0: gpu-01: cordon started",
        "engine-0: gpu-01: cordon done: cordoned (it was schedulable)", "engine-0: gpu-01: evict started"]
    assert logged(caplog, logging.WARNING) == []


def test_a_start_the_database_refused_once_after_the_api_answered_again_logs_the_answer_once(db, cluster, caplog):
    drain = Drain(db, cluster, "wait", words=ONE_NODE)
    locked = Locked(db)
    drain.db = locked  # type: ignore[assignment]  # the engine reaches the database through it
    drain.restart()
    reads = NodeReads(cluster)
    reads.errors["gpu-01"] = [Unavailable(DOWN)]
    drain.engine.run_pass({"gpu-01"})
    reads.then_once = locked.lock_next  # the start's own transaction meets a locked database

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        with pytest.raises(DatabaseUnavailable):  # the engine's loop logs it and passes again
            drain.engine.run_pass({"gpu-01"})
        assert drain.step("gpu-01", "cordon") == "pending"
        drain.engine.run_pass({"gpu-01"})

    assert drain.step("gpu-01", "cordon") == "done"
    assert [line for line in logged(caplog, logging.INFO) if "answers again" in line] == [
        "engine-0: the API answers again; starting cordon on gpu-01"]
    assert logged(caplog, logging.WARNING) == [f"engine-0: cannot start cordon on gpu-01 yet: {DOWN}"]


# ------------------------------------------------------------------ a step resumed after a restart


def blocked_then_restarted(db: Any, cluster: Any) -> Drain:
    """A one-node drain whose job a budget protects, tried twice (its eviction intent
    recorded at NOW), then a fresh engine a minute later, as after a restart."""
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "wait", words=ONE_NODE)
    drain.drive(lambda: len(cluster.did("evict")) >= 2)
    drain.clock.advance(60)
    drain.restart()
    return drain


def test_a_step_resumed_after_a_restart_is_on_record_in_the_audit_and_the_log(db, cluster, caplog):
    drain = blocked_then_restarted(db, cluster)
    evict = step_of(drain, "gpu-01", "evict")

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        drain.engine.run_pass({"gpu-01"})

    text = "gpu-01: evict resumed by engine-0 after a restart or lease change; checking the cluster first"
    assert audited(db, drain, "step.resumed") == [
        ("gpuops", IDENTITY, "step.resumed", "gpu-01", drain.view().request_id, drain.run_id, "running", "running",
         {"step": evict.id, "kind": "evict", "attempt": evict.attempt, "text": text, "replica": "engine-0",
          "dry_run": False})]
    assert logged(caplog, logging.INFO) == [f"engine-0: resuming evict on gpu-01 (step {evict.id})"]


def test_a_resumed_step_gets_back_each_intent_on_record_with_when_it_was_recorded(db, cluster):
    drain = blocked_then_restarted(db, cluster)
    evict = step_of(drain, "gpu-01", "evict")
    # A row of the run whose detail is no object (nothing gpuops writes today) is passed over.
    audit.append(db, actor="U0ADA", k8s_identity=None, action="run.note", target="train-a", at=drain.clock.now,
                 run_id=drain.run_id, detail="moved by hand")

    live = drain.engine.transitions.adopt(drain.run(), info_of(db, drain), evict)

    assert live == LiveStep(step_id=evict.id, intents={"evict/uid-job-01": NOW})
    assert drain.engine.live[evict.id] is live and drain.clock.now > NOW  # when recorded, not when resumed
