"""The bench fleet at real pod density: per GPU node the operator's operand pods, the
system DaemonSets' pods and a few workloads, some of them holding GPUs.

Pods are created bound (spec.nodeName) and their status then written as a kubelet
would (Running, Ready, one status a container): there is no kubelet on these nodes. They
carry no ownerReferences: the control plane's garbage collector would delete pods whose
DaemonSet does not exist.
"""

from __future__ import annotations

import hashlib
from typing import Any

from testenv import fleet as fl

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
