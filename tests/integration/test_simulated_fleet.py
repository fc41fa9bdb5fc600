"""The simulated GPU Operator behaves like the real one where gpuops looks: driver pods,
advertised GPUs, MIG changes and the demo fleet's special nodes."""

from __future__ import annotations

import threading

from kubernetes import client

from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import observe
from workflows.kube.gateway import KubeGateway
from workflows.kube.gateway.paths import NODES


class _AdvertisedHistory:
    """Records every GPU count a node advertised, from a watch (no polling gaps)."""

    def __init__(self, kubeconfig, node: str) -> None:
        self.values: list[int] = []
        self._gateway = KubeGateway.connect(kubeconfig=kubeconfig)
        self._node = node
        self._stop = threading.Event()
        self._response = None
        listed = self._gateway.list(NODES, field_selector=f"metadata.name={node}")
        self._version = listed.resource_version
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self._gateway.watch(NODES, resource_version=self._version, timeout_seconds=60,
                                                 field_selector=f"metadata.name={self._node}",
                                                 on_open=lambda r: setattr(self, "_response", r)):
                    self._version = event.object["metadata"]["resourceVersion"]
                    if event.type != "BOOKMARK":
                        self.values.append(advertised(event.object))
            except Exception:  # noqa: BLE001 - resume from the last version seen
                if self._stop.wait(0.2):
                    return

    def stop(self) -> None:
        self._stop.set()
        if self._response is not None:
            self._response.shutdown()


def test_deleting_a_driver_pod_recreates_it_and_the_node_re_advertises_its_gpus(demo_fleet):
    installer = demo_fleet.installer()
    node = "serving-a-04"
    (old,) = observe.operand_pods(installer, node, "nvidia-driver-daemonset")
    assert advertised(observe.node(installer, node)) == 8
    history = _AdvertisedHistory(demo_fleet.kubeconfig, node)

    installer.delete(old)

    def replaced_and_ready() -> bool:
        pods = observe.operand_pods(installer, node, "nvidia-driver-daemonset")
        return len(pods) == 1 and pods[0]["metadata"]["uid"] != old["metadata"]["uid"] and observe.pod_ready(pods[0])

    wait_until(replaced_and_ready, timeout=60, what="the DaemonSet to recreate the driver pod")
    wait_until(lambda: advertised(observe.node(installer, node)) == 8, timeout=30,
               what=f"{node} to re-advertise 8 GPUs")
    wait_until(lambda: history.values and history.values[-1] == 8, timeout=10, what="the watch to catch up")
    history.stop()
    # In between, without a ready driver, the node advertised nothing.
    assert 0 in history.values
    assert history.values.index(0) < len(history.values) - 1


def test_the_demo_fleets_special_nodes_look_as_described(demo_fleet):
    installer = demo_fleet.installer()
    spec = demo_fleet.fleet
    gpu_nodes = installer.list("Node", selector="nvidia.com/gpu.present=true")
    pools = {}
    for node in gpu_nodes:
        pools.setdefault(node["metadata"]["labels"][fl.POOL_LABEL], []).append(node)
    assert {p: len(n) for p, n in pools.items()} == {"serving-a": 8, "training-a": 10, "inference-mig": 6}
    assert {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in pools["serving-a"]} == {"NVIDIA-H100-80GB-HBM3"}
    assert {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in pools["training-a"]} == {"NVIDIA-H200"}

    # Host driver: pre-installed, no operator driver pod, GPUs advertised from the host driver.
    host = observe.node(installer, "training-a-09")
    assert host["metadata"]["labels"]["nvidia.com/gpu.deploy.driver"] == "pre-installed"
    assert host["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"] == "570.172.08"
    assert observe.operand_pods(installer, "training-a-09", "nvidia-driver-daemonset") == []
    assert advertised(host) == 8

    # Conflict: the host driver works, the operator's driver pod crash-loops beside it.
    conflict = observe.node(installer, "training-a-10")
    assert conflict["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"] == "570.172.08"
    (driver,) = observe.operand_pods(installer, "training-a-10", "nvidia-driver-daemonset")
    init = driver["status"]["initContainerStatuses"][0]
    assert init["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert "pre-installed on host" in init["lastState"]["terminated"]["message"]

    # Fewer GPUs: the device plugin is Ready but advertises 7 of 8.
    short = observe.node(installer, "serving-a-05")
    assert short["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert short["status"]["capacity"]["nvidia.com/gpu"] == "7"
    assert all(observe.pod_ready(p) for p in observe.operand_pods(installer, "serving-a-05", "nvidia-device-plugin-daemonset"))

    # Cordoned by a human.
    assert observe.node(installer, "training-a-03")["spec"]["unschedulable"] is True

    # A production replica on serving-a-02 that a PDB protects.
    (replica,) = [p for p in installer.list("Pod", namespace="serving") if p["spec"].get("nodeName") == "serving-a-02"]
    assert observe.pod_ready(replica)
    assert replica["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    pdb = installer.get({"kind": "PodDisruptionBudget", "metadata": {"name": "llm-serving", "namespace": "serving"}})
    assert pdb["status"]["disruptionsAllowed"] == 0

    # MIG pool: every node advertises 7 x 1g.10gb per GPU.
    for node in pools["inference-mig"]:
        assert node["status"]["capacity"]["nvidia.com/mig-1g.10gb"] == "56"
        assert node["metadata"]["labels"]["nvidia.com/mig.config.state"] == "success"

    # Every other GPU node: operator driver, full count, driver version from the image tag.
    special = {s.node for s in spec.special_nodes}
    for node in gpu_nodes:
        name = node["metadata"]["name"]
        if name in special:
            continue
        assert node["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"] == "580.95.05", name
        assert advertised(node) in (8, 56), name


def test_a_mig_profile_change_goes_pending_then_advertises_the_new_layout(demo_fleet):
    installer = demo_fleet.installer()
    core = client.CoreV1Api(demo_fleet.api_client())
    node = "inference-mig-06"
    core.patch_node(node, {"metadata": {"labels": {"nvidia.com/mig.config": "all-3g.40gb"}}})
    try:
        wait_until(lambda: observe.node(installer, node)["status"]["capacity"].get("nvidia.com/mig-3g.40gb") == "16",
                   timeout=60, what=f"{node} to advertise 16 x 3g.40gb")
        after = observe.node(installer, node)
        labels = after["metadata"]["labels"]
        assert labels["nvidia.com/mig.config.state"] == "success"
        assert labels["nvidia.com/mig-3g.40gb.count"] == "16"
        assert "nvidia.com/mig-1g.10gb.count" not in labels
        assert "nvidia.com/mig-1g.10gb" not in after["status"]["capacity"]
        assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    finally:
        core.patch_node(node, {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}})
        wait_until(lambda: observe.node(installer, node)["status"]["capacity"].get("nvidia.com/mig-1g.10gb") == "56",
                   timeout=60, what=f"{node} to return to all-1g.10gb")


def test_a_stuck_mig_change_pauses_operands_and_advertises_nothing(demo_fleet):
    installer = demo_fleet.installer()
    core = client.CoreV1Api(demo_fleet.api_client())
    node = "inference-mig-05"
    core.patch_node(node, {"metadata": {"annotations": {fl.ANN_MIG_STUCK: "true"},
                                        "labels": {"nvidia.com/mig.config": "all-2g.20gb"}}})
    try:
        wait_until(lambda: observe.node(installer, node)["metadata"]["labels"].get(
            "nvidia.com/gpu.deploy.device-plugin") == "paused-for-mig-change", timeout=30,
            what="the device plugin to be paused for the MIG change")
        wait_until(lambda: advertised(observe.node(installer, node)) == 0, timeout=30, what=f"{node} to advertise 0")
        assert observe.node(installer, node)["metadata"]["labels"]["nvidia.com/mig.config.state"] == "pending"
    finally:
        core.patch_node(node, {"metadata": {"annotations": {fl.ANN_MIG_STUCK: None},
                                            "labels": {"nvidia.com/mig.config": "all-1g.10gb"}}})
        wait_until(lambda: observe.node(installer, node)["status"]["capacity"].get("nvidia.com/mig-1g.10gb") == "56",
                   timeout=60, what=f"{node} to recover")
