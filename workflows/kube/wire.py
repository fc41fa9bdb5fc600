"""What gpuops reads of a Kubernetes object, as typed schemas of the API's JSON, and
the frozen views of `workflows.kube.objects` they become.

A schema names only the fields gpuops uses. msgspec decodes an API answer straight
into it and skips everything else (managedFields, images, most of a pod's spec) without
building Python objects for it. Measured on pages of 500 bench objects: a node page
decodes in a third of the time a generic parse plus the walk over its dicts took (half
the time of the parse alone), a pod page in a tenth. Missing fields take their
defaults, as the API omits empty ones; a field of the wrong type is an error.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import msgspec
from msgspec import Struct, field

from workflows.kube.labels import (
    ANNOTATION_TEMPLATE_GENERATION,
    DRIVER_CONTAINER,
    ENV_TOOLKIT_RUNTIME,
    ENV_TOOLKIT_RUNTIME_CLASS,
    TOOLKIT_CONTAINER,
)
from workflows.kube.objects import (
    ANYWHERE,
    ContainerState,
    CustomObject,
    DeploymentObject,
    FieldManager,
    DriverTemplate,
    NodeInfo,
    NodeName,
    NodeObject,
    NodeRequirement,
    NodeSelectorTerm,
    OwnerRef,
    Placement,
    PodObject,
    ResourceQuotaObject,
    Taint,
    Terminated,
    Toleration,
    ToolkitTemplate,
    is_gpu_resource,
)

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def frozen_map(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    # The dict is fresh from the decoder and referenced nowhere else: wrap, do not copy.
    return MappingProxyType(mapping) if mapping else _EMPTY


# JSON cannot hold cycles, so no schema needs the cyclic garbage collector's attention.
class _Wire(Struct, gc=False):
    pass


class OwnerReferenceWire(_Wire):
    kind: str | None = None
    name: str | None = None
    controller: bool | None = None


class ObjectMetaWire(_Wire):
    # Empty in a watch BOOKMARK, whose object carries only a resourceVersion.
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    resourceVersion: str | None = None
    creationTimestamp: dt.datetime | None = None
    deletionTimestamp: dt.datetime | None = None
    ownerReferences: list[OwnerReferenceWire] | None = None


class ConditionWire(_Wire):
    type: str | None = None
    status: str | None = None
    lastTransitionTime: dt.datetime | None = None


class TaintWire(_Wire):
    key: str | None = None
    value: str | None = None
    effect: str | None = None


class NodeSpecWire(_Wire):
    unschedulable: bool | None = None
    taints: list[TaintWire] | None = None


class NodeInfoWire(_Wire):
    kubeletVersion: str | None = None
    containerRuntimeVersion: str | None = None
    kernelVersion: str | None = None
    osImage: str | None = None


class NodeStatusWire(_Wire):
    capacity: dict[str, str] | None = None
    allocatable: dict[str, str] | None = None
    conditions: list[ConditionWire] | None = None
    nodeInfo: NodeInfoWire | None = None


class NodeWire(_Wire):
    metadata: ObjectMetaWire | None = None
    spec: NodeSpecWire | None = None
    status: NodeStatusWire | None = None


class ResourcesWire(_Wire):
    requests: dict[str, str] | None = None
    limits: dict[str, str] | None = None


class ContainerWire(_Wire):
    name: str | None = None
    image: str | None = None
    resources: ResourcesWire | None = None


class PodSpecWire(_Wire):
    nodeName: str | None = None
    # NB: a watch BOOKMARK's pod says `"containers": null`.
    containers: list[ContainerWire] | None = None
    # Where the pod may land, kept as raw JSON: decoded (`placement_of`) only for pods
    # that ask for a GPU, so the operator's thousands of DaemonSet pods (tolerations and
    # affinity each) cost the cache's cold start nothing.
    nodeSelector: msgspec.Raw = msgspec.Raw()
    affinity: msgspec.Raw = msgspec.Raw()
    tolerations: msgspec.Raw = msgspec.Raw()


class NodeRequirementWire(_Wire):
    key: str | None = None
    operator: str | None = None
    values: list[str] | None = None


class NodeSelectorTermWire(_Wire):
    matchExpressions: list[NodeRequirementWire] | None = None
    matchFields: list[NodeRequirementWire] | None = None


class NodeSelectorWire(_Wire):
    nodeSelectorTerms: list[NodeSelectorTermWire] | None = None


class NodeAffinityWire(_Wire):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelectorWire | None = None


class AffinityWire(_Wire):
    nodeAffinity: NodeAffinityWire | None = None


class TolerationWire(_Wire):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None


class WaitingWire(_Wire):
    reason: str | None = None


class TerminatedWire(_Wire):
    reason: str | None = None
    exitCode: int | None = None
    # The container's termination message (with FallbackToLogsOnError: its log's tail).
    message: str | None = None


class ContainerStateWire(_Wire):
    waiting: WaitingWire | None = None
    running: dict[str, Any] | None = None
    terminated: TerminatedWire | None = None


class ContainerStatusWire(_Wire):
    name: str | None = None
    image: str | None = None
    ready: bool | None = None
    restartCount: int | None = None
    state: ContainerStateWire | None = None
    lastState: ContainerStateWire | None = None


class PodStatusWire(_Wire):
    phase: str | None = None
    # Why the kubelet failed the pod as a whole (e.g. OutOfnvidia.com/gpu, DeadlineExceeded).
    reason: str | None = None
    message: str | None = None
    # The pod's address on the cluster network (status.podIP); absent until the pod has one.
    podIP: str | None = None
    conditions: list[ConditionWire] | None = None
    containerStatuses: list[ContainerStatusWire] | None = None
    initContainerStatuses: list[ContainerStatusWire] | None = None


class PodWire(_Wire):
    metadata: ObjectMetaWire | None = None
    spec: PodSpecWire | None = None
    status: PodStatusWire | None = None


class ScopedResourceSelectorRequirementWire(_Wire):
    scopeName: str | None = None


class ScopeSelectorWire(_Wire):
    matchExpressions: list[ScopedResourceSelectorRequirementWire] | None = None


class ResourceQuotaSpecWire(_Wire):
    hard: dict[str, str] | None = None
    scopes: list[str] | None = None
    scopeSelector: ScopeSelectorWire | None = None


class ResourceQuotaStatusWire(_Wire):
    used: dict[str, str] | None = None


class ResourceQuotaWire(_Wire):
    metadata: ObjectMetaWire | None = None
    spec: ResourceQuotaSpecWire | None = None
    status: ResourceQuotaStatusWire | None = None


class EnvVarWire(_Wire):
    name: str | None = None
    value: str | None = None


class TemplateContainerWire(_Wire):
    """A container of a DaemonSet's or Deployment's pod template. Unlike a pod's
    (`ContainerWire`) it keeps the environment: a pod list must not pay for it."""

    name: str | None = None
    image: str | None = None
    env: list[EnvVarWire] | None = None


class PodTemplateSpecWire(_Wire):
    containers: list[TemplateContainerWire] | None = None
    nodeSelector: dict[str, str] | None = None


class PodTemplateWire(_Wire):
    spec: PodTemplateSpecWire | None = None


class DeploymentSpecWire(_Wire):
    replicas: int | None = None
    template: PodTemplateWire | None = None


class DeploymentStatusWire(_Wire):
    readyReplicas: int | None = None


class DeploymentWire(_Wire):
    metadata: ObjectMetaWire | None = None
    spec: DeploymentSpecWire | None = None
    status: DeploymentStatusWire | None = None


class DaemonSetSpecWire(_Wire):
    template: PodTemplateWire | None = None


class DaemonSetWire(_Wire):
    metadata: ObjectMetaWire | None = None
    spec: DaemonSetSpecWire | None = None


class ManagedFieldsEntryWire(_Wire):
    manager: str | None = None
    operation: str | None = None
    # The fields it owns as the API's own tree ({"f:spec": {"f:driver": {"f:version": {}}}}).
    fieldsV1: dict[str, Any] | None = None


class CustomObjectMetaWire(ObjectMetaWire):
    """A custom object's metadata keeps its managedFields: there are a few such objects,
    and who owns the driver version is read from them."""

    managedFields: list[ManagedFieldsEntryWire] | None = None


class CustomObjectWire(_Wire):
    """A ClusterPolicy or NVIDIADriver: spec and status stay generic JSON."""

    kind: str | None = None
    metadata: CustomObjectMetaWire | None = None
    # Free-form: a CR's schema decides, and may allow null.
    spec: dict[str, Any] | None = None
    status: dict[str, Any] | None = None


Item = TypeVar("Item")


class ListMetaWire(_Wire):
    resourceVersion: str | None = None
    continue_: str | None = field(name="continue", default=None)


class ListPageWire(_Wire, Generic[Item]):
    metadata: ListMetaWire | None = None
    items: list[Item] | None = None


class WatchEventWire(_Wire):
    """One line of a watch; the object is decoded once its type says how."""

    type: str
    object: msgspec.Raw = msgspec.Raw(b"{}")


# The API may send null for any field its Go types do not mark `omitempty` (a BOOKMARK
# pod says `"containers": null`), so every field above is optional and read through
# these, which turn a null into the empty value.
_NO_META = ObjectMetaWire()
_NO_NODE_SPEC = NodeSpecWire()
_NO_NODE_STATUS = NodeStatusWire()
_NO_POD_SPEC = PodSpecWire()
_NO_POD_STATUS = PodStatusWire()
_NO_RESOURCES = ResourcesWire()
_NO_CONTAINER_STATE = ContainerStateWire()
_NO_LIST_META = ListMetaWire()


def meta_of(obj: NodeWire | PodWire | DeploymentWire | DaemonSetWire | CustomObjectWire | ResourceQuotaWire) -> ObjectMetaWire:
    return obj.metadata or _NO_META


def pod_spec_of(pod: PodWire) -> PodSpecWire:
    return pod.spec or _NO_POD_SPEC


def list_meta_of(page: ListPageWire[Any]) -> ListMetaWire:
    return page.metadata or _NO_LIST_META


def labels_of(meta: ObjectMetaWire) -> Mapping[str, str]:
    return meta.labels or _EMPTY


def object_key(obj: NodeWire | PodWire | DeploymentWire | DaemonSetWire | CustomObjectWire) -> str:
    """namespace/name, or the name of a cluster-scoped object."""
    meta = meta_of(obj)
    return f"{meta.namespace}/{meta.name or ''}" if meta.namespace else (meta.name or "")


# --- schemas to views ------------------------------------------------------------------


def _quantity(value: str) -> int:
    """GPU quantities are whole numbers ("8"); anything else counts as 0."""
    try:
        return int(value)
    except ValueError:
        return 0


def gpu_requests(spec: PodSpecWire) -> dict[str, int]:
    """Per GPU resource, the sum over containers of max(request, limit)."""
    totals: dict[str, int] = {}
    for container in spec.containers or ():
        resources = container.resources or _NO_RESOURCES
        requests, limits = resources.requests or _EMPTY, resources.limits or _EMPTY
        if not requests and not limits:
            continue
        for name in requests.keys() | limits.keys():
            if is_gpu_resource(name):
                amount = max(_quantity(requests.get(name) or "0"), _quantity(limits.get(name) or "0"))
                totals[name] = totals.get(name, 0) + amount
    return totals


_NO_NODE_INFO_WIRE = NodeInfoWire()


def _node_info(status: NodeStatusWire) -> NodeInfo:
    info = status.nodeInfo or _NO_NODE_INFO_WIRE
    return NodeInfo(kubelet_version=info.kubeletVersion or "",
                    container_runtime_version=info.containerRuntimeVersion or "",
                    kernel_version=info.kernelVersion or "", os_image=info.osImage or "")


def node_view(wire: NodeWire) -> NodeObject:
    meta, spec, status = meta_of(wire), wire.spec or _NO_NODE_SPEC, wire.status or _NO_NODE_STATUS
    ready: bool | None = None
    ready_changed: dt.datetime | None = None
    for condition in status.conditions or ():
        if condition.type == "Ready":
            ready = condition.status == "True"
            ready_changed = condition.lastTransitionTime
    return NodeObject(
        name=NodeName(meta.name or ""),
        labels=frozen_map(meta.labels),
        annotations=frozen_map(meta.annotations),
        unschedulable=spec.unschedulable is True,
        taints=tuple(Taint(key=t.key or "", value=t.value or "", effect=t.effect or "") for t in spec.taints or ()),
        ready=ready,
        ready_changed_at=ready_changed,
        capacity=frozen_map(status.capacity),
        allocatable=frozen_map(status.allocatable),
        created_at=meta.creationTimestamp or EPOCH,
        resource_version=meta.resourceVersion or "",
        info=_node_info(status),
    )


def _containers(statuses: list[ContainerStatusWire] | None) -> tuple[ContainerState, ...]:
    states = []
    for cs in statuses or ():
        state, last = cs.state or _NO_CONTAINER_STATE, cs.lastState or _NO_CONTAINER_STATE
        states.append(ContainerState(
            name=cs.name or "", image=cs.image or "", ready=cs.ready is True, restart_count=cs.restartCount or 0,
            waiting_reason=state.waiting.reason if state.waiting else None,
            last_terminated_reason=last.terminated.reason if last.terminated else None,
            running=state.running is not None,
            terminated=Terminated(reason=state.terminated.reason, exit_code=state.terminated.exitCode,
                                  message=state.terminated.message) if state.terminated else None,
        ))
    return tuple(states)


_SELECTOR = msgspec.json.Decoder(dict[str, str] | None)
_AFFINITY = msgspec.json.Decoder(AffinityWire | None)
_TOLERATIONS = msgspec.json.Decoder(list[TolerationWire] | None)


def _requirements(found: list[NodeRequirementWire] | None) -> tuple[NodeRequirement, ...]:
    return tuple(NodeRequirement(key=r.key or "", operator=r.operator or "", values=tuple(r.values or ()))
                 for r in found or ())


@functools.lru_cache(maxsize=512)
def _placement(selector: bytes, affinity: bytes, tolerations: bytes) -> Placement:
    # NB: memoized on the raw JSON, so the pods of one workload share one frozen value.
    node_selector = _SELECTOR.decode(selector) if selector else None
    found = _AFFINITY.decode(affinity) if affinity else None
    required = None
    if found is not None and found.nodeAffinity is not None:
        required = found.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
    terms = tuple(NodeSelectorTerm(match_expressions=_requirements(t.matchExpressions),
                                   match_fields=_requirements(t.matchFields))
                  for t in required.nodeSelectorTerms or ()) if required is not None else ()
    tolerated = _TOLERATIONS.decode(tolerations) if tolerations else None
    placement = Placement(
        node_selector=frozen_map(node_selector), required_terms=terms,
        tolerations=tuple(Toleration(key=t.key or "", operator=t.operator or "Equal", value=t.value or "",
                                     effect=t.effect or "") for t in tolerated or ()))
    return ANYWHERE if placement == ANYWHERE else placement


def placement_of(spec: PodSpecWire) -> Placement:
    """Where a pod may land: its nodeSelector, required node affinity and tolerations."""
    return _placement(bytes(spec.nodeSelector), bytes(spec.affinity), bytes(spec.tolerations))


def pod_view(wire: PodWire) -> PodObject:
    meta, spec, status = meta_of(wire), pod_spec_of(wire), wire.status or _NO_POD_STATUS
    requests = gpu_requests(spec)
    return PodObject(
        namespace=meta.namespace or "",
        name=meta.name or "",
        node_name=NodeName(spec.nodeName) if spec.nodeName else None,
        labels=frozen_map(meta.labels),
        annotations=frozen_map(meta.annotations),
        phase=status.phase or "Pending",
        status_reason=status.reason,
        status_message=status.message,
        ready=any(c.type == "Ready" and c.status == "True" for c in status.conditions or ()),
        deleting=meta.deletionTimestamp is not None,
        owners=tuple(OwnerRef(kind=o.kind or "", name=o.name or "", controller=o.controller is True)
                     for o in meta.ownerReferences or ()),
        containers=_containers(status.containerStatuses),
        init_containers=_containers(status.initContainerStatuses),
        images=tuple(c.image or "" for c in spec.containers or ()),
        gpu_requests=frozen_map(requests),
        created_at=meta.creationTimestamp or EPOCH,
        resource_version=meta.resourceVersion or "",
        placement=placement_of(spec) if requests else ANYWHERE,
        ip=status.podIP or None,
    )


def _gpu_entries(values: dict[str, str] | None) -> Mapping[str, str]:
    """Quota keys that name a GPU resource: `requests.X`, `limits.X` or `X`."""
    found = {k: v for k, v in (values or {}).items()
             if is_gpu_resource(k.removeprefix("requests.").removeprefix("limits."))}
    return frozen_map(found)


def resource_quota_view(wire: ResourceQuotaWire) -> ResourceQuotaObject:
    meta = meta_of(wire)
    spec = wire.spec or ResourceQuotaSpecWire()
    selected = (spec.scopeSelector.matchExpressions if spec.scopeSelector else None) or ()
    scopes = [*(spec.scopes or ()), *(r.scopeName or "" for r in selected)]
    return ResourceQuotaObject(namespace=meta.namespace or "", name=meta.name or "", hard=_gpu_entries(spec.hard),
                               used=_gpu_entries(wire.status.used if wire.status else None),
                               scopes=tuple(s for s in scopes if s))


def deployment_view(wire: DeploymentWire) -> DeploymentObject:
    meta = meta_of(wire)
    spec = wire.spec or DeploymentSpecWire()
    template = (spec.template.spec if spec.template else None) or PodTemplateSpecWire()
    return DeploymentObject(
        namespace=meta.namespace or "", name=meta.name or "", labels=frozen_map(meta.labels),
        images=tuple(c.image or "" for c in template.containers or ()),
        replicas=spec.replicas if spec.replicas is not None else 1,
        ready_replicas=(wire.status.readyReplicas if wire.status else None) or 0,
    )


def driver_template_view(wire: DaemonSetWire) -> DriverTemplate:
    meta = meta_of(wire)
    template = (wire.spec.template.spec if wire.spec and wire.spec.template else None) or PodTemplateSpecWire()
    containers = template.containers or []
    driver = next((c for c in containers if c.name == DRIVER_CONTAINER), containers[0] if containers else None)
    return DriverTemplate(
        namespace=meta.namespace or "", name=meta.name or "",
        template_generation=(meta.annotations or _EMPTY).get(ANNOTATION_TEMPLATE_GENERATION),
        driver_image=driver.image if driver else None,
        node_selector=frozen_map(template.nodeSelector), deleting=meta.deletionTimestamp is not None,
    )


def toolkit_template_view(wire: DaemonSetWire) -> ToolkitTemplate:
    meta = meta_of(wire)
    template = (wire.spec.template.spec if wire.spec and wire.spec.template else None) or PodTemplateSpecWire()
    containers = template.containers or []
    toolkit = next((c for c in containers if c.name == TOOLKIT_CONTAINER), containers[0] if containers else None)
    env = {e.name: e.value for e in (toolkit.env if toolkit else None) or () if e.name}
    return ToolkitTemplate(namespace=meta.namespace or "", name=meta.name or "",
                           runtime=env.get(ENV_TOOLKIT_RUNTIME) or None,
                           runtime_class=env.get(ENV_TOOLKIT_RUNTIME_CLASS) or None)


def custom_object_view(wire: CustomObjectWire) -> CustomObject:
    meta = wire.metadata or _NO_CUSTOM_META
    managers = tuple(
        FieldManager(manager=entry.manager or "unknown", operation=entry.operation or "",
                     spec_fields=frozenset(_field_paths((entry.fieldsV1 or {}).get("f:spec"))))
        for entry in meta.managedFields or ()
    )
    return CustomObject(
        kind=wire.kind or "", name=meta.name or "", labels=frozen_map(meta.labels),
        annotations=frozen_map(meta.annotations), spec=frozen_map(wire.spec), status=frozen_map(wire.status),
        created_at=meta.creationTimestamp or EPOCH, resource_version=meta.resourceVersion or "",
        field_managers=managers,
    )


_NO_CUSTOM_META = CustomObjectMetaWire()


def _field_paths(tree: object, prefix: str = "") -> list[str]:
    """The leaf fields of a managedFields tree as dotted paths ("driver.version"); list
    items ("k:", "v:", "i:") end the path at their list."""
    if not isinstance(tree, dict) or not tree:
        return [prefix] if prefix else []
    paths: list[str] = []
    for key, below in tree.items():
        if key == ".":
            continue
        if not key.startswith("f:"):
            if prefix:
                paths.append(prefix)
            continue
        paths.extend(_field_paths(below, f"{prefix}.{key[2:]}" if prefix else key[2:]))
    return paths
