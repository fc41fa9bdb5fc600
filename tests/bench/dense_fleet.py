"""The bench fleet at real pod density: per GPU node the operator's operand pods, the
system DaemonSets' pods and a few workloads, some of them holding GPUs.

Pods are created bound (spec.nodeName) and their status then written as a kubelet
would (Running, Ready, one status a container): there is no kubelet on these nodes. They
carry no ownerReferences: the control plane's garbage collector would delete pods whose
DaemonSet does not exist.

`grow` creates such a fleet (8 pools of 8 GPUs a node) in a control plane, or adds nodes
to the one already there: the inventory bench creates it at once, the scaling curve grows
it step by step.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import config

from testenv import fleet as fl
from testenv.controlplane import KWOK_ANNOTATION
from testenv.install import Installer

WORKLOAD_LABEL = "bench.gpuops.io/workload"
# The operator's operands, in the order a node gets them (the driver first: with one pod
# a node, the fleet is the earlier bench's). `app` labels as the operator's manifests set
# them (FACTS.md); the driver also carries its component label.
OPERAND_APPS = tuple(name for name, _ in fl.OPERANDS)
SYSTEM_APPS = (("kube-proxy", "registry.k8s.io/kube-proxy:v1.37.2"),
               ("calico-node", "docker.io/calico/node:v3.30.0"),
               ("node-exporter", "quay.io/prometheus/node-exporter:v1.9.1"))
# (namespace, app, GPUs requested): cycled over a node's workload pods.
WORKLOADS = (("training", "llm-pretrain", 4), ("inference", "vllm-serve", 2), ("batch", "log-shipper", 0),
             ("inference", "embedder", 1), ("research", "notebook", 0), ("batch", "etl", 0))
WORKLOAD_NAMESPACES = tuple(sorted({ns for ns, _, _ in WORKLOADS}))
OPERAND_IMAGES = {
    "nvidia-driver-daemonset": None,  # the fleet's driver image
    "nvidia-container-toolkit-daemonset": "nvcr.io/nvidia/k8s/container-toolkit:v1.18.0-ubuntu20.04",
    "nvidia-device-plugin-daemonset": "nvcr.io/nvidia/k8s-device-plugin:v0.18.0",
    "gpu-feature-discovery": "nvcr.io/nvidia/k8s-device-plugin:v0.18.0",
    "nvidia-dcgm-exporter": "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04",
    "nvidia-operator-validator": "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v26.7.0",
    "nvidia-mig-manager": "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.13.0-ubuntu20.04",
}
OPERAND_CONTAINERS = {
    "nvidia-driver-daemonset": "nvidia-driver-ctr", "nvidia-container-toolkit-daemonset": "nvidia-container-toolkit-ctr",
    "nvidia-device-plugin-daemonset": "nvidia-device-plugin", "gpu-feature-discovery": "gpu-feature-discovery",
    "nvidia-dcgm-exporter": "nvidia-dcgm-exporter", "nvidia-operator-validator": "nvidia-operator-validator",
    "nvidia-mig-manager": "nvidia-mig-manager",
}
_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]


def composition(pods_per_node: int) -> tuple[int, int, int]:
    """(operand, system, workload) pods a node for `pods_per_node` pods a node."""
    operands = min(len(OPERAND_APPS), pods_per_node)
    system = min(len(SYSTEM_APPS), pods_per_node - operands)
    return operands, system, pods_per_node - operands - system


def describe(pods_per_node: int) -> dict[str, int]:
    """A node's pods by kind, for a results file."""
    operands, system, workloads = composition(pods_per_node)
    return {"operands": operands, "system": system, "workloads": workloads,
            "workloads_holding_gpus": sum(1 for i in range(workloads) if WORKLOADS[i % len(WORKLOADS)][2])}


def _suffix(node: str, app: str) -> str:
    return hashlib.sha1(f"{node}/{app}".encode()).hexdigest()[:10]


def _container(name: str, image: str, gpus: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if gpus:
        resources = {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": str(gpus)},
                     "limits": {"nvidia.com/gpu": str(gpus)}}
    return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent", "resources": resources,
            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}


def _pod(namespace: str, name: str, node: str, labels: dict[str, str], containers: list[dict[str, Any]],
         *, tolerations: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node, "containers": containers, "restartPolicy": "Always",
                            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 30}
    if tolerations:
        spec["tolerations"] = _TOLERATIONS
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": spec}


def node_pods(spec: fl.FleetSpec, node: str, pods_per_node: int) -> list[dict[str, Any]]:
    """The pods bound to one bench node."""
    operands, system, workloads = composition(pods_per_node)
    pods = []
    for app in OPERAND_APPS[:operands]:
        labels = {"app": app, fl.FLEET_LABEL: spec.name}
        image = OPERAND_IMAGES[app] or fl.driver_image(spec.operator.driver_version)
        if app == "nvidia-driver-daemonset":
            labels["app.kubernetes.io/component"] = fl.DRIVER_COMPONENT
            # The earlier bench's name, so a one-pod-a-node run is the same fleet.
            name = f"{app}-{node}"
        else:
            name = f"{app}-{_suffix(node, app)}"
        pods.append(_pod(spec.operator.namespace, name, node, labels,
                         [_container(OPERAND_CONTAINERS[app], image)],
                         tolerations=True))
    for app, image in SYSTEM_APPS[:system]:
        pods.append(_pod("kube-system", f"{app}-{_suffix(node, app)}", node, {"k8s-app": app},
                         [_container(app, image)], tolerations=True))
    for index in range(workloads):
        namespace, app, gpus = WORKLOADS[index % len(WORKLOADS)]
        pods.append(_pod(namespace, f"{app}-{index}-{node}", node, {"app": app, WORKLOAD_LABEL: "bench"},
                         [_container(app, f"registry.example.com/{app}:2026.12", gpus)], tolerations=gpus > 0))
    return pods


def churn_pod(node: str, index: int) -> dict[str, Any]:
    """A short-lived GPU workload pod of the churn."""
    return _pod("batch", f"churn-{index}", node, {"app": "churn", "bench.gpuops.io/churn": "true"},
                [_container("job", "registry.example.com/finetune:2026.12", 1)], tolerations=True)


def running_status(pod: dict[str, Any], *, seed: int) -> dict[str, Any]:
    """What a kubelet writes once the pod's containers run."""
    at = "2026-12-01T00:00:00Z"
    ip = f"10.{(seed >> 16) & 255}.{(seed >> 8) & 255}.{seed & 255}"
    return {
        "phase": "Running", "hostIP": "10.0.0.1", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": at,
        "qosClass": "Burstable",
        "conditions": [{"type": t, "status": "True", "lastTransitionTime": at}
                       for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                 "PodScheduled")],
        "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": c["image"] + "@sha256:" + "0" * 64,
                               "containerID": "containerd://" + hashlib.sha1(f"{seed}{c['name']}".encode()).hexdigest(),
                               "ready": True, "started": True, "restartCount": 0,
                               "state": {"running": {"startedAt": at}}}
                              for c in pod["spec"]["containers"]],
    }


POOLS = 8
PRODUCTS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S")


def bench_fleet(nodes: int) -> fl.FleetSpec:
    """The bench fleet of `nodes` GPU nodes: 8 pools, 8 GPUs a node, no system nodes."""
    return fl.FleetSpec(name="bench", system_nodes=0, operator=fl.OperatorSpec(stand_in=(
        f"{nodes} nodes created straight through the API, Ready and advertising, with no kwok and no operator: "
        "their heartbeats and reconciles would be the load, not the inventory")), pools=tuple(
        fl.PoolSpec(name=f"pool-{i}", kind="serving" if i < 4 else "training",
                    nodes=nodes // POOLS + (i < nodes % POOLS), product=PRODUCTS[i % 4], gpus_per_node=8)
        for i in range(POOLS)))


def name_width(nodes: int) -> int:
    """Digits of a node's number in the names of the largest pool of a `nodes`-node fleet,
    as `fl.pool_node_names` counts them."""
    return max(2, len(str(bench_fleet(nodes).pools[0].nodes)))


def gpu_node(spec: fl.FleetSpec, pool: fl.PoolSpec, name: str) -> dict[str, Any]:
    node = fl.node_object(spec, pool, name, advertise=True)
    # No kwok for thousands of nodes (its lease heartbeats would be the load): the node
    # is created Ready, with its GPUs advertised and GFD's driver labels.
    node["metadata"]["annotations"].pop(KWOK_ANNOTATION)
    node["metadata"]["labels"].update(fl.driver_version_labels(spec.operator.driver_version))
    node["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                     "message": "bench", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    return node


@dataclass(frozen=True)
class Growth:
    """What one `grow` call created, and how long it took."""

    spec: fl.FleetSpec
    nodes_created: int
    pods_created: int
    create_s: float  # the objects
    create_and_status_s: float  # and the pods' Running status


def grow(kubeconfig: Path, *, nodes: int, pods_per_node: int, have: int = 0, width: int | None = None,
         workers: int = 12) -> Growth:
    """Bring the bench fleet in the control plane of `kubeconfig` from `have` nodes (0: none
    yet; its ClusterPolicy, operator Deployment and namespaces are created too) to `nodes`.
    Node names have `width` digits (default: as `fl.pool_node_names` names them, by the
    pool's size): a fleet that grows keeps its names when given the width of its largest
    size from the start (see `name_width`)."""
    spec = bench_fleet(nodes)
    earlier = bench_fleet(have)
    api = config.new_client_from_config(config_file=str(kubeconfig))
    api.configuration.connection_pool_maxsize = workers + 4
    installer = Installer(api)
    namespaces = (spec.operator.namespace, *WORKLOAD_NAMESPACES)
    for namespace in namespaces:
        installer.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, exist_ok=True)
    installer.create(fl.cluster_policy_object(spec), exist_ok=True)
    installer.create(fl.operator_deployment(spec), exist_ok=True)
    new = [gpu_node(spec, pool, f"{pool.name}-{i:0{width or max(2, len(str(pool.nodes)))}d}")
           for pool, before in zip(spec.pools, earlier.pools, strict=True)
           for i in range(before.nodes + 1, pool.nodes + 1)]
    pods = [pod for node in new for pod in node_pods(spec, node["metadata"]["name"], pods_per_node)]
    first_seed = have * pods_per_node  # pod IPs go on from the pods created before
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        # The answers are dropped as they come: kept, 75,000 parsed pods would be the
        # bench's largest memory.
        for _ in pool.map(lambda obj: installer.create(obj, exist_ok=True), new + pods):
            pass
        created_s = time.perf_counter() - started
        # As a kubelet would: the pods' containers run (no kubelet here to say so).
        for _ in pool.map(lambda item: installer.patch_status(item[1], running_status(item[1], seed=item[0])),
                          enumerate(pods, start=first_seed)):
            pass
    return Growth(spec=spec, nodes_created=len(new), pods_created=len(pods), create_s=created_s,
                  create_and_status_s=time.perf_counter() - started)


def count_nodes(kubeconfig: Path) -> int:
    """The bench fleet's nodes as the API lists them."""
    installer = Installer(config.new_client_from_config(config_file=str(kubeconfig)))
    return len(installer.list("Node", selector=f"{fl.FLEET_LABEL}=bench"))
