"""Declarative simulated GPU fleets: the YAML model, the Kubernetes objects it turns
into, and applying/removing them on the local control plane.

A fleet declares GPU nodes as hardware: kwok nodes labelled as Node Feature Discovery
and GPU Feature Discovery label a GPU node (product, count, memory, MIG capability),
with faults (a host driver, fewer GPUs advertised, ...) as node annotations under
`sim.gpuops.io/`. A ClusterPolicy (or NVIDIADriver CRs) asks the real GPU Operator
(testenv/operator.py) for the rest: its deploy labels, its operand DaemonSets and its
upgrade labels. The operand simulator (testenv/simulator.py) plays what the operands'
containers and the hardware do on a node. Optional workloads come with
PodDisruptionBudgets.

A fleet whose scenario the real operator cannot produce on kwok names why in
`operator.stand_in`; only then the operator's part (deploy labels, DaemonSets, the
ClusterPolicy's status) is written by testenv.install's stand-in instead.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from testenv import operator
from testenv.controlplane import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE

FLEETS_DIR = Path(__file__).with_name("fleets")

# Labels and annotations the testenv owns.
FLEET_LABEL = "gpuops.io/testenv-fleet"
POOL_LABEL = "gpuops.io/pool"
SIM = "sim.gpuops.io/"
ANN_HOST_DRIVER = SIM + "host-driver"
ANN_ADVERTISE = SIM + "advertise-gpus"
ANN_UNHEALTHY = SIM + "unhealthy-gpus"
ANN_DRIVER_DELAY = SIM + "driver-ready-seconds"
ANN_VALIDATOR_DELAY = SIM + "validator-ready-seconds"
ANN_VALIDATOR_FAILS = SIM + "validator-fails"
ANN_MIG_STUCK = SIM + "mig-stuck"
# mig-parted fails the next layout asked of this node (nvidia.com/mig.config.state=failed).
ANN_MIG_FAILS = SIM + "mig-fails"
ANN_MIG_APPLIED = SIM + "mig-applied"
ANN_NOT_READY = SIM + "not-ready"
# What DCGM's diagnostics find on the node when a gpuops `diag` check runs there: unset or
# "pass" every test passes; "<test>:<gpu>" that test fails on that GPU (e.g. "memory:3");
# "hang" the diagnostics never end (the check pod runs out its deadline).
ANN_DIAG = SIM + "diag"
# What GFD finds on the node's hardware (JSON of its labels): the simulator publishes those
# missing from the node while a driver works, as GFD does.
ANN_GFD = SIM + "gfd-labels"
GFD_KEYS = ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory", "nvidia.com/gpu.replicas",
            "nvidia.com/gpu.sharing-strategy", "nvidia.com/mig.capable")
FAULTS_CONFIGMAP = "gpuops-sim-faults"
FAULT_CRASHLOOP_VERSIONS = "crashloop-driver-versions"
# Driver versions that load and advertise every GPU, but fail gpuops's check pod
# (nvidia-smi: "Driver/library version mismatch").
FAULT_CHECK_FAILING_VERSIONS = "check-failing-driver-versions"
# Kernels NVIDIA built no precompiled driver image for: a driver pod whose image tag names
# one cannot pull its image (ImagePullBackOff).
FAULT_NO_PRECOMPILED_KERNELS = "no-precompiled-kernels"
# gpuops's check pods (workflows.engine.check_pod), which the simulator runs to an end.
CHECK_POD_LABEL = "gpuops.io/gpu-check"

# The stand-in's operand DaemonSets: (name, deploy label suffix), named as the operator names them.
OPERANDS = (
    ("nvidia-driver-daemonset", "driver"),
    ("nvidia-container-toolkit-daemonset", "container-toolkit"),
    ("nvidia-device-plugin-daemonset", "device-plugin"),
    ("gpu-feature-discovery", "gpu-feature-discovery"),
    ("nvidia-dcgm-exporter", "dcgm-exporter"),
    ("nvidia-operator-validator", "operator-validator"),
    ("nvidia-mig-manager", "mig-manager"),
)
# The operand pods whose containers the simulator plays, by the labels the operator's
# manifests give them (the driver by component: NVIDIADriver DaemonSets have other names).
DRIVER_COMPONENT = "nvidia-driver"
SIMULATED_APPS = {"nvidia-device-plugin-daemonset": "device-plugin",
                  "nvidia-operator-validator": "validator"}


def operand_of(labels: dict[str, str]) -> str | None:
    """Which simulated operand a pod is: "driver", "device-plugin", "validator" or None."""
    if labels.get("app.kubernetes.io/component") == DRIVER_COMPONENT:
        return "driver"
    return SIMULATED_APPS.get(labels.get("app", ""))


# Hardware: the PCI device id each GPU product reports (mig-parted's device-filter keys).
PCI_DEVICE_IDS = {
    "NVIDIA-A100-SXM4-40GB": "0x20B010DE",
    "NVIDIA-A100-SXM4-80GB": "0x20B210DE",
    "NVIDIA-A100-80GB-PCIe": "0x20B510DE",
    "NVIDIA-H100-80GB-HBM3": "0x233010DE",
    "NVIDIA-H100-PCIe": "0x233110DE",
    "NVIDIA-H200": "0x233510DE",
}
# Hardware: the MIG profiles each product's GPUs can make (a "+me" variant of one too).
_A100_80GB = frozenset({"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"})
MIG_PROFILES = {
    "NVIDIA-A100-SXM4-40GB": frozenset({"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}),
    "NVIDIA-A100-SXM4-80GB": _A100_80GB,
    "NVIDIA-A100-80GB-PCIe": _A100_80GB,
    "NVIDIA-H100-80GB-HBM3": _A100_80GB,
    "NVIDIA-H100-PCIe": _A100_80GB,
    "NVIDIA-H200": frozenset({"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}),
}
MIG_PARTED_CONFIGMAP = "default-mig-parted-config"


class MigLayoutError(ValueError):
    """mig-parted cannot apply a layout to a node's GPUs (unknown name, no entry for the device)."""


def mig_parted_configs(config_yaml: str) -> dict[str, list[dict[str, Any]]]:
    """The `mig-configs` of a mig-parted config.yaml (the ConfigMap's data)."""
    return (yaml.safe_load(config_yaml) or {}).get("mig-configs") or {}


def default_mig_parted_config() -> str:
    """config.yaml of the operator's own default-mig-parted-config ConfigMap (its asset)."""
    asset = operator.source_folder() / "assets" / "state-mig-manager" / "0400_configmap.yaml"
    return yaml.safe_load(asset.read_text())["data"]["config.yaml"]


_DEFAULT_CONFIGS: dict[str, list[dict[str, Any]]] = {}


def mig_devices(layout: str, *, product: str, gpus: int,
                configs: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, int]:
    """MIG devices per profile on a node of `gpus` x `product` with `layout` applied, as
    mig-parted would make them: every GPU takes the entries whose `devices` and
    `device-filter` match it. Raises MigLayoutError when the layout is unknown or leaves
    a GPU without an entry or asks for a profile the GPU cannot make (mig-parted fails
    the change)."""
    if configs is None:
        if not _DEFAULT_CONFIGS:
            _DEFAULT_CONFIGS.update(mig_parted_configs(default_mig_parted_config()))
        configs = _DEFAULT_CONFIGS
    if layout not in configs:
        raise MigLayoutError(f"no MIG layout {layout!r} in the mig-parted config")
    product = product.removesuffix("-SHARED")
    device_id = PCI_DEVICE_IDS.get(product, "")
    can_make = MIG_PROFILES.get(product)
    totals: dict[str, int] = {}
    for index in range(gpus):
        matched = False
        for entry in configs[layout]:
            devices = entry.get("devices", "all")
            if devices != "all" and index not in devices:
                continue
            wanted = entry.get("device-filter")
            if wanted is not None and device_id.lower() not in {d.lower() for d in (
                    [wanted] if isinstance(wanted, str) else wanted)}:
                continue
            matched = True
            if entry.get("mig-enabled"):
                for profile, n in (entry.get("mig-devices") or {}).items():
                    if can_make is not None and profile.split("+")[0] not in can_make:
                        raise MigLayoutError(f"MIG layout {layout!r}: a {product} GPU cannot make {profile}")
                    totals[profile] = totals.get(profile, 0) + int(n)
        if not matched:
            raise MigLayoutError(f"MIG layout {layout!r} has no entry for GPU {index} of {product} ({device_id or '?'})")
    return totals


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OperatorSpec(_Model):
    # None: the real GPU Operator runs. A text: why this fleet's scenario cannot be had from
    # the real operator on kwok, and testenv.install's stand-in plays the operator instead.
    stand_in: str | None = None
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
    # operator does; False (stand-in only) selects every GPU node, so a stale
    # pre-installed label can sit next to a running operator driver pod.
    driver_follows_deploy_label: bool = True
    # driver.usePrecompiled: one driver DaemonSet per kernel (the NFD kernel label), image
    # tag `<branch>-<kernel>-<os>`; the ClusterPolicy names the branch of driver_version.
    use_precompiled: bool = False

    @property
    def real(self) -> bool:
        """Whether the real GPU Operator runs for this fleet."""
        return self.installed and self.stand_in is None

    @model_validator(mode="after")
    def _stand_in_only_where_needed(self) -> OperatorSpec:
        if not self.driver_follows_deploy_label and self.stand_in is None:
            raise ValueError("driver_follows_deploy_label=False is something only the stand-in can do: "
                             "say why in operator.stand_in")
        if self.use_precompiled and self.stand_in is not None:
            raise ValueError("use_precompiled needs the real operator: it makes one driver DaemonSet per kernel, "
                             "which the stand-in does not")
        return self


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
    # What the kubelet reports of the host (status.nodeInfo), when given: the container
    # runtime ("containerd://1.7.20", "cri-o://1.30.4"), the kernel (also NFD's kernel
    # label) and the kubelet's version ("v1.33.4").
    container_runtime: str | None = None
    kernel: str | None = None
    kubelet_version: str | None = None


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
    # The operator validator's CUDA validation fails on the node: its pod never becomes
    # Ready (an init container crash-loops), while the driver and device plugin are fine.
    validator_fails: bool = False
    # The node's own host, over its pool's (PoolSpec.container_runtime and friends).
    container_runtime: str | None = None
    kernel: str | None = None
    kubelet_version: str | None = None
    # NFD's kernel label when it lags the kernel the kubelet reports (the node rebooted
    # into a new kernel before NFD's next pass).
    nfd_kernel: str | None = None


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
    check_failing_driver_versions: tuple[str, ...] = ()
    no_precompiled_kernels: tuple[str, ...] = ()
    # The simulator's default delays, seconds.
    driver_ready_seconds: float = 1.0
    validator_ready_seconds: float = 0.5
    mig_apply_seconds: float = 1.0
    # Tests only: wake the operator's upgrade controller when a driver or validator pod
    # turns Ready (simulator.OperandSimulator.nudge_node), through the first system node.
    nudge_upgrade_controller: bool = False

    @model_validator(mode="after")
    def _special_nodes_exist(self) -> FleetSpec:
        if self.nudge_upgrade_controller and self.system_nodes < 1:
            raise ValueError("nudge_upgrade_controller needs a system node to flip the upgrade skip label on")
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


# What Node Feature Discovery labels on a GPU node: the operator acts on nodes with the
# NVIDIA PCI vendor label and needs the OS to pick its driver image.
NFD_LABELS = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
    "feature.node.kubernetes.io/kernel-version.full": "5.15.0-125-generic",
}


def node_object(spec: FleetSpec, pool: PoolSpec, name: str, *, advertise: bool = False) -> dict[str, Any]:
    """A kwok GPU node: the hardware as NFD and GFD label it, the admin's own labels (a
    requested MIG layout, a driver opt-out, a sticky pre-installed mark) and the faults.
    With the real operator, it adds gpu.present and the deploy labels; the stand-in's
    are written here. GPUs are advertised only once the simulator sees a ready driver,
    unless `advertise` (fleets without a simulator)."""
    special = spec.special(name) or SpecialNode(node=name)
    mig = pool.mig_config is not None and spec.operator.mig_strategy != "none"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        FLEET_LABEL: spec.name,
        pool.label_key: pool.name,
        **NFD_LABELS,
        **_kernel_label(special.nfd_kernel or special.kernel or pool.kernel),
        # With renameByDefault the device plugin advertises nvidia.com/gpu.shared and GFD
        # appends -SHARED to the product name.
        "nvidia.com/gpu.product": pool.product + ("-SHARED" if pool.rename_shared else ""),
        "nvidia.com/gpu.count": str(pool.gpus_per_node),
        "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
        "nvidia.com/gpu.replicas": str(pool.replicas),
        "nvidia.com/gpu.sharing-strategy": "time-slicing" if pool.replicas > 1 else "none",
        "nvidia.com/mig.capable": "true" if pool.mig_config is not None else "false",
    }
    if special.driver_deploy != "true":
        # An admin's opt-out, or the driver manager's sticky mark from an earlier boot.
        labels["nvidia.com/gpu.deploy.driver"] = special.driver_deploy
    if spec.operator.installed and not spec.operator.real:
        labels["nvidia.com/gpu.present"] = "true"
        for _, deploy in OPERANDS:
            labels.setdefault(f"nvidia.com/gpu.deploy.{deploy}", "true")
        if pool.mig_config is None:
            labels["nvidia.com/gpu.deploy.mig-manager"] = "false"
        if spec.operator.use_nvidia_driver_crd:
            labels["nvidia.com/gpu-operator.driver.owner"] = nvidia_driver_name(pool)
    elif not spec.operator.installed:
        labels["nvidia.com/gpu.present"] = "true"  # GFD runs without the operator
    if mig:
        labels["nvidia.com/mig.strategy"] = spec.operator.mig_strategy
        labels["nvidia.com/mig.config"] = pool.mig_config or "all-disabled"
    if special.host_driver:
        labels.update(driver_version_labels(special.host_driver))

    annotations = {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE, "node.alpha.kubernetes.io/ttl": "0",
                   ANN_GFD: json.dumps({k: labels[k] for k in GFD_KEYS}, sort_keys=True)}
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
    if mig:  # the GPUs come up partitioned as the pool declares
        annotations[ANN_MIG_APPLIED] = pool.mig_config or "all-disabled"
    if special.driver_ready_seconds is not None:
        annotations[ANN_DRIVER_DELAY] = str(special.driver_ready_seconds)
    if special.validator_ready_seconds is not None:
        annotations[ANN_VALIDATOR_DELAY] = str(special.validator_ready_seconds)
    if special.validator_fails:
        annotations[ANN_VALIDATOR_FAILS] = "true"

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
    info = {"containerRuntimeVersion": special.container_runtime or pool.container_runtime,
            "kernelVersion": special.kernel or pool.kernel,
            "kubeletVersion": special.kubelet_version or pool.kubelet_version}
    if any(info.values()):
        node["status"]["nodeInfo"] = {key: value for key, value in info.items() if value}
    return node


def _kernel_label(kernel: str | None) -> dict[str, str]:
    return {"feature.node.kubernetes.io/kernel-version.full": kernel} if kernel else {}


def advertised_resources(
    pool: PoolSpec, *, mig_config: str | None, strategy: str, gpus: int | None = None,
    configs: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, str]:
    """What the device plugin advertises for a healthy node of this pool (MIG devices
    from the mig-parted `configs`, the operator's default when None)."""
    count = pool.gpus_per_node if gpus is None else gpus
    layout = mig_devices(mig_config or "all-disabled", product=pool.product, gpus=count, configs=configs)
    if layout and strategy == "mixed":
        return {f"nvidia.com/mig-{profile}": str(n) for profile, n in layout.items()}
    if layout and strategy == "single":
        return {"nvidia.com/gpu": str(sum(layout.values()))}
    resource = "nvidia.com/gpu.shared" if pool.rename_shared else "nvidia.com/gpu"
    return {resource: str(count * pool.replicas)}


def mig_count_labels(pool: PoolSpec, mig_config: str | None,
                     configs: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, str]:
    """GFD's per-profile MIG device counts for a node of this pool."""
    layout = mig_devices(mig_config or "all-disabled", product=pool.product, gpus=pool.gpus_per_node,
                         configs=configs)
    return {f"nvidia.com/mig-{profile}.count": str(n) for profile, n in layout.items()}


def system_node_name(index: int) -> str:
    return f"system-{index:02d}"


def system_node_object(spec: FleetSpec, index: int) -> dict[str, Any]:
    name = system_node_name(index)
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
    """The fleet's ClusterPolicy: the operator's own sample with the chart's images
    (testenv.operator.cluster_policy), the fleet's driver, upgrade and MIG settings."""
    op = spec.operator
    policy = operator.cluster_policy(driver_version=op.driver_version, name=op.cluster_policy_name,
                                     auto_upgrade=op.auto_upgrade)
    policy["metadata"]["labels"] = {FLEET_LABEL: spec.name}
    policy["spec"]["driver"]["useNvidiaDriverCRD"] = op.use_nvidia_driver_crd
    policy["spec"]["driver"]["upgradePolicy"].setdefault("maxParallelUpgrades", 1)
    policy["spec"]["mig"] = {"strategy": op.mig_strategy if op.mig_strategy != "none" else "single"}
    if op.use_precompiled:
        policy["spec"]["driver"]["usePrecompiled"] = True
        policy["spec"]["driver"]["version"] = op.driver_version.split(".")[0]
    return policy


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
    owner: dict[str, Any],
    image: str,
    extra_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {"app": name, FLEET_LABEL: spec.name}
    pod_labels = {"app": name}
    if deploy == "driver":
        labels["app.kubernetes.io/component"] = DRIVER_COMPONENT
        pod_labels["app.kubernetes.io/component"] = DRIVER_COMPONENT
    container = "nvidia-driver" if deploy == "driver" else name.replace("nvidia-", "").replace("-daemonset", "")
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
