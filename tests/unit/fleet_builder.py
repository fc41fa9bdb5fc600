"""Small builders for the plain values the inventory reads.

A default node is a healthy 8 x H100 node in pool `train-a` with a Ready operator
driver at 580.95.05; tests change only what their story is about. Builders are handed
out through the `make` fixture (tests/unit/conftest.py); a test imports only the time
they are built at, `NOW`.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from fake_cluster import merged

from workflows.fleet.assessment import NodeInventory
from workflows.fleet.settings import InventorySettings
from workflows.fleet.summary import Fleet, build_fleet
from workflows.kube.objects import (
    ClusterSnapshot,
    ContainerState,
    CustomObject,
    DeploymentObject,
    DriverTemplate,
    FieldManager,
    NodeName,
    NodeObject,
    OwnerRef,
    PodObject,
)

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
OPERATOR_NS = "gpu-operator"
DRIVER_VERSION = "580.95.05"

_names = itertools.count(1)


class FleetBuilder:
    now = NOW

    # ---------------------------------------------------------------- nodes
    def node(
        self,
        name: str = "gpu-h100-01",
        *,
        pool: str | None = "train-a",
        pool_label_key: str = "gpuops.io/pool",
        gpus: int = 8,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str] | None = None,
        capacity: Mapping[str, str | None] | None = None,
        allocatable: Mapping[str, str | None] | None = None,
        ready: bool | None = True,
        ready_changed_at: dt.datetime | None = None,
        unschedulable: bool = False,
    ) -> NodeObject:
        base_labels = {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/cuda.driver-version.full": DRIVER_VERSION,
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/mig.config": "all-disabled",
            "nvidia.com/mig.config.state": "success",
            "nvidia.com/gpu.deploy.driver": "true",
            "nvidia.com/gpu.deploy.device-plugin": "true",
            "nvidia.com/gpu.deploy.operator-validator": "true",
        }
        if pool is not None:
            base_labels[pool_label_key] = pool
        base_capacity = {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus)}
        cap = merged(base_capacity, capacity)
        return NodeObject(
            name=NodeName(name),
            labels=merged(base_labels, labels),
            annotations=dict(annotations or {}),
            unschedulable=unschedulable,
            taints=(),
            ready=ready,
            ready_changed_at=ready_changed_at,
            capacity=cap,
            allocatable=merged(cap, allocatable),
            created_at=NOW - dt.timedelta(days=30),
        )

    def cpu_node(self, name: str = "cpu-01") -> NodeObject:
        return NodeObject(
            name=NodeName(name),
            labels={"gpuops.io/pool": "system"},
            annotations={},
            unschedulable=False,
            taints=(),
            ready=True,
            ready_changed_at=None,
            capacity={"cpu": "16"},
            allocatable={"cpu": "16"},
            created_at=NOW - dt.timedelta(days=30),
        )

    # ---------------------------------------------------------------- pods
    def pod(
        self,
        *,
        node: str | None,
        name: str | None = None,
        namespace: str = OPERATOR_NS,
        labels: Mapping[str, str] | None = None,
        phase: str = "Running",
        ready: bool = True,
        deleting: bool = False,
        owner_kind: str | None = "DaemonSet",
        image: str = "nvcr.io/nvidia/k8s-device-plugin:v0.17.2",
        restarts: int = 0,
        waiting_reason: str | None = None,
        last_terminated_reason: str | None = None,
        init_containers: Sequence[ContainerState] = (),
        gpu_requests: Mapping[str, int] | None = None,
        created_at: dt.datetime | None = None,
    ) -> PodObject:
        container = ContainerState(
            name="main",
            image=image,
            ready=ready,
            restart_count=restarts,
            waiting_reason=waiting_reason,
            last_terminated_reason=last_terminated_reason,
            running=phase == "Running" and waiting_reason is None,
        )
        owners = (OwnerRef(kind=owner_kind, name="owner", controller=True),) if owner_kind else ()
        return PodObject(
            namespace=namespace,
            name=name or f"pod-{next(_names)}",
            node_name=NodeName(node) if node else None,
            labels=dict(labels or {}),
            annotations={},
            phase=phase,
            ready=ready,
            deleting=deleting,
            owners=owners,
            containers=(container,),
            init_containers=tuple(init_containers),
            images=(image,),
            gpu_requests=dict(gpu_requests or {}),
            created_at=created_at or NOW - dt.timedelta(hours=1),
        )

    def driver_pod(
        self,
        node: str,
        *,
        version: str = DRIVER_VERSION,
        name: str | None = None,
        namespace: str = OPERATOR_NS,
        generation: str = "1",
        **kwargs: Any,
    ) -> PodObject:
        return self.pod(
            node=node,
            name=name or f"nvidia-driver-daemonset-{next(_names)}",
            namespace=namespace,
            labels={"app": "nvidia-driver-daemonset", "app.kubernetes.io/component": "nvidia-driver",
                    "pod-template-generation": generation},
            image=f"nvcr.io/nvidia/driver:{version}-ubuntu22.04",
            **kwargs,
        )

    def driver_template(self, *, version: str = DRIVER_VERSION, generation: str = "1") -> DriverTemplate:
        """The driver DaemonSet every driver_pod belongs to (its controller is "owner")."""
        return DriverTemplate(namespace=OPERATOR_NS, name="owner", template_generation=generation,
                              driver_image=f"nvcr.io/nvidia/driver:{version}-ubuntu22.04")

    def device_plugin_pod(self, node: str, **kwargs: Any) -> PodObject:
        return self.pod(
            node=node,
            name=f"nvidia-device-plugin-daemonset-{next(_names)}",
            labels={"app": "nvidia-device-plugin-daemonset"},
            **kwargs,
        )

    def validator_pod(self, node: str, **kwargs: Any) -> PodObject:
        return self.pod(
            node=node,
            name=f"nvidia-operator-validator-{next(_names)}",
            labels={"app": "nvidia-operator-validator"},
            image="nvcr.io/nvidia/gpu-operator:v26.7.0",
            **kwargs,
        )

    def workload(
        self, node: str, *, gpus: int, resource: str = "nvidia.com/gpu", **kwargs: Any
    ) -> PodObject:
        kwargs.setdefault("namespace", "ml")
        kwargs.setdefault("owner_kind", "Job")
        # A workload's own image: a device plugin's image outside the operator's namespace is
        # a second device plugin (workflows.fleet.pods).
        kwargs.setdefault("image", "nvcr.io/nvidia/cuda:12.6.3-base-ubuntu24.04")
        return self.pod(node=node, gpu_requests={resource: gpus}, **kwargs)

    def operands(self, node: str) -> list[PodObject]:
        """The healthy operand pods every managed node runs."""
        return [self.driver_pod(node), self.device_plugin_pod(node), self.validator_pod(node)]

    def init_container(
        self, *, waiting_reason: str | None = None, last_terminated_reason: str | None = None,
        restarts: int = 0, running: bool = False,
    ) -> ContainerState:
        return ContainerState(
            name="k8s-driver-manager",
            image="nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.0",
            ready=False,
            restart_count=restarts,
            waiting_reason=waiting_reason,
            last_terminated_reason=last_terminated_reason,
            running=running,
        )

    # ---------------------------------------------------------------- custom objects
    def cluster_policy(
        self,
        name: str = "cluster-policy",
        *,
        driver: Mapping[str, object] | None = None,
        state: str | None = "ready",
        annotations: Mapping[str, str] | None = None,
        created_at: dt.datetime | None = None,
        mig_strategy: str = "single",
        labels: Mapping[str, str] | None = None,
        field_managers: Sequence[FieldManager] = (),
    ) -> CustomObject:
        return CustomObject(
            kind="ClusterPolicy",
            name=name,
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
            spec={"driver": dict(driver if driver is not None else {"enabled": True}),
                  "mig": {"strategy": mig_strategy}},
            status={"state": state} if state else {},
            created_at=created_at or NOW - dt.timedelta(days=60),
            field_managers=tuple(field_managers),
        )

    def nvidia_driver(
        self,
        name: str,
        *,
        node_selector: Mapping[str, str] | None = None,
        auto_upgrade: bool | None = None,
        default: bool = False,
        version: str = DRIVER_VERSION,
    ) -> CustomObject:
        spec: dict[str, object] = {
            "driverType": "gpu",
            "version": version,
            "nodeSelector": dict(node_selector or {}),
            "default": default,
        }
        if auto_upgrade is not None:
            spec["upgradePolicy"] = {"autoUpgrade": auto_upgrade, "maxParallelUpgrades": 1}
        return CustomObject(
            kind="NVIDIADriver",
            name=name,
            labels={},
            annotations={},
            spec=spec,
            status={"state": "ready"},
            created_at=NOW - dt.timedelta(days=10),
        )

    # ---------------------------------------------------------------- snapshots
    def snapshot(
        self,
        nodes: Sequence[NodeObject],
        pods: Sequence[PodObject] = (),
        *,
        operator: bool = True,
        crds: bool = True,
        operator_version: str = "v26.7.0",
        policies: Sequence[CustomObject] | None = None,
        nvidia_drivers: Sequence[CustomObject] = (),
        driver_templates: Sequence[DriverTemplate] = (),
    ) -> ClusterSnapshot:
        if policies is None:
            policies = (self.cluster_policy(),) if crds else ()
        deployment = (
            DeploymentObject(
                namespace=OPERATOR_NS,
                name="gpu-operator",
                labels={"app": "gpu-operator"},
                images=(f"nvcr.io/nvidia/gpu-operator:{operator_version}",),
                replicas=1,
                ready_replicas=1,
            )
            if operator
            else None
        )
        return ClusterSnapshot(
            nodes={n.name: n for n in nodes},
            pods=tuple(pods),
            operator_namespace=OPERATOR_NS if operator else None,
            operator_deployment=deployment,
            operator_crds_installed=crds,
            cluster_policies=tuple(policies),
            nvidia_drivers=tuple(nvidia_drivers),
            driver_templates=tuple(driver_templates),
            taken_at=NOW,
        )

    def fleet(
        self,
        nodes: Sequence[NodeObject],
        pods: Sequence[PodObject] = (),
        *,
        settings: InventorySettings | None = None,
        now: dt.datetime = NOW,
        **snapshot_args: Any,
    ) -> Fleet:
        return build_fleet(
            self.snapshot(nodes, pods, **snapshot_args),
            settings=settings or InventorySettings(),
            now=now,
        )

    def assess(
        self,
        node: NodeObject,
        pods: Sequence[PodObject] | None = None,
        **fleet_args: Any,
    ) -> NodeInventory:
        """One node through the whole pipeline; healthy operand pods unless `pods` given."""
        chosen = self.operands(node.name) if pods is None else pods
        return self.fleet([node], chosen, **fleet_args).nodes[node.name]
