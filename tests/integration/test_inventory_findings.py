"""Every finding the inventory raises, provoked on a real control plane with the real
GPU Operator through the simulator's faults, and (on a stand-in fleet) the upgrade
states the operator's upgrade controller leaves behind."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from kubernetes import client

from testenv import fleet as fl
from tests.integration.inventory_helpers import CONFIG, _codes, wait_fleet


TROUBLE = fl.FleetSpec(
    name="trouble", system_nodes=1,
    operator=fl.OperatorSpec(use_nvidia_driver_crd=True, mig_strategy="mixed"),
    pools=(
        fl.PoolSpec(name="good", kind="serving", nodes=5, driver_version="580.95.05", auto_upgrade=False),
        fl.PoolSpec(name="bad", kind="training", nodes=1, driver_version="575.51.03", auto_upgrade=False),
        fl.PoolSpec(name="mig", kind="serving", nodes=2, product="NVIDIA-A100-SXM4-80GB", mig_config="all-1g.10gb",
                    driver_version="580.95.05", auto_upgrade=False),
    ),
    special_nodes=(
        fl.SpecialNode(node="good-01", advertise_gpus=0),
        fl.SpecialNode(node="good-02", unhealthy_gpus=2),
        fl.SpecialNode(node="good-03", not_ready=True),
        fl.SpecialNode(node="mig-01", mig_stuck=True),
    ),
    crashloop_driver_versions=("575.51.03",),
)

SHORT = CONFIG.model_copy(update={
    "pools": {"good": CONFIG.pools["serving-a"], "mig": CONFIG.pools["serving-a"]},
    "inventory": CONFIG.inventory.model_copy(update={"mig_pending_stuck_after": dt.timedelta(seconds=1),
                                                     "upgrade_stuck_after": dt.timedelta(minutes=30)}),
})


def test_each_fault_raises_its_finding(fleet, cluster, fleet_cache):
    fleet(TROUBLE)
    core = client.CoreV1Api(cluster.api_client())
    custom = client.CustomObjectsApi(cluster.api_client())
    # A MIG change the stuck MIG manager never finishes, and one it gave up on.
    core.patch_node("mig-01", {"metadata": {"labels": {"nvidia.com/mig.config": "all-3g.40gb"}}})
    core.patch_node("mig-02", {"metadata": {"labels": {"nvidia.com/mig.config.state": "failed"}}})
    # A second ClusterPolicy: the real operator marks it ignored, and reports the first
    # notReady while bad-01's driver crash-loops.
    second = fl.cluster_policy_object(TROUBLE)
    second["metadata"]["name"] = "cluster-policy-copy"
    custom.create_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", second)

    cache = fleet_cache(config=SHORT)
    expected = {
        ("good-01", "device-plugin-no-gpus"),
        ("good-02", "unhealthy-gpus"),
        ("good-03", "node-not-ready"),
        ("bad-01", "driver-crash-loop"),
        ("mig-01", "mig-change-stuck"),
        ("mig-02", "mig-change-failed"),
        ("cluster", "duplicate-cluster-policy"),
        # The operator's own verdict, written on its next pass after the crash loop began.
        ("cluster", "cluster-policy-not-ready"),
    }
    missing: set[tuple[str, str]] = set()

    def all_found(view) -> bool:
        missing.clear()
        missing.update((s, c) for s, c in expected if c not in _codes(view, s))
        return not missing

    try:
        view = wait_fleet(cache, all_found, "every fault to show as a finding", timeout=90)
    except TimeoutError:
        pytest.fail(f"findings never raised: {sorted(missing)}")
    severities = {f.code: f.severity for f in view.findings}
    assert severities["driver-crash-loop"] == "critical"
    assert severities["unhealthy-gpus"] == "warning"
    # The stuck MIG change explains its missing GPUs: no separate mismatch finding.
    assert "advertised-mismatch" not in _codes(view, "mig-01")
    assert view.nodes["bad-01"].driver_pod.crash_looping
    assert view.nodes["good-02"].allocatable_gpus == 6 and view.nodes["good-02"].advertised_gpus == 8


UPGRADES = fl.FleetSpec(
    name="upgrades", system_nodes=0,
    operator=fl.OperatorSpec(stand_in=(
        "upgrade states planted as the upgrade controller leaves them at one moment: the real controller "
        "rewrites them on every pass (and removes them all with autoUpgrade off), and a node two hours "
        "into wait-for-jobs cannot be waited for")),
    pools=(fl.PoolSpec(name="good", kind="serving", nodes=2),),
)


def test_upgrade_states_the_operator_leaves_behind_raise_their_findings(fleet, cluster, fleet_cache):
    fleet(UPGRADES)
    core = client.CoreV1Api(cluster.api_client())
    started = int(time.time()) - 2 * 3600
    core.patch_node("good-01", {"metadata": {
        "labels": {"nvidia.com/gpu-driver-upgrade-state": "wait-for-jobs-required"},
        "annotations": {"nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time": str(started)}}})
    core.patch_node("good-02", {"metadata": {"labels": {"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}}})

    view = wait_fleet(fleet_cache(config=SHORT), lambda v: "upgrade-stuck" in _codes(v, "good-01")
                      and "upgrade-failed" in _codes(v, "good-02"), "both upgrade findings")
    severities = {f.code: f.severity for f in view.findings}
    assert severities["upgrade-failed"] == "critical"
    messages = {f.code: f.message for f in view.findings}
    assert "2h" in messages["upgrade-stuck"] or "2 h" in messages["upgrade-stuck"], messages["upgrade-stuck"]
