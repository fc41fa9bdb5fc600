"""An in-memory cluster for the engine's unit tests: the `KubeGateway` calls the steps
make (fresh reads, node patches, evictions, deletes) and the watch cache's `fleet(now)`,
over plain node and pod values, recording every write with all its arguments.

It answers like the API server where gpuops depends on it: a patch naming an old
resourceVersion is a Conflict; an eviction or delete naming another uid is a Conflict and
a missing pod NotFound; an eviction a PodDisruptionBudget forbids is a 429
(TooManyRequests) whether or not it is a dry run; a dry run changes nothing. An evicted
or deleted pod is gone at once, unless the test said it terminates slowly (then it is
`deleting` until `terminate` is called). Handed to tests by the `fake_cluster` fixture.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workflows.fleet.settings import InventorySettings
from workflows.fleet.summary import Fleet, build_fleet
from workflows.kube.errors import Conflict, NotFound, TooManyRequests
from workflows.kube.objects import ClusterSnapshot, NodeObject, PodObject, PodOnNode
from workflows.pools.selectors import LabelSelector

PDB_REFUSAL = "Cannot evict pod as it would violate the pod's disruption budget."


@dataclass(frozen=True)
class Write:
    """One write as the gateway was asked for it."""

    verb: str  # cordon, uncordon, annotate, label, evict, delete
    target: str  # "gpu-01" or "ml/trainer-0"
    args: Mapping[str, Any] = field(default_factory=dict)


class FakeCluster:
    identity = "system:serviceaccount:gpuops:gpuops"

    def __init__(self, snapshot: Callable[..., ClusterSnapshot]) -> None:
        self._snapshot = snapshot  # FleetBuilder.snapshot: nodes and pods -> ClusterSnapshot
        self.nodes: dict[str, NodeObject] = {}
        self.pods: dict[str, PodOnNode] = {}  # by uid
        self.blocked: set[str] = set()  # uids a PodDisruptionBudget protects
        self.slow: set[str] = set()  # uids that stay terminating after an eviction or delete
        self.racing: set[str] = set()  # uids whose controller removes them just before our call
        self.writes: list[Write] = []
        self._versions = itertools.count(100)

    # --- what the test sets up
    def add_node(self, node: NodeObject) -> None:
        self.nodes[node.name] = dataclasses.replace(node, resource_version=str(next(self._versions)))

    def add_pod(self, pod: PodObject, *, uid: str, visible_devices: str | None = None) -> None:
        self.pods[uid] = PodOnNode(pod=pod, uid=uid, visible_devices=visible_devices)

    def terminate(self, uid: str) -> None:
        """A terminating pod is finally gone."""
        self.pods.pop(uid, None)

    def node(self, name: str) -> NodeObject:
        return self.nodes[name]

    def did(self, *verbs: str) -> list[tuple[str, str]]:
        """The writes of these verbs, as (verb, target), in order; every write without verbs."""
        return [(w.verb, w.target) for w in self.writes if not verbs or w.verb in verbs]

    # --- the gateway's reads
    def get_node(self, name: str) -> NodeObject:
        if name not in self.nodes:
            raise NotFound(f"GET /api/v1/nodes/{name}: nodes \"{name}\" not found", status=404)
        return self.nodes[name]

    def list_pods_on_node(self, node: str, *, label_selector: str | None = None) -> list[PodOnNode]:
        selector = LabelSelector.parse(label_selector) if label_selector else None
        return [p for p in self.pods.values()
                if p.pod.node_name == node and (selector is None or selector.matches(p.pod.labels))]

    # --- the gateway's writes
    def _patch(self, verb: str, name: str, *, dry_run: bool, resource_version: str | None,
               unschedulable: bool | None = None, annotations: Mapping[str, str | None] | None = None,
               labels: Mapping[str, str | None] | None = None) -> NodeObject:
        self.writes.append(Write(verb, name, {"annotations": dict(annotations or {}), "labels": dict(labels or {}),
                                              "resource_version": resource_version, "dry_run": dry_run}))
        node = self.get_node(name)
        if resource_version and resource_version != node.resource_version:
            raise Conflict(f"PATCH /api/v1/nodes/{name}: the object has been modified", status=409)
        if dry_run:
            return node
        changed = dataclasses.replace(
            node, annotations=merged(node.annotations, annotations), labels=merged(node.labels, labels),
            unschedulable=node.unschedulable if unschedulable is None else unschedulable,
            resource_version=str(next(self._versions)))
        self.nodes[name] = changed
        return changed

    def cordon_node(self, name: str, *, annotations: Mapping[str, str | None], resource_version: str | None,
                    dry_run: bool) -> NodeObject:
        return self._patch("cordon", name, unschedulable=True, annotations=annotations,
                           resource_version=resource_version, dry_run=dry_run)

    def uncordon_node(self, name: str, *, annotations: Mapping[str, str | None], resource_version: str | None,
                      dry_run: bool) -> NodeObject:
        return self._patch("uncordon", name, unschedulable=False, annotations=annotations,
                           resource_version=resource_version, dry_run=dry_run)

    def annotate_node(self, name: str, *, annotations: Mapping[str, str | None], resource_version: str | None,
                      dry_run: bool) -> NodeObject:
        return self._patch("annotate", name, annotations=annotations, resource_version=resource_version,
                           dry_run=dry_run)

    def label_node(self, name: str, *, labels: Mapping[str, str | None], dry_run: bool,
                   resource_version: str | None = None) -> NodeObject:
        return self._patch("label", name, labels=labels, resource_version=resource_version, dry_run=dry_run)

    def _pod_named(self, verb: str, namespace: str, name: str, uid: str) -> PodOnNode:
        where = f"{verb} /api/v1/namespaces/{namespace}/pods/{name}"
        if uid in self.racing:
            self.pods.pop(uid, None)
        found = [p for p in self.pods.values() if (p.pod.namespace, p.pod.name) == (namespace, name)]
        if not found:
            raise NotFound(f"{where}: pods \"{name}\" not found", status=404)
        if found[0].uid != uid:
            raise Conflict(f"{where}: Precondition failed: UID in precondition: {uid}, UID in object meta: "
                           f"{found[0].uid}", status=409)
        return found[0]

    def _remove(self, pod: PodOnNode) -> None:
        if pod.uid in self.slow:
            self.pods[pod.uid] = dataclasses.replace(pod, pod=dataclasses.replace(pod.pod, deleting=True))
        else:
            del self.pods[pod.uid]

    def evict_pod(self, namespace: str, name: str, *, uid: str, dry_run: bool) -> None:
        self.writes.append(Write("evict", f"{namespace}/{name}", {"uid": uid, "dry_run": dry_run}))
        pod = self._pod_named("POST", namespace, name, uid)
        if uid in self.blocked:
            raise TooManyRequests(f"POST /api/v1/namespaces/{namespace}/pods/{name}/eviction: {PDB_REFUSAL}",
                                  retry_after=None, status=429, reason="TooManyRequests", api_message=PDB_REFUSAL)
        if not dry_run:
            self._remove(pod)

    def delete_pod(self, namespace: str, name: str, *, uid: str, dry_run: bool,
                   grace_seconds: int | None = None) -> None:
        self.writes.append(Write("delete", f"{namespace}/{name}", {"uid": uid, "dry_run": dry_run,
                                                                   "grace_seconds": grace_seconds}))
        pod = self._pod_named("DELETE", namespace, name, uid)
        if not dry_run:
            self._remove(pod)

    # --- the watch cache (workflows.engine.NodeSource)
    def add_listener(self, listener: Callable[[str, str, Any], None]) -> None:
        return None  # the tests drive the engine pass by pass

    def fleet(self, now: dt.datetime) -> Fleet:
        snapshot = self._snapshot(list(self.nodes.values()), [p.pod for p in self.pods.values()])
        return build_fleet(snapshot, settings=InventorySettings(), now=now)


def merged(base: Mapping[str, str], changes: Mapping[str, str | None] | None) -> dict[str, str]:
    """`base` with `changes` applied as a merge patch applies them (None removes a key)."""
    merged = dict(base)
    for key, value in (changes or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged
