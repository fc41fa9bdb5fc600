"""What the engine records of a run's life, driven by the real engine over the in-memory
cluster (the two-node drain of tests/unit/test_engine_safety.py):

- its settings refuse `max_parallel_nodes` below 1, saying which setting and why; 1 is
  allowed;
- a run it starts goes `pending -> running` once, with a `run.started` audit row (from
  `pending` to `running`, its text, this replica, whether it is a dry run), one post to
  the request's thread (deduplicated per run) and a log line naming the replica; a dry
  run says "Dry run" and marks every record `dry_run`;
- a run it halts (a step that failed, or `fail_run` called inside a commit) has its
  unfinished steps stopped with the given error, the run failed with the sentence as its
  `halted_reason` naming the nodes it leaves cordoned, the request failed, a `run.failed`
  audit row (from the state it was in, running or paused; the caller's detail plus the
  nodes left cordoned and the sentence), one post naming the halt code and a warning log
  line; none of its steps is in flight any more;
- a per-object intent (a pod's eviction) is one audit row, committed once per key, whose
  detail names the step, its kind and the intent key, and which queues the Kubernetes
  Event about the step's node.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

import pytest

from storage import audit
from storage import kube_events as queued
from storage import requests as stored_requests
from storage import steps as stored_steps
from storage.audit import AuditEntry
from storage.database import Database
from workflows.engine.context import LiveStep, RunInfo
from workflows.engine.loop import EngineSettings
from workflows.engine.runs import RunService
from workflows.plans import plan_from_json

from tests.unit.test_engine_safety import NOW, Drain
from tests.unit.test_engine_safety import cluster as cluster  # noqa: F401  (the two-node drain's cluster fixture)
from tests.unit.test_engine_safety import config as drain_config

ENGINE_LOG = "gpuops.engine"
IDENTITY = "system:serviceaccount:gpuops:gpuops"  # the fake cluster's Kubernetes identity
BUDGET = "Cannot evict pod as it would violate the pod's disruption budget."
GAVE_UP = (f"gpu-01: eviction of ml/job-01 is blocked by a PodDisruptionBudget: {BUDGET}; gave up after 60s. "
           "Free the budget (scale the workload up elsewhere) or move the pod by hand, then start a new run")


def row(entry: AuditEntry) -> tuple[Any, ...]:
    """An audit row as a whole, all but its time and hash chain."""
    return (entry.actor, entry.k8s_identity, entry.action, entry.target, entry.request_id, entry.run_id,
            entry.before, entry.after, entry.detail)


def audited(db: Database, drain: Drain, action: str) -> list[tuple[Any, ...]]:
    return [row(e) for e in audit.for_run(db, drain.run_id) if e.action == action]


def posted(db: Database, event: str) -> list[dict[str, Any]]:
    """The outbox messages of `event`, whole: where they go, their kind, dedupe key and payload."""
    messages = [{**m, "payload": json.loads(m["payload"])} for m in db.query("SELECT * FROM outbox ORDER BY id")]
    return [{k: m[k] for k in ("channel", "thread_ts", "kind", "dedupe_key", "payload")}
            for m in messages if m["payload"]["event"] == event]


def logged(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == ENGINE_LOG and r.levelno == level]


def info_of(db: Database, drain: Drain) -> RunInfo:
    request = stored_requests.get(db, id=drain.run().request_id)
    assert request is not None
    return RunInfo(request=request, plan=plan_from_json(request.plan))


# ------------------------------------------------------------------ settings


def test_fewer_than_one_parallel_node_is_refused_naming_the_setting_and_one_is_allowed():
    with pytest.raises(ValueError) as refused:
        EngineSettings(max_parallel_nodes=0)

    assert str(refused.value) == "max_parallel_nodes must be at least 1"
    assert EngineSettings(max_parallel_nodes=1).max_parallel_nodes == 1


# ------------------------------------------------------------------ a run starts


def assert_started_on_record(db: Database, drain: Drain, caplog: pytest.LogCaptureFixture, request_id: str,
                             text: str, *, dry_run: bool) -> None:
    """The run's start as the audit, the thread and the log have it: `text`, this
    replica, and whether it is a dry run."""
    assert audited(db, drain, "run.started") == [
        ("gpuops", IDENTITY, "run.started", "train-a", request_id, drain.run_id, "pending", "running",
         {"text": text, "replica": "engine-0", "dry_run": dry_run})]
    assert posted(db, "run.started") == [
        {"channel": "C0OPS", "thread_ts": None, "kind": "post", "dedupe_key": f"{drain.run_id}/started",
         "payload": {"event": "run.started", "request_id": request_id, "run_id": drain.run_id, "pool": "train-a",
                     "kind": "drain", "state": "running", "text": text, "dry_run": dry_run}}]
    assert logged(caplog, logging.INFO)[0] == f"engine-0: {text}"


def test_a_started_run_is_running_and_on_record_in_the_audit_the_thread_and_the_log(db, cluster, caplog):
    drain = Drain(db, cluster, "wait")
    request_id = drain.view().request_id

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        drain.engine.run_pass(set())

    text = f"Run {drain.run_id} of {request_id} started: 2 nodes in 1 wave"
    assert (drain.run().state, drain.run().started_at) == ("running", NOW)
    assert_started_on_record(db, drain, caplog, request_id, text, dry_run=False)


def test_a_dry_run_says_it_is_one_when_it_starts_and_marks_its_records_dry_run(db, cluster, caplog):
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move", dry_run=True)
    request_id = drain.view().request_id

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        drain.engine.run_pass(set())

    text = f"Dry run {drain.run_id} of {request_id} started: 1 node in 1 wave"
    assert_started_on_record(db, drain, caplog, request_id, text, dry_run=True)


# ------------------------------------------------------------------ a run halts


def test_a_run_a_failed_step_halts_is_failed_with_its_request_on_record_in_the_audit_the_thread_and_the_log(
        db, cluster, caplog):
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "wait")
    request_id = drain.view().request_id

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        drain.drive(drain.finished)

    said = (f"gpu-01: evict failed: {GAVE_UP}. The run stopped; no further steps or waves. Left cordoned by this "
            "run: gpu-01, gpu-02 (once you have checked them, `/gpu uncordon <node>` gives each back).")
    run = drain.run()
    assert (run.state, run.halted_reason, run.ended_at) == ("failed", said, NOW + dt.timedelta(seconds=60))
    request = stored_requests.get(db, id=request_id)
    assert request is not None and request.state == "failed"
    # gpu-02's hold was under way: it is stopped naming the node that failed; what had not started is skipped.
    assert [(s.node, s.kind, s.state, s.error) for s in drain.view().steps if s.state in ("failed", "skipped")] == [
        ("gpu-01", "evict", "failed", GAVE_UP), ("gpu-01", "hold", "skipped", None),
        ("gpu-01", "validate", "skipped", None), ("gpu-01", "uncordon", "skipped", None),
        ("gpu-02", "hold", "failed", "stopped because gpu-01 failed"), ("gpu-02", "validate", "skipped", None),
        ("gpu-02", "uncordon", "skipped", None)]
    assert audited(db, drain, "run.failed") == [
        ("gpuops", IDENTITY, "run.failed", "train-a", request_id, drain.run_id, "running", "failed",
         {"node": "gpu-01", "kind": "evict", "reason": GAVE_UP, "code": "eviction-blocked",
          "left_cordoned": ["gpu-01", "gpu-02"], "text": said, "replica": "engine-0", "dry_run": False})]
    assert posted(db, "run.failed") == [
        {"channel": "C0OPS", "thread_ts": None, "kind": "post", "dedupe_key": f"{drain.run_id}/failed",
         "payload": {"event": "run.failed", "request_id": request_id, "run_id": drain.run_id, "pool": "train-a",
                     "kind": "drain", "state": "failed", "text": said, "dry_run": False,
                     "halted_on": "eviction-blocked"}}]
    assert logged(caplog, logging.WARNING) == [f"engine-0: run {drain.run_id} halted: {said}"]


def test_a_paused_run_failed_inside_a_commit_is_failed_from_paused_and_none_of_its_steps_stays_in_flight(
        db, cluster, caplog):
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "wait")
    request_id = drain.view().request_id
    drain.drive(lambda: drain.step("gpu-01", "evict") == "running" and drain.step("gpu-02", "hold") == "running")
    RunService(db).pause(drain_config("wait").actor("U0ADA"), drain.run_id, now=drain.clock.now)
    engine, run = drain.engine, drain.run()
    in_flight = [s.id for s in drain.view().steps if s.state == "running"]
    assert run.state == "paused" and in_flight and all(engine.in_flight(s) for s in in_flight)
    told: list[tuple[str, ...]] = []

    def text(left: tuple[str, ...]) -> str:
        told.append(left)
        return f"halted by the test; left cordoned: {', '.join(left)}"

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG), engine.commit():
        engine.fail_run(run, info_of(db, drain), drain.clock.now, stopped="stopped by the test", text=text,
                        detail={"wave": 0, "reason": "the test stops it"})

    said = "halted by the test; left cordoned: gpu-01, gpu-02"
    assert told == [("gpu-01", "gpu-02")]
    assert (drain.run().state, drain.run().halted_reason) == ("failed", said)
    assert [(s.node, s.kind, s.state, s.error) for s in drain.view().steps if s.id in in_flight] == [
        ("gpu-01", "evict", "failed", "stopped by the test"), ("gpu-02", "hold", "failed", "stopped by the test")]
    request = stored_requests.get(db, id=request_id)
    assert request is not None and request.state == "failed"
    assert audited(db, drain, "run.failed") == [
        ("gpuops", IDENTITY, "run.failed", "train-a", request_id, drain.run_id, "paused", "failed",
         {"wave": 0, "reason": "the test stops it", "left_cordoned": ["gpu-01", "gpu-02"], "text": said,
          "replica": "engine-0", "dry_run": False})]
    # No halt code in the detail: the post names none.
    assert posted(db, "run.failed") == [
        {"channel": "C0OPS", "thread_ts": None, "kind": "post", "dedupe_key": f"{drain.run_id}/failed",
         "payload": {"event": "run.failed", "request_id": request_id, "run_id": drain.run_id, "pool": "train-a",
                     "kind": "drain", "state": "failed", "text": said, "dry_run": False}}]
    assert logged(caplog, logging.WARNING) == [f"engine-0: run {drain.run_id} halted: {said}"]
    assert not any(engine.in_flight(s.id) for s in drain.view().steps)


# ------------------------------------------------------------------ intents


def test_a_pods_eviction_is_audited_with_its_step_kind_and_key_and_queues_the_event_about_its_node(db, cluster):
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")
    request_id = drain.view().request_id

    drain.drive(lambda: drain.step("gpu-01", "evict") == "done")

    evict = next(s for s in drain.view().steps if s.kind == "evict")
    assert audited(db, drain, "pod.evict") == [
        ("gpuops", IDENTITY, "pod.evict", "ml/job-01", request_id, drain.run_id, None, None,
         {"node": "gpu-01", "uid": "uid-job-01", "why": "uses GPUs: nvidia.com/gpu=8", "step": evict.id,
          "kind": "evict", "intent_key": "evict/uid-job-01", "replica": "engine-0", "dry_run": False})]
    event = queued.kube_event(db, key=f"{drain.run_id}/Node/gpu-01/PodEvicted")
    assert event is not None and isinstance(event.body, dict)
    assert (event.count, event.body["reason"], event.body["action"], event.body["regarding"]) == (
        1, "PodEvicted", "evict", {"apiVersion": "v1", "kind": "Node", "name": "gpu-01", "uid": "gpu-01"})


def test_an_intent_recorded_again_under_the_same_key_writes_nothing_more(db, cluster):
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")
    drain.engine.run_pass(set())
    step = next(s for s in stored_steps.for_run(db, run_id=drain.run_id) if s.kind == "evict")
    live = LiveStep(step.id)
    before = len(audit.for_run(db, drain.run_id))

    for _ in range(2):
        drain.engine.record_intent(drain.run(), info_of(db, drain), step, live, key="evict/uid-x",
                                   action="pod.evict", target="ml/x", detail={"node": "gpu-01"})

    assert len(audit.for_run(db, drain.run_id)) == before + 1
    assert audited(db, drain, "pod.evict")[-1][-1] == {
        "node": "gpu-01", "step": step.id, "kind": "evict", "intent_key": "evict/uid-x", "replica": "engine-0",
        "dry_run": False}
    assert live.intents == {"evict/uid-x": drain.clock.now}
