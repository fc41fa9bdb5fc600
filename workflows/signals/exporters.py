"""Reads DCGM health straight from the dcgm-exporter pods, without Prometheus: the pod on
each node (from the cluster snapshot the watch cache keeps: the operator's namespace,
`app=nvidia-dcgm-exporter` by default) and its pod IP, its `/metrics` page through
`workflows.prometheus` (one node: that node's pod; every node: all of them at once, in a
bounded pool, each page whole within the timeout and all by the deadline, a page still
being read then cut off there, its socket shut), the page's samples turned into the same health
Prometheus readings give. The node is the pod's node, whatever its series' Hostname says.

An exporter that does not answer makes its node's health unknown with the reason in one
sentence, never healthy. Correctable ECC errors and PCIe replays get a rate from the
previous reading of the same GPU (`rates`); the first reading has none yet."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from workflows.fleet.assessment import is_gpu_node
from workflows.kube.labels import LABEL_DEPLOY_OPERANDS, LABEL_DEPLOY_PREFIX, POD_SELECTOR_DCGM_EXPORTER
from workflows.kube.objects import ClusterSnapshot, NodeName, NodeObject, PodObject
from workflows.prometheus.client import (DEFAULT_MAX_ANSWER_BYTES, Endpoint, PrometheusTimedOut, PrometheusUnavailable,
                                        scrape)
from workflows.prometheus.fetching import Deadline
from workflows.signals import messages as msg
from workflows.signals.health import (RATED, SERIES, NodeHealth, Rate, counter_value, gpu_key, node_health_of,
                                      unreadable_because)
from workflows.signals.rates import CounterMemory
from workflows.signals.reading import Reading


@runtime_checkable
class ClusterPods(Protocol):
    """Where the exporter pods are read from: the watch cache (`FleetCache.snapshot`)."""

    def snapshot(self, now: dt.datetime) -> ClusterSnapshot: ...


def _default_labels() -> Mapping[str, str]:
    return {POD_SELECTOR_DCGM_EXPORTER[0]: POD_SELECTOR_DCGM_EXPORTER[1]}


@dataclass(frozen=True, slots=True, kw_only=True)
class ExporterSettings:
    """Where on each exporter pod its page is and how to ask (`signals.exporters`)."""

    port: int = 9400
    path: str = "/metrics"
    scheme: Literal["http", "https"] = "http"
    timeout_seconds: float = 5.0
    # None: the GPU Operator's namespace (configured, or found by the watch cache).
    namespace: str | None = None
    pod_labels: Mapping[str, str] = field(default_factory=_default_labels)
    bearer_token_file: Path | None = None
    ca_file: Path | None = None
    # Pages read at once when every node is asked for, and how long reading them all may
    # take (a node whose page is not in by then is unknown).
    parallel: int = 16
    deadline_seconds: float = 20.0
    # The longest page read (signals.max_answer_mb); a longer one leaves its node unknown.
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES

    def address(self, ip: str) -> str:
        return f"[{ip}]:{self.port}" if ":" in ip else f"{ip}:{self.port}"

    def endpoint(self, ip: str) -> Endpoint:
        return Endpoint(url=f"{self.scheme}://{self.address(ip)}{self.path}", bearer_token_file=self.bearer_token_file,
                        ca_file=self.ca_file, timeout_seconds=self.timeout_seconds,
                        max_answer_bytes=self.max_answer_bytes)


def exporter_pods(snapshot: ClusterSnapshot, *, namespace: str,
                  labels: Mapping[str, str]) -> dict[NodeName, PodObject]:
    """Per node, its exporter pod: of several (a rolling update), the one that is
    running with an IP and not being deleted, else the newest."""
    found: dict[NodeName, PodObject] = {}
    for pod in snapshot.pods:
        if pod.namespace != namespace or pod.node_name is None:
            continue
        if any(pod.labels.get(key) != value for key, value in labels.items()):
            continue
        other = found.get(pod.node_name)
        if other is None or _preference(pod) > _preference(other):
            found[pod.node_name] = pod
    return found


def _preference(pod: PodObject) -> tuple[bool, bool, bool, dt.datetime]:
    return (not pod.deleting, pod.phase == "Running" and pod.ip is not None, pod.ready, pod.created_at)


def _opted_out(node: NodeObject) -> bool:
    return (node.labels.get(LABEL_DEPLOY_PREFIX + "dcgm-exporter") == "false"
            or node.labels.get(LABEL_DEPLOY_OPERANDS) == "false")


@dataclass(frozen=True, slots=True)
class _Unknown:
    reason: str
    failed: bool  # an exporter that did not answer (else there is none)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class ExporterPages:
    """The reader of `SignalsService` when `signals.exporters` is configured."""

    def __init__(self, *, settings: ExporterSettings, cluster: ClusterPods | None, memory: CounterMemory,
                 clock: Callable[[], dt.datetime] = _utc_now) -> None:
        self.settings = settings
        self.cluster = cluster
        self.memory = memory
        # NB: the time of a scrape is a measurement (as the watch cache's `taken_at`),
        # not logic: rates take it as an argument. Tests set it with freezegun.
        self.clock = clock

    @property
    def source(self) -> str:
        return msg.exporters_source(self.settings.port)

    def read(self, node: str | None = None) -> Reading:
        source = self.source
        if self.cluster is None:
            return Reading(source=source, unavailable=msg.no_cluster())
        snapshot = self.cluster.snapshot(self.clock())
        namespace = self.settings.namespace or snapshot.operator_namespace
        if namespace is None:
            return Reading(source=source, unavailable=msg.no_namespace())
        selector = msg.selector_text(namespace, self.settings.pod_labels)
        if snapshot.operator_namespace is not None and namespace != snapshot.operator_namespace:
            # NB: the watch cache keeps the operator's namespace's pods (and GPU pods) only.
            selector = msg.outside_the_watched_namespace(selector, snapshot.operator_namespace)
        pods = exporter_pods(snapshot, namespace=namespace, labels=self.settings.pod_labels)
        if node is not None:
            pod = pods.get(NodeName(node))
            if pod is None:
                return Reading(source=source, unavailable=msg.none_on(node, selector))
            result = self._read_one(pod)
            if isinstance(result, _Unknown):
                return Reading(source=source, unavailable=result.reason)
            return Reading(source=source, nodes={result.node: result})
        if not pods:
            return Reading(source=source, unavailable=msg.none_found(selector))
        nodes: dict[NodeName, NodeHealth] = {}
        unknown: dict[NodeName, str] = {}
        failed: set[NodeName] = set()
        targets = sorted(pods.items())
        # A command waits for this reading: pages not read by the deadline (many exporters
        # that do not answer, each taking its whole timeout) are unknown, not waited for;
        # and a page still being read then stops there (its socket is shut), not later.
        deadline = Deadline.within(self.settings.deadline_seconds)
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.settings.parallel, len(targets))),
                                  thread_name_prefix="dcgm-scrape")
        asked = {pool.submit(self._read_one, pod, deadline): name for name, pod in targets}
        _, late = wait(asked, timeout=max(0.0, deadline.remaining()))
        for future in late:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        for future, name in asked.items():
            if future in late:
                unknown[name] = msg.past_deadline(name, self.settings.deadline_seconds)
                failed.add(name)
                continue
            result = future.result()
            if isinstance(result, _Unknown):
                unknown[name] = result.reason
                if result.failed:
                    failed.add(name)
            else:
                nodes[name] = result
        for name, seen in sorted(snapshot.nodes.items()):
            # A node an admin took the exporter (or every operand) off is no finding.
            if name not in pods and is_gpu_node(seen) and not _opted_out(seen):
                unknown[name] = msg.none_on(name, selector)
        return Reading(source=source, nodes=nodes, unknown=unknown, failed=frozenset(failed))

    def _read_one(self, pod: PodObject, deadline: Deadline | None = None) -> NodeHealth | _Unknown:
        node = pod.node_name
        assert node is not None  # exporter_pods keeps bound pods only
        name = f"{pod.namespace}/{pod.name}"
        if pod.deleting:
            return _Unknown(msg.being_deleted(node, name), failed=True)
        if pod.ip is None or pod.phase != "Running":
            return _Unknown(msg.not_running(node, name, pod.phase), failed=True)
        address = self.settings.address(pod.ip)
        try:
            samples = scrape(self.settings.endpoint(pod.ip), names=SERIES, deadline=deadline)
        except PrometheusTimedOut as err:
            if err.cut_by_reading:  # as a page the pool never started reading
                return _Unknown(msg.past_deadline(node, self.settings.deadline_seconds), failed=True)
            return _Unknown(msg.did_not_answer(node, name, address, err.reason), failed=True)
        except PrometheusUnavailable as err:
            return _Unknown(msg.did_not_answer(node, name, address, err.reason), failed=True)
        at = self.clock()
        rates: dict[tuple[str, str], Rate] = {}
        for sample in samples:
            if sample.name not in RATED or unreadable_because(sample) is not None:
                continue
            total = counter_value(sample)
            if total is None:
                continue
            gpu = gpu_key(sample.labels)
            rate = self.memory.observe((node, gpu, sample.name), total, at=at)
            if rate is not None:
                rates[(gpu, sample.name)] = rate
        health = node_health_of(node, samples, rates=rates)
        if not health.gpus and health.unreadable:
            return _Unknown(msg.only_unreadable_series(node, name, address, health.unreadable), failed=True)
        if not health.gpus:
            return _Unknown(msg.no_health_series(node, name, address), failed=True)
        return health
