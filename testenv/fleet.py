"""Declarative simulated GPU fleets: the YAML model, the Kubernetes objects it turns
into, and applying/removing them on the local control plane.

A fleet is pools of kwok nodes carrying the labels GPU Feature Discovery and the GPU
Operator set (see ../shared/reference/gpu-operator/FACTS.md), a GPU Operator namespace
with a ClusterPolicy (or NVIDIADriver CRs) and the operand DaemonSets, and optional
workloads with PodDisruptionBudgets. The operand simulator (testenv/simulator.py) makes
the operands behave; knobs for it are node annotations under `sim.gpuops.io/`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from testenv.controlplane import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE

FLEETS_DIR = Path(__file__).with_name("fleets")

# Labels and annotations the testenv owns.
FLEET_LABEL = "gpuops.io/testenv-fleet"
POOL_LABEL = "gpuops.io/pool"
OPERAND_LABEL = "sim.gpuops.io/operand"
SIM = "sim.gpuops.io/"
ANN_HOST_DRIVER = SIM + "host-driver"
ANN_ADVERTISE = SIM + "advertise-gpus"
ANN_UNHEALTHY = SIM + "unhealthy-gpus"
ANN_DRIVER_DELAY = SIM + "driver-ready-seconds"
ANN_VALIDATOR_DELAY = SIM + "validator-ready-seconds"
ANN_MIG_STUCK = SIM + "mig-stuck"
ANN_MIG_APPLIED = SIM + "mig-applied"
ANN_NOT_READY = SIM + "not-ready"
FAULTS_CONFIGMAP = "gpuops-sim-faults"
FAULT_CRASHLOOP_VERSIONS = "crashloop-driver-versions"

OPERANDS = (
    # (DaemonSet name, deploy label suffix, simulated by the operand simulator)
    ("nvidia-driver-daemonset", "driver", "driver"),
    ("nvidia-container-toolkit-daemonset", "container-toolkit", None),
    ("nvidia-device-plugin-daemonset", "device-plugin", "device-plugin"),
    ("gpu-feature-discovery", "gpu-feature-discovery", None),
    ("nvidia-dcgm-exporter", "dcgm-exporter", None),
    ("nvidia-operator-validator", "operator-validator", "validator"),
    ("nvidia-mig-manager", "mig-manager", None),
)

# MIG devices per GPU for the A100/H100 80GB profiles the simulator knows.
MIG_LAYOUTS: dict[str, dict[str, int]] = {
    "all-disabled": {},
    "all-1g.10gb": {"1g.10gb": 7},
    "all-2g.20gb": {"2g.20gb": 3},
    "all-3g.40gb": {"3g.40gb": 2},
    "all-7g.80gb": {"7g.80gb": 1},
    "all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OperatorSpec(_Model):
    namespace: str = "gpu-operator"
    version: str = "v26.7.0"
    driver_version: str = "580.95.05"
    auto_upgrade: bool = False
    mig_strategy: Literal["none", "single", "mixed"] = "mixed"
    use_nvidia_driver_crd: bool = False
    cluster_policy_name: str = "cluster-policy"
    # Whether to install the operator at all (a cluster without it must be answered too).
    installed: bool = True
    # The driver DaemonSet selects nodes by nvidia.com/gpu.deploy.driver=true, as the
    # operator does; False selects every GPU node, so a stale pre-installed label can sit
    # next to a running operator driver pod.
    driver_follows_deploy_label: bool = True


class PoolSpec(_Model):
    name: str
    kind: Literal["serving", "training"] = "training"
    nodes: int = Field(ge=0)
    product: str = "NVIDIA-H100-80GB-HBM3"
    gpus_per_node: int = Field(default=8, ge=0)
    gpu_memory_mib: int = 81559
    # Time-slicing: each GPU is advertised this many times.
    replicas: int = Field(default=1, ge=1)
    rename_shared: bool = False
    mig_config: str | None = None
    # With NVIDIADriver CRs: the pool's own driver version (defaults to the operator's).
    driver_version: str | None = None
    auto_upgrade: bool | None = None
    # The label key that names the pool (cloud node-group labels work too).
    label_key: str = POOL_LABEL


class SpecialNode(_Model):
    node: str
    host_driver: str | None = None
    driver_deploy: Literal["true", "false", "pre-installed"] = "true"
    advertise_gpus: int | None = None
    unhealthy_gpus: int = 0
    cordoned: bool = False
    not_ready: bool = False
    mig_stuck: bool = False
    driver_ready_seconds: float | None = None
    validator_ready_seconds: float | None = None


class WorkloadSpec(_Model):
    name: str
    namespace: str
    node: str
    gpus: int = 1
    replicas: int = 1
    pdb_min_available: int | None = None


class FleetSpec(_Model):
    name: str
    operator: OperatorSpec = OperatorSpec()
    system_nodes: int = 1
    pools: tuple[PoolSpec, ...]
    special_nodes: tuple[SpecialNode, ...] = ()
    workloads: tuple[WorkloadSpec, ...] = ()
    crashloop_driver_versions: tuple[str, ...] = ()
    # The simulator's default delays, seconds.
    driver_ready_seconds: float = 1.0
    validator_ready_seconds: float = 0.5
    mig_apply_seconds: float = 1.0

    @model_validator(mode="after")
    def _special_nodes_exist(self) -> FleetSpec:
        names = set(self.node_names())
        for special in self.special_nodes:
            if special.node not in names:
                raise ValueError(f"special node {special.node!r} is not in any pool")
        for workload in self.workloads:
            if workload.node not in names:
                raise ValueError(f"workload {workload.name!r} names unknown node {workload.node!r}")
        return self

    def node_names(self) -> list[str]:
        return [name for pool in self.pools for name in pool_node_names(pool)]

    def special(self, node: str) -> SpecialNode | None:
        return next((s for s in self.special_nodes if s.node == node), None)


def pool_node_names(pool: PoolSpec) -> list[str]:
    width = max(2, len(str(pool.nodes)))
    return [f"{pool.name}-{i:0{width}d}" for i in range(1, pool.nodes + 1)]


def load_fleet(name_or_path: str | Path) -> FleetSpec:
    path = Path(name_or_path)
    if not path.suffix:
        path = FLEETS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in FLEETS_DIR.glob("*.yaml")))
        raise FileNotFoundError(f"no fleet {name_or_path!r} (known fleets: {known})")
    return FleetSpec.model_validate(yaml.safe_load(path.read_text()))


# --- the objects a fleet turns into ------------------------------------------------------


def driver_version_labels(version: str) -> dict[str, str]:
    major, minor, revision = (version.split(".") + ["", ""])[:3]
    return {
        "nvidia.com/cuda.driver-version.full": version,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": revision,
    }


def driver_image(version: str) -> str:
    return f"nvcr.io/nvidia/driver:{version}-ubuntu22.04"


def nvidia_driver_name(pool: PoolSpec) -> str:
    return f"{pool.name}-driver"


def pool_driver_version(spec: FleetSpec, pool: PoolSpec) -> str:
    return pool.driver_version or spec.operator.driver_version


def node_object(spec: FleetSpec, pool: PoolSpec, name: str, *, advertise: bool = False) -> dict[str, Any]:
    """A kwok node carrying GFD and operator labels. GPUs are advertised only once the
    simulator sees a ready driver, unless `advertise` (fleets without a simulator)."""
    special = spec.special(name) or SpecialNode(node=name)
    mig = pool.mig_config is not None and spec.operator.mig_strategy != "none"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        FLEET_LABEL: spec.name,
        pool.label_key: pool.name,
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "nvidia.com/gpu.present": "true",
        # With renameByDefault the device plugin advertises nvidia.com/gpu.shared and GFD
        # appends -SHARED to the product name.
        "nvidia.com/gpu.product": pool.product + ("-SHARED" if pool.rename_shared else ""),
        "nvidia.com/gpu.count": str(pool.gpus_per_node),
        "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
        "nvidia.com/gpu.replicas": str(pool.replicas),
        "nvidia.com/gpu.sharing-strategy": "time-slicing" if pool.replicas > 1 else "none",
        "nvidia.com/mig.capable": "true" if pool.mig_config is not None else "false",
    }
    if spec.operator.installed:
        for _, deploy, _ in OPERANDS:
            labels[f"nvidia.com/gpu.deploy.{deploy}"] = "true"
        labels["nvidia.com/gpu.deploy.driver"] = special.driver_deploy
        if pool.mig_config is None:
            labels["nvidia.com/gpu.deploy.mig-manager"] = "false"
        if spec.operator.use_nvidia_driver_crd:
            labels["nvidia.com/gpu-operator.driver.owner"] = nvidia_driver_name(pool)
    if mig:
        labels["nvidia.com/mig.strategy"] = spec.operator.mig_strategy
        labels["nvidia.com/mig.config"] = pool.mig_config or "all-disabled"
    if special.host_driver:
        labels.update(driver_version_labels(special.host_driver))

    annotations = {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE, "node.alpha.kubernetes.io/ttl": "0"}
    if special.host_driver:
        annotations[ANN_HOST_DRIVER] = special.host_driver
    if special.advertise_gpus is not None:
        annotations[ANN_ADVERTISE] = str(special.advertise_gpus)
    if special.unhealthy_gpus:
        annotations[ANN_UNHEALTHY] = str(special.unhealthy_gpus)
    if special.not_ready:
        annotations[ANN_NOT_READY] = "true"
    if special.mig_stuck:
        annotations[ANN_MIG_STUCK] = "true"
    if special.driver_ready_seconds is not None:
        annotations[ANN_DRIVER_DELAY] = str(special.driver_ready_seconds)
    if special.validator_ready_seconds is not None:
        annotations[ANN_VALIDATOR_DELAY] = str(special.validator_ready_seconds)

    resources = {"cpu": "96", "memory": "1536Gi", "pods": "250", "ephemeral-storage": "2Ti"}
    if advertise:
        resources.update(advertised_resources(pool, mig_config=pool.mig_config, strategy=spec.operator.mig_strategy))
        if mig:
            labels.update(mig_count_labels(pool, pool.mig_config))
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"unschedulable": True} if special.cordoned else {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
    return node


def advertised_resources(
    pool: PoolSpec, *, mig_config: str | None, strategy: str, gpus: int | None = None
) -> dict[str, str]:
    """What the device plugin advertises for a healthy node of this pool."""
    count = pool.gpus_per_node if gpus is None else gpus
    layout = MIG_LAYOUTS.get(mig_config or "all-disabled", {})
    if layout and strategy == "mixed":
        return {f"nvidia.com/mig-{profile}": str(n * count) for profile, n in layout.items()}
    if layout and strategy == "single":
        (profile, n), = list(layout.items())[:1]
        return {"nvidia.com/gpu": str(n * count)}
    resource = "nvidia.com/gpu.shared" if pool.rename_shared else "nvidia.com/gpu"
    return {resource: str(count * pool.replicas)}


def mig_count_labels(pool: PoolSpec, mig_config: str | None) -> dict[str, str]:
    layout = MIG_LAYOUTS.get(mig_config or "all-disabled", {})
    return {f"nvidia.com/mig-{profile}.count": str(n * pool.gpus_per_node) for profile, n in layout.items()}


def system_node_object(spec: FleetSpec, index: int) -> dict[str, Any]:
    name = f"system-{index:02d}"
    resources = {"cpu": "32", "memory": "128Gi", "pods": "250"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "type": "kwok",
                FLEET_LABEL: spec.name,
                "node-role.gpuops.io/system": "true",
            },
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
        },
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def cluster_policy_object(spec: FleetSpec) -> dict[str, Any]:
    op = spec.operator
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": op.cluster_policy_name, "labels": {FLEET_LABEL: spec.name}},
        "spec": {
            "operator": {"defaultRuntime": "containerd"},
            "daemonsets": {"updateStrategy": "RollingUpdate"},
            "driver": {
                "enabled": True,
                "useNvidiaDriverCRD": op.use_nvidia_driver_crd,
                "repository": "nvcr.io/nvidia",
                "image": "driver",
                "version": op.driver_version,
                "upgradePolicy": {"autoUpgrade": op.auto_upgrade, "maxParallelUpgrades": 1},
            },
            "toolkit": {"enabled": True},
            "devicePlugin": {"enabled": True},
            "dcgm": {"enabled": True},
            "dcgmExporter": {"enabled": True},
            "gfd": {"enabled": True},
            "migManager": {"enabled": True},
            "nodeStatusExporter": {"enabled": False},
            "mig": {"strategy": op.mig_strategy if op.mig_strategy != "none" else "single"},
        },
    }


def nvidia_driver_object(spec: FleetSpec, pool: PoolSpec) -> dict[str, Any]:
    upgrade: dict[str, Any] = {}
    if pool.auto_upgrade is not None:
        upgrade = {"upgradePolicy": {"autoUpgrade": pool.auto_upgrade}}
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": nvidia_driver_name(pool), "labels": {FLEET_LABEL: spec.name}},
        "spec": {
            "default": False,
            "driverType": "gpu",
            "repository": "nvcr.io/nvidia",
            "image": "driver",
            "version": pool_driver_version(spec, pool),
            "nodeSelector": {pool.label_key: pool.name},
            **upgrade,
        },
    }


def _owner(kind: str, api_version: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def operand_daemonset(
    spec: FleetSpec,
    *,
    name: str,
    deploy: str,
    operand: str | None,
    owner: dict[str, Any],
    image: str,
    extra_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {"app": name, FLEET_LABEL: spec.name}
    pod_labels = {"app": name}
    if deploy == "driver":
        labels["app.kubernetes.io/component"] = "nvidia-driver"
        pod_labels["app.kubernetes.io/component"] = "nvidia-driver"
    if operand:
        pod_labels[OPERAND_LABEL] = operand
    container = name.replace("nvidia-", "").replace("-daemonset", "").replace(".", "-")
    containers = [{"name": container[:50] + "-ctr", "image": image}]
    init = []
    if deploy == "driver":
        init = [{"name": "k8s-driver-manager", "image": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.9.1"}]
    node_selector = {f"nvidia.com/gpu.deploy.{deploy}": "true", **(extra_selector or {})}
    if deploy == "driver" and not spec.operator.driver_follows_deploy_label:
        node_selector = {"nvidia.com/gpu.present": "true", **(extra_selector or {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": spec.operator.namespace, "labels": labels,
                     "ownerReferences": [owner]},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "updateStrategy": {"type": "OnDelete"} if deploy == "driver" else {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "nodeSelector": node_selector,
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "priorityClassName": "system-node-critical",
                    "initContainers": init,
                    "containers": containers,
                    "terminationGracePeriodSeconds": 5,
                },
            },
        },
    }


def operator_deployment(spec: FleetSpec) -> dict[str, Any]:
    labels = {"app": "gpu-operator", "app.kubernetes.io/component": "gpu-operator"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-operator", "namespace": spec.operator.namespace,
                     "labels": {**labels, FLEET_LABEL: spec.name}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "gpu-operator"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"node-role.gpuops.io/system": "true"},
                    "containers": [{"name": "gpu-operator",
                                    "image": f"nvcr.io/nvidia/gpu-operator:{spec.operator.version}"}],
                },
            },
        },
    }


def workload_objects(spec: FleetSpec, workload: WorkloadSpec) -> list[dict[str, Any]]:
    labels = {"app": workload.name}
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": workload.name, "namespace": workload.namespace,
                         "labels": {**labels, FLEET_LABEL: spec.name}},
            "spec": {
                "replicas": workload.replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": workload.node},
                        "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}],
                        "terminationGracePeriodSeconds": 5,
                        "containers": [{
                            "name": "main",
                            "image": "registry.example/inference:1.0",
                            "resources": {"limits": {"nvidia.com/gpu": str(workload.gpus)},
                                          "requests": {"nvidia.com/gpu": str(workload.gpus)}},
                        }],
                    },
                },
            },
        }
    ]
    if workload.pdb_min_available is not None:
        objects.append({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": workload.name, "namespace": workload.namespace,
                         "labels": {FLEET_LABEL: spec.name}},
            "spec": {"minAvailable": workload.pdb_min_available, "selector": {"matchLabels": labels}},
        })
    return objects


def namespaces(spec: FleetSpec) -> list[str]:
    names = [spec.operator.namespace] if spec.operator.installed else []
    for workload in spec.workloads:
        if workload.namespace not in names:
            names.append(workload.namespace)
    return names


def daemonset_name_for_driver(pool: PoolSpec) -> str:
    # The operator names NVIDIADriver DaemonSets nvidia-gpu-driver-<os>-<hash>.
    digest = hashlib.sha256(pool.name.encode()).hexdigest()[:8]
    return f"nvidia-gpu-driver-ubuntu22.04-{digest}"
