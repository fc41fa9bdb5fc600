"""A watch-backed cache of what the inventory reads: every node, the GPU Operator's
operand pods and every pod that asks for a GPU, the operator Deployment, ClusterPolicies
and NVIDIADrivers.

Each resource is listed once as raw JSON, decoded straight into the schema of what
gpuops reads of it (`workflows.kube.wire`), then watched from that list's resourceVersion;
a watch that ends is resumed from the last version seen, and one whose version expired
(410) is replaced by a fresh list whose differences (including deletions) are applied,
so no change is lost. The fleet view is memoized per node: a
node is assessed again only when it or a pod on it changed, or when cluster-level
objects changed.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from workflows.fleet.assessment import NodeInventory, assess_node
from workflows.fleet.canaries import LastCanaries
from workflows.fleet.first_seen import FirstSeen
from workflows.fleet.operator_settings import FleetContext, fleet_context
from workflows.fleet.pods import looks_like_device_plugin
from workflows.fleet.settings import InventorySettings
from workflows.fleet.summary import Fleet, FleetIndex
from workflows.durations import utc_now
from workflows.kube import wire
from workflows.kube.errors import Gone, KubeError, NotFound, WatchError
from workflows.kube.gateway import KubeGateway
from workflows.kube.gateway.decoding import gc_paused
from workflows.kube.gateway.paths import CLUSTER_POLICIES, DAEMONSETS, DEPLOYMENTS, NODES, NVIDIA_DRIVERS, PODS
from workflows.kube.labels import (
    POD_SELECTOR_DEVICE_PLUGIN,
    POD_SELECTOR_DRIVER,
    POD_SELECTOR_VALIDATOR,
    TOOLKIT_SELECTOR,
)
from workflows.kube.objects import (
    ClusterSnapshot,
    CustomObject,
    DeploymentObject,
    NodeName,
    NodeObject,
    PodObject,
)

log = logging.getLogger("gpuops.watchcache")

_OPERAND_APPS = frozenset({POD_SELECTOR_DEVICE_PLUGIN[1], POD_SELECTOR_VALIDATOR[1]})
OPERATOR_DEPLOYMENT_SELECTOR = "app=gpu-operator"
DRIVER_DAEMONSET_SELECTOR = "=".join(POD_SELECTOR_DRIVER)
TOOLKIT_DAEMONSET_SELECTOR = "=".join(TOOLKIT_SELECTOR)
# Seconds between attempts to reach the API while it does not answer.
_BACKOFF_MIN = 0.5
_BACKOFF_MAX = 30.0


def _keep_pod(pod: wire.PodWire, operator_namespace: str | None) -> bool:
    """Operator pods, GPU-requesting pods and NVIDIA device plugins wherever they run (a
    second one beside the operator's is a finding); the rest of a big cluster stays out."""
    meta = wire.meta_of(pod)
    labels = wire.labels_of(meta)
    if operator_namespace and meta.namespace == operator_namespace:
        return True
    if labels.get(POD_SELECTOR_DRIVER[0]) == POD_SELECTOR_DRIVER[1] or labels.get("app") in _OPERAND_APPS:
        return True
    spec = wire.pod_spec_of(pod)
    return bool(wire.gpu_requests(spec)) or looks_like_device_plugin(
        labels, tuple(c.image or "" for c in spec.containers or ()))


@dataclass
class _Resource:
    name: str
    path: str
    schema: type[Any]  # what is read of each object (workflows.kube.wire)
    label_selector: str | None = None
    optional: bool = False  # a CRD that may not be installed
    store: dict[str, Any] = field(default_factory=dict)
    resource_version: str = ""
    available: bool = True
    relists: int = 0
    bookmarks: int = 0
    watches: int = 0  # watches opened
    # Since when the API has not answered this resource's list or watch (None: it does).
    lost_since: float | None = None
    # When the API last told this resource anything (a list, an event, a bookmark).
    heard: float | None = None
    synced: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True)
class CacheState:
    resource: str
    synced: bool
    available: bool  # False: an optional CRD that is not installed
    relists: int
    silent_for: float | None  # seconds since the API last said anything about it
    lost_for: float | None  # seconds the API has not answered its list or watch


class FleetCache:
    """Start once, then ask `fleet(now)` as often as needed."""

    def __init__(self, gateway: KubeGateway, *, settings: InventorySettings,
                 operator_namespace: str | None = None, watch_timeout: int = 300,
                 first_seen: FirstSeen | None = None, clock: Callable[[], dt.datetime] = utc_now,
                 canaries: LastCanaries | None = None) -> None:
        self._gateway = gateway
        # What time it is when the cache assesses what it lists or sees change (tests and
        # freezegun control it; `fleet(now)` is asked with the caller's own time).
        self._clock = clock
        # Ages of upgrade and MIG states from gpuops' own records (None: only what the
        # nodes say; see workflows.fleet.first_seen).
        self._first_seen = first_seen
        # Each node's last check-pod verdict from gpuops' records (None: no canary findings).
        self._canaries = canaries
        # The API server's version, read at the start and whenever the nodes' watch opens.
        self._kubernetes_version: str | None = None
        self._version_read_at = 0.0
        self._settings = settings
        self._configured_namespace = operator_namespace
        self._watch_timeout = watch_timeout
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._resources = {
            "nodes": _Resource("nodes", NODES, wire.NodeWire),
            "pods": _Resource("pods", PODS, wire.PodWire),
            "deployments": _Resource("deployments", DEPLOYMENTS, wire.DeploymentWire,
                                     label_selector=OPERATOR_DEPLOYMENT_SELECTOR),
            "daemonsets": _Resource("daemonsets", DAEMONSETS, wire.DaemonSetWire,
                                    label_selector=DRIVER_DAEMONSET_SELECTOR),
            "toolkits": _Resource("toolkits", DAEMONSETS, wire.DaemonSetWire,
                                  label_selector=TOOLKIT_DAEMONSET_SELECTOR),
            "clusterpolicies": _Resource("clusterpolicies", CLUSTER_POLICIES, wire.CustomObjectWire, optional=True),
            "nvidiadrivers": _Resource("nvidiadrivers", NVIDIA_DRIVERS, wire.CustomObjectWire, optional=True),
        }
        self._pods_by_node: dict[NodeName, set[str]] = defaultdict(set)
        self._dirty: set[NodeName] = set()
        self._context_dirty = True
        self._context: FleetContext | None = None
        self._assessed: dict[NodeName, NodeInventory] = {}
        # The summary of `_assessed`, kept up to date node by node (see FleetIndex).
        self._index = FleetIndex(settings)
        self._fleet: Fleet | None = None
        self._fleet_at: dt.datetime | None = None
        self._generation = 0
        self._fleet_generation = -1
        self._listeners: list[Callable[[str, str, Any], None]] = []
        self._open_watches: dict[str, Any] = {}

    # --- lifecycle -------------------------------------------------------------------
    def start(self, *, watch: bool = True) -> FleetCache:
        """List everything, then keep it current with watches.

        Pods and the cluster-level objects are listed first (in parallel); nodes come
        last and are assessed page by page while the next page is on its way, so the
        first fleet view costs one summary pass, not 5,000 assessments. The garbage
        collector pauses meanwhile, and what was listed is frozen out of its sight (see
        `gc_paused`): walking the million objects of a big fleet again and again would
        cost more than the assessments."""
        with gc_paused(keep=True):
            self._initial_list()
        if watch:
            self.watch()
        return self

    def _initial_list(self) -> None:
        context_ready = threading.Event()
        # NB: which pods are kept depends on the operator's namespace (its operands, such as
        # the dcgm-exporter and feature discovery, carry no label that says so), which the
        # ClusterPolicies and Deployments tell: pods are fetched alongside them but kept
        # only once they are in. Kept earlier, a quiet operand pod would be missing until
        # its next change, which may be days away.
        namespace_known = threading.Event()
        cluster = [self._resources[name] for name in ("clusterpolicies", "deployments")]
        first = [r for name, r in self._resources.items() if name != "nodes" and r not in cluster]
        lead = [threading.Thread(target=self._list, args=(r,), daemon=True) for r in cluster]
        listers = [threading.Thread(target=self._list, args=(r,), daemon=True,
                                    kwargs={"convert_when": namespace_known} if r.name == "pods" else {})
                   for r in first]
        nodes = threading.Thread(target=self._list, args=(self._resources["nodes"],),
                                 kwargs={"assess_when": context_ready}, daemon=True)
        for thread in [*lead, *listers, nodes]:
            thread.start()
        self._read_kubernetes_version()
        for thread in lead:
            thread.join()
        namespace_known.set()
        for thread in listers:
            thread.join()
        with self._lock:
            self._refresh_context(self._clock())
        context_ready.set()
        nodes.join()
        errors = [r.name for r in self._resources.values() if not r.synced.is_set()]
        if errors:
            raise KubeError(f"could not list {', '.join(errors)}; see the log for the API's answer")

    def watch(self) -> None:
        """Start (or, after `stop`, resume) watching from the last version seen."""
        # NB: a new event each time: a thread of the last watch that `stop` could not join
        # (a stalled connection) keeps its own, set, event and ends; clearing a shared one
        # would bring it back to apply its stale stream beside the new thread's.
        self._stop = threading.Event()
        for resource in self._resources.values():
            thread = threading.Thread(target=self._watch_loop, args=(resource, self._stop),
                                      name=f"watch-{resource.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop watching; what was seen stays in the cache."""
        self._stop.set()
        for response in list(self._open_watches.values()):
            try:
                response.shutdown()
            except (RuntimeError, ValueError, OSError):
                # NB: the watch ended on its own meanwhile (its connection is back in the
                # pool, or never had a socket to cut): nothing left to stop.
                pass
        self._gateway.close_idle_connections()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()
        self._open_watches.clear()

    def add_listener(self, listener: Callable[[str, str, Any], None]) -> None:
        """Called with (resource, event type, view) after each change is applied; the
        engine and notifier react to events this way instead of polling."""
        self._listeners.append(listener)

    def relists(self, resource: str) -> int:
        return self._resources[resource].relists

    def states(self) -> list[CacheState]:
        """Each watched resource as a health check or a metric reads it."""
        now = time.monotonic()
        return [CacheState(resource=r.name, synced=r.synced.is_set(), available=r.available, relists=r.relists,
                           silent_for=None if r.heard is None else now - r.heard,
                           lost_for=None if r.lost_since is None else now - r.lost_since)
                for r in self._resources.values()]

    @property
    def synced(self) -> bool:
        """Every resource listed at least once (a CRD that is not installed counts)."""
        return all(r.synced.is_set() for r in self._resources.values())

    def bookmarks(self, resource: str) -> int:
        """Watch BOOKMARK events seen for `resource` (the API server sends one about every
        minute, and shortly before a watch times out)."""
        return self._resources[resource].bookmarks

    def watches(self, resource: str) -> int:
        """Watches of `resource` opened so far (one more each time the server ends one)."""
        return self._resources[resource].watches

    # --- losing and regaining the API: one line each way per resource, never one per retry
    def _lost(self, resource: _Resource, what: str, err: KubeError) -> None:
        if resource.lost_since is None:
            resource.lost_since = time.monotonic()
            log.warning("%s of %s failed: %s; trying again with backoff (up to %.0f s apart)",
                        what, resource.name, err, _BACKOFF_MAX)
        else:
            log.debug("%s of %s failed again: %s", what, resource.name, err)

    def _answered(self, resource: _Resource) -> None:
        resource.heard = time.monotonic()
        if resource.lost_since is not None:
            log.info("%s: the API answers again after %.0f s", resource.name, time.monotonic() - resource.lost_since)
            resource.lost_since = None

    # --- listing and watching ----------------------------------------------------------
    def _list(self, resource: _Resource, *, assess_when: threading.Event | None = None,
              convert_when: threading.Event | None = None) -> bool:
        """List `resource` into the cache. With `assess_when`, nodes are also assessed as
        their pages arrive, once that event says pods and cluster objects are in. With
        `convert_when`, pages are read while waiting for it and kept once it is set."""
        fresh: dict[str, Any] = {}
        early: dict[NodeName, NodeInventory] = {}
        waiting: list[NodeObject] = []
        now = self._clock()

        def assess_waiting() -> None:
            if assess_when is None or not assess_when.is_set() or self._context is None:
                return
            for node in waiting:
                early[node.name] = self._assess(node, self.pods_on(node.name), now)
            waiting.clear()

        def convert(items: list[Any]) -> None:
            if convert_when is not None:
                convert_when.wait()
            for obj in items:
                view = self._convert(resource, obj)
                if view is not None:
                    fresh[self._key(obj)] = view
                    if assess_when is not None:
                        waiting.append(view)
            assess_waiting()

        try:
            result = self._gateway.list(resource.path, label_selector=resource.label_selector, on_page=convert,
                                        schema=resource.schema)
        except NotFound:
            if not resource.optional:
                raise
            with self._lock:
                if resource.available or not resource.synced.is_set():
                    resource.available = False
                    self._replace(resource, {})
                    self._context_dirty = True
            resource.synced.set()
            return False
        except KubeError as err:
            self._lost(resource, "listing", err)
            return False
        self._answered(resource)
        if assess_when is not None:
            assess_when.wait()
            assess_waiting()
        with self._lock:
            resource.available = True
            self._replace(resource, fresh)
            resource.resource_version = result.resource_version
            if early and not self._context_dirty:
                for name, assessed in early.items():
                    self._assessed[name] = assessed
                    self._index.update(name, assessed)
                self._dirty.difference_update(early)
        resource.synced.set()
        return True

    def _read_kubernetes_version(self) -> None:
        """Note the API server's version; a failure keeps the last one read (the version
        matters for a finding, never enough to hold up the cache)."""
        self._version_read_at = time.monotonic()
        try:
            version = self._gateway.server_version()
        except KubeError as err:
            log.debug("reading the API server's version failed: %s", err)
            return
        with self._lock:
            if version is not None and version != self._kubernetes_version:
                self._kubernetes_version = version
                self._generation += 1
                self._context_dirty = True

    def _watch_loop(self, resource: _Resource, stop: threading.Event) -> None:
        backoff = _BACKOFF_MIN
        while not stop.is_set():
            if not resource.available:
                # A CRD that is not installed: look again now and then.
                if stop.wait(30):
                    return
                self._list(resource)
                continue
            version = resource.resource_version
            opened_before = resource.watches

            def opened(response: Any, resource: _Resource = resource) -> None:
                self._open_watches[resource.name] = response
                if 200 <= response.status <= 299:
                    resource.watches += 1
                    self._answered(resource)

            try:
                for event in self._gateway.watch(
                    resource.path, resource_version=version, timeout_seconds=self._watch_timeout,
                    label_selector=resource.label_selector, schema=resource.schema, on_open=opened,
                ):
                    if stop.is_set():
                        return
                    self._apply(resource, event.type, event.object)
                    backoff = _BACKOFF_MIN
                if (resource.name == "nodes" and not stop.is_set()
                        and time.monotonic() - self._version_read_at >= self._watch_timeout):
                    # The watch ended: an upgraded control plane shows within about one watch
                    # timeout (read at most that often, and never after a failed watch).
                    self._read_kubernetes_version()
            except (Gone, WatchError) as err:
                if isinstance(err, Gone):
                    log.info("watch of %s expired at %s; listing again", resource.name, version)
                else:
                    log.info("watch of %s broke at %s (%s); listing again", resource.name, version,
                             err.api_message)
                resource.relists += 1
                if not self._list(resource):
                    stop.wait(backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX)
                else:
                    backoff = _BACKOFF_MIN
            except KubeError as err:
                if stop.is_set():
                    return
                if resource.watches > opened_before:
                    # NB: the watch opened (the API answers) and then broke: back off from
                    # the start. Otherwise a quiet resource, whose backoff no event resets,
                    # waits longer after each dropped connection, up to the maximum.
                    backoff = _BACKOFF_MIN
                self._lost(resource, "watch", err)
                stop.wait(backoff * (1 + random.random() * 0.2))
                backoff = min(backoff * 2, _BACKOFF_MAX)
                if isinstance(err, NotFound) and resource.optional:
                    with self._lock:
                        resource.available = False
                        self._replace(resource, {})
                        self._context_dirty = True

    def _apply(self, resource: _Resource, kind: str, obj: Any) -> None:
        resource.heard = time.monotonic()
        version = wire.meta_of(obj).resourceVersion
        if kind == "BOOKMARK":
            resource.bookmarks += 1
            if version:
                resource.resource_version = version
            return
        key = self._key(obj)
        view = None if kind == "DELETED" else self._convert(resource, obj)
        with self._lock:
            old = resource.store.get(key)
            if view is None:
                if old is not None:
                    del resource.store[key]
                    self._touch(resource, key, old, None)
            elif old != view:  # a driver DaemonSet's status moves with every pod; its view does not
                resource.store[key] = view
                self._touch(resource, key, old, view)
            if version:
                resource.resource_version = version
        for listener in self._listeners:
            listener(resource.name, kind, view if view is not None else old)

    def _replace(self, resource: _Resource, fresh: dict[str, Any]) -> None:
        for key in set(resource.store) - set(fresh):
            self._touch(resource, key, resource.store.pop(key), None)
        for key, view in fresh.items():
            old = resource.store.get(key)
            if old != view:
                resource.store[key] = view
                self._touch(resource, key, old, view)

    def _touch(self, resource: _Resource, key: str, old: Any, new: Any) -> None:
        """Mark what a change invalidates (called with the lock held)."""
        self._generation += 1
        if resource.name == "nodes":
            self._dirty.add(NodeName(key))
            if new is None:
                self._assessed.pop(NodeName(key), None)
                self._index.update(NodeName(key), None)
        elif resource.name == "pods":
            for pod in (old, new):
                if pod is not None and pod.node_name:
                    self._dirty.add(pod.node_name)
            if old is not None and old.node_name:
                self._pods_by_node[old.node_name].discard(key)
            if new is not None and new.node_name:
                self._pods_by_node[new.node_name].add(key)
        else:
            self._context_dirty = True

    def _key(self, obj: Any) -> str:
        return wire.object_key(obj)

    def _convert(self, resource: _Resource, obj: Any) -> Any:
        if resource.name == "nodes":
            return wire.node_view(obj)
        if resource.name == "pods":
            return wire.pod_view(obj) if _keep_pod(obj, self.operator_namespace) else None
        if resource.name == "deployments":
            return wire.deployment_view(obj)
        if resource.name == "daemonsets":
            return wire.driver_template_view(obj)
        if resource.name == "toolkits":
            return wire.toolkit_template_view(obj)
        return wire.custom_object_view(obj)

    # --- reading -----------------------------------------------------------------------
    @property
    def operator_namespace(self) -> str | None:
        if self._configured_namespace:
            return self._configured_namespace
        # NB: under the lock: the pods' watch asks while another thread may relist these.
        with self._lock:
            for policy in self._resources["clusterpolicies"].store.values():
                namespace = policy.status.get("namespace")
                if namespace:
                    return str(namespace)
            for deployment in self._resources["deployments"].store.values():
                return deployment.namespace
        return None

    def snapshot(self, now: dt.datetime) -> ClusterSnapshot:
        with self._lock:
            return self._snapshot(now)

    def _snapshot(self, now: dt.datetime) -> ClusterSnapshot:
        namespace = self.operator_namespace
        deployments: list[DeploymentObject] = [
            d for d in self._resources["deployments"].store.values() if namespace is None or d.namespace == namespace
        ]
        policies: list[CustomObject] = list(self._resources["clusterpolicies"].store.values())
        return ClusterSnapshot(
            nodes=cast(dict[NodeName, NodeObject], dict(self._resources["nodes"].store)),
            pods=tuple(self._resources["pods"].store.values()),
            operator_namespace=namespace,
            operator_deployment=deployments[0] if deployments else None,
            operator_crds_installed=self._resources["clusterpolicies"].available,
            cluster_policies=tuple(policies),
            nvidia_drivers=tuple(self._resources["nvidiadrivers"].store.values()),
            driver_templates=tuple(self._resources["daemonsets"].store.values()),
            toolkit_templates=tuple(self._resources["toolkits"].store.values()),
            kubernetes_version=self._kubernetes_version,
            taken_at=now,
        )

    def _refresh_context(self, now: dt.datetime) -> FleetContext:
        """Cluster-level facts every node assessment uses (called with the lock held)."""
        self._context = fleet_context(self._snapshot(now), settings=self._settings)
        self._context_dirty = False
        return self._context

    def node(self, name: str) -> NodeObject | None:
        with self._lock:
            return self._resources["nodes"].store.get(name)

    def pods_on(self, node: str) -> list[PodObject]:
        with self._lock:
            store = self._resources["pods"].store
            return [store[k] for k in self._pods_by_node.get(NodeName(node), ()) if k in store]

    def _assess(self, node: NodeObject, pods: list[PodObject], now: dt.datetime) -> NodeInventory:
        assert self._context is not None
        assessed = assess_node(node, pods_on_node=pods, context=self._context, settings=self._settings, now=now)
        if self._first_seen is None:
            return assessed
        # A person's cordon and taints are aged here, where the node object is at hand,
        # so their age counts from the watch, not from the first command that asks.
        self._first_seen.stamp_restrictions(assessed, node, now)
        return self._first_seen.stamp(assessed, now)

    def fleet(self, now: dt.datetime, *, max_age: dt.timedelta = dt.timedelta(seconds=5)) -> Fleet:
        """The fleet view. Reused as it is while nothing changed and it is younger than
        `max_age` (ages in findings move with time); otherwise only changed nodes are
        assessed again."""
        with self._lock:
            if (self._fleet is not None and self._fleet_generation == self._generation
                    and self._fleet_at is not None and dt.timedelta(0) <= now - self._fleet_at < max_age):
                return self._fleet
            nodes = self._resources["nodes"].store
            pods = self._resources["pods"].store
            context = self._context
            if self._context_dirty or context is None:
                context = self._refresh_context(now)
                self._dirty = set(cast(Mapping[NodeName, NodeObject], nodes))
            for name in self._dirty:
                node = nodes.get(name)
                if node is None:
                    self._index.update(name, None)
                    if self._assessed.pop(name, None) is not None and self._first_seen is not None:
                        self._first_seen.forget(name, now)
                    continue
                on_node = [pods[k] for k in self._pods_by_node.get(name, ()) if k in pods]
                self._assessed[name] = assessed = self._assess(node, on_node, now)
                self._index.update(name, assessed)
            self._dirty.clear()
            canaries = self._canaries.verdicts(now) if self._canaries is not None else None
            self._fleet = self._index.fleet(now, context=context, canaries=canaries)
            self._fleet_at = now
            self._fleet_generation = self._generation
            return self._fleet
