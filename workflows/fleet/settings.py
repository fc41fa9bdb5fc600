"""How gpuops reads the fleet, parsed once from configuration (`InventorySettings`), with
each pool's documented placement of workloads on MIG slices and whole GPUs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from workflows.fleet.platform import KubernetesRange, shipped_operator_support
from workflows.kinds import PoolKind
from workflows.kube.objects import PodObject, PoolName


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
class PoolPlacement:
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
    placement: Mapping[str, PoolPlacement] = field(default_factory=lambda: MappingProxyType({}))
    operator_support: Mapping[str, KubernetesRange] = field(default_factory=shipped_operator_support)

    def kind_of(self, pool: PoolName) -> PoolKind | None:
        return self.pool_kinds.get(pool)
