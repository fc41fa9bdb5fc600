"""Kubernetes Events from the engine's audited actions: which action makes which Event on
which object, what its note says, how a repeat becomes a series in the queue, and that
a real drain (the engine over an in-memory cluster) queues them in the transactions that
audit its steps while a dry run queues none."""

from __future__ import annotations

import datetime as dt

import pytest

from commands.drain_grammar import read_drain_words
from storage import kube_events as queued
from storage.database import Database
from workflows.config import GpuopsConfig
from workflows.drain.plan import drain_spec, plan_drain
from workflows.engine.event_messages import NOTE_LIMIT, event_note
from workflows.engine.kube_events import drafts_for
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine
from workflows.engine.runs import RunService
from workflows.fleet.pods import group_pods_by_node
from workflows.requests.service import RequestService

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
UTC = dt.timezone.utc


@pytest.mark.parametrize(("action", "target", "detail", "node", "waves", "expected"), [
    ("step.done", "gpu-01", {"kind": "cordon"}, "gpu-01", (), [("Cordoned", "Normal", "Node", "gpu-01")]),
    ("step.running", "gpu-01", {"kind": "evict"}, "gpu-01", (), [("EvictionStarted", "Normal", "Node", "gpu-01")]),
    ("step.pdb-blocked", "gpu-01", {"kind": "evict"}, "gpu-01", (),
     [("EvictionBlocked", "Warning", "Node", "gpu-01")]),
    ("driver-version.set", "ClusterPolicy cluster-policy", {"kind": "driver-version", "from": "550", "to": "570"},
     "gpu-01", (), [("DriverVersionSet", "Normal", "ClusterPolicy", "cluster-policy"),
                    ("DriverVersionSet", "Normal", "Node", "gpu-01")]),
    ("driver-version.set", "NVIDIADriver default", {"kind": "driver-version"}, "gpu-01", (),
     [("DriverVersionSet", "Normal", "NVIDIADriver", "default"), ("DriverVersionSet", "Normal", "Node", "gpu-01")]),
    ("step.done", "gpu-01", {"kind": "driver"}, "gpu-01", (), [("DriverPodRestarted", "Normal", "Node", "gpu-01")]),
    ("step.done", "gpu-01", {"kind": "mig"}, "gpu-01", (), [("MigLayoutSet", "Normal", "Node", "gpu-01")]),
    ("step.done", "gpu-01", {"kind": "validate"}, "gpu-01", (), [("NodeValidated", "Normal", "Node", "gpu-01")]),
    ("gpu-check.passed", "pod gpuops/check-1", {"kind": "gpu-check"}, "gpu-01", (),
     [("GpuCheckPassed", "Normal", "Node", "gpu-01")]),
    ("step.failed", "gpu-01", {"kind": "gpu-check", "reason": "xid 79"}, "gpu-01", (),
     [("GpuCheckFailed", "Warning", "Node", "gpu-01")]),
    ("step.done", "gpu-01", {"kind": "uncordon"}, "gpu-01", (), [("Uncordoned", "Normal", "Node", "gpu-01")]),
    ("run.failed", "train-a", {"node": "gpu-02", "reason": "PDB"}, None, (), [("Halted", "Warning", "Node", "gpu-02")]),
    ("run.waiting", "train-a", {"wave": 1, "text": "too few GPUs"}, None, ("gpu-03", "gpu-04"),
     [("GateHeld", "Normal", "Node", "gpu-03"), ("GateHeld", "Normal", "Node", "gpu-04")]),
    ("run.unfrozen", "train-a", {}, None, ("gpu-03",), [("GateReleased", "Normal", "Node", "gpu-03")]),
    # A step kind the table does not name (a new kind's own) still reports, in general words.
    ("step.done", "gpu-01", {"kind": "node-labels"}, "gpu-01", (), [("NodeLabelsDone", "Normal", "Node", "gpu-01")]),
    ("step.failed", "gpu-01", {"kind": "node-labels", "reason": "x"}, "gpu-01", (),
     [("StepFailed", "Warning", "Node", "gpu-01")]),
    # What other actions tell already, or what changes no object, makes none.
    ("step.done", "gpu-01", {"kind": "gpu-check"}, "gpu-01", (), []),
    ("step.running", "gpu-01", {"kind": "cordon"}, "gpu-01", (), []),
    ("run.started", "train-a", {}, None, ("gpu-01",), []),
    ("run.succeeded", "train-a", {}, None, ("gpu-01",), []),
])
def test_each_audited_action_makes_its_event_on_the_object_it_changed(action, target, detail, node, waves, expected):
    drafts = drafts_for(action, target=target, detail=detail, node=node, wave_nodes=waves)

    assert [(d.reason, d.type, d.regarding.kind, d.regarding.name) for d in drafts] == expected


def test_a_node_event_regards_the_node_as_kubectl_describe_node_looks_for_it():
    (draft,) = drafts_for("step.done", target="gpu-01", detail={"kind": "cordon"}, node="gpu-01")

    assert draft.regarding.to_json() == {"apiVersion": "v1", "kind": "Node", "name": "gpu-01", "uid": "gpu-01"}


def test_the_note_names_the_run_the_request_who_approved_it_and_the_window():
    note = event_note("Cordoned by gpuops", run_id="run-9b01de", request_id="req-7f3a2c", request_kind="drain",
                      pool="train-a", approvers=["U0BOB", "U0CAROL"], window_start=NOW,
                      window_end=NOW + dt.timedelta(hours=2), zone=UTC)

    assert note == ("Cordoned by gpuops. Run run-9b01de of request req-7f3a2c (drain, pool train-a), approved by "
                    "U0BOB and U0CAROL, window 2025-06-07 12:00 UTC to 2025-06-07 14:00 UTC.")


def test_a_long_reason_is_cut_so_the_note_fits_the_api_and_still_names_the_run():
    note = event_note("Run halted here: " + "é" * 2000, run_id="run-9b01de", request_id="req-7f3a2c",
                      request_kind="drain", pool="train-a", approvers=[], window_start=None, window_end=None, zone=UTC)

    assert len(note.encode()) <= NOTE_LIMIT
    assert note.endswith("Run run-9b01de of request req-7f3a2c (drain, pool train-a), no approval required, "
                         "no window.")


def queue(db: Database, key: str = "run-1/Node/gpu-01/PodEvicted", *, at: dt.datetime = NOW) -> queued.KubeEventRow:
    with db.transaction():
        return queued.queue_kube_event(db, key=key, cluster=None, namespace="default", name="gpu-01.gpuops-1",
                                       body={"reason": "PodEvicted"}, at=at)


def test_a_repeat_of_an_event_counts_in_its_series_instead_of_a_second_event(db):
    first = queue(db)
    again = queue(db, at=NOW + dt.timedelta(seconds=5))

    assert again.id == first.id and again.count == 2 and again.last_at == NOW + dt.timedelta(seconds=5)
    assert again.first_at == NOW and len(db.query("SELECT id FROM kube_events")) == 1


def test_a_sent_event_is_due_again_only_when_it_repeated(db):
    row = queue(db)
    queued.mark_kube_event_sent(db, id=row.id, count=1)
    assert queued.kube_events_due(db, now=NOW, limit=10) == []

    queue(db, at=NOW + dt.timedelta(seconds=1))
    (due,) = queued.kube_events_due(db, now=NOW + dt.timedelta(seconds=1), limit=10)
    assert (due.count, due.sent_count) == (2, 1)


def test_an_event_the_api_refused_is_not_tried_again_even_when_it_repeats(db):
    row = queue(db)
    queued.mark_kube_event_failed(db, id=row.id, error="403 Forbidden", retry_at=None)
    queue(db, at=NOW + dt.timedelta(seconds=1))

    assert queued.kube_events_due(db, now=NOW + dt.timedelta(minutes=5), limit=10) == []


def test_an_unanswered_event_waits_for_its_retry_time(db):
    row = queue(db)
    queued.mark_kube_event_failed(db, id=row.id, error="timed out", retry_at=NOW + dt.timedelta(seconds=8))

    assert queued.kube_events_due(db, now=NOW + dt.timedelta(seconds=7), limit=10) == []
    assert [r.id for r in queued.kube_events_due(db, now=NOW + dt.timedelta(seconds=8), limit=10)] == [row.id]


def test_the_queue_forgets_events_older_than_their_life_in_the_api(db):
    old = queue(db, "run-1/Node/gpu-01/Cordoned")
    queued.mark_kube_event_sent(db, id=old.id, count=1)
    queue(db, "run-1/Node/gpu-01/Uncordoned", at=NOW + dt.timedelta(minutes=50))

    assert queued.prune_kube_events(db, now=NOW + queued.KUBE_EVENT_TTL + dt.timedelta(seconds=1)) == 1
    assert [r["key"] for r in db.query("SELECT key FROM kube_events")] == ["run-1/Node/gpu-01/Uncordoned"]


def test_events_are_queued_for_each_cluster_apart(db):
    with db.transaction():
        queued.queue_kube_event(db, key="a", cluster=None, namespace="default", name="a", body={}, at=NOW)
        queued.queue_kube_event(db, key="b", cluster="east", namespace="default", name="b", body={}, at=NOW)
        queued.queue_kube_event(db, key="c", cluster="west", namespace="default", name="c", body={}, at=NOW)

    assert [r.key for r in queued.kube_events_due(db, now=NOW, limit=10)] == ["a"]
    assert [r.key for r in queued.kube_events_due(db, now=NOW, limit=10, clusters=(None, "east"))] == ["a", "b"]
    assert [r.key for r in queued.kube_events_due(db, now=NOW, limit=10, clusters=("west",))] == ["c"]


# --- the engine queues them -------------------------------------------------------------------

CONFIG = GpuopsConfig.model_validate({
    "pools": {"train-a": {"kind": "training", "windows": "always", "max_unavailable": 1, "min_ready_gpus": 0,
                          "validate_timeout": "60s"}},
    "access": {"users": {"U0ADA": ["operator"]}, "names": {"U0ADA": "Ada"}},
})


def drain(db: Database, cluster, *, dry_run: bool) -> str:
    fleet = cluster.fleet(NOW)
    spec = drain_spec(read_drain_words("gpu-01 for 30m firmware".split(), fleet=fleet, pools=CONFIG.pools, now=NOW),
                      fleet=fleet, pools=CONFIG.pools, now=NOW)
    plan = plan_drain(spec, fleet=fleet, pods_by_node=group_pods_by_node([]), policy=CONFIG.pools["train-a"],
                      open_requests=(), now=NOW, requested_by="U0ADA").plan
    ada = CONFIG.actor("U0ADA")
    request = RequestService(db, CONFIG).submit(ada, kind="drain", pool="train-a", targets=list(spec.nodes),
                                                plan=plan, window_start=spec.start, window_end=spec.end,
                                                reason="rack move", channel="C0OPS", now=NOW)
    run_id = RunService(db).start(request.id, dry_run=dry_run, now=NOW, actor=ada).id
    clock = {"now": NOW, "mono": 0.0}
    engine = Engine(db=db, gateway=cluster, cache=cluster, lease=AlwaysHeld(), replica="engine-0",
                    clock=lambda: clock["now"], monotonic=lambda: clock["mono"], pools=CONFIG.pools)
    for _ in range(400):
        if db.query_one("SELECT 1 FROM runs WHERE id = ? AND state IN ('succeeded', 'failed')", (run_id,)):
            break
        engine.run_pass({"gpu-01"})
        clock["now"] += dt.timedelta(seconds=60)
        clock["mono"] += 60
    return run_id


@pytest.fixture
def cluster(fake_cluster, make):
    fake_cluster.add_node(make.node("gpu-01", pool="train-a"))
    for index, pod in enumerate(make.operands("gpu-01")):
        fake_cluster.add_pod(pod, uid=f"uid-{pod.name}-{index}")
    return fake_cluster


def test_a_drain_queues_an_event_on_the_node_for_each_thing_done_to_it_naming_the_run(db, cluster):
    run_id = drain(db, cluster, dry_run=False)

    rows = db.query("SELECT key, body FROM kube_events ORDER BY id")
    reasons = [queued.kube_event(db, key=r["key"]).body["reason"] for r in rows]  # type: ignore[union-attr,index]
    assert reasons == ["WaveStarted", "Cordoned", "EvictionStarted", "Drained", "HoldEnded", "NodeValidated",
                       "Uncordoned"]
    for row in rows:
        body = queued.kube_event(db, key=row["key"]).body  # type: ignore[union-attr]
        assert body["regarding"]["name"] == "gpu-01"  # type: ignore[index,call-overload]
        assert body["reportingController"] == "gpuops" and body["reportingInstance"] == "engine-0"  # type: ignore[index,call-overload]
        assert f"Run {run_id} of request" in body["note"]  # type: ignore[index,call-overload]


def test_a_dry_run_changes_nothing_and_so_queues_no_event(db, cluster):
    drain(db, cluster, dry_run=True)

    assert db.query("SELECT key FROM kube_events") == []
