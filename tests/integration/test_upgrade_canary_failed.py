"""What comes after a failed canary, on the real GPU Operator, as the bot's ServiceAccount.

A ClusterPolicy shared by two pools (the request names the other with --also): the run
sets the new version, the canary's new driver crash-loops and the run halts. The object
must not stay armed: every driver pod that restarts anywhere it reaches would take the
failed version. So the plan includes, for a failed canary, setting the object back to
the version it replaced (only while it still names the run's), audited and told in the
thread; the canary keeps what it was given and waits for the rollback request, which
still puts it back. An object Git keeps (Argo CD's tracking mark) is not patched: the run
says what to set back in Git, and until then the fleet's finding is critical and names
the nodes at risk.

Before a driver change, GPU pods that tolerate node.kubernetes.io/unschedulable land on
the cordoned node again right after eviction: the thread hears it once, they are evicted
again up to the pool's `evict_retries`, and the run halts naming them and their owners."""

from __future__ import annotations

import pytest

from commands.services import Services
from storage import audit
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration import observe
from tests.integration.desk import ACCESS, Desk, bot_granted_for_the_test
from tests.integration.inventory_helpers import wait_fleet
from workflows.config import GpuopsConfig


OLD, NEW = "580.95.05", "580.105.08"
SHARED = fl.FleetSpec(
    name="armed", system_nodes=0, crashloop_driver_versions=(NEW,),
    operator=fl.OperatorSpec(auto_upgrade=False, driver_version=OLD),
    pools=(fl.PoolSpec(name="upg", nodes=2), fl.PoolSpec(name="other", nodes=1)),
)
NODES = ("upg-01", "upg-02", "other-01")
POLICY = SHARED.operator.cluster_policy_name
# `patch`: the run sets the version itself even on an object Git keeps (Git mode has tests of its own).
CONFIG = GpuopsConfig.model_validate({
    "pools": {"upg": {"kind": "serving", "windows": "always", "max_unavailable": 1, "upgrade_soak": "1s",
                      "driver_version_source": "patch"},
              "other": {"kind": "serving", "windows": "always"}},
    "access": ACCESS,
})


@pytest.fixture
def as_bot(cluster):
    yield from bot_granted_for_the_test(cluster)


def _policy_version(installer) -> str:
    return installer.get({"kind": "ClusterPolicy", "metadata": {"name": POLICY}})["spec"]["driver"]["version"]


def _driver_pod_uid(installer, node: str) -> str:
    (pod,) = observe.driver_pods(installer, node)
    return pod["metadata"]["uid"]


def _ask_and_halt(cluster, db, fleet_cache, as_bot):
    installer = cluster.installer()
    wait_until(lambda: all(advertised(observe.node(installer, n)) == 8 for n in NODES), timeout=120,
               what="every node to advertise its GPUs")
    desk = Desk(cluster, db, Services.on_database(config=CONFIG, fleet=fleet_cache(user=as_bot), database=db),
                CONFIG, user=as_bot)
    asked = desk.say("U0ALICE", f"upgrade upg to {NEW} --also other driver CVE")
    assert asked.ok, asked.summary
    # The plan says what a failed canary does to the object.
    assert any(f"if the canary fails, ClusterPolicy {POLICY} is set back to {OLD}" in b
               for b in asked.sections[1].bullets), asked.sections[1].bullets
    (request,) = desk.services.requests.open_requests("upg")  # type: ignore[union-attr]
    before = {n: _driver_pod_uid(installer, n) for n in ("upg-02", "other-01")}
    halted = desk.approve_and_run(request.id)
    assert halted.state == "failed"
    assert "upg-01" in (halted.halted_reason or "") and "CrashLoopBackOff" in (halted.halted_reason or "")
    return desk, halted, before


def test_a_failed_canary_sets_the_shared_cluster_policy_back_and_the_rollback_still_puts_the_canary_back(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(SHARED)
    installer = cluster.installer()
    desk, halted, before = _ask_and_halt(cluster, db, fleet_cache, as_bot)

    # Disarmed: the object names the version it replaced, once, on record, and the thread says so.
    assert _policy_version(installer) == OLD
    rows = audit.for_run(db, halted.id)
    assert [(r.detail["from"], r.detail["to"]) for r in rows if r.action == "driver-version.set"] == [(OLD, NEW)]
    assert [(r.target, r.detail["from"], r.detail["to"]) for r in rows if r.action == "driver-version.set-back"] == [
        (f"ClusterPolicy {POLICY}", NEW, OLD)]
    assert audit.verify(db).ok
    (told,) = [m for m in h.thread_messages(db) if m["event"] == "run.failed"]
    said = told["text"]
    assert f"ClusterPolicy {POLICY} set back from {NEW} to {OLD}" in said, said
    # Why it halted is the canary's failure, not the set-back that ran after it: its runbook.
    assert told["halted_on"] == "new-driver-failing"
    assert f"`/gpu rollback {halted.id}`" in said and said == halted.halted_reason
    # The canary keeps what it was given, cordoned, for the rollback; nothing else moved.
    assert h.unschedulable(installer, "upg-01")
    for node, uid in before.items():
        assert _driver_pod_uid(installer, node) == uid and not h.unschedulable(installer, node)
    # With the DaemonSet back at OLD, no pod elsewhere is armed to take the failed version.
    view = wait_fleet(desk.services.fleet, lambda v: not v.pool("other").driver_pods_behind,
                      "the other pool's pods to be at their DaemonSet's version again")
    assert not [f for f in view.findings if f.code == "driver-pods-behind-template" and f.severity == "critical"]

    asked = desk.say("U0ALICE", f"rollback {halted.id}")
    assert asked.ok, asked.summary
    back = desk.approve_and_run(desk.rollback_request(halted.id, "upg"))

    assert back.state == "succeeded", back.halted_reason
    assert _policy_version(installer) == OLD
    wait_until(lambda: observe.node(installer, "upg-01")["metadata"]["labels"].get(
        "nvidia.com/cuda.driver-version.full") == OLD, timeout=30, what="upg-01 to report the old driver")
    assert not h.unschedulable(installer, "upg-01")


def test_a_failed_canary_of_a_git_kept_cluster_policy_says_what_to_set_back_in_git_and_the_finding_is_critical(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(SHARED)
    installer = cluster.installer()
    tracking = f"gpu-platform:nvidia.com/ClusterPolicy:/{POLICY}"
    installer.call("PATCH", f"/apis/nvidia.com/v1/clusterpolicies/{POLICY}", content_type="application/merge-patch+json",
                   body={"metadata": {"annotations": {"argocd.argoproj.io/tracking-id": tracking}}})
    desk, halted, _ = _ask_and_halt(cluster, db, fleet_cache, as_bot)

    # Not patched behind Git's back: the run says what to set back there.
    assert _policy_version(installer) == NEW
    assert not [r for r in audit.for_run(db, halted.id) if r.action == "driver-version.set-back"]
    reason = halted.halted_reason or ""
    assert f"ClusterPolicy {POLICY} is kept by Argo CD ({tracking})" in reason, reason
    assert f"Set spec.driver.version back from {NEW} to {OLD} in Git" in reason, reason
    # Until then, every pod the failed version would reach is at risk, and the finding says so.
    view = wait_fleet(desk.services.fleet, lambda v: any(
        f.code == "driver-pods-behind-template" and f.severity == "critical" and f.subject == "other"
        for f in v.findings), "the armed object's finding to be critical")
    (found,) = [f for f in view.findings if f.code == "driver-pods-behind-template" and f.subject == "other"]
    assert f"driver {NEW} failed on upg-01" in found.message, found.message
    assert "nodes at risk (other-01)" in found.message, found.message
    (upg,) = [f for f in view.findings if f.code == "driver-pods-behind-template" and f.subject == "upg"]
    assert upg.severity == "critical" and "nodes at risk (upg-02)" in upg.message, upg.message


# ---- evicted pods that come straight back

BACK = fl.FleetSpec(
    name="back", system_nodes=0, pools=(fl.PoolSpec(name="upg", nodes=1),),
    # The demo's kind of workload: pinned to its node and tolerating the cordon.
    workloads=(fl.WorkloadSpec(name="trainer", namespace="backjobs", node="upg-01"),))


def test_gpu_pods_that_come_straight_back_are_evicted_again_within_the_limit_and_then_halt_the_run(
        fleet, cluster, db):
    fleet(BACK)
    installer = cluster.installer()
    wait_until(lambda: any(h.running_ready(p) for p in h.workload_pods(installer, "backjobs", "trainer")),
               timeout=60, what="the trainer to run on upg-01")
    steps = (("cordon", {}), ("evict", {"scope": "gpu", "evict_retries": 2, "timeout_s": 120}),
             ("wait-for", {"timeout_s": 60}), ("uncordon", {}))
    run = h.start_run(db, h.plan("upgrade", "upg", [["upg-01"]], steps))
    with h.EngineThread(cluster.kubeconfig, db.path):
        finished = h.wait_run(db, run.id, timeout=120)

    assert finished.state == "failed"
    reason = finished.halted_reason or ""
    assert "kept coming back to upg-01 after 2 more evictions" in reason, reason
    assert "(ReplicaSet trainer-" in reason and "node.kubernetes.io/unschedulable" in reason, reason
    assert h.unschedulable(installer, "upg-01")  # halted with the node cordoned, for a person
    rows = audit.for_run(db, run.id)
    # The first eviction and one per round, each on record; two rounds, as the limit says.
    assert len([r for r in rows if r.action == "pod.evict"]) == 3
    assert [r.detail["round"] for r in rows if r.action == "pods.returned"] == [1, 2]
    assert audit.verify(db).ok
    # The thread heard once why the run went on evicting.
    returned = [m["text"] for m in h.thread_messages(db) if m["event"] == "step.pods-returned"]
    assert len(returned) == 1 and "came back to upg-01 right after eviction" in returned[0], returned
