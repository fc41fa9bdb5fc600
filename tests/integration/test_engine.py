"""The engine against the real control plane: drains, a PodDisruptionBudget that will not
give, a driver restart, and a dry run, each on a small fleet of its own."""

from __future__ import annotations

import logging

from storage import audit
from storage import requests as stored_requests
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration import observe
from workflows.engine.runs import RunService


def _converged(installer, nodes: list[str]) -> None:
    wait_until(lambda: all(advertised(h.node(installer, n)) == 8 for n in nodes), timeout=60,
               what=f"{', '.join(nodes)} to advertise their GPUs")


def _ready_workload(installer, namespace: str, app: str) -> dict:
    wait_until(lambda: any(h.running_ready(p) for p in h.workload_pods(installer, namespace, app)), timeout=60,
               what=f"{namespace}/{app} to run")
    return next(p for p in h.workload_pods(installer, namespace, app) if h.running_ready(p))


def test_a_drain_cordons_evicts_and_uncordons_and_leaves_a_node_a_human_cordoned_cordoned(fleet, cluster, db, tmp_path):
    fleet(fl.FleetSpec(name="drain", system_nodes=0, pools=(fl.PoolSpec(name="drain", nodes=3),),
                       special_nodes=(fl.SpecialNode(node="drain-03", cordoned=True),),
                       workloads=(fl.WorkloadSpec(name="trainer", namespace="jobs", node="drain-01"),)))
    installer = cluster.installer()
    _converged(installer, ["drain-01", "drain-02", "drain-03"])
    trainer = _ready_workload(installer, "jobs", "trainer")

    run = h.start_run(db, h.plan("drain", "drain", [["drain-01", "drain-02"], ["drain-03"]]))
    with h.EngineThread(cluster.kubeconfig, db.path):
        finished = h.wait_run(db, run.id)

    view = RunService(db).get(run.id)
    assert finished.state == "succeeded", finished.halted_reason
    assert stored_requests.get(db, id=run.request_id).state == "done"
    # The two nodes the run cordoned are schedulable again; the human's stays cordoned.
    assert not h.unschedulable(installer, "drain-01") and not h.unschedulable(installer, "drain-02")
    assert h.unschedulable(installer, "drain-03")
    assert all(h.cordon_mark(installer, n) is None for n in ("drain-01", "drain-02", "drain-03"))
    notes = {(s.node, s.kind): (s.detail or {}).get("note") for s in view.steps}
    assert notes[("drain-03", "uncordon")].startswith("stays cordoned")
    assert notes[("drain-01", "evict")].startswith("evicted 1 pod")
    # The trainer pod was evicted (its Deployment may have started a new one).
    assert trainer["metadata"]["uid"] not in {p["metadata"]["uid"] for p in h.workload_pods(installer, "jobs", "trainer")}

    assert audit.verify(db).ok
    rows = audit.for_run(db, run.id)
    assert {r.k8s_identity for r in rows if r.actor == "gpuops"} == {"admin"}
    evictions = [r for r in rows if r.action == "pod.evict"]
    assert [r.target for r in evictions] == [f"jobs/{trainer['metadata']['name']}"]
    posted = [m["event"] for m in h.thread_messages(db)]
    assert posted[0] == "request.created" and "run.started" in posted and posted[-1] == "run.succeeded"
    assert posted.count("step.done") == 12  # 3 nodes x 4 steps


def test_an_eviction_a_pod_disruption_budget_blocks_times_out_and_halts_the_run_with_the_node_cordoned(
        fleet, cluster, db, caplog):
    fleet(fl.FleetSpec(name="pdb", system_nodes=0, pools=(fl.PoolSpec(name="pdb", nodes=2),),
                       workloads=(fl.WorkloadSpec(name="llm", namespace="serving", node="pdb-01",
                                                  pdb_min_available=1),)))
    installer = cluster.installer()
    _converged(installer, ["pdb-01", "pdb-02"])
    pod = _ready_workload(installer, "serving", "llm")

    steps = (("cordon", {}), ("evict", {"timeout_s": 3}), ("wait-for", {}), ("uncordon", {}))
    run = h.start_run(db, h.plan("drain", "pdb", [["pdb-01"], ["pdb-02"]], steps))
    with caplog.at_level(logging.INFO, logger="gpuops.kube"), h.EngineThread(cluster.kubeconfig, db.path):
        finished = h.wait_run(db, run.id)

    assert finished.state == "failed"
    assert "pdb-01: evict failed" in finished.halted_reason
    assert "PodDisruptionBudget" in finished.halted_reason and "gave up after 3s" in finished.halted_reason
    assert "Left cordoned by this run: pdb-01" in finished.halted_reason
    # The node stays cordoned, the pod keeps running, and the next wave never started.
    assert h.unschedulable(installer, "pdb-01") and h.cordon_mark(installer, "pdb-01") is not None
    assert pod["metadata"]["uid"] in {p["metadata"]["uid"] for p in h.workload_pods(installer, "serving", "llm")}
    assert not h.unschedulable(installer, "pdb-02")
    view = RunService(db).get(run.id)
    assert {(s.node, s.kind): s.state for s in view.steps if s.node == "pdb-02"} == {
        ("pdb-02", "cordon"): "skipped", ("pdb-02", "evict"): "skipped",
        ("pdb-02", "wait-for"): "skipped", ("pdb-02", "uncordon"): "skipped"}
    assert view.left_cordoned == ("pdb-01",)
    # It tried more than once while it waited, and said so in the thread.
    tries = [m for m in h.attempts(caplog.text) if m.startswith("evict pod serving/")]
    assert len(tries) >= 2
    assert not [m for m in h.mutations(caplog.text) if m.startswith("evict pod serving/")]  # all refused
    failed = [m for m in h.thread_messages(db) if m["event"] == "run.failed"]
    assert len(failed) == 1 and failed[0]["text"] == finished.halted_reason
    assert failed[0]["halted_on"] == "eviction-blocked"  # Slack links the runbook of this reason to halt
    assert audit.verify(db).ok


def test_a_driver_step_restarts_the_driver_pod_and_waits_for_the_node_to_advertise_its_gpus_again(
        fleet, cluster, db):
    fleet(fl.FleetSpec(name="drv", system_nodes=0, pools=(fl.PoolSpec(name="drv", nodes=2),)))
    installer = cluster.installer()
    _converged(installer, ["drv-01", "drv-02"])
    (old,) = observe.operand_pods(installer, "drv-01", "nvidia-driver-daemonset")

    steps = (("cordon", {}), ("evict", {}), ("driver", {"timeout_s": 120}), ("wait-for", {"timeout_s": 120}),
             ("uncordon", {}))
    run = h.start_run(db, h.plan("upgrade", "drv", [["drv-01"]], steps))
    with h.EngineThread(cluster.kubeconfig, db.path):
        finished = h.wait_run(db, run.id)

    assert finished.state == "succeeded", finished.halted_reason
    (new,) = observe.operand_pods(installer, "drv-01", "nvidia-driver-daemonset")
    assert new["metadata"]["uid"] != old["metadata"]["uid"] and observe.pod_ready(new)
    assert advertised(h.node(installer, "drv-01")) == 8
    assert not h.unschedulable(installer, "drv-01")
    view = RunService(db).get(run.id)
    notes = {(s.node, s.kind): (s.detail or {}).get("note") for s in view.steps}
    assert notes[("drv-01", "wait-for")].startswith("holds: node-ready, gpus-advertised")
    assert audit.verify(db).ok


def test_a_dry_run_drain_changes_nothing_in_the_cluster_but_records_what_it_would_do(fleet, cluster, db):
    fleet(fl.FleetSpec(name="dry", system_nodes=0, pools=(fl.PoolSpec(name="dry", nodes=2),),
                       workloads=(fl.WorkloadSpec(name="trainer", namespace="dryjobs", node="dry-01"),)))
    installer = cluster.installer()
    _converged(installer, ["dry-01", "dry-02"])
    pod = _ready_workload(installer, "dryjobs", "trainer")

    run = h.start_run(db, h.plan("drain", "dry", [["dry-01", "dry-02"]]), dry_run=True)
    with h.EngineThread(cluster.kubeconfig, db.path):
        finished = h.wait_run(db, run.id)

    assert finished.state == "succeeded" and finished.dry_run
    assert not h.unschedulable(installer, "dry-01") and not h.unschedulable(installer, "dry-02")
    assert h.cordon_mark(installer, "dry-01") is None
    assert pod["metadata"]["uid"] in {p["metadata"]["uid"] for p in h.workload_pods(installer, "dryjobs", "trainer")}
    view = RunService(db).get(run.id)
    notes = {(s.node, s.kind): (s.detail or {}).get("note") for s in view.steps}
    assert notes[("dry-01", "cordon")] == "would cordon it (it was schedulable)"
    operands_on_node = {p["metadata"]["ownerReferences"][0]["name"] for p in installer.list("Pod", namespace="gpu-operator")
                        if p["spec"].get("nodeName") == "dry-01"}
    assert notes[("dry-01", "evict")].startswith(f"would evict 1 pod; {len(operands_on_node)} left alone (gpu-operator/")
    evict = next(s for s in view.steps if (s.node, s.kind) == ("dry-01", "evict"))
    assert operands_on_node >= {"nvidia-driver-daemonset", "nvidia-device-plugin-daemonset"}
    assert {entry["why"].split(" pod:")[0] for entry in evict.detail["result"]["skipped"]} == {
        f"DaemonSet {name}" for name in operands_on_node}
    assert notes[("dry-01", "uncordon")] == "would uncordon it"
    assert view.left_cordoned == ()
    rows = audit.for_run(db, run.id)
    assert all(r.detail["dry_run"] for r in rows if r.actor == "gpuops")
    assert [r.target for r in rows if r.action == "pod.evict"] == [f"dryjobs/{pod['metadata']['name']}"]


def test_a_mig_step_asks_the_mig_manager_for_a_new_layout_and_waits_until_it_is_applied(fleet, cluster, db):
    fleet(fl.FleetSpec(name="mig", system_nodes=0, pools=(fl.PoolSpec(
        name="mig", nodes=1, product="NVIDIA-A100-SXM4-80GB", mig_config="all-1g.10gb"),)))
    installer = cluster.installer()
    wait_until(lambda: advertised(h.node(installer, "mig-01")) == 56, timeout=60, what="mig-01 to advertise 56 MIG devices")

    steps = (("cordon", {}), ("mig", {"config": "all-3g.40gb", "timeout_s": 120}), ("wait-for", {"timeout_s": 120}),
             ("uncordon", {}))
    run = h.start_run(db, h.plan("mig", "mig", [["mig-01"]], steps))
    with h.EngineThread(cluster.kubeconfig, db.path):
        finished = h.wait_run(db, run.id)

    assert finished.state == "succeeded", finished.halted_reason
    labels = h.node(installer, "mig-01")["metadata"]["labels"]
    assert (labels["nvidia.com/mig.config"], labels["nvidia.com/mig.config.state"]) == ("all-3g.40gb", "success")
    capacity = h.node(installer, "mig-01")["status"]["capacity"]
    assert capacity.get("nvidia.com/mig-3g.40gb") == "16" and "nvidia.com/mig-1g.10gb" not in capacity
    assert not h.unschedulable(installer, "mig-01")


def test_a_paused_run_finishes_the_step_in_flight_starts_nothing_new_and_resumes_where_it_stopped(
        fleet, cluster, db):
    fleet(fl.FleetSpec(name="pause", system_nodes=0, pools=(fl.PoolSpec(name="pause", nodes=1),)))
    installer = cluster.installer()
    _converged(installer, ["pause-01"])
    steps = (("cordon", {}), ("hold", {"seconds": 2}), ("uncordon", {}))
    run = h.start_run(db, h.plan("drain", "pause", [["pause-01"]], steps))
    runs = RunService(db)

    def state_of(kind: str) -> str:
        return next(s.state for s in runs.get(run.id).steps if s.kind == kind)

    with h.EngineThread(cluster.kubeconfig, db.path) as engine:
        wait_until(lambda: state_of("hold") == "running", timeout=30, what="the hold to start")
        runs.pause(h.ALICE, run.id, now=h.now())
        wait_until(lambda: state_of("hold") == "done", timeout=30, what="the hold in flight to finish")
        engine.passes_after(5)
        assert state_of("uncordon") == "pending" and runs.get(run.id).state == "paused"
        assert h.unschedulable(installer, "pause-01")

        runs.resume(h.ALICE, run.id, now=h.now())
        finished = h.wait_run(db, run.id)
    assert finished.state == "succeeded" and not h.unschedulable(installer, "pause-01")
    actions = [r.action for r in audit.for_run(db, run.id)]
    assert actions.index("run.paused") < actions.index("run.resumed") < actions.index("run.succeeded")
