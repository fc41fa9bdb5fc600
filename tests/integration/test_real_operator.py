"""The real GPU Operator (built from its vendored source, testenv/operator.py) against
the test control plane: given a ClusterPolicy and a kwok node labelled as Node Feature
Discovery labels a GPU node, it labels the node for its operands and creates the
ClusterPolicy's DaemonSets, whose driver pod lands on the node; gpuops's inventory reads
what the operator made. (The other integration tests still run on the simulator's model
of the operator; moving them is the rest of issue 16.)"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from testenv import operator
from testenv.controlplane import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE
from testenv.environment import Environment
from testenv.install import Installer, wait_until
from tests.integration.inventory_helpers import CONFIG
from workflows.fleet.watchcache import FleetCache
from workflows.kube.gateway import KubeGateway

pytestmark = pytest.mark.controlplane

DRIVER_VERSION = "580.95.05"
NODE = "gpu-real-01"
# What NFD and GFD put on a GPU node; without the OS labels the operator's init fails
# ("unable to retrieve OS name").
NFD_LABELS = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "81559",
    "gpuops.io/pool": "train-a",
}
OPERANDS = ("nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset", "nvidia-device-plugin-daemonset",
            "nvidia-operator-validator")


@pytest.fixture(scope="module")
def real_operator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Environment]:
    try:
        operator.operator_binary()
    except operator.OperatorMissing as err:
        pytest.fail(str(err), pytrace=False)
    env = Environment(folder=tmp_path_factory.mktemp("real-operator")).start()
    try:
        installer = env.installer()
        for crd in operator.operator_crds():
            installer.create(crd, exist_ok=True)
        wait_until(lambda: all(_established(installer, c["metadata"]["name"]) for c in operator.operator_crds()),
                   timeout=30, what="the GPU Operator's CRDs to be established")
        installer.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": operator.NAMESPACE}})
        resources = {"cpu": "96", "memory": "1536Gi", "pods": "250"}
        installer.create({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE, "labels": {**NFD_LABELS, "kubernetes.io/hostname": NODE},
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE}},
            "status": {"capacity": resources, "allocatable": resources}})
        env.plane.start_operator()
        installer.create(operator.cluster_policy(driver_version=DRIVER_VERSION))
        yield env
    finally:
        env.stop()


def _established(installer: Installer, name: str) -> bool:
    crd = installer.get({"kind": "CustomResourceDefinition", "metadata": {"name": name}})
    return any(c["type"] == "Established" and c["status"] == "True" for c in (crd.get("status") or {}).get("conditions") or [])


def _node_labels(installer: Installer) -> dict[str, str]:
    return installer.get({"kind": "Node", "metadata": {"name": NODE}})["metadata"].get("labels") or {}


def test_the_real_operator_labels_an_nfd_gpu_node_and_creates_its_operand_daemonsets(real_operator):
    installer = real_operator.installer()

    wait_until(lambda: _node_labels(installer).get("nvidia.com/gpu.deploy.driver") == "true",
               timeout=60, what="the operator's deploy labels on the node")
    wait_until(lambda: {d["metadata"]["name"] for d in installer.list("DaemonSet", namespace=operator.NAMESPACE)}
               >= set(OPERANDS), timeout=60, what="the ClusterPolicy's operand DaemonSets")

    labels = _node_labels(installer)
    assert labels["nvidia.com/gpu.present"] == "true"
    assert all(labels[f"nvidia.com/gpu.deploy.{operand}"] == "true"
               for operand in ("driver", "container-toolkit", "device-plugin", "operator-validator"))
    driver = next(d for d in installer.list("DaemonSet", namespace=operator.NAMESPACE)
                  if d["metadata"]["name"] == "nvidia-driver-daemonset")
    images = [c["image"] for c in driver["spec"]["template"]["spec"]["containers"]]
    assert any(image.startswith("nvcr.io/nvidia/driver:" + DRIVER_VERSION) for image in images), images
    assert driver["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.deploy.driver": "true"}


def test_gpuops_reads_the_driver_pod_the_real_operator_made_as_the_nodes_driver(real_operator):
    installer = real_operator.installer()
    wait_until(lambda: any(p["spec"].get("nodeName") == NODE
                           for p in installer.list("Pod", namespace=operator.NAMESPACE,
                                                   selector="app.kubernetes.io/component=nvidia-driver")),
               timeout=90, what="the driver DaemonSet's pod on the node")
    cache = FleetCache(KubeGateway.connect(kubeconfig=real_operator.kubeconfig, context="admin"),
                       settings=CONFIG.inventory_settings()).start(watch=False)
    try:
        node = cache.fleet(dt.datetime.now(dt.timezone.utc)).nodes[NODE]
    finally:
        cache.stop()

    assert node.pool == "train-a"
    assert node.driver_pod.name.startswith(f"{operator.NAMESPACE}/nvidia-driver-daemonset-")
    assert (node.driver_pod.owner_kind, node.driver_pod.version) == ("DaemonSet", DRIVER_VERSION)
    # The operator's driver pod is the driver's owner; GFD (the simulator's part) has not
    # labelled the node with a loaded version, so that evidence is missing.
    assert node.driver.owner == "operator", node.driver.evidence
    assert node.deploy_driver == "true"
