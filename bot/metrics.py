"""The bot's Prometheus metrics (prometheus-client), served on the metrics port's /metrics.

Two kinds. What happens is counted as it happens: Kubernetes API calls by verb and status
code with their latency (`workflows.kube.gateway.client.observe_kube_calls`), Slack Web API calls by
method and outcome (`bot.slack_api.observe_slack_calls`). What is true now is read at each
scrape, so it is never stale and survives a restart: requests by kind and state, approvals
pending and how long the oldest has waited, runs by state (every state, 0 when none),
each unfinished run's window end and whether it overran it, the time since each run that
halted in the last day halted, steps in flight (every step kind, 0 when none) and the durations of steps finished in the
last day (`storage.gauges`), findings by severity (every severity, 0 when none) and each
pool's GPUs physical, advertised and out (cordoned, by gpuops or by hand) from the watch
cache's fleet, each watched resource's silence and relists, the Slack outbox's depth,
handovers acknowledged late, and whether this replica holds the engine's Lease. With several clusters, whether each answers
(`gpuops_cluster_up`, `gpuops_cluster_down_seconds`), and the findings and watch-cache
metrics carry a `cluster` label (findings only of clusters that answer now).

One registry per process (not prometheus-client's global one), so tests build their own.
"""

from __future__ import annotations

import datetime as dt
import typing
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from storage import gauges
from storage.database import Database
from storage.runs import RunState
from workflows.fleet.clusters import Reach
from workflows.fleet.findings import Severity
from workflows.kinds import KINDS
from workflows.fleet.watchcache import CacheState

# Step durations range from a cordon (a second) to a drain waiting on jobs (hours).
STEP_BUCKETS = (1, 5, 15, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600)
API_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
STEP_WINDOW = dt.timedelta(days=1)
RUN_STATES: tuple[RunState, ...] = typing.get_args(RunState)
SEVERITIES: tuple[Severity, ...] = typing.get_args(Severity)


class FleetState(Protocol):
    """What the metrics read of the watch cache (`workflows.fleet.watchcache.FleetCache`)."""

    def fleet(self, now: dt.datetime) -> Any: ...

    def states(self) -> list[CacheState]: ...


class ClusterState(Protocol):
    """A cluster of several as the metrics read it (`workflows.fleet.clusters.ClusterFleet`,
    `WatchedCluster`): whether it answers, and its cache once it was listed."""

    @property
    def cache(self) -> FleetState | None: ...

    def reach(self, now: dt.datetime) -> Reach: ...


@dataclass
class Sources:
    """Where the scrape-time metrics come from; each may be missing (a test, a console).
    With several clusters, `clusters` (name -> cluster, the home one among them) replaces
    `fleet`: every fleet metric then carries a `cluster` label, and whether each cluster
    answers is a metric of its own."""

    database: Callable[[], Database] | None = None
    fleet: FleetState | None = None
    leader: Callable[[], bool] | None = None
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)
    clusters: Mapping[str, ClusterState] | None = None


class Metrics:
    def __init__(self, sources: Sources | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.kube_calls = Counter("gpuops_kube_api_requests", "Kubernetes API calls by HTTP method (WATCH: a "
                                  "watch) and status code (error: no answer)", ["verb", "code"], registry=self.registry)
        self.kube_latency = Histogram("gpuops_kube_api_request_duration_seconds",
                                      "Kubernetes API call latency to the response headers", ["verb"],
                                      buckets=API_BUCKETS, registry=self.registry)
        self.slack_calls = Counter("gpuops_slack_api_calls", "Slack Web API calls by method and outcome "
                                   "(ok, or Slack's error code)", ["method", "outcome"], registry=self.registry)
        self.sources = sources or Sources()
        self.registry.register(_StateCollector(self.sources))

    def observe_kube(self, verb: str, code: str, seconds: float) -> None:
        self.kube_calls.labels(verb=verb, code=code).inc()
        self.kube_latency.labels(verb=verb).observe(seconds)

    def observe_slack(self, method: str, outcome: str) -> None:
        self.slack_calls.labels(method=method, outcome=outcome).inc()


class _StateCollector(Collector):
    def __init__(self, sources: Sources) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Metric]:
        sources, now = self._sources, self._sources.clock()
        if sources.database is not None:
            yield from _database_metrics(gauges.read(sources.database(), since=now - STEP_WINDOW), now)
        if sources.clusters:
            yield from _cluster_metrics(sources.clusters, now)
        elif sources.fleet is not None:
            yield from _fleet_metrics([((), sources.fleet)], now)
        if sources.leader is not None:
            lease = GaugeMetricFamily("gpuops_engine_lease_held", "1 when this replica holds the engine's Lease "
                                      "(runs the engine, scheduler and notifier)")
            lease.add_metric([], 1.0 if sources.leader() else 0.0)
            yield lease


def _database_metrics(read: gauges.Gauges, now: dt.datetime) -> Iterable[Metric]:
    requests = GaugeMetricFamily("gpuops_requests", "Requests by kind and state", labels=["kind", "state"])
    for (kind, state), n in sorted(read.requests.items()):
        requests.add_metric([kind, state], n)
    yield requests
    yield GaugeMetricFamily("gpuops_approvals_pending", "Requests waiting for approvals",
                            value=read.approvals_pending)
    waited = (now - read.oldest_pending).total_seconds() if read.oldest_pending is not None else 0.0
    yield GaugeMetricFamily("gpuops_approvals_oldest_pending_seconds", "Seconds the oldest request waiting for "
                            "approvals has waited since it was asked for; 0 when none waits", value=max(waited, 0.0))
    runs = GaugeMetricFamily("gpuops_runs", "Runs by state (every state, 0 when none)", labels=["state"])
    for state in sorted({*RUN_STATES, *read.runs}):
        runs.add_metric([state], read.runs.get(state, 0))
    yield runs
    yield from _run_metrics(read, now)
    running = GaugeMetricFamily("gpuops_steps_in_flight", "Steps running now, by kind (every step kind, 0 when "
                                "none)", labels=["kind"])
    for kind in sorted({*KINDS.step_kinds, *read.steps_running}):
        running.add_metric([kind], read.steps_running.get(kind, 0))
    yield running
    took = HistogramMetricFamily("gpuops_step_duration_seconds",
                                 "How long steps finished in the last day took, by kind", labels=["kind"])
    for kind, seconds in sorted(read.step_seconds.items()):
        buckets = [(str(float(b)), float(sum(1 for s in seconds if s <= b))) for b in STEP_BUCKETS]
        took.add_metric([kind], buckets + [("+Inf", float(len(seconds)))], sum_value=sum(seconds))
    yield took
    outbox = GaugeMetricFamily("gpuops_slack_outbox", "Slack messages not yet delivered, by state",
                               labels=["state"])
    for state in ("pending", "failed"):
        outbox.add_metric([state], read.outbox.get(state, 0))
    yield outbox
    late = CounterMetricFamily("gpuops_handover_acks_late", "Handovers not acknowledged in time, by what "
                               "followed (a reminder, then an escalation)", labels=["stage"])
    late.add_metric(["reminded"], read.handovers_reminded)
    late.add_metric(["escalated"], read.handovers_escalated)
    yield late


def _run_metrics(read: gauges.Gauges, now: dt.datetime) -> Iterable[Metric]:
    labels = ["run", "pool", "kind"]
    ends = GaugeMetricFamily("gpuops_run_window_end_timestamp_seconds", "When the window of an unfinished run "
                             "(pending, running or paused) ends, in Unix seconds; no series for a run without an "
                             "end", labels=labels)
    overran = GaugeMetricFamily("gpuops_run_overran", "1 while an unfinished run is past its window's end, else 0",
                                labels=labels)
    for window in read.windows:
        key = [window.run, window.pool, window.kind]
        if window.window_end is not None:
            ends.add_metric(key, window.window_end.timestamp())
        overran.add_metric(key, 1.0 if window.window_end is not None and now > window.window_end else 0.0)
    yield ends
    yield overran
    halted = GaugeMetricFamily("gpuops_run_halted_seconds", "Seconds since a run halted (failed), for the runs that "
                               "halted in the last day", labels=labels)
    for halt in read.halted:
        halted.add_metric([halt.run, halt.pool, halt.kind], max((now - halt.at).total_seconds(), 0.0))
    yield halted


def _cluster_metrics(clusters: Mapping[str, ClusterState], now: dt.datetime) -> Iterable[Metric]:
    """Several clusters: whether each answers, and the fleet metrics of each that was
    listed (findings only of those that answer now: a cluster away is not checked)."""
    up = GaugeMetricFamily("gpuops_cluster_up", "1 while the cluster's API answers (nodes and pods listed and "
                           "watched), 0 while it does not or was never reached", labels=["cluster"])
    down = GaugeMetricFamily("gpuops_cluster_down_seconds", "Seconds since the cluster's API stopped answering "
                             "(or since gpuops began trying, for one never reached); 0 while it answers",
                             labels=["cluster"])
    fleets: list[tuple[tuple[str, ...], FleetState]] = []
    answering: set[tuple[str, ...]] = set()
    for name, cluster in sorted(clusters.items()):
        reach = cluster.reach(now)
        up.add_metric([name], 1.0 if reach.state == "up" else 0.0)
        away = (now - reach.since).total_seconds() if reach.state != "up" and reach.since is not None else 0.0
        down.add_metric([name], max(away, 0.0))
        if cluster.cache is not None:
            fleets.append(((name,), cluster.cache))
            if reach.state == "up":
                answering.add((name,))
    yield up
    yield down
    yield from _fleet_metrics(fleets, now, label="cluster", findings_of=answering)


def _fleet_metrics(fleets: Sequence[tuple[tuple[str, ...], FleetState]], now: dt.datetime, *,
                   label: str | None = None, findings_of: Collection[tuple[str, ...]] | None = None) -> Iterable[Metric]:
    """The findings and watch-cache metrics of each fleet, labelled by `label` (with several
    clusters) before their own labels; findings only of `findings_of` when given."""
    first = [label] if label else []
    findings = GaugeMetricFamily("gpuops_findings", "Problems found in the fleet, by severity (every severity, 0 "
                                 "when none)", labels=[*first, "severity"])
    gpus = GaugeMetricFamily("gpuops_pool_gpus", "Each pool's GPUs: physical (per GPU Feature Discovery, on the "
                             "nodes where it is known) and advertised (by the device plugin)",
                             labels=[*first, "pool", "state"])
    out = GaugeMetricFamily("gpuops_pool_gpus_out", "Each pool's physical GPUs on cordoned nodes, by who "
                            "cordoned them: gpuops (its mark on the node) or hand (anyone else)",
                            labels=[*first, "pool", "by"])
    silent = GaugeMetricFamily("gpuops_watch_cache_silent_seconds", "Seconds since the API last said anything "
                               "about a watched resource (a list, an event or a bookmark, about one a minute)",
                               labels=[*first, "resource"])
    relists = CounterMetricFamily("gpuops_watch_cache_relists", "Lists again after a watch expired (410)",
                                  labels=[*first, "resource"])
    synced = GaugeMetricFamily("gpuops_watch_cache_synced", "1 once the resource was listed",
                               labels=[*first, "resource"])
    for key, fleet in fleets:
        if findings_of is None or key in findings_of:
            seen = fleet.fleet(now)
            counts: dict[str, int] = dict.fromkeys(SEVERITIES, 0)
            for finding in seen.findings:
                counts[finding.severity] = counts.get(finding.severity, 0) + 1
            for severity, n in sorted(counts.items()):
                findings.add_metric([*key, severity], n)
            for pool in seen.pools:
                gpus.add_metric([*key, pool.name, "physical"], pool.gpus_physical)
                gpus.add_metric([*key, pool.name, "advertised"], pool.gpus_advertised)
                cordoned = [seen.nodes[n] for n in pool.cordoned if n in seen.nodes]
                by_gpuops = [n for n in cordoned if n.cordoned_by is not None and not n.cordoned_before_run]
                out.add_metric([*key, pool.name, "gpuops"], sum(n.physical_gpus or 0 for n in by_gpuops))
                out.add_metric([*key, pool.name, "hand"], sum(n.physical_gpus or 0 for n in cordoned
                                                              if n not in by_gpuops))
        for state in fleet.states():
            if state.silent_for is not None:
                silent.add_metric([*key, state.resource], state.silent_for)
            relists.add_metric([*key, state.resource], state.relists)
            synced.add_metric([*key, state.resource], 1.0 if state.synced else 0.0)
    yield findings
    yield gpus
    yield out
    yield silent
    yield relists
    yield synced
