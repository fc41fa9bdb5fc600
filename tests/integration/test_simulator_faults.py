"""Fault injection in the operand simulator, on a fleet of its own."""

from __future__ import annotations

from kubernetes import client

from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import observe


def test_a_crash_looping_driver_version_and_a_slow_validator_can_be_injected(fleet, cluster):
    spec = fleet(fl.FleetSpec(
        name="faults", system_nodes=0,
        pools=(fl.PoolSpec(name="pool-f", nodes=2),),
        special_nodes=(fl.SpecialNode(node="pool-f-02", validator_ready_seconds=3.0),),
        crashloop_driver_versions=("580.95.05",),
    ))
    installer = cluster.installer()

    def crash_looping() -> bool:
        pods = observe.operand_pods(installer, "pool-f-01", "nvidia-driver-daemonset")
        statuses = pods[0].get("status", {}).get("containerStatuses", []) if pods else []
        return bool(statuses) and statuses[0].get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"

    wait_until(crash_looping, timeout=60, what="the faulty driver version to crash-loop")
    assert advertised(observe.node(installer, "pool-f-01")) == 0

    # Clearing the fault and replacing the pod brings the node back.
    client.CoreV1Api(cluster.api_client()).patch_namespaced_config_map(
        fl.FAULTS_CONFIGMAP, spec.operator.namespace, {"data": {fl.FAULT_CRASHLOOP_VERSIONS: ""}})
    for node in ("pool-f-01", "pool-f-02"):
        for pod in observe.operand_pods(installer, node, "nvidia-driver-daemonset"):
            installer.delete(pod)
    wait_until(lambda: advertised(observe.node(installer, "pool-f-01")) == 8, timeout=60, what="pool-f-01 to recover")
    # The slow validator on pool-f-02 trails its driver.
    wait_until(lambda: any(observe.pod_ready(p) for p in observe.operand_pods(installer, "pool-f-02", "nvidia-driver-daemonset")),
               timeout=60, what="pool-f-02's driver to be ready")
    assert not any(observe.pod_ready(p) for p in observe.operand_pods(installer, "pool-f-02", "nvidia-operator-validator"))
    wait_until(lambda: any(observe.pod_ready(p) for p in observe.operand_pods(installer, "pool-f-02", "nvidia-operator-validator")),
               timeout=30, what="the slow validator to become ready")
