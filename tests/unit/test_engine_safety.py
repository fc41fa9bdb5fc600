"""The engine's safety rules, on a drain planned by `/gpu drain` itself, run by the real
engine over an in-memory cluster that records every write with its arguments (so a
wrong argument fails a test, not only a missing call): evictions go through the Eviction
API and never become deletes; a node someone cordoned stays cordoned and gets only our
mark, and loses it again; a PodDisruptionBudget that still blocks at the pool's
`drain_timeout` halts the run (`wait`), leaves the node out and gives it back (`skip`),
or deletes each blocked pod exactly once (`delete`); and a restart, or a kill right
after any commit, repeats no eviction intent and no delete.

The clock is a value the test moves; each engine pass looks at every node.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from commands.drain_grammar import read_drain_words
from storage import audit
from storage import runs as stored_runs
from storage.database import Database
from storage.runs import Run
from workflows.config import GpuopsConfig
from workflows.drain.plan import drain_spec, plan_drain
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine
from workflows.engine.runs import RunService, RunView
from workflows.fleet.pods import group_pods_by_node
from workflows.kube.labels import ANNOTATION_CORDONED_BY
from workflows.requests.service import RequestService

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
NODES = ("gpu-01", "gpu-02")
TIMEOUT_S = 60


def config(action: str) -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        "pools": {"train-a": {"kind": "training", "windows": "always", "max_unavailable": 2,
                              "drain_timeout": f"{TIMEOUT_S}s", "validate_timeout": "60s",
                              "pdb_timeout_action": action, "allow_delete": action == "delete"}},
        "access": {"users": {"U0ADA": ["operator"]}, "names": {"U0ADA": "Ada"}},
    })


class Clock:
    def __init__(self) -> None:
        self.now, self.mono = NOW, 0.0

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        self.mono += seconds


class Killed(BaseException):
    """The engine process died right after a commit (what SIGKILL leaves behind)."""


@pytest.fixture
def cluster(fake_cluster, make):
    """Two nodes of train-a, each with its operand pods and one GPU job (`ml/job-01` on
    gpu-01, uid `uid-job-01`; `ml/job-02` on gpu-02)."""
    for node in NODES:
        fake_cluster.add_node(make.node(node, pool="train-a"))
        for index, pod in enumerate(make.operands(node)):
            fake_cluster.add_pod(pod, uid=f"uid-{pod.name}-{index}")
        job = f"job-{node[-2:]}"
        fake_cluster.add_pod(make.workload(node, gpus=8, name=job, labels={"app": job}), uid=f"uid-{job}")
    return fake_cluster


class Drain:
    """A `/gpu drain gpu-01 gpu-02 for 10m` on train-a, approved at once, its run started;
    then engines (one per process lifetime) driven pass by pass."""

    def __init__(self, db: Database, cluster: Any, action: str, *, words: str = "gpu-01 gpu-02 for 10m rack move",
                 dry_run: bool = False) -> None:
        self.db, self.cluster, self.clock = db, cluster, Clock()
        cfg = config(action)
        fleet = cluster.fleet(NOW)
        ask = read_drain_words(words.split(), fleet=fleet, pools=cfg.pools, now=NOW)
        spec = drain_spec(ask, fleet=fleet, pools=cfg.pools, now=NOW)
        pods = group_pods_by_node([p.pod for p in cluster.pods.values()])
        self.plan = plan_drain(spec, fleet=fleet, pods_by_node=pods, policy=cfg.pools["train-a"], open_requests=(),
                               now=NOW, requested_by="U0ADA").plan
        ada = cfg.actor("U0ADA")
        request = RequestService(db, cfg).submit(ada, kind="drain", pool="train-a", targets=list(spec.nodes),
                                                 plan=self.plan, window_start=spec.start, window_end=spec.end,
                                                 reason="rack move", channel="C0OPS", now=NOW)
        self.run_id = RunService(db).start(request.id, dry_run=dry_run, now=NOW, actor=ada).id
        self.engine = self.restart()

    def restart(self, *, kill_after: Callable[[Database], bool] | None = None) -> Engine:
        """A fresh engine on the same database and cluster, as after a restart; with
        `kill_after`, it dies right after the first commit for which that is true."""
        def on_commit(_: int) -> None:
            if kill_after is not None and kill_after(self.db):
                raise Killed()

        self.engine = Engine(db=self.db, gateway=self.cluster, cache=self.cluster, lease=AlwaysHeld(),
                             replica="engine-0", clock=lambda: self.clock.now, monotonic=lambda: self.clock.mono,
                             on_commit=on_commit)
        return self.engine

    def drive(self, until: Callable[[], bool], *, step_s: float = 5, passes: int = 400) -> None:
        for _ in range(passes):
            if until():
                return
            self.engine.run_pass(set(NODES))
            self.clock.advance(step_s)
        assert until(), self.view()

    def run(self) -> Run:
        run = stored_runs.get(self.db, id=self.run_id)
        assert run is not None
        return run

    def finished(self) -> bool:
        return self.run().state in ("succeeded", "failed", "aborted")

    def view(self) -> RunView:
        return RunService(self.db).get(self.run_id)

    def step(self, node: str, kind: str) -> str:
        return next(s.state for s in self.view().steps if (s.node, s.kind) == (node, kind))

    def audited(self, action: str) -> list[str]:
        return [e.target for e in audit.for_run(self.db, self.run_id) if e.action == action]

    def thread(self, event: str) -> list[str]:
        rows = self.db.query("SELECT payload FROM outbox ORDER BY id")
        return [p["text"] for p in (json.loads(r["payload"]) for r in rows) if p["event"] == event]


def mark(cluster, node: str) -> dict[str, Any] | None:
    raw = cluster.node(node).annotations.get(ANNOTATION_CORDONED_BY)
    return json.loads(raw) if raw else None


# ------------------------------------------------------------------ cordon, evict, uncordon


def test_a_drain_cordons_with_its_mark_evicts_through_the_eviction_api_and_gives_the_nodes_back(db, cluster):
    versions = {n: cluster.node(n).resource_version for n in NODES}
    drain = Drain(db, cluster, "wait")

    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    # Every write, with its arguments: a cordon carrying the mark on the version read,
    # an eviction of the job naming its uid, and an uncordon taking the mark off. No delete.
    cordons = [w for w in cluster.writes if w.verb == "cordon"]
    assert [(w.target, w.args["resource_version"], w.args["dry_run"]) for w in cordons] == [
        (n, versions[n], False) for n in NODES]
    written = json.loads(cordons[0].args["annotations"][ANNOTATION_CORDONED_BY])
    assert written == {"run": drain.run_id, "by": "gpuops for Ada", "prior_unschedulable": False,
                       "at": "2025-06-07T12:00:00.000000Z"}
    assert [(w.target, dict(w.args)) for w in cluster.writes if w.verb == "evict"] == [
        (f"ml/job-{n[-2:]}", {"uid": f"uid-job-{n[-2:]}", "dry_run": False}) for n in NODES]
    assert cluster.did("delete", "annotate", "label") == []
    uncordons = [w for w in cluster.writes if w.verb == "uncordon"]
    assert [(w.target, w.args["annotations"], w.args["dry_run"]) for w in uncordons] == [
        (n, {ANNOTATION_CORDONED_BY: None}, False) for n in NODES]
    assert all(not cluster.node(n).unschedulable and mark(cluster, n) is None for n in NODES)
    assert not any(p.pod.name.startswith("job-") for p in cluster.pods.values())
    # The operand DaemonSet pods were left alone.
    assert len(cluster.pods) == 6
    assert drain.audited("pod.evict") == ["ml/job-01", "ml/job-02"]


def test_a_node_a_person_cordoned_gets_only_the_mark_and_stays_cordoned_when_the_run_ends(db, cluster, make):
    cluster.add_node(make.node("gpu-02", pool="train-a", unschedulable=True))
    version = cluster.node("gpu-02").resource_version
    drain = Drain(db, cluster, "wait")

    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    gpu02 = [w for w in cluster.writes if w.target == "gpu-02"]
    assert [w.verb for w in gpu02] == ["annotate", "annotate"]  # never a cordon or an uncordon patch
    assert gpu02[0].args["resource_version"] == version
    assert json.loads(gpu02[0].args["annotations"][ANNOTATION_CORDONED_BY])["prior_unschedulable"] is True
    assert gpu02[1].args["annotations"] == {ANNOTATION_CORDONED_BY: None}
    assert cluster.node("gpu-02").unschedulable and mark(cluster, "gpu-02") is None
    assert not cluster.node("gpu-01").unschedulable
    assert "Still cordoned, as they were before the run: gpu-02" in drain.thread("run.succeeded")[0]


def test_a_node_changed_between_the_read_and_the_cordon_is_read_again_not_overwritten(db, cluster):
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")
    real_cordon = cluster.cordon_node
    raced: list[str] = []

    def someone_writes_first(name: str, **kwargs: Any) -> Any:
        if not raced:  # a label lands after the engine read the node
            raced.append(name)
            cluster.label_node(name, labels={"team": "ml"}, dry_run=False)
            cluster.writes.pop()
        return real_cordon(name, **kwargs)

    cluster.cordon_node = someone_writes_first
    drain.drive(drain.finished)

    cordons = [w for w in cluster.writes if w.verb == "cordon"]
    assert len(cordons) == 2 and cordons[0].args["resource_version"] != cordons[1].args["resource_version"]
    assert drain.run().state == "succeeded" and cluster.node("gpu-01").labels["team"] == "ml"


def test_a_dry_run_sends_every_write_as_a_dry_run_and_changes_nothing(db, cluster):
    before = (dict(cluster.nodes), dict(cluster.pods))
    drain = Drain(db, cluster, "wait", dry_run=True)

    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert cluster.writes and all(w.args["dry_run"] is True for w in cluster.writes)
    assert {w.verb for w in cluster.writes} == {"cordon", "evict", "uncordon"}
    assert (cluster.nodes, cluster.pods) == before


# ------------------------------------------------------------------ PodDisruptionBudgets


def test_a_blocked_eviction_is_retried_and_told_once_then_with_wait_the_run_halts_with_the_node_cordoned(
        db, cluster):
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "wait")

    drain.drive(lambda: drain.step("gpu-01", "evict") == "running" and len(cluster.did("evict")) >= 3)
    # While it waits: the thread hears why, once, and no pod was deleted.
    (told,) = drain.thread("step.pdb-blocked")
    assert told.startswith("gpu-01: eviction of ml/job-01 is blocked by a PodDisruptionBudget: Cannot evict pod")
    assert "the run halts with the node cordoned, for a person to decide" in told
    drain.drive(drain.finished)

    assert drain.run().state == "failed"
    reason = drain.run().halted_reason or ""
    assert reason.startswith("gpu-01: evict failed: gpu-01: eviction of ml/job-01 is blocked by a "
                             "PodDisruptionBudget"), reason
    # Both nodes stay as they are: gpu-02 (same wave) was drained and is held.
    assert "gave up after 60s" in reason and "Left cordoned by this run: gpu-01, gpu-02" in reason
    assert cluster.did("delete") == [] and "uid-job-01" in cluster.pods
    assert cluster.node("gpu-01").unschedulable and mark(cluster, "gpu-01")["run"] == drain.run_id  # type: ignore[index]
    assert ("uncordon", "gpu-01") not in cluster.did()
    assert drain.audited("pod.evict").count("ml/job-01") == 1  # one intent, however often it was tried
    assert drain.step("gpu-01", "uncordon") == "skipped"


def test_a_run_halted_by_a_budget_names_why_by_its_code_in_the_audit_and_the_threads_message(db, cluster):
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "wait")
    drain.drive(drain.finished)

    assert drain.run().state == "failed"
    (halt,) = [e for e in audit.for_run(db, drain.run_id) if e.action == "run.failed"]
    assert halt.detail["code"] == "eviction-blocked"
    rows = [json.loads(r["payload"]) for r in db.query("SELECT payload FROM outbox ORDER BY id")]
    (told,) = [p for p in rows if p["event"] == "run.failed"]
    assert told["halted_on"] == "eviction-blocked"  # the runbook Slack links


def test_with_skip_a_node_still_blocked_at_the_timeout_is_left_out_and_given_back_and_the_rest_drains(db, cluster):
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "skip")

    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    states = {k: drain.step("gpu-01", k) for k in ("cordon", "evict", "hold", "validate", "uncordon")}
    assert states == {"cordon": "done", "evict": "skipped", "hold": "skipped", "validate": "skipped",
                      "uncordon": "done"}
    assert "uid-job-01" in cluster.pods and cluster.did("delete") == []
    assert not cluster.node("gpu-01").unschedulable and mark(cluster, "gpu-01") is None
    assert ("uncordon", "gpu-01") in cluster.did() and "uid-job-02" not in cluster.pods
    (left,) = drain.thread("node.left_out")
    assert left.startswith("gpu-01 is left out of this run: eviction of ml/job-01 is blocked") and "after 60s" in left


def test_a_node_left_out_is_on_record_in_its_step_the_audit_log_the_thread_and_the_log(db, cluster, caplog):
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "skip", words="gpu-01 for 10m rack move")

    with caplog.at_level(logging.WARNING, logger="gpuops.engine"):
        drain.drive(drain.finished)

    budget = "Cannot evict pod as it would violate the pod's disruption budget."
    reason = (f"gpu-01 is left out of this run: eviction of ml/job-01 is blocked by a PodDisruptionBudget: {budget} "
              "still, after 60s. Its remaining pods keep running; it is uncordoned and the run goes on with the other "
              "nodes")
    evict = next(s for s in drain.view().steps if s.kind == "evict")
    assert (evict.state, evict.error) == ("skipped", reason)
    assert evict.detail == {"params": {"scope": "all-non-daemonset", "pdb_timeout_s": 60, "pdb_timeout_action": "skip"},
                            "intent": evict.detail["intent"], "note": reason,
                            "result": {"evicted": ["ml/job-01"], "skipped": evict.detail["intent"]["skipped"],
                                       "blocked": {"ml/job-01": budget}, "left_out": True}}
    (row,) = [e for e in audit.for_run(db, drain.run_id) if e.action == "node.left_out"]
    assert (row.target, row.before, row.after, row.actor) == ("gpu-01", "running", "skipped", "gpuops")
    assert row.detail == {"step": evict.id, "kind": "evict", "reason": reason, "text": reason, "replica": "engine-0",
                          "dry_run": False}
    (message,) = [m for m in db.query("SELECT * FROM outbox ORDER BY id") if '"node.left_out"' in m["payload"]]
    assert (message["kind"], message["dedupe_key"]) == ("post", f"{drain.run_id}/step/{evict.id}/left-out")
    assert json.loads(message["payload"]) == {
        "event": "node.left_out", "request_id": drain.view().request_id, "run_id": drain.run_id, "pool": "train-a",
        "kind": "drain", "state": "running", "text": reason, "dry_run": False, "node": "gpu-01"}
    assert f"engine-0: {reason}" in [r.getMessage() for r in caplog.records]
    assert drain.thread("run.succeeded") == [
        f"Run {drain.run_id} finished without gpu-01 (left out, see the thread); every other step done"]


def test_a_node_left_out_of_a_plan_without_an_uncordon_says_it_stays_as_it_is(db, cluster):
    from workflows.plans import NodeStep, Plan, PlanSummary, Wave

    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "skip", words="gpu-01 for 10m rack move")
    RunService(db).abort(config("skip").actor("U0ADA"), drain.run_id, now=NOW)
    node = NODES[0]
    plan = Plan(kind="drain", pool="train-a", summary=PlanSummary(), created_for="U0ADA", waves=(Wave(0, (node,), (
        NodeStep("cordon", node, {}), NodeStep("evict", node, {"pdb_timeout_s": 5, "pdb_timeout_action": "skip"}),
        NodeStep("hold", node, {"seconds": 60}))),))
    cfg = config("skip")
    request = RequestService(db, cfg).submit(cfg.actor("U0ADA"), kind="drain", pool="train-a", targets=[node],
                                             plan=plan, window_start=None, window_end=None, reason="r",
                                             channel="C0OPS", now=NOW)
    drain.run_id = RunService(db).start(request.id, dry_run=False, now=NOW).id
    drain.restart()
    drain.drive(drain.finished)

    (left,) = drain.thread("node.left_out")
    assert left.endswith(". Its plan has no uncordon step: it stays as it is now")
    assert cluster.node("gpu-01").unschedulable


def test_only_a_step_skipped_as_left_out_leaves_its_node_out():
    from storage.ids import RunId, StepId
    from storage.steps import Step
    from workflows.engine.waves import has_left_out

    def step(state: str, detail: Any) -> Step:
        return Step(id=StepId(1), run_id=RunId("run-1"), wave=0, node="gpu-01", seq=0, kind="evict",  # type: ignore[arg-type]
                    state=state, attempt=1, started_at=NOW, ended_at=NOW, detail=detail, error=None)  # type: ignore[arg-type]

    assert has_left_out([step("skipped", {"result": {"left_out": True}})])
    assert not has_left_out([step("done", {"result": {"left_out": True}})])
    assert not has_left_out([step("skipped", {})])  # skipped because the run stopped
    assert not has_left_out([step("skipped", "skipped")])  # detail that is not an object
    assert not has_left_out([])


def test_with_delete_each_pod_still_blocked_at_the_timeout_is_deleted_once_by_uid_on_record(db, cluster, make):
    cluster.add_pod(make.workload("gpu-01", gpus=0, name="sidecar-01", labels={"app": "side"}), uid="uid-side-01")
    cluster.blocked.update({"uid-job-01", "uid-side-01"})
    drain = Drain(db, cluster, "delete")

    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    deletes = [(w.target, dict(w.args)) for w in cluster.writes if w.verb == "delete"]
    assert deletes == [("ml/job-01", {"uid": "uid-job-01", "dry_run": False, "grace_seconds": None}),
                       ("ml/sidecar-01", {"uid": "uid-side-01", "dry_run": False, "grace_seconds": None})]
    # Not before the timeout: every delete came after the evictions the budget refused.
    first_delete = cluster.did().index(("delete", "ml/job-01"))
    assert cluster.did("evict")[:2] == [("evict", "ml/job-01"), ("evict", "ml/sidecar-01")]
    assert first_delete > 2
    assert drain.audited("pod.delete") == ["ml/job-01", "ml/sidecar-01"]
    assert not cluster.node("gpu-01").unschedulable


def test_a_pdb_refusal_is_never_taken_for_a_pod_that_is_gone(db, cluster):
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")

    drain.drive(lambda: len(cluster.did("evict")) >= 2)

    assert drain.step("gpu-01", "evict") == "running"
    assert "is blocked by a PodDisruptionBudget" in drain.view().steps[1].detail["waiting"]
    cluster.blocked.clear()  # the budget allows it now: the next try evicts it
    drain.drive(lambda: drain.step("gpu-01", "evict") == "done")
    assert "uid-job-01" not in cluster.pods


# ------------------------------------------------------------------ restarts and kills


def test_after_a_restart_the_eviction_intents_on_record_are_not_recorded_again(db, cluster):
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")
    drain.drive(lambda: len(cluster.did("evict")) >= 2)

    drain.restart()
    drain.drive(lambda: len(cluster.did("evict")) >= 4)

    assert drain.audited("pod.evict") == ["ml/job-01"]
    assert drain.audited("step.resumed") == ["gpu-01"]
    assert drain.step("gpu-01", "evict") == "running"


def test_a_blocked_pod_deleted_before_a_restart_is_not_deleted_again_after_it(db, cluster):
    cluster.blocked.add("uid-job-01")
    cluster.slow.add("uid-job-01")  # it takes its time to terminate
    drain = Drain(db, cluster, "delete", words="gpu-01 for 10m rack move")
    drain.drive(lambda: cluster.did("delete") != [])

    drain.restart()
    drain.drive(lambda: len(drain.audited("step.resumed")) == 1, step_s=1)
    for _ in range(5):  # the restarted engine looks again and again while the pod terminates
        drain.engine.run_pass(set(NODES))
        drain.clock.advance(1)
    cluster.terminate("uid-job-01")
    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert cluster.did("delete") == [("delete", "ml/job-01")]
    assert drain.audited("pod.delete") == ["ml/job-01"]


@pytest.mark.parametrize("action", ["pod.delete", "pod.evict", "step.running", "step.done"])
def test_a_kill_right_after_any_commit_repeats_no_delete_and_the_run_still_completes(db, cluster, action):
    cluster.blocked.add("uid-job-01")
    drain = Drain(db, cluster, "delete", words="gpu-01 for 10m rack move")

    def after(rows: int) -> Callable[[Database], bool]:
        return lambda _db: len([e for e in audit.for_run(_db, drain.run_id) if e.action == action]) >= rows

    kills = 0
    for rows in range(1, 8):
        drain.restart(kill_after=after(rows))
        try:
            drain.drive(drain.finished)
            break
        except Killed:
            kills += 1
    drain.restart()
    drain.drive(drain.finished)

    assert kills >= 1
    assert drain.run().state == "succeeded", drain.run().halted_reason
    assert cluster.did("delete") == [("delete", "ml/job-01")]
    assert drain.audited("pod.delete") == ["ml/job-01"] and drain.audited("pod.evict") == ["ml/job-01"]
    assert [w.verb for w in cluster.writes if w.target == "gpu-01"] == ["cordon", "uncordon"]
