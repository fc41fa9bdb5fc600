"""The pods on a node: the operator's operand pods (driver, device plugin, validator) as an
on-call engineer would describe them, and the GPU pods (what they hold, and which of them
the pool's documented placement does not allow).

Pure: the frozen pod views of `workflows.kube.objects` in, plain values out."""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from workflows.fleet.node_changes import MigStatus
from workflows.fleet.settings import PoolPlacement
from workflows.kube.labels import POD_SELECTOR_DEVICE_PLUGIN, POD_SELECTOR_DRIVER, POD_SELECTOR_VALIDATOR
from workflows.kube.objects import MIG_RESOURCE_PREFIX, NodeName, PodObject
from workflows.wording import plural


# How a role pod (driver, device plugin, validator) is doing, coarse enough to decide on.
PodCondition: TypeAlias = Literal[
    "missing", "healthy", "starting", "pending", "failing", "terminating", "finished"
]


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


@dataclass(slots=True)
class OperandPods:
    """A node's pods sorted by role in one pass: the operator's operand pods in its
    namespace, best (live, newest) first, and the GPUs the node's pods hold per resource
    (pods bound, not finished, not being deleted)."""

    driver: list[PodObject] = field(default_factory=list)
    device_plugin: list[PodObject] = field(default_factory=list)
    validator: list[PodObject] = field(default_factory=list)
    requested: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def operand_pods(pods_on_node: Sequence[PodObject], *, namespace: str | None) -> OperandPods:
    """Sort a node's pods by role; without the operator's namespace no pod is an operand."""
    found = OperandPods()
    requested = found.requested
    for pod in pods_on_node:
        if not pod.deleting and not _is_terminated(pod):
            for resource, amount in pod.gpu_requests.items():
                requested[resource] += amount
        if namespace is not None and pod.namespace != namespace:
            continue
        if pod.labels.get(POD_SELECTOR_DRIVER[0]) == POD_SELECTOR_DRIVER[1]:
            found.driver.append(pod)
        elif pod.labels.get(POD_SELECTOR_DEVICE_PLUGIN[0]) == POD_SELECTOR_DEVICE_PLUGIN[1]:
            found.device_plugin.append(pod)
        elif pod.labels.get(POD_SELECTOR_VALIDATOR[0]) == POD_SELECTOR_VALIDATOR[1]:
            found.validator.append(pod)
    found.driver = _best_first(found.driver)
    found.device_plugin = _best_first(found.device_plugin)
    found.validator = _best_first(found.validator)
    return found


def first_pod_state(pods: Sequence[PodObject]) -> PodState:
    """The state of the best of a role's pods (best first), or MISSING_POD."""
    return pod_state(pods[0]) if pods else MISSING_POD


def misplaced(pods: Sequence[PodObject], placement: PoolPlacement | None,
              mig: MigStatus) -> tuple[tuple[str, str], ...]:
    """The pods holding GPUs here that the pool's placement does not allow: (pod, "mig"
    for MIG slices or "full_gpu" for whole GPUs)."""
    if placement is None:
        return ()
    sliced = mig.strategy == "single" and mig.enabled
    found = []
    for pod in pods:
        if pod.deleting or _is_terminated(pod) or not pod.gpu_requests:
            continue
        use = "mig" if sliced or any(r.startswith(MIG_RESOURCE_PREFIX) for r in pod.gpu_requests) else "full_gpu"
        rule = placement.mig if use == "mig" else placement.full_gpu
        if rule is not None and not rule.matches(pod):
            found.append((f"{pod.namespace}/{pod.name}", use))
    return tuple(sorted(found))


# --------------------------------------------------------------------------------------
# Every operand pod, the GPU pods with their owners, and device plugins not the operator's

# How a hand-installed NVIDIA device plugin labels its pods: the project's Helm chart, its
# static DaemonSet (nvidia-device-plugin.yml), and a copy of the operator's own label.
_DEVICE_PLUGIN_LABELS = (
    ("app.kubernetes.io/name", "nvidia-device-plugin"),
    ("name", "nvidia-device-plugin-ds"),
    POD_SELECTOR_DEVICE_PLUGIN,
)
_DEVICE_PLUGIN_IMAGE = "/k8s-device-plugin"
# GPU feature discovery ships in the device plugin's image since v0.15: its pods say so.
_FEATURE_DISCOVERY = "feature-discovery"


def looks_like_device_plugin(labels: Mapping[str, str], images: Sequence[str]) -> bool:
    """An NVIDIA device plugin pod by its labels, or by its image (k8s-device-plugin)
    when its labels do not say it is GPU feature discovery, which ships in that image."""
    if any(labels.get(key) == value for key, value in _DEVICE_PLUGIN_LABELS):
        return True
    if any(_FEATURE_DISCOVERY in value for value in labels.values()):
        return False
    return any(image.split("@", 1)[0].rsplit(":", 1)[0].endswith(_DEVICE_PLUGIN_IMAGE) for image in images)


@dataclass(frozen=True, slots=True, kw_only=True)
class OperandPod:
    """One of the operator's pods on a node: which operand (its `app` label, else its
    owner's name) and how it is doing."""

    operand: str
    state: PodState


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuPod:
    """A pod holding GPUs on a node, with the controller that owns it."""

    namespace: str
    name: str
    # "Deployment web" (through its ReplicaSet), "StatefulSet db", "Job train-7"; None: a bare pod.
    owner: str | None
    gpus: int
    labels: Mapping[str, str]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def operand_name(pod: PodObject) -> str:
    controller = pod.controller
    return (pod.labels.get("app") or pod.labels.get("app.kubernetes.io/component")
            or (controller.name if controller is not None else pod.name))


def every_operand(pods_on_node: Sequence[PodObject], *, namespace: str | None) -> tuple[OperandPod, ...]:
    """Every pod of the operator's namespace on the node, by operand, live ones first."""
    if namespace is None:
        return ()
    mine = _best_first([p for p in pods_on_node if p.namespace == namespace and not _is_terminated(p)])
    return tuple(sorted((OperandPod(operand=operand_name(p), state=pod_state(p)) for p in mine),
                        key=lambda o: o.operand))


def other_device_plugins(pods_on_node: Sequence[PodObject], *, namespace: str | None) -> tuple[PodState, ...]:
    """NVIDIA device plugin pods on the node outside the operator's namespace (none
    without an operator: then a device plugin is not a second one)."""
    if namespace is None:
        return ()
    return tuple(pod_state(p) for p in pods_on_node
                 if p.namespace != namespace and not p.deleting and not _is_terminated(p)
                 and looks_like_device_plugin(p.labels, p.images))


def controller_text(pod: PodObject) -> str | None:
    """The pod's controller as a person names it: a ReplicaSet made by a Deployment (its
    pod-template-hash ends the ReplicaSet's name) is named by the Deployment."""
    controller = pod.controller
    if controller is None:
        return None
    if controller.kind == "ReplicaSet":
        hash_ = pod.labels.get("pod-template-hash")
        if hash_ and controller.name.endswith(f"-{hash_}"):
            return f"Deployment {controller.name.removesuffix(f'-{hash_}')}"
    return f"{controller.kind} {controller.name}"


def gpu_pods(pods_on_node: Sequence[PodObject]) -> tuple[GpuPod, ...]:
    """The pods holding GPUs here (bound, not finished, not being deleted)."""
    return tuple(sorted((GpuPod(namespace=p.namespace, name=p.name, owner=controller_text(p),
                                gpus=sum(p.gpu_requests.values()), labels=p.labels)
                         for p in pods_on_node if p.gpu_requests and not p.deleting and not _is_terminated(p)),
                        key=lambda g: g.ref))
