"""The node as a whole: what one GPU node looks like at one moment, the assembly that
answers `/gpu node` (`NodeInventory`, from `assess_node`).

Pure domain logic over the frozen views in `workflows.kube.objects`: no API calls, no clock
(time is the `now` argument), no Kubernetes client. The work is split for a 5,000-node
watch cache:

- `fleet_context(snapshot)` (`fleet.operator_settings`) reads the few cluster-level
  objects once (ClusterPolicy, NVIDIADriver CRs, the operator Deployment).
- `assess_node(...)` here looks at one node and the pods bound to it, and depends on
  nothing else, so the cache memoizes it per node and recomputes only nodes that changed.
  It asks each question of its own module: the pods on the node (`fleet.pods`), the
  operator's settings that reach it (`fleet.operator_settings`), a driver upgrade or MIG
  change under way (`fleet.node_changes`), who owns the driver (`fleet.driver_owner`).
- `summarize(...)` (`fleet.summary`) folds the node inventories into pools
  (`fleet.pool`) and findings in one pass.

The labels, annotations and states read here are the ones in
shared/reference/gpu-operator/FACTS.md; the wording of findings lives in
`workflows.fleet.findings`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from workflows.fleet.driver_owner import DriverOwnership, gfd_driver_version, judge_driver_owner
from workflows.fleet.loose_values import int_or_none, parse_time, str_or_none
from workflows.fleet.node_changes import MigStatus, UpgradeStatus, mig_status, upgrade_status
from workflows.fleet.operator_settings import FleetContext
from workflows.fleet.pods import (
    MISSING_POD,
    GpuPod,
    OperandPod,
    PodState,
    every_operand,
    first_pod_state,
    gpu_pods,
    misplaced,
    operand_pods,
    other_device_plugins,
    pod_state,
)
from workflows.fleet.settings import InventorySettings
from workflows.kube.labels import (
    ANNOTATION_CORDONED_BY,
    LABEL_DEPLOY_DRIVER,
    LABEL_DEPLOY_PREFIX,
    LABEL_GPU_COUNT,
    LABEL_GPU_PRESENT,
    LABEL_GPU_PRODUCT,
    LABEL_GPU_REPLICAS,
    LABEL_MIG_STRATEGY,
    LABEL_SHARING_STRATEGY,
    PAUSED_FOR_MIG_CHANGE,
    PAUSED_PREFIX,
)
from workflows.kube.objects import (
    GPU_RESOURCE,
    GPU_SHARED_RESOURCE,
    MIG_RESOURCE_PREFIX,
    NO_NODE_INFO,
    NodeInfo,
    NodeName,
    NodeObject,
    PodObject,
    PoolName,
    is_gpu_resource,
)

_NVIDIA = "nvidia.com/"

UNPOOLED = PoolName("unpooled")


def is_gpu_node(node: NodeObject) -> bool:
    """Any one sign is enough: the operator's label, GFD's count, or a GPU resource the
    device plugin registered (even with 0 devices, which is itself worth reporting)."""
    if node.labels.get(LABEL_GPU_PRESENT) == "true" or LABEL_GPU_COUNT in node.labels:
        return True
    return any(is_gpu_resource(name) for name in node.capacity)


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
    # Every pod of the operator's namespace on the node, by operand.
    operands: tuple[OperandPod, ...] = ()
    # The pods holding GPUs here, with their owners.
    gpu_pods: tuple[GpuPod, ...] = ()
    # NVIDIA device plugin pods here that are not the operator's (a hand-installed one).
    other_device_plugins: tuple[PodState, ...] = ()
    # The operator runs its device plugin here, or its deploy label says it will.
    operator_device_plugin: bool = False

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
        enabled = self.mig.enabled
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
    operands = operand_pods(pods_on_node, namespace=context.operator_namespace)
    requested = operands.requested
    driver_states = tuple(pod_state(p, template_version=context.behind_template(p)) for p in operands.driver)
    driver_pod = driver_states[0] if driver_states else MISSING_POD
    device_plugin_pod = first_pod_state(operands.device_plugin)
    validator_pod = first_pod_state(operands.validator)

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
                mig_expected[MIG_RESOURCE_PREFIX + profile] = int_or_none(value) or 0
            elif attribute == "replicas":
                mig_replicas[MIG_RESOURCE_PREFIX + profile] = max(int_or_none(value) or 1, 1)

    product = labels.get(LABEL_GPU_PRODUCT)
    count = int_or_none(labels.get(LABEL_GPU_COUNT))
    replicas = max(int_or_none(labels.get(LABEL_GPU_REPLICAS)) or 1, 1)
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
            capacity=int_or_none(node.capacity.get(name)) or 0,
            allocatable=int_or_none(node.allocatable.get(name)) or 0,
            requested=requested.get(name, 0),
        )
        for name in names
    )

    gfd_version = gfd_driver_version(labels)
    upgrade = upgrade_status(node)
    mig = mig_status(node, strategy=strategy)
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
        misplaced=misplaced(pods_on_node, settings.placement.get(pool), mig),
        node_info=node.info,
        precompiled=context.precompiled_for(labels),
        operands=every_operand(pods_on_node, namespace=context.operator_namespace),
        gpu_pods=gpu_pods(pods_on_node),
        other_device_plugins=other_device_plugins(pods_on_node, namespace=context.operator_namespace),
        operator_device_plugin=device_plugin_pod.present or labels.get(LABEL_DEPLOY_PREFIX + "device-plugin") == "true",
    )


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
    return (str_or_none(mark.get("by")), str_or_none(mark.get("run")), parse_time(at if isinstance(at, str) else None),
            mark.get("prior_unschedulable") is True)
