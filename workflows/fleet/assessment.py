"""The fleet inventory: what each GPU node, pool and the cluster look like at one moment.

Pure domain logic over the frozen views in `workflows.kube.objects`: no API calls, no clock
(time is the `now` argument), no Kubernetes client. The work is split for a 5,000-node
watch cache:

- `fleet_context(snapshot)` reads the few cluster-level objects once (ClusterPolicy,
  NVIDIADriver CRs, the operator Deployment).
- `assess_node(...)` looks at one node and the pods bound to it, and depends on nothing
  else, so the cache memoizes it per node and recomputes only nodes that changed.
- `summarize(...)` folds the node inventories into pools and findings in one pass.

`build_fleet(snapshot)` chains the three for callers that hold a whole snapshot.

The labels, annotations and states read here are the ones in
shared/reference/gpu-operator/FACTS.md; the wording of evidence lives in the
"Evidence wording" section below, the wording of findings in `workflows.fleet.findings`.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeAlias

from workflows.kube.labels import (
    ANNOTATION_CORDONED_BY,
    ANNOTATION_MIG_STATE_SINCE,
    ANNOTATION_OWNER,
    ANNOTATION_UPGRADE_HELD_BY,
    ANNOTATION_UPGRADE_STATE_SINCE,
    ANNOTATION_VALIDATION_START,
    ANNOTATION_WAIT_FOR_JOBS_START,
    LABEL_DEPLOY_DRIVER,
    LABEL_DEPLOY_OPERANDS,
    LABEL_DEPLOY_PREFIX,
    LABEL_DRIVER_CR_OWNER,
    LABEL_DRIVER_VERSION_FULL,
    LABEL_GPU_COUNT,
    LABEL_GPU_PRESENT,
    LABEL_GPU_PRODUCT,
    LABEL_GPU_REPLICAS,
    LABEL_MIG_CAPABLE,
    LABEL_MIG_CONFIG,
    LABEL_MIG_CONFIG_STATE,
    LABEL_MIG_STRATEGY,
    LABEL_POD_TEMPLATE_GENERATION,
    LABEL_SHARING_STRATEGY,
    LABEL_UPGRADE_SKIP,
    LABEL_UPGRADE_STATE,
    LABELS_DRIVER_VERSION_PARTS,
    LABELS_DRIVER_VERSION_PARTS_OLD,
    PAUSED_FOR_MIG_CHANGE,
    PAUSED_PREFIX,
    POD_SELECTOR_DEVICE_PLUGIN,
    POD_SELECTOR_DRIVER,
    POD_SELECTOR_VALIDATOR,
    PRE_INSTALLED,
)
from workflows.kube.objects import (
    GPU_RESOURCE,
    GPU_SHARED_RESOURCE,
    MIG_RESOURCE_PREFIX,
    NO_NODE_INFO,
    ClusterSnapshot,
    CustomObject,
    DriverTemplate,
    NodeInfo,
    NodeName,
    NodeObject,
    PodObject,
    PoolName,
    is_gpu_resource,
)
from workflows.fleet.platform import KubernetesRange, shipped_operator_support
from workflows.wording import plural

# --------------------------------------------------------------------------------------
_NVIDIA = "nvidia.com/"

UNPOOLED = PoolName("unpooled")

# --------------------------------------------------------------------------------------
# States

PoolKind: TypeAlias = Literal["serving", "training"]
DriverOwner: TypeAlias = Literal["operator", "host", "conflict", "none", "unknown"]
AutoUpgradeState: TypeAlias = Literal["on", "off", "unknown"]
# How a role pod (driver, device plugin, validator) is doing, coarse enough to decide on.
PodCondition: TypeAlias = Literal[
    "missing", "healthy", "starting", "pending", "failing", "terminating", "finished"
]
# Values of nvidia.com/gpu-driver-upgrade-state, in the controller's order. The label is
# read as a plain string because a newer operator may add states.
UpgradeState: TypeAlias = Literal[
    "upgrade-required",
    "cordon-required",
    "wait-for-jobs-required",
    "pod-deletion-required",
    "drain-required",
    "pod-restart-required",
    "validation-required",
    "uncordon-required",
    "upgrade-done",
    "upgrade-failed",
]
UPGRADE_DONE: UpgradeState = "upgrade-done"
UPGRADE_FAILED: UpgradeState = "upgrade-failed"
# Values of nvidia.com/mig.config.state (read as a plain string for the same reason).
MigConfigState: TypeAlias = Literal["pending", "rebooting", "success", "failed"]
MIG_STATES_IN_PROGRESS: frozenset[str] = frozenset({"pending", "rebooting"})
MIG_STATE_FAILED: MigConfigState = "failed"

# Waiting reasons after which a container will not start without someone acting.
_ERROR_WAITING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "PreCreateHookError",
        "PostStartHookError",
    }
)
_STARTING_WAITING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})
# kubectl's own threshold for calling a pod that restarts on errors a crash loop in practice.
CRASH_LOOP_RESTARTS = 5


# --------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True, slots=True)
class PodMatch:
    """Which pods a placement rule takes: in one of `namespaces` (any when empty) and, with
    `labels`, whose labels it accepts (the configured selector's `matches`). `text` is the
    rule as configured, for messages."""

    text: str
    namespaces: frozenset[str] = frozenset()
    labels: Callable[[Mapping[str, str]], bool] | None = None

    def matches(self, pod: PodObject) -> bool:
        return (not self.namespaces or pod.namespace in self.namespaces) and (
            self.labels is None or self.labels(pod.labels))


@dataclass(frozen=True, slots=True)
class Placement:
    """A pool's documented placement (`pools.<name>.workloads`): which workloads may land
    on MIG slices and which on whole GPUs (None: not documented, anything goes)."""

    mig: PodMatch | None = None
    full_gpu: PodMatch | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InventorySettings:
    """How gpuops reads the fleet; parsed once from configuration.

    pool_label_key: the node label whose value names a node's pool (a cloud node-group
        label such as `cloud.google.com/gke-nodepool` works as well).
    pool_kinds: pool name -> "serving" | "training"; a pool not listed has no kind.
    upgrade_stuck_after: how long a node may sit in one driver-upgrade state.
    mig_pending_stuck_after: how long a MIG change may stay pending/rebooting.
    cluster_policy_owner: who owns the ClusterPolicy (team or channel); when unset the
        ClusterPolicy's `gpuops.io/owner` annotation is used.
    placement: pool name -> which workloads may use MIG slices and which whole GPUs.
    operator_support: GPU Operator release line ("25.10") -> the Kubernetes versions NVIDIA
        supports it on (the shipped table, `workflows/fleet/operator_support.yaml`, with
        the configuration's rows over it).
    """

    pool_label_key: str = "gpuops.io/pool"
    pool_kinds: Mapping[str, PoolKind] = field(default_factory=lambda: MappingProxyType({}))
    upgrade_stuck_after: dt.timedelta = dt.timedelta(hours=1)
    mig_pending_stuck_after: dt.timedelta = dt.timedelta(minutes=30)
    cluster_policy_owner: str | None = None
    placement: Mapping[str, Placement] = field(default_factory=lambda: MappingProxyType({}))
    operator_support: Mapping[str, KubernetesRange] = field(default_factory=shipped_operator_support)

    def kind_of(self, pool: PoolName) -> PoolKind | None:
        return self.pool_kinds.get(pool)


def is_gpu_node(node: NodeObject) -> bool:
    """Any one sign is enough: the operator's label, GFD's count, or a GPU resource the
    device plugin registered (even with 0 devices, which is itself worth reporting)."""
    if node.labels.get(LABEL_GPU_PRESENT) == "true" or LABEL_GPU_COUNT in node.labels:
        return True
    return any(is_gpu_resource(name) for name in node.capacity)


# --------------------------------------------------------------------------------------
# Pods on a node


@dataclass(frozen=True, slots=True, kw_only=True)
class PodState:
    """One operand pod (driver, device plugin or validator) as an on-call engineer
    would describe it."""

    present: bool
    name: str | None = None  # namespace/name
    phase: str | None = None
    ready: bool = False
    deleting: bool = False
    restarts: int = 0
    # The reason a container waits, "Init:"-prefixed for init containers as kubectl does.
    waiting_reason: str | None = None
    last_terminated_reason: str | None = None
    image: str | None = None
    image_tag: str | None = None
    # The version at the start of the tag: "580.95.05" from "580.95.05-ubuntu22.04".
    version: str | None = None
    owner_kind: str | None = None
    condition: PodCondition = "missing"
    # The driver version the pod's DaemonSet now specifies, when the pod runs an older
    # template with another driver image (OnDelete: it changes on the pod's next restart).
    template_version: str | None = None

    @property
    def crash_looping(self) -> bool:
        return _crash_looping(self.waiting_reason, self.restarts, self.last_terminated_reason)

    @property
    def text(self) -> str:
        """One line: "Running, Ready", "CrashLoopBackOff (12 restarts)", "missing"."""
        if not self.present:
            return "missing"
        restarts = plural(self.restarts, "restart")
        if self.condition == "terminating":
            return "Terminating"
        if self.condition == "healthy":
            return "Running, Ready" + (f" ({restarts})" if self.restarts else "")
        if self.condition == "failing":
            if self.waiting_reason:
                return f"{self.waiting_reason} ({restarts})"
            if self.crash_looping:
                return f"{self.phase}, restarting on errors ({restarts})"
            return self.phase or "Failed"
        if self.phase == "Running":
            return "Running, not Ready" + (f" ({restarts})" if self.restarts else "")
        if self.waiting_reason:
            return f"{self.phase} ({self.waiting_reason})"
        return self.phase or "Unknown"


MISSING_POD = PodState(present=False)

# "580.95.05" from "580.95.05-ubuntu22.04"; a precompiled driver's tag names only its
# branch before the kernel: "580" from "580-5.15.0-1045-nvidia-ubuntu22.04".
_VERSION_AT_START = re.compile(r"^v?(\d+(?:\.\d+)*)(?=$|[-_+])", re.ASCII)


@functools.lru_cache(maxsize=1024)  # a fleet runs a handful of images on thousands of pods
def image_tag(image: str) -> str | None:
    """The tag of an image reference, ignoring a registry port and a digest."""
    reference = image.split("@", 1)[0]
    last_segment = reference.rsplit("/", 1)[-1]
    if ":" not in last_segment:
        return None
    return last_segment.split(":", 1)[1] or None


@functools.lru_cache(maxsize=1024)
def version_of_tag(tag: str | None) -> str | None:
    if tag is None:
        return None
    match = _VERSION_AT_START.match(tag)
    return match.group(1) if match else tag


def pod_state(pod: PodObject, *, template_version: str | None = None) -> PodState:
    restarts = 0
    for container in (*pod.containers, *pod.init_containers):
        restarts += container.restart_count
    waiting_reason: str | None = None
    init_failed = False
    init_running = False
    for init in pod.init_containers:
        if init.running:
            init_running = True
        if init.waiting_reason and init.waiting_reason != "PodInitializing":
            waiting_reason = f"Init:{init.waiting_reason}"
            break
        if not init.ready and not init.running and init.last_terminated_reason == "Error":
            # The driver manager's init container exits with an error on a host driver.
            waiting_reason = "Init:Error"
            init_failed = True
            break
    if waiting_reason is None:
        waiting_reason = next((c.waiting_reason for c in pod.containers if c.waiting_reason), None)
    last_terminated = next(
        (c.last_terminated_reason for c in pod.containers if c.last_terminated_reason),
        None,
    ) or next(
        (c.last_terminated_reason for c in pod.init_containers if c.last_terminated_reason),
        None,
    )
    image = pod.images[0] if pod.images else None
    tag = image_tag(image) if image else None
    controller = pod.controller
    bare_reason = waiting_reason.removeprefix("Init:") if waiting_reason else None
    if pod.deleting:
        condition: PodCondition = "terminating"
    elif (
        pod.phase == "Failed"
        or init_failed
        or bare_reason in _ERROR_WAITING_REASONS
        or _crash_looping(waiting_reason, restarts, last_terminated)
    ):
        condition = "failing"
    elif pod.phase == "Succeeded":
        condition = "finished"
    elif pod.phase == "Running":
        condition = "healthy" if pod.ready else "starting"
    elif pod.phase == "Pending" and (init_running or bare_reason in _STARTING_WAITING_REASONS):
        condition = "starting"
    else:
        condition = "pending"
    return PodState(
        present=True,
        name=f"{pod.namespace}/{pod.name}",
        phase=pod.phase,
        ready=pod.ready,
        deleting=pod.deleting,
        restarts=restarts,
        waiting_reason=waiting_reason,
        last_terminated_reason=last_terminated,
        image=image,
        image_tag=tag,
        version=version_of_tag(tag),
        owner_kind=controller.kind if controller else None,
        condition=condition,
        template_version=template_version,
    )


def _same_driver(loaded: str, pod_version: str) -> bool:
    """Whether the loaded driver can be the pod's: the same version, or one of the pod's
    branch (a precompiled image names its branch only, "580")."""
    return loaded == pod_version or loaded.startswith(pod_version + ".")


def _crash_looping(waiting_reason: str | None, restarts: int, last_terminated: str | None) -> bool:
    if waiting_reason is not None and waiting_reason.endswith("CrashLoopBackOff"):
        return True
    return restarts >= CRASH_LOOP_RESTARTS and last_terminated == "Error"


def _is_terminated(pod: PodObject) -> bool:
    return pod.phase in ("Succeeded", "Failed")


def group_pods_by_node(pods: Iterable[PodObject]) -> dict[NodeName, list[PodObject]]:
    """One pass over all pods, so assessing a node never scans the whole pod list."""
    by_node: dict[NodeName, list[PodObject]] = defaultdict(list)
    for pod in pods:
        if pod.node_name is not None:
            by_node[pod.node_name].append(pod)
    return by_node


def _best_first(pods: list[PodObject]) -> list[PodObject]:
    # A rollout or a wedged termination can leave two pods of one role on a node: the
    # live, newest one is the one that describes the node now.
    if len(pods) < 2:
        return pods
    return sorted(pods, key=lambda p: (p.deleting, -p.created_at.timestamp()))


# --------------------------------------------------------------------------------------
# Cluster-level context


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoUpgradeSetting:
    """Whether the operator upgrades a driver on its own, and which object says so."""

    state: AutoUpgradeState
    source: str  # "ClusterPolicy cluster-policy", "NVIDIADriver h100-driver"
    # The object leaves autoUpgrade unset, so the CRD default decided.
    defaulted: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class NvidiaDriverRef:
    """The parts of an NVIDIADriver CR that say which nodes it drives and how."""

    name: str
    node_selector: Mapping[str, str]
    default: bool
    version: str | None
    auto_upgrade: AutoUpgradeSetting
    # spec.usePrecompiled: one driver image per kernel, prebuilt by NVIDIA.
    precompiled: bool = False

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.node_selector.items())


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolkitSetting:
    """How the container toolkit is set up for the container runtime. The operator picks
    one runtime for the whole cluster (OpenShift: cri-o; else containerd as soon as one
    GPU node runs it, else what the GPU nodes run) and writes it into the toolkit
    DaemonSet's RUNTIME variable; `spec.operator.defaultRuntime` is not what it uses
    (deprecated as unused in 26.x)."""

    enabled: bool  # ClusterPolicy spec.toolkit.enabled (unset: enabled)
    runtime: str | None  # RUNTIME of the toolkit DaemonSet; None when not seen
    daemonset: str | None  # namespace/name of that DaemonSet
    default_runtime: str | None = None  # ClusterPolicy spec.operator.defaultRuntime
    # spec.cdi.nriPluginEnabled: the toolkit injects devices through NRI and leaves the
    # runtime's configuration alone, so which runtime it was told matters not.
    nri_plugin: bool = False


NO_TOOLKIT = ToolkitSetting(enabled=False, runtime=None, daemonset=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfiguredRuntime:
    """The runtime the toolkit is set up for, and how gpuops knows."""

    runtime: str
    evidence: str  # "RUNTIME=containerd on DaemonSet gpu-operator/nvidia-container-toolkit-daemonset"


def configured_runtime(toolkit: ToolkitSetting, node_runtimes: Iterable[str]) -> ConfiguredRuntime | None:
    """What the toolkit is configured for: the DaemonSet's RUNTIME when seen; before that,
    the operator's own choice from the GPU nodes' runtimes when it is certain (containerd
    as soon as one node runs it, or the one runtime they all run). None when the toolkit
    is not the operator's (disabled), leaves the runtime alone (NRI), or it cannot be told."""
    if not toolkit.enabled or toolkit.nri_plugin:
        return None
    if toolkit.runtime:
        return ConfiguredRuntime(runtime=toolkit.runtime, evidence=_say_toolkit_runtime(toolkit))
    known = {kind for kind in node_runtimes if kind in ("docker", "containerd", "crio")}
    if "containerd" in known or len(known) == 1:
        chosen = "containerd" if "containerd" in known else next(iter(known))
        return ConfiguredRuntime(runtime=chosen, evidence=_say_toolkit_runtime_inferred(chosen))
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInfo:
    """The GPU Operator installation as a whole. A cluster without one is a valid answer."""

    crds_installed: bool
    operator_namespace: str | None
    operator_version: str | None  # tag of the operator Deployment's first image
    operator_deployment: str | None  # namespace/name
    cluster_policy: str | None  # the one in effect
    cluster_policy_state: str | None  # status.state: ready | notReady | ignored
    cluster_policy_owner: str | None
    # More than one ClusterPolicy: the operator honours one and ignores these.
    duplicate_cluster_policies: tuple[str, ...]
    uses_nvidia_driver_crds: bool
    nvidia_drivers: tuple[str, ...]
    # The driver version the ClusterPolicy in effect names (spec.driver.version).
    cluster_policy_driver_version: str | None = None
    # The API server's version ("v1.31.4"); None when it was not read.
    kubernetes_version: str | None = None
    toolkit: ToolkitSetting = NO_TOOLKIT

    @property
    def operator_found(self) -> bool:
        return self.crds_installed and self.operator_deployment is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetContext:
    """Everything cluster-wide that a node assessment needs; computed once per snapshot
    of the cluster-level objects, not per node."""

    cluster: ClusterInfo
    # ClusterPolicy spec.driver.enabled (unset means enabled); None without a ClusterPolicy.
    driver_enabled: bool | None
    mig_strategy: str | None  # ClusterPolicy spec.mig.strategy
    cluster_policy_auto_upgrade: AutoUpgradeSetting
    nvidia_drivers: tuple[NvidiaDriverRef, ...]
    # namespace/name of each driver DaemonSet -> what its template runs now
    driver_templates: Mapping[str, DriverTemplate] = field(default_factory=lambda: MappingProxyType({}))
    # ClusterPolicy spec.driver.usePrecompiled (for nodes no NVIDIADriver CR drives).
    cluster_policy_precompiled: bool = False

    def precompiled_for(self, labels: Mapping[str, str]) -> bool:
        """Whether the operator's driver for a node with these labels uses precompiled
        modules: its NVIDIADriver's usePrecompiled, else the ClusterPolicy's."""
        if self.cluster.uses_nvidia_driver_crds:
            driver = self.nvidia_driver_for(labels)
            return driver is not None and driver.precompiled
        return self.cluster_policy_precompiled

    @property
    def operator_namespace(self) -> str | None:
        return self.cluster.operator_namespace

    def behind_template(self, pod: PodObject) -> str | None:
        """The driver version `pod`'s DaemonSet now specifies, if the pod runs an older
        template with another driver image; None when it is up to date or unknown.

        The DaemonSet controller's own test of an up-to-date pod compares the template
        generation (or the revision hash); only a different driver image makes the next
        restart a driver change, so both must differ. A template changed and changed back
        has a new generation but the pod's image: not behind."""
        controller = pod.controller
        if controller is None or controller.kind != "DaemonSet" or not pod.images:
            return None
        template = self.driver_templates.get(f"{pod.namespace}/{controller.name}")
        if template is None or template.template_generation is None or template.driver_image is None:
            return None
        if pod.labels.get(LABEL_POD_TEMPLATE_GENERATION) == template.template_generation:
            return None
        if pod.images[0] == template.driver_image:
            return None
        return version_of_tag(image_tag(template.driver_image)) or template.driver_image

    def nvidia_driver_named(self, name: str) -> NvidiaDriverRef | None:
        return next((d for d in self.nvidia_drivers if d.name == name), None)

    def nvidia_driver_for(self, labels: Mapping[str, str]) -> NvidiaDriverRef | None:
        """The NVIDIADriver that manages a node with these labels: the one the operator
        names on the node, else a CR whose nodeSelector matches, else the default CR."""
        if not self.cluster.uses_nvidia_driver_crds:
            return None
        named = labels.get(LABEL_DRIVER_CR_OWNER)
        if named:
            found = self.nvidia_driver_named(named)
            if found is not None:
                return found
        fallback: NvidiaDriverRef | None = None
        for driver in self.nvidia_drivers:
            if driver.default or not driver.node_selector:
                fallback = fallback or driver
            elif driver.selects(labels):
                return driver
        return fallback


def fleet_context(snapshot: ClusterSnapshot, *, settings: InventorySettings) -> FleetContext:
    policy, duplicates = _policy_in_effect(snapshot.cluster_policies)
    driver_spec = _mapping(policy.spec.get("driver")) if policy else {}
    uses_crds = bool(driver_spec.get("useNvidiaDriverCRD", False))
    deployment = snapshot.operator_deployment
    operator_image = deployment.images[0] if deployment and deployment.images else None
    owner = settings.cluster_policy_owner
    if owner is None and policy is not None:
        owner = policy.annotations.get(ANNOTATION_OWNER)
    drivers = tuple(
        sorted((_nvidia_driver_ref(cr) for cr in snapshot.nvidia_drivers), key=lambda d: d.name)
    )
    cluster = ClusterInfo(
        crds_installed=snapshot.operator_crds_installed,
        operator_namespace=snapshot.operator_namespace,
        operator_version=image_tag(operator_image) if operator_image else None,
        operator_deployment=f"{deployment.namespace}/{deployment.name}" if deployment else None,
        cluster_policy=policy.name if policy else None,
        cluster_policy_state=_str_or_none(policy.status.get("state")) if policy else None,
        cluster_policy_owner=owner,
        duplicate_cluster_policies=tuple(p.name for p in duplicates),
        uses_nvidia_driver_crds=uses_crds,
        nvidia_drivers=tuple(d.name for d in drivers),
        cluster_policy_driver_version=_str_or_none(driver_spec.get("version")),
        kubernetes_version=snapshot.kubernetes_version,
        toolkit=_toolkit_setting(policy, snapshot),
    )
    if policy is None:
        cp_auto = AutoUpgradeSetting(state="unknown", source=_say_no_cluster_policy())
        driver_enabled: bool | None = None
        mig_strategy = None
    else:
        # The ClusterPolicy CRD defaults autoUpgrade to false (Helm writes true explicitly).
        cp_auto = _auto_upgrade_from(
            _mapping(driver_spec.get("upgradePolicy")),
            source=f"ClusterPolicy {policy.name}",
            crd_default=False,
        )
        if cp_auto.state == "on" and _mapping(policy.spec.get("sandboxWorkloads")).get("enabled") is True:
            # NB: with sandbox workloads the operator's upgrade controller removes every
            # upgrade-state label and upgrades no driver, whatever autoUpgrade says.
            cp_auto = AutoUpgradeSetting(state="off", source=_say_sandbox_workloads(policy.name))
        # The operator treats an unset `enabled` as enabled.
        driver_enabled = driver_spec.get("enabled") is not False
        mig_strategy = _str_or_none(_mapping(policy.spec.get("mig")).get("strategy"))
    return FleetContext(
        cluster=cluster,
        driver_enabled=driver_enabled,
        mig_strategy=mig_strategy,
        cluster_policy_auto_upgrade=cp_auto,
        nvidia_drivers=drivers,
        driver_templates=MappingProxyType({f"{t.namespace}/{t.name}": t for t in snapshot.driver_templates}),
        cluster_policy_precompiled=driver_spec.get("usePrecompiled") is True,
    )


def _toolkit_setting(policy: CustomObject | None, snapshot: ClusterSnapshot) -> ToolkitSetting:
    if policy is None:
        return NO_TOOLKIT
    namespace = snapshot.operator_namespace
    templates = [t for t in snapshot.toolkit_templates if namespace is None or t.namespace == namespace]
    template = min(templates, key=lambda t: (t.namespace, t.name)) if templates else None
    return ToolkitSetting(
        enabled=_mapping(policy.spec.get("toolkit")).get("enabled") is not False,
        runtime=template.runtime if template else None,
        daemonset=f"{template.namespace}/{template.name}" if template else None,
        default_runtime=_str_or_none(_mapping(policy.spec.get("operator")).get("defaultRuntime")),
        nri_plugin=_mapping(policy.spec.get("cdi")).get("nriPluginEnabled") is True,
    )


def _policy_in_effect(
    policies: Sequence[CustomObject],
) -> tuple[CustomObject | None, tuple[CustomObject, ...]]:
    if not policies:
        return None, ()
    # The operator acts on one ClusterPolicy and marks the rest "ignored"; before it has
    # written a status, the oldest is the best guess of the one it keeps.
    ordered = sorted(
        policies,
        key=lambda p: (p.status.get("state") == "ignored", p.created_at, p.name),
    )
    return ordered[0], tuple(ordered[1:])


def _nvidia_driver_ref(cr: CustomObject) -> NvidiaDriverRef:
    selector = _mapping(cr.spec.get("nodeSelector"))
    # The v26.7 NVIDIADriver CRD defaults autoUpgrade to true.
    auto = _auto_upgrade_from(
        _mapping(cr.spec.get("upgradePolicy")),
        source=f"NVIDIADriver {cr.name}",
        crd_default=True,
    )
    return NvidiaDriverRef(
        name=cr.name,
        node_selector=MappingProxyType({str(k): str(v) for k, v in selector.items()}),
        default=cr.spec.get("default") is True,
        version=_str_or_none(cr.spec.get("version")),
        auto_upgrade=auto,
        precompiled=cr.spec.get("usePrecompiled") is True,
    )


def _auto_upgrade_from(
    upgrade_policy: Mapping[str, object], *, source: str, crd_default: bool
) -> AutoUpgradeSetting:
    value = upgrade_policy.get("autoUpgrade")
    if isinstance(value, bool):
        return AutoUpgradeSetting(state="on" if value else "off", source=source)
    return AutoUpgradeSetting(
        state="on" if crd_default else "off", source=source, defaulted=True
    )


# --------------------------------------------------------------------------------------
# One node


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuResource:
    """One extended resource (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*)."""

    resource: str
    # What GFD's labels say the device plugin should advertise; None when they say nothing.
    expected: int | None
    capacity: int
    allocatable: int
    requested: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DriverOwnership:
    owner: DriverOwner
    # Facts that were seen, strongest first, each short enough for one Slack line.
    evidence: tuple[str, ...]
    nvidia_driver: str | None = None  # the NVIDIADriver CR managing the node, if any


@dataclass(frozen=True, slots=True, kw_only=True)
class UpgradeStatus:
    state: str | None  # nvidia.com/gpu-driver-upgrade-state; None when not labelled
    since: dt.datetime | None  # when the node entered it, when known
    # nvidia.com/gpu-driver-upgrade.skip=true: the upgrade controller leaves the node alone.
    skip: bool = False
    # The gpuops run that set that label to gate the operator (None: a person set it).
    held_by: str | None = None

    @property
    def in_progress(self) -> bool:
        return self.state is not None and self.state != UPGRADE_DONE

    @property
    def failed(self) -> bool:
        return self.state == UPGRADE_FAILED

    def age(self, now: dt.datetime) -> dt.timedelta | None:
        return None if self.since is None else now - self.since


@dataclass(frozen=True, slots=True, kw_only=True)
class MigStatus:
    capable: bool
    strategy: str | None  # none | single | mixed
    config: str | None  # the requested profile, nvidia.com/mig.config
    config_state: str | None  # pending | rebooting | success | failed
    since: dt.datetime | None  # when config_state was entered, when known

    @property
    def in_progress(self) -> bool:
        return self.config_state in MIG_STATES_IN_PROGRESS

    @property
    def failed(self) -> bool:
        return self.config_state == MIG_STATE_FAILED

    def age(self, now: dt.datetime) -> dt.timedelta | None:
        return None if self.since is None else now - self.since


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInventory:
    """One GPU node. Holds timestamps, never ages, so a cached value stays true as time
    passes; findings turn timestamps into ages with `now`."""

    name: NodeName
    pool: PoolName
    gpu_node: bool
    product: str | None
    # Real GPUs per GFD; None when unknown (no GFD labels, or single-strategy MIG where
    # GFD counts MIG devices instead).
    physical_gpus: int | None
    replicas: int
    sharing_strategy: str | None
    resources: tuple[GpuResource, ...]
    # GPU pods that hold devices here (bound, not finished, not being deleted).
    requested_gpus: int
    ready: bool | None
    ready_changed_at: dt.datetime | None
    cordoned: bool
    # From gpuops' cordon annotation; None when gpuops did not cordon the node.
    cordoned_by: str | None
    cordon_run: str | None
    driver_version: str | None  # what GFD reads from the loaded driver
    driver_image_tag: str | None  # what the operator's driver pod runs
    deploy_driver: str | None  # nvidia.com/gpu.deploy.driver
    driver: DriverOwnership
    driver_pod: PodState
    device_plugin_pod: PodState
    validator_pod: PodState
    upgrade: UpgradeStatus
    mig: MigStatus
    # deploy label suffix -> value, for every operand paused by the operator.
    paused_operands: Mapping[str, str]
    # The run named by a gpuops cordon mark left on a node that is schedulable (a person
    # uncordoned it by hand): a stale mark, see workflows.engine.cordons.
    stale_mark_run: str | None = None
    # When gpuops cordoned it, from its mark (None when gpuops did not).
    cordoned_at: dt.datetime | None = None
    # The mark says the node was cordoned before the run (a person's cordon, which the
    # run leaves in place when it ends).
    cordoned_before_run: bool = False
    # GPU pods here that the pool's documented placement does not allow: (namespace/name,
    # "mig" for MIG slices | "full_gpu" for whole GPUs).
    misplaced: tuple[tuple[str, str], ...] = ()
    # What the kubelet reports of the host: its version, container runtime, kernel, OS.
    node_info: NodeInfo = NO_NODE_INFO
    # The operator's driver here uses precompiled modules (one image per kernel).
    precompiled: bool = False

    @property
    def expected_advertised(self) -> int | None:
        known = [r.expected for r in self.resources if r.expected is not None]
        return sum(known) if known else None

    @property
    def advertised_gpus(self) -> int:
        return sum(r.capacity for r in self.resources)

    @property
    def allocatable_gpus(self) -> int:
        return sum(r.allocatable for r in self.resources)

    @property
    def mig_slices_advertised(self) -> int:
        """How many of `advertised_gpus` are MIG slices, not whole GPUs: every
        nvidia.com/mig-* resource, and nvidia.com/gpu itself under the single strategy
        with MIG enabled."""
        enabled = bool(self.mig.config) and not str(self.mig.config).startswith("all-disabled")
        return sum(r.capacity for r in self.resources
                   if r.resource.startswith("nvidia.com/mig-")
                   or (enabled and self.mig.strategy == "single" and r.resource == "nvidia.com/gpu"))

    @property
    def effective_driver_version(self) -> str | None:
        return self.driver_version or (self.driver_pod.version if self.driver_pod.present else None)

    @property
    def paused_for_mig_change(self) -> bool:
        return PAUSED_FOR_MIG_CHANGE in self.paused_operands.values()

    @property
    def changing(self) -> bool:
        """Mid driver upgrade or MIG change: missing GPUs are expected for a while."""
        return self.upgrade.in_progress or self.mig.in_progress


def assess_node(
    node: NodeObject,
    *,
    pods_on_node: Sequence[PodObject],
    context: FleetContext,
    settings: InventorySettings,
    now: dt.datetime,
) -> NodeInventory:
    """The inventory of one node from the node and the pods bound to it.

    `now` is accepted so callers keep one signature for all assessments; the result
    holds timestamps rather than ages, so it depends only on its other inputs and a
    cache may keep it until the node or its pods change.
    """
    del now
    labels = node.labels
    namespace = context.operator_namespace
    driver_pods: list[PodObject] = []
    device_plugin_pods: list[PodObject] = []
    validator_pods: list[PodObject] = []
    requested: dict[str, int] = defaultdict(int)
    for pod in pods_on_node:
        if not pod.deleting and not _is_terminated(pod):
            for resource, amount in pod.gpu_requests.items():
                requested[resource] += amount
        if namespace is not None and pod.namespace != namespace:
            continue
        if pod.labels.get(POD_SELECTOR_DRIVER[0]) == POD_SELECTOR_DRIVER[1]:
            driver_pods.append(pod)
        elif pod.labels.get(POD_SELECTOR_DEVICE_PLUGIN[0]) == POD_SELECTOR_DEVICE_PLUGIN[1]:
            device_plugin_pods.append(pod)
        elif pod.labels.get(POD_SELECTOR_VALIDATOR[0]) == POD_SELECTOR_VALIDATOR[1]:
            validator_pods.append(pod)

    driver_pods = _best_first(driver_pods)
    driver_states = tuple(pod_state(p, template_version=context.behind_template(p)) for p in driver_pods)
    driver_pod = driver_states[0] if driver_states else MISSING_POD
    device_plugin_pod = (
        pod_state(_best_first(device_plugin_pods)[0]) if device_plugin_pods else MISSING_POD
    )
    validator_pod = pod_state(_best_first(validator_pods)[0]) if validator_pods else MISSING_POD

    paused: dict[str, str] = {}
    mig_expected: dict[str, int] = {}
    mig_replicas: dict[str, int] = {}
    # GFD sets dozens of labels per node and few matter here: one substring search over
    # all keys (or values) decides whether they need a look one by one.
    scan_paused = PAUSED_PREFIX in "\n".join(labels.values())
    scan_mig = "\n" + MIG_RESOURCE_PREFIX in "\n" + "\n".join(labels)
    for key, value in labels.items() if scan_paused or scan_mig else ():
        if key.startswith(LABEL_DEPLOY_PREFIX):
            if value.startswith(PAUSED_PREFIX):
                paused[key.removeprefix(LABEL_DEPLOY_PREFIX)] = value
        elif key.startswith(MIG_RESOURCE_PREFIX):
            profile, _, attribute = key.removeprefix(MIG_RESOURCE_PREFIX).rpartition(".")
            if attribute == "count":
                mig_expected[MIG_RESOURCE_PREFIX + profile] = _int(value) or 0
            elif attribute == "replicas":
                mig_replicas[MIG_RESOURCE_PREFIX + profile] = max(_int(value) or 1, 1)

    product = labels.get(LABEL_GPU_PRODUCT)
    count = _int(labels.get(LABEL_GPU_COUNT))
    replicas = max(_int(labels.get(LABEL_GPU_REPLICAS)) or 1, 1)
    strategy = labels.get(LABEL_MIG_STRATEGY) or context.mig_strategy
    expected: dict[str, int | None] = {}
    if strategy == "mixed" and mig_expected:
        # Mixed: each MIG profile is its own resource; how many whole GPUs stay
        # non-MIG (and so advertise nvidia.com/gpu) is not in the labels.
        for resource, devices in mig_expected.items():
            expected[resource] = devices * mig_replicas.get(resource, 1)
        physical = count
    else:
        # Time-slicing may rename the resource to nvidia.com/gpu.shared.
        whole = GPU_SHARED_RESOURCE if GPU_SHARED_RESOURCE in node.capacity else GPU_RESOURCE
        expected[whole] = None if count is None else count * replicas
        # Single-strategy MIG: GFD's count is MIG devices and the product ends "-MIG-<profile>".
        mig_devices_counted = strategy == "single" and product is not None and "-MIG-" in product
        physical = None if mig_devices_counted else count

    names = sorted(
        {r for r in (*node.capacity, *node.allocatable) if r.startswith(_NVIDIA) and is_gpu_resource(r)}
        | {r for r, n in expected.items() if n is not None}
        | {r for r, n in requested.items() if n}
    )
    resources = tuple(
        GpuResource(
            resource=name,
            expected=expected.get(name),
            capacity=_int(node.capacity.get(name)) or 0,
            allocatable=_int(node.allocatable.get(name)) or 0,
            requested=requested.get(name, 0),
        )
        for name in names
    )

    gfd_version = gfd_driver_version(labels)
    upgrade_state = labels.get(LABEL_UPGRADE_STATE) or None
    upgrade = UpgradeStatus(state=upgrade_state, since=_upgrade_since(node, upgrade_state),
                            skip=labels.get(LABEL_UPGRADE_SKIP) == "true",
                            held_by=node.annotations.get(ANNOTATION_UPGRADE_HELD_BY) or None)
    mig = MigStatus(
        capable=labels.get(LABEL_MIG_CAPABLE) == "true",
        strategy=strategy,
        config=labels.get(LABEL_MIG_CONFIG),
        config_state=labels.get(LABEL_MIG_CONFIG_STATE),
        since=_parse_time(node.annotations.get(ANNOTATION_MIG_STATE_SINCE)),
    )
    cordoned_by, cordon_run, cordoned_at, before_run = _cordon_mark(node.annotations.get(ANNOTATION_CORDONED_BY))
    stale_mark_run = None
    if not node.unschedulable:
        stale_mark_run, cordoned_by, cordon_run, cordoned_at, before_run = cordon_run, None, None, None, False
    driver = judge_driver_owner(
        labels=labels,
        driver_pods=driver_states,
        gfd_version=gfd_version,
        upgrade=upgrade,
        context=context,
    )
    pool = PoolName(labels.get(settings.pool_label_key) or UNPOOLED)
    return NodeInventory(
        name=node.name,
        pool=pool,
        gpu_node=is_gpu_node(node),
        product=product,
        physical_gpus=physical,
        replicas=replicas,
        sharing_strategy=labels.get(LABEL_SHARING_STRATEGY),
        resources=resources,
        requested_gpus=sum(requested.values()),
        ready=node.ready,
        ready_changed_at=node.ready_changed_at,
        cordoned=node.unschedulable,
        cordoned_by=cordoned_by,
        stale_mark_run=stale_mark_run,
        cordoned_at=cordoned_at,
        cordon_run=cordon_run,
        cordoned_before_run=before_run,
        driver_version=gfd_version,
        driver_image_tag=driver_pod.image_tag,
        deploy_driver=labels.get(LABEL_DEPLOY_DRIVER),
        driver=driver,
        driver_pod=driver_pod,
        device_plugin_pod=device_plugin_pod,
        validator_pod=validator_pod,
        upgrade=upgrade,
        mig=mig,
        paused_operands=MappingProxyType(paused),
        misplaced=_misplaced(pods_on_node, settings.placement.get(pool), mig),
        node_info=node.info,
        precompiled=context.precompiled_for(labels),
    )


def _misplaced(pods: Sequence[PodObject], placement: Placement | None,
               mig: MigStatus) -> tuple[tuple[str, str], ...]:
    """The pods holding GPUs here that the pool's placement does not allow: (pod, "mig"
    for MIG slices or "full_gpu" for whole GPUs)."""
    if placement is None:
        return ()
    sliced = mig.strategy == "single" and bool(mig.config) and not str(mig.config).startswith("all-disabled")
    found = []
    for pod in pods:
        if pod.deleting or _is_terminated(pod) or not pod.gpu_requests:
            continue
        use = "mig" if sliced or any(r.startswith(MIG_RESOURCE_PREFIX) for r in pod.gpu_requests) else "full_gpu"
        rule = placement.mig if use == "mig" else placement.full_gpu
        if rule is not None and not rule.matches(pod):
            found.append((f"{pod.namespace}/{pod.name}", use))
    return tuple(sorted(found))


def gfd_driver_version(labels: Mapping[str, str]) -> str | None:
    full = labels.get(LABEL_DRIVER_VERSION_FULL)
    if full:
        return full
    for keys in (LABELS_DRIVER_VERSION_PARTS, LABELS_DRIVER_VERSION_PARTS_OLD):
        parts = [labels.get(key) for key in keys]
        if parts[0] and parts[1]:
            return ".".join(part for part in parts if part)
    return None


def _upgrade_since(node: NodeObject, state: str | None) -> dt.datetime | None:
    if state is None:
        return None
    recorded = _parse_time(node.annotations.get(ANNOTATION_UPGRADE_STATE_SINCE))
    if recorded is not None:
        return recorded
    # Without gpuops' record, the controller's own start times cover the two states in
    # which nodes are known to hang (waiting for jobs, validation).
    if state == "wait-for-jobs-required":
        return _parse_unix(node.annotations.get(ANNOTATION_WAIT_FOR_JOBS_START))
    if state == "validation-required":
        return _parse_unix(node.annotations.get(ANNOTATION_VALIDATION_START))
    return None


def _cordon_mark(raw: str | None) -> tuple[str | None, str | None, dt.datetime | None, bool]:
    if not raw:
        return None, None, None, False
    try:
        mark = json.loads(raw)
    except ValueError:
        return None, None, None, False
    if not isinstance(mark, dict):
        return None, None, None, False
    at = mark.get("at")
    return (_str_or_none(mark.get("by")), _str_or_none(mark.get("run")), _parse_time(at if isinstance(at, str) else None),
            mark.get("prior_unschedulable") is True)


# --------------------------------------------------------------------------------------
# Who owns the driver (FACTS.md, "Who owns the driver on a node")


def judge_driver_owner(
    *,
    labels: Mapping[str, str],
    driver_pods: Sequence[PodState],
    gfd_version: str | None,
    upgrade: UpgradeStatus,
    context: FleetContext,
) -> DriverOwnership:
    """Decide the driver owner from what can be seen without exec'ing into the node.

    `driver_pods` are this node's driver pods, best (live, newest) first.
    """
    evidence: list[str] = []
    deploy_driver = labels.get(LABEL_DEPLOY_DRIVER)
    host_label = deploy_driver == PRE_INSTALLED
    cluster = context.cluster

    nvidia_driver = context.nvidia_driver_for(labels)
    owner_label = labels.get(LABEL_DRIVER_CR_OWNER)
    if owner_label:
        evidence.append(
            _say_driver_cr_label(owner_label, exists=context.nvidia_driver_named(owner_label) is not None)
        )
    elif nvidia_driver is not None:
        evidence.append(_say_driver_cr_selects(nvidia_driver))
    elif cluster.uses_nvidia_driver_crds:
        evidence.append(_say_no_driver_cr_selects())

    pod = driver_pods[0] if driver_pods else None
    live = [p for p in driver_pods if not p.deleting]
    if len(live) > 1:
        evidence.append(_say_several_driver_pods(live))
    operator_pod = pod is not None and pod.owner_kind == "DaemonSet"
    if pod is not None:
        evidence.append(_say_driver_pod(pod))
        if not operator_pod:
            evidence.append(_say_driver_pod_not_from_daemonset(pod))

    opted_out = deploy_driver == "false" or labels.get(LABEL_DEPLOY_OPERANDS) == "false"
    if deploy_driver is not None:
        evidence.append(_say_deploy_driver_label(deploy_driver))
    if labels.get(LABEL_DEPLOY_OPERANDS) == "false":
        evidence.append(_say_operands_removed())
    if context.driver_enabled is False:
        evidence.append(_say_driver_disabled(cluster.cluster_policy))
    if upgrade.in_progress:
        evidence.append(_say_upgrade_state(upgrade.state))

    def verdict(owner: DriverOwner, *why: str) -> DriverOwnership:
        return DriverOwnership(
            owner=owner,
            evidence=tuple(evidence) + why,
            nvidia_driver=nvidia_driver.name if nvidia_driver else None,
        )

    if pod is not None and operator_pod:
        gfd = (_say_gfd_version(gfd_version),) if gfd_version else ()
        if pod.condition == "healthy":
            if host_label:
                return verdict("operator", *gfd, _say_stale_pre_installed())
            return verdict("operator", *gfd)
        if pod.condition == "failing":
            if host_label:
                return verdict("conflict", *gfd, _say_two_driver_sources())
            if gfd_version and pod.version and not _same_driver(gfd_version, pod.version):
                # A working driver the failing pod cannot have loaded: the host's. The
                # driver manager missed it (a wrong deploy.driver=true label).
                return verdict("conflict", *gfd, _say_host_driver_beside_failing_pod(gfd_version, pod))
            return verdict("operator", *gfd)
        if pod.condition == "starting":
            if host_label:
                return verdict("unknown", *gfd, _say_starting_on_pre_installed())
            return verdict("operator", *gfd)
        if upgrade.in_progress:
            # The upgrade controller deletes the driver pod and its DaemonSet recreates it.
            return verdict("operator", *gfd, _say_being_replaced())
        return verdict(
            "unknown", *gfd, _say_driver_pod_stalled(pod, gfd_version, host_marked=host_label)
        )

    if deploy_driver is not None and deploy_driver.startswith(PAUSED_PREFIX):
        return verdict("operator", _say_operator_paused_driver())
    if host_label:
        return verdict(
            "host",
            _say_gfd_version(gfd_version) if gfd_version else _say_gfd_no_version(),
        )
    if gfd_version is not None:
        if opted_out or context.driver_enabled is False:
            return verdict("host", _say_gfd_version_without_driver_pod(gfd_version))
        if not cluster.operator_found:
            return verdict(
                "host", _say_gfd_version_without_driver_pod(gfd_version), _say_no_operator()
            )
        if upgrade.in_progress and pod is None:
            return verdict("operator", _say_gfd_version(gfd_version), _say_being_replaced())
        return verdict("unknown", _say_gfd_version_unexplained(gfd_version))
    if pod is not None:
        return verdict("unknown", _say_driver_pod_unexplained())
    return verdict("none", _say_no_driver_anywhere())


# --------------------------------------------------------------------------------------
# Pools and the fleet


@dataclass(frozen=True, slots=True, kw_only=True)
class DriverManager:
    """The one object whose driver version the operator rolls out to a set of nodes: the
    ClusterPolicy (every node it deploys the driver to) or an NVIDIADriver CR (the nodes
    its nodeSelector picks). Changing its version changes every pool it drives."""

    kind: Literal["ClusterPolicy", "NVIDIADriver"]
    name: str
    version: str | None
    auto_upgrade: AutoUpgradeSetting
    pools: tuple[PoolName, ...]  # every pool with nodes it drives

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolInventory:
    name: PoolName
    kind: PoolKind | None
    nodes: tuple[NodeName, ...]
    nodes_ready: int
    # Sums over the pool's nodes; physical counts only nodes where it is known.
    gpus_physical: int
    gpus_expected: int
    gpus_advertised: int
    gpus_allocatable: int
    gpus_requested: int
    # driver version -> number of nodes running it
    driver_versions: Mapping[str, int]
    auto_upgrade: AutoUpgradeSetting
    # driver version -> who owns the driver on the nodes running it ("host", "operator")
    driver_version_owners: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # version their DaemonSet now specifies -> nodes whose driver pod runs an older one
    driver_pods_behind: Mapping[str, tuple[NodeName, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # What sets the driver version of this pool's operator-driven nodes (none: host drivers only).
    driver_managers: tuple[DriverManager, ...] = ()
    # nodeInfo.containerRuntimeVersion ("containerd://1.7.20") -> the nodes reporting it.
    runtimes: Mapping[str, tuple[NodeName, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # kernel version -> the nodes on it whose operator driver uses precompiled modules.
    precompiled_kernels: Mapping[str, tuple[NodeName, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # How many of gpus_advertised are MIG slices (NodeInventory.mig_slices_advertised summed).
    mig_slices_advertised: int = 0
    # The pool's cordoned nodes, by name (kept with the sums: `/gpu status` reads them
    # without walking every node).
    cordoned: tuple[NodeName, ...] = ()

    def shares_driver_with(self) -> tuple[PoolName, ...]:
        """Other pools whose driver version changes with this one's."""
        return tuple(sorted({p for m in self.driver_managers for p in m.pools if p != self.name}))

    @property
    def nodes_total(self) -> int:
        return len(self.nodes)

    @property
    def mixed_driver_versions(self) -> bool:
        return len(self.driver_versions) > 1


# --------------------------------------------------------------------------------------
# Evidence wording (what the inventory says it saw; findings word their own messages)


def _say_toolkit_runtime(toolkit: ToolkitSetting) -> str:
    said = f"RUNTIME={toolkit.runtime} on DaemonSet {toolkit.daemonset}"
    if toolkit.default_runtime and toolkit.default_runtime != toolkit.runtime:
        said += f" (the ClusterPolicy's defaultRuntime={toolkit.default_runtime} is not used by the operator)"
    return said


def _say_toolkit_runtime_inferred(runtime: str) -> str:
    return (f"{runtime}, as the operator chooses from the GPU nodes' runtimes (containerd when any runs it); "
            "the toolkit DaemonSet was not seen")


def _say_driver_pod(pod: PodState) -> str:
    state = "Running and Ready" if pod.condition == "healthy" else pod.text
    tag = f" (image tag {pod.image_tag})" if pod.image_tag else ""
    return f"driver pod {pod.name} is {state}{tag}"


def _say_driver_pod_not_from_daemonset(pod: PodState) -> str:
    owner = pod.owner_kind or "no controller"
    return f"driver pod {pod.name} is not run by a DaemonSet ({owner})"


def _say_several_driver_pods(pods: Sequence[PodState]) -> str:
    return f"{len(pods)} live driver pods on this node: {', '.join(p.name or '?' for p in pods)}"


def _say_deploy_driver_label(value: str) -> str:
    return f"label {LABEL_DEPLOY_DRIVER}={value}"


def _say_operands_removed() -> str:
    return f"label {LABEL_DEPLOY_OPERANDS}=false (all operands removed from this node)"


def _say_driver_disabled(policy: str | None) -> str:
    return f"ClusterPolicy {policy} spec.driver.enabled=false"


def _say_sandbox_workloads(policy: str) -> str:
    return (f"ClusterPolicy {policy}: autoUpgrade is on, but with sandboxWorkloads.enabled the operator "
            "upgrades no driver")


def _say_upgrade_state(state: str | None) -> str:
    return f"label {LABEL_UPGRADE_STATE}={state}"


def _say_driver_cr_label(name: str, *, exists: bool) -> str:
    if exists:
        return f"label {LABEL_DRIVER_CR_OWNER}={name} (NVIDIADriver {name} manages this node)"
    return f"label {LABEL_DRIVER_CR_OWNER}={name} but no NVIDIADriver named {name} exists"


def _say_driver_cr_selects(driver: NvidiaDriverRef) -> str:
    if driver.node_selector:
        selector = ",".join(f"{k}={v}" for k, v in sorted(driver.node_selector.items()))
        return f"NVIDIADriver {driver.name} selects this node (nodeSelector {selector})"
    return f"NVIDIADriver {driver.name} is the default driver for nodes no other CR selects"


def _say_no_driver_cr_selects() -> str:
    return "ClusterPolicy uses NVIDIADriver CRs but none selects this node"


def _say_no_driver_cr_for_pool() -> str:
    return "no NVIDIADriver selects this pool's nodes"


def _say_no_cluster_policy() -> str:
    return "no ClusterPolicy"


def _say_gfd_version(version: str) -> str:
    return f"GFD reports driver {version}"


def _say_gfd_no_version() -> str:
    return "GFD reports no driver version yet"


def _say_gfd_version_without_driver_pod(version: str) -> str:
    return f"GFD reports driver {version} but no operator driver pod runs here"


def _say_gfd_version_unexplained(version: str) -> str:
    return (
        f"GFD reports driver {version} but no operator driver pod runs here and nothing "
        "marks a host driver: check the driver DaemonSet's node selector and the node's host"
    )


def _say_stale_pre_installed() -> str:
    return (
        f"{LABEL_DEPLOY_DRIVER}={PRE_INSTALLED} is stale: the operator's driver pod is "
        "Running and Ready"
    )


def _say_two_driver_sources() -> str:
    return (
        "two driver sources: a host driver is marked and the operator's driver pod keeps "
        'failing (the driver manager stops with "driver is pre-installed on host")'
    )


def _say_host_driver_beside_failing_pod(gfd_version: str, pod: PodState) -> str:
    return (
        f"two driver sources: driver {gfd_version} is loaded, yet the operator's driver pod "
        f"({pod.version}) keeps failing, so the loaded driver came from the host"
    )


def _say_starting_on_pre_installed() -> str:
    return (
        f"the operator's driver pod is still starting on a node marked {PRE_INSTALLED}: "
        "it should either become Ready (stale label) or fail (conflict)"
    )


def _say_being_replaced() -> str:
    return "the upgrade controller is replacing the operator's driver pod"


def _say_driver_pod_stalled(pod: PodState, gfd_version: str | None, *, host_marked: bool) -> str:
    if host_marked:
        return (
            f"driver pod {pod.name} is {pod.text} on a node marked {PRE_INSTALLED}: "
            "cannot tell whether the host or the operator will provide the driver"
        )
    if gfd_version:
        return (
            f"driver pod {pod.name} is {pod.text} yet GFD reports driver {gfd_version}: "
            "cannot tell which driver is loaded"
        )
    return (
        f"driver pod {pod.name} is {pod.text}, no host driver is marked and GFD reports no "
        "driver: nothing shows a driver is loaded"
    )


def _say_driver_pod_unexplained() -> str:
    return "a driver pod runs outside the operator's DaemonSets and GFD reports no driver"


def _say_operator_paused_driver() -> str:
    return "the operator paused its own driver pod on this node"


def _say_no_operator() -> str:
    return "no GPU Operator runs in this cluster, so the driver comes from the host"


def _say_no_driver_anywhere() -> str:
    return "no driver pod, no pre-installed label and no driver version from GFD"


# --------------------------------------------------------------------------------------
# Parsing the loose values found in labels, annotations and CR specs


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def _parse_unix(value: str | None) -> dt.datetime | None:
    seconds = _int(value)
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def pool_auto_upgrade(nvidia_drivers: set[str], *, context: FleetContext) -> AutoUpgradeSetting:
    """Whether the driver of a pool whose nodes the NVIDIADriver CRs `nvidia_drivers` own
    (the ClusterPolicy's, without such CRs) upgrades on its own."""
    if not context.cluster.uses_nvidia_driver_crds:
        return context.cluster_policy_auto_upgrade
    settings = [d.auto_upgrade for name in sorted(nvidia_drivers) if (d := context.nvidia_driver_named(name))]
    if not settings:
        return AutoUpgradeSetting(state="unknown", source=_say_no_driver_cr_for_pool())
    if len(settings) == 1:
        return settings[0]
    # Nodes of one pool under different CRs: any CR that upgrades on its own is the
    # risk worth showing, so "on" wins and the source names every CR.
    state: AutoUpgradeState = "on" if any(s.state == "on" for s in settings) else "off"
    return AutoUpgradeSetting(
        state=state,
        source=", ".join(f"{s.source} ({s.state})" for s in settings),
        defaulted=any(s.defaulted for s in settings),
    )
