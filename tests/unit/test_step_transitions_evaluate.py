"""One look at a running step and what the engine makes of it (StepTransitions in
workflows/engine/transitions.py: evaluate, finish, show_waiting, tell), on one-node plans
written out here and run by the real engine over the in-memory cluster, on clocks the test
moves (the harness of tests/unit/test_safety_rules.py):

- a control written into a step's params that the codec refuses fails the step saying its
  params cannot be used (code `bad-params`); an API that refuses the step's read fails it
  with the API's words (code `api-refused`);
- an API that does not answer keeps the step waiting, saying so, and it is looked at again
  after 1s, 2s, 4s ... up to the engine's `api_retry_max`; a look that gets an answer
  starts that count again;
- a wait past the step's timeout fails it naming the timeout and what it last waited for
  (code `step-timed-out`); a step with a deadline is looked at again just after the
  deadline, not only at the slow resync, and fails then;
- a drain's extension is looked at once: after that the hold waits for its time, even when
  the wall clock has passed its old end;
- a finished step is done on record: its `step.done` audit row (from running to done, its
  note and result), one update to the request's thread naming its node (deduplicated per
  step) and a log line naming the replica;
- what a running step waits for is kept in its detail and posted as an update, once per
  reason: a second look at the same reason writes nothing, not even after a restart, and
  a step that stopped running meanwhile (aborted elsewhere) gets no update;
- a step's notice is posted to the thread once and audited once: keyed by the step and
  naming its node, or, for the whole run, keyed by the run and naming none; a notice
  about a new end (`again_for`) is keyed by that end and so posted again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

import pytest

from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.runs import Run
from storage.step_params import HoldExtension
from storage.steps import Step
from workflows.engine.context import RunInfo
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine
from workflows.engine.runs import RunService, step_params
from workflows.engine.steps.contract import Failed, Outcome, StepNotice, Waiting
from workflows.kube.errors import Forbidden, Unavailable
from workflows.plans import NodeStep, plan_from_json

from tests.unit.test_engine_records import ENGINE_LOG, IDENTITY, audited, logged, posted
from tests.unit.test_safety_rules import NOW, PlannedRun
from tests.unit.test_safety_rules import cluster as cluster  # noqa: F401  (ten nodes of train-a)

NODE = "gpu-01"
DOWN = "GET /api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-01: connection refused"
UNREACHABLE = f"the Kubernetes API did not answer: {DOWN}; trying again"


def one_step(db: Any, cluster: Any, kind: str, params: dict[str, Any]) -> PlannedRun:
    """A run of one step of `kind` on gpu-01, started and looked at once (at NOW, 0 on the
    monotonic clock)."""
    run = PlannedRun(db, cluster, [(NODE,)], steps=lambda node: (NodeStep(kind, node, params),))
    run.engine.run_pass(set())
    return run


def the_step(run: PlannedRun) -> Step:
    (step,) = stored_steps.for_run(run.db, run_id=run.run_id)
    return step


def run_and_info(run: PlannedRun) -> tuple[Run, RunInfo]:
    stored = stored_runs.get(run.db, id=run.run_id)
    assert stored is not None
    request = stored_requests.get(run.db, id=stored.request_id)
    assert request is not None
    return stored, RunInfo(request=request, plan=plan_from_json(request.plan))


def look(run: PlannedRun) -> Outcome:
    """One look at the run's step by its engine, with what the engine knows of it."""
    step = the_step(run)
    stored, info = run_and_info(run)
    return run.engine.transitions.evaluate(stored, info, step, run.engine.live[step.id], [step])


def at(run: PlannedRun, seconds: float) -> None:
    """Both clocks `seconds` after the run started."""
    run.now, run.mono = NOW + dt.timedelta(seconds=seconds), seconds


def a_job(cluster: Any, make: Any) -> None:
    """A job on gpu-01 that a `wait-for-jobs` step of selector `app=job` waits for."""
    cluster.add_pod(make.workload(NODE, gpus=8, name="job-01", labels={"app": "job"}), uid="uid-job-01")


def not_ready(cluster: Any) -> None:
    cluster.nodes[NODE] = dataclasses.replace(cluster.node(NODE), ready=False)


def write_params(run: PlannedRun, **control: Any) -> None:
    """A control written into the step's params by another process (as `drain done` or an
    extension is)."""
    step = the_step(run)
    assert isinstance(step.detail, dict)
    stored_steps.replace_detail(run.db, id=step.id, expected="running",
                                detail={**step.detail, "params": {**step_params(step), **control}})


# ------------------------------------------------------------------ a look that fails


def test_a_control_the_codec_refuses_fails_the_step_saying_its_params_cannot_be_used(db, cluster):
    run = one_step(db, cluster, "hold", {"seconds": 60})
    write_params(run, extended_until="soon")

    assert look(run) == Failed(
        "the plan's parameters for this step cannot be used: hold step: params.extended_until must be a time "
        "with its zone (ISO-8601), not 'soon'", code="bad-params")


def test_an_api_that_refuses_the_steps_read_fails_it_with_the_apis_words(db, cluster, make):
    a_job(cluster, make)
    run = one_step(db, cluster, "wait-for-jobs", {"selector": "app=job"})

    def refuse(node: str, **_: Any) -> Any:
        raise Forbidden('pods is forbidden: User "gpuops" cannot list resource "pods"', status=403)

    cluster.list_pods_on_node = refuse

    assert look(run) == Failed(
        'the Kubernetes API refused: pods is forbidden: User "gpuops" cannot list resource "pods"',
        code="api-refused")


class Outage:
    """The API server's answers to the step's reads of the node's pods: none while `down`."""

    def __init__(self, cluster: Any) -> None:
        self.down = True
        self._list = cluster.list_pods_on_node
        cluster.list_pods_on_node = self

    def __call__(self, node: str, **kwargs: Any) -> Any:
        if self.down:
            raise Unavailable(DOWN)
        return self._list(node, **kwargs)


def test_an_api_that_does_not_answer_keeps_the_step_waiting_and_backs_off_to_api_retry_max(
        db, cluster, make):
    a_job(cluster, make)
    run = one_step(db, cluster, "wait-for-jobs", {"selector": "app=job"})
    Outage(cluster)
    live = run.engine.live[the_step(run).id]

    looks = []
    for second in range(6):
        at(run, second)
        looks.append((look(run), live.due))

    # 0.5s doubled at each failure, at most the engine's api_retry_max (30s).
    assert looks == [(Waiting(UNREACHABLE, retry_in=retry), second + retry)
                     for second, retry in enumerate([1.0, 2.0, 4.0, 8.0, 16.0, 30.0])]


def test_a_look_the_api_answers_starts_the_backoff_again_from_one_second(db, cluster, make):
    a_job(cluster, make)
    run = one_step(db, cluster, "wait-for-jobs", {"selector": "app=job"})
    outage = Outage(cluster)

    first = [look(run), look(run)]
    outage.down = False
    answered = look(run)
    outage.down = True
    again = [look(run), look(run)]

    assert first == [Waiting(UNREACHABLE, retry_in=1.0), Waiting(UNREACHABLE, retry_in=2.0)]
    assert answered == Waiting("waiting for ml/job-01 to finish", retry_in=5.0)
    assert again == first


# ------------------------------------------------------------------ timeouts and timers


def test_a_wait_past_its_timeout_fails_naming_the_timeout_and_what_it_last_waited_for(db, cluster):
    not_ready(cluster)
    run = one_step(db, cluster, "wait-for", {"condition": "node-ready", "timeout_s": 60})

    at(run, 59)
    before = look(run)
    at(run, 60)

    assert before == Waiting("waiting: node NotReady")
    assert look(run) == Failed("timed out after 60s; last: waiting: node NotReady", code="step-timed-out")


@pytest.mark.parametrize("last_look_s", [50, 59.5])
def test_a_step_with_a_deadline_is_looked_at_again_just_after_it_and_fails_then(db, cluster, last_look_s):
    not_ready(cluster)
    run = one_step(db, cluster, "wait-for", {"condition": "node-ready", "timeout_s": 60})
    at(run, last_look_s)
    run.engine.run_pass({NODE})  # woken: looked at now, not at the resync (30s later)

    at(run, 60)
    run.engine.run_pass(set())
    still = the_step(run).state
    at(run, 60.1)
    run.engine.run_pass(set())

    assert still == "running"
    assert (the_step(run).state, the_step(run).error) == (
        "failed", "timed out after 60s; last: waiting: node NotReady")


def test_a_drains_extension_is_looked_at_once_then_the_hold_waits_for_its_time(db, cluster):
    run = one_step(db, cluster, "hold", {"seconds": 60})  # looked at again at 60
    write_params(run, **HoldExtension(extended_until=NOW + dt.timedelta(seconds=120)).written_into({}))
    at(run, 10)
    run.engine.run_pass(set())  # the extension is looked at at once: held until 120, looked at again then

    at(run, 20)
    run.now = NOW + dt.timedelta(seconds=130)  # the wall clock is past both ends; the monotonic one is not
    run.engine.run_pass(set())

    assert the_step(run).state == "running"


# ------------------------------------------------------------------ a step done


def test_a_finished_step_is_done_on_record_in_the_audit_the_thread_and_the_log(db, cluster, caplog):
    run = one_step(db, cluster, "hold", {"seconds": 60})
    step = the_step(run)
    request_id = run_and_info(run)[1].request.id
    at(run, 60)

    with caplog.at_level(logging.INFO, logger=ENGINE_LOG):
        run.engine.run_pass(set())

    note = "held until 2025-06-07 12:01:00 UTC"
    text = f"gpu-01: hold done: {note}"
    assert the_step(run).state == "done"
    assert audited(db, run, "step.done") == [
        ("gpuops", IDENTITY, "step.done", NODE, request_id, run.run_id, "running", "done",
         {"step": step.id, "kind": "hold", "note": note, "result": {}, "replica": "engine-0", "dry_run": False})]
    assert posted(db, "step.done") == [
        {"channel": "C0OPS", "thread_ts": None, "kind": "update", "dedupe_key": f"{run.run_id}/step/{step.id}/done",
         "payload": {"event": "step.done", "request_id": request_id, "run_id": run.run_id, "pool": "train-a",
                     "kind": "drain", "state": "done", "text": text, "dry_run": False, "node": NODE}}]
    assert logged(caplog, logging.INFO)[0] == f"engine-0: {text}"
    assert not run.engine.in_flight(step.id)


# ------------------------------------------------------------------ what a step waits for


def waiting_update(run: PlannedRun, text: str) -> dict[str, Any]:
    request_id = run_and_info(run)[1].request.id
    return {"channel": "C0OPS", "thread_ts": None, "kind": "update", "dedupe_key": None,
            "payload": {"event": "step.waiting", "request_id": request_id, "run_id": run.run_id, "pool": "train-a",
                        "kind": "drain", "state": "running", "text": text, "dry_run": False, "node": NODE}}


def test_what_a_running_step_waits_for_is_kept_in_its_detail_and_posted_once_per_reason(db, cluster):
    not_ready(cluster)
    run = one_step(db, cluster, "wait-for", {"condition": "node-ready", "timeout_s": 600})
    commits = run.engine.commits

    at(run, 5)
    run.engine.run_pass({NODE})  # the same reason again: nothing written, not even a transaction
    same = run.engine.commits - commits
    run.engine = Engine(db=db, gateway=cluster, cache=cluster, lease=AlwaysHeld(), replica="engine-0",
                        clock=lambda: run.now, monotonic=lambda: run.mono)
    run.engine.run_pass({NODE})  # after a restart, still the same reason

    assert same == 0
    assert the_step(run).detail == {"params": {"condition": "node-ready", "timeout_s": 600},
                                    "intent": {"conditions": ["node-ready"]}, "waiting": "waiting: node NotReady"}
    assert posted(db, "step.waiting") == [waiting_update(run, "waiting: node NotReady")]


def test_a_new_reason_is_written_over_the_old_one_and_posted(db, cluster):
    not_ready(cluster)
    run = one_step(db, cluster, "wait-for", {"conditions": ["node-ready", "gpus-advertised"], "timeout_s": 600})
    step = the_step(run)
    stored, info = run_and_info(run)

    run.engine.transitions.show_waiting(stored, info, step, run.engine.live[step.id], "waiting: the test")

    assert the_step(run).detail["waiting"] == "waiting: the test"
    assert [m["payload"]["text"] for m in posted(db, "step.waiting")] == [
        "waiting: node NotReady", "waiting: the test"]
    assert posted(db, "step.waiting")[-1] == waiting_update(run, "waiting: the test")


def test_a_step_aborted_meanwhile_gets_no_waiting_update(db, cluster):
    not_ready(cluster)
    run = one_step(db, cluster, "wait-for", {"condition": "node-ready", "timeout_s": 600})
    step = the_step(run)  # read while it ran
    RunService(db).abort(run.cfg.actor("U0ADA"), run.run_id, now=run.now)
    stored, info = run_and_info(run)
    live = run.engine.live[step.id]

    run.engine.transitions.show_waiting(stored, info, step, live, "waiting: something else")

    assert "waiting: something else" not in str(the_step(run).detail)
    assert posted(db, "step.waiting") == [waiting_update(run, "waiting: node NotReady")]
    assert live.reason == "waiting: node NotReady"


# ------------------------------------------------------------------ notices


def tell_twice(run: PlannedRun, notice: StepNotice) -> Step:
    step = the_step(run)
    stored, info = run_and_info(run)
    for _ in range(2):
        run.engine.transitions.tell(stored, info, step, run.engine.live[step.id], notice)
    return step


def notice_posted(run: PlannedRun, event: str, text: str, dedupe: str, **node: str) -> dict[str, Any]:
    request_id = run_and_info(run)[1].request.id
    return {"channel": "C0OPS", "thread_ts": None, "kind": "post", "dedupe_key": dedupe,
            "payload": {"event": event, "request_id": request_id, "run_id": run.run_id, "pool": "train-a",
                        "kind": "drain", "state": "running", "text": text, "dry_run": False, **node}}


def test_a_steps_notice_is_posted_once_keyed_by_the_step_naming_its_node_and_audited_once(db, cluster):
    run = one_step(db, cluster, "hold", {"seconds": 3600})
    text = "gpu-01: a PodDisruptionBudget blocks the eviction of ml/job-01"

    step = tell_twice(run, StepNotice("pdb-blocked", text))

    request_id = run_and_info(run)[1].request.id
    assert audited(db, run, "step.pdb-blocked") == [
        ("gpuops", IDENTITY, "step.pdb-blocked", NODE, request_id, run.run_id, None, None,
         {"step": step.id, "kind": "hold", "notice": "pdb-blocked", "text": text, "replica": "engine-0",
          "dry_run": False})]
    assert posted(db, "step.pdb-blocked") == [
        notice_posted(run, "step.pdb-blocked", text, f"{run.run_id}/step/{step.id}/pdb-blocked", node=NODE)]


def test_a_notice_for_the_whole_run_is_keyed_by_the_run_and_names_no_node(db, cluster):
    run = one_step(db, cluster, "hold", {"seconds": 3600})
    text = "The window of the request ends at 13:00 UTC"

    tell_twice(run, StepNotice("window-ending", text, per_run=True))

    assert posted(db, "step.window-ending") == [
        notice_posted(run, "step.window-ending", text, f"{run.run_id}/notice/window-ending")]


def test_a_notice_about_a_new_end_is_keyed_by_that_end_and_so_posted_again_for_the_next(db, cluster):
    run = one_step(db, cluster, "hold", {"seconds": 3600})
    first, then = "2025-06-07T13:00:00.000000Z", "2025-06-07T14:00:00.000000Z"

    tell_twice(run, StepNotice("window-ending", "ends at 13:00", per_run=True, again_for=first))
    tell_twice(run, StepNotice("window-ending", "ends at 14:00", per_run=True, again_for=then))

    assert posted(db, "step.window-ending") == [
        notice_posted(run, "step.window-ending", "ends at 13:00", f"{run.run_id}/notice/window-ending/{first}"),
        notice_posted(run, "step.window-ending", "ends at 14:00", f"{run.run_id}/notice/window-ending/{then}")]
    assert [row[-1]["text"] for row in audited(db, run, "step.window-ending")] == [
        "ends at 13:00", "ends at 14:00"]
