"""Plain, frozen views of the Kubernetes objects gpuops reads.

The gateway (`workflows.kube.gateway`) and its watch cache turn API JSON into these; everything
above works on them and never sees the `kubernetes` client. Only the fields gpuops uses
are kept, which also keeps a 5,000-node cache small.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NewType

NodeName = NewType("NodeName", str)
PoolName = NewType("PoolName", str)

# Resource names the device plugin advertises and pods request.
GPU_RESOURCE = "nvidia.com/gpu"
GPU_SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def is_gpu_resource(name: str) -> bool:
    return name in (GPU_RESOURCE, GPU_SHARED_RESOURCE) or name.startswith(MIG_RESOURCE_PREFIX)


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the kubelet reports of its host (`status.nodeInfo`); "" when not reported."""

    kubelet_version: str = ""  # "v1.31.4"
    container_runtime_version: str = ""  # "<runtime>://<version>": "containerd://1.7.20"
    kernel_version: str = ""  # "5.15.0-1045-nvidia"
    os_image: str = ""  # "Ubuntu 22.04.4 LTS"


NO_NODE_INFO = NodeInfo()


@dataclass(frozen=True, slots=True)
class NodeObject:
    name: NodeName
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool
    taints: tuple[Taint, ...]
    # None when the node reports no Ready condition at all.
    ready: bool | None
    # When the Ready condition last changed (None if unknown).
    ready_changed_at: dt.datetime | None
    # Quantities as the API gives them ("8", "500m", "1Ti"); GPU ones are whole numbers.
    capacity: Mapping[str, str]
    allocatable: Mapping[str, str]
    created_at: dt.datetime
    resource_version: str = ""
    info: NodeInfo = NO_NODE_INFO


@dataclass(frozen=True, slots=True)
class Terminated:
    """How a container ended (its current state, not a previous restart's)."""

    reason: str | None
    exit_code: int | None
    message: str | None


@dataclass(frozen=True, slots=True)
class ContainerState:
    name: str
    image: str
    ready: bool
    restart_count: int
    # e.g. "CrashLoopBackOff", "ImagePullBackOff", "ContainerCreating"; None when running
    waiting_reason: str | None = None
    # e.g. "Error", "Completed"; the last termination if the container restarted
    last_terminated_reason: str | None = None
    running: bool = False
    terminated: Terminated | None = None


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str
    controller: bool


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """One requirement of a required node-affinity term: a label (matchExpressions) or,
    for matchFields, `metadata.name`. `operator`: In | NotIn | Exists | DoesNotExist | Gt | Lt."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Every requirement must hold; an empty term matches no node (as in Kubernetes)."""

    match_expressions: tuple[NodeRequirement, ...] = ()
    match_fields: tuple[NodeRequirement, ...] = ()


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str  # "" with operator Exists: every taint
    operator: str  # Equal | Exists
    value: str
    effect: str  # "": every effect


@dataclass(frozen=True, slots=True)
class Placement:
    """What decides which nodes the scheduler may put a pod on: its nodeSelector, the
    terms of its required node affinity (any one must hold; none: any node) and its
    tolerations. Pods of one workload share one value (see `workflows.kube.wire`)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[NodeSelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()


ANYWHERE = Placement()


@dataclass(frozen=True, slots=True)
class PodObject:
    namespace: str
    name: str
    node_name: NodeName | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    # Pending | Running | Succeeded | Failed | Unknown
    phase: str
    ready: bool
    deleting: bool
    owners: tuple[OwnerRef, ...]
    containers: tuple[ContainerState, ...]
    init_containers: tuple[ContainerState, ...]
    # The images of spec.containers, in order (the driver version is the image tag).
    images: tuple[str, ...]
    # GPU resources the pod asks for (nvidia.com/gpu, nvidia.com/gpu.shared,
    # nvidia.com/mig-*): per resource, the sum over containers of max(request, limit).
    gpu_requests: Mapping[str, int]
    created_at: dt.datetime
    resource_version: str = ""
    # Why the pod as a whole failed, when it did (phase Failed before or without a container).
    status_reason: str | None = None
    status_message: str | None = None
    # Kept for GPU-requesting pods only (ANYWHERE for the rest): where they may land.
    placement: Placement = ANYWHERE
    # The pod's IP (status.podIP), where an exporter on it answers; None until it has one.
    ip: str | None = None

    @property
    def controller(self) -> OwnerRef | None:
        return next((o for o in self.owners if o.controller), None)


@dataclass(frozen=True, slots=True)
class PodOnNode:
    """A pod bound to a node, with what deciding on its eviction needs beyond `PodObject`."""

    pod: PodObject
    uid: str
    # NVIDIA_VISIBLE_DEVICES as a container's env sets it literally, if any: the NVIDIA
    # container runtime then hands the pod GPUs without any resource request.
    visible_devices: str | None


@dataclass(frozen=True, slots=True)
class DeploymentObject:
    namespace: str
    name: str
    labels: Mapping[str, str]
    images: tuple[str, ...]
    replicas: int
    ready_replicas: int


@dataclass(frozen=True, slots=True)
class DriverTemplate:
    """What a driver DaemonSet (app.kubernetes.io/component=nvidia-driver) now asks its
    pods to run. Only what the inventory compares with the pods: its status changes with
    every pod, this does not."""

    namespace: str
    name: str
    # The DaemonSet controller's template generation (annotation
    # deprecated.daemonset.template.generation); its pods carry theirs as the label
    # pod-template-generation.
    template_generation: str | None
    # The driver container's image (nvidia-driver-ctr, else the first container).
    driver_image: str | None
    # The nodes it runs on: its pod template's nodeSelector.
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # Being deleted (an NVIDIADriver's old DaemonSet after a version change): makes no pods.
    deleting: bool = False

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.node_selector.items())


@dataclass(frozen=True, slots=True)
class ToolkitTemplate:
    """What the container toolkit DaemonSet (app=nvidia-container-toolkit-daemonset) tells
    its pods: the operator writes the container runtime it configures for the whole
    cluster into the toolkit container's RUNTIME variable (and, for containerd, the
    runtime class into CONTAINERD_RUNTIME_CLASS)."""

    namespace: str
    name: str
    runtime: str | None  # docker | containerd | crio; None when the variable is not set
    runtime_class: str | None = None


@dataclass(frozen=True, slots=True)
class FieldManager:
    """One entry of an object's managedFields: a field manager ("argocd-controller",
    "kubectl-patch", "gpuops"), how it wrote (Apply: server-side apply; Update: a patch,
    an edit, a client-side apply) and the spec fields it owns, as dotted paths
    ("driver.version")."""

    manager: str
    operation: str
    spec_fields: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class CustomObject:
    """A ClusterPolicy (nvidia.com/v1) or NVIDIADriver (nvidia.com/v1alpha1)."""

    kind: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    spec: Mapping[str, object]
    status: Mapping[str, object]
    created_at: dt.datetime
    resource_version: str = ""
    # Who owns which spec field (managedFields): the version field's managers say who
    # set it last, whatever the labels claim.
    field_managers: tuple[FieldManager, ...] = ()

    def managers_of(self, field: str) -> tuple[FieldManager, ...]:
        """The managers that own spec field `field` ("driver.version")."""
        return tuple(m for m in self.field_managers if field in m.spec_fields)


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget (policy/v1). `selector` is its matchLabels; an empty one
    selects every pod in the namespace."""

    namespace: str
    name: str
    selector: Mapping[str, str]
    disruptions_allowed: int
    has_expressions: bool = False

    def selects(self, pod: PodObject) -> bool:
        return pod.namespace == self.namespace and all(pod.labels.get(k) == v for k, v in self.selector.items())

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A coordination.k8s.io/v1 Lease as leader election reads and writes it."""

    namespace: str
    name: str
    holder: str | None
    duration_seconds: int | None
    acquire_time: dt.datetime | None
    renew_time: dt.datetime | None
    transitions: int
    resource_version: str


@dataclass(frozen=True, slots=True)
class ResourceQuotaObject:
    """A ResourceQuota's GPU entries only: spec.hard and status.used keyed as written
    (`requests.nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, ...), quantities as text."""

    namespace: str
    name: str
    hard: Mapping[str, str]
    used: Mapping[str, str]
    # spec.scopes and the scope names of spec.scopeSelector: the quota counts only the
    # pods in those scopes (e.g. PriorityClass, Terminating).
    scopes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """What the cache holds at one moment. `pods` are the pods in the operator's
    namespace plus every pod that asks for a GPU resource."""

    nodes: Mapping[NodeName, NodeObject]
    pods: tuple[PodObject, ...]
    # The namespace the GPU Operator runs in, None if no operator was found.
    operator_namespace: str | None
    operator_deployment: DeploymentObject | None
    # False when the ClusterPolicy CRD is not installed (no GPU Operator at all).
    operator_crds_installed: bool
    # When the snapshot was read (the caller's clock: object views never read one).
    taken_at: dt.datetime
    cluster_policies: tuple[CustomObject, ...] = ()
    nvidia_drivers: tuple[CustomObject, ...] = ()
    driver_templates: tuple[DriverTemplate, ...] = ()
    toolkit_templates: tuple[ToolkitTemplate, ...] = ()
    # The API server's version (GET /version gitVersion, "v1.31.4"); None when not known.
    kubernetes_version: str | None = None
