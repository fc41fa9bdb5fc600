"""Run as its own process (the bot's read path and nothing else): time the raw list
of nodes and pods, the cache's cold start, warm `/gpu status` renders (quiet, and while
tests.bench.pod_churn churns pods in a process of its own), `/gpu status` right after a
single node or pod change, and report its RSS.

    python -m tests.bench.inventory_probe --kubeconfig PATH --renders 100 --churn-rate 300

With `--kubeconfig` given several times, one process reads every cluster as gpuops
does with several clusters: one cache each, started side by side; a baseline lists every
cluster side by side, a cold start ends when every cache has its fleet, a render is
`/gpu status` of each cluster in turn (their sum is timed), and each change is one change
in every cluster. `--quick` (the scaling curve) leaves out the churn, the typed baseline
and the forced re-summaries, and takes one (baseline, cold start) pair unless `--repeat`
says otherwise.

What touches the database: only `/gpu status` (the change freezes in force, the unfinished
runs, the drain history: five reads). The lists, the cold start, the cache and its memory
touch none, so the renders above are timed without one. With `--database NAME=LOCATION`
(a SQLite path or a `postgresql://` URL; several), `/gpu status` is rendered again as the
bot renders it, on each database in turn (the order alternating), from the same warm cache:
`status_by_database` in the report.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from storage.database import Database, open_database
from workflows.access import Actor, Role, UserId
from workflows.config import GpuopsConfig
from workflows.fleet.watchcache import FleetCache
from workflows.kube import wire
from workflows.kube.gateway import KubeGateway
from workflows.kube.gateway.paths import NODES, PODS

ACTOR = Actor(user_id=UserId("bench"), name="bench", roles=frozenset({Role.VIEWER}), via="cli")
# How long a cache may take to open its watches, or to apply a change the probe made.
SETTLE_TIMEOUT_S = 60.0
# What the probe's changes write (the churn writes labels of its own).
CHANGE_KEY = "bench.gpuops.io/probe-step"


def _status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _median_p99(seconds: list[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    return statistics.median(ordered) * 1000, ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000


class MachineBusy:
    """How many cores everything but this process kept busy since it was made (from
    /proc/stat and this process's own CPU time): the load a render competes with."""

    def __init__(self) -> None:
        self._busy, self._own, self._wall = self._machine_busy_s(), time.process_time(), time.perf_counter()

    @staticmethod
    def _machine_busy_s() -> float:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle, iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def others_cores(self) -> float:
        wall = time.perf_counter() - self._wall
        busy = self._machine_busy_s() - self._busy - (time.process_time() - self._own)
        return round(max(0.0, busy) / wall, 2) if wall > 0 else 0.0


@dataclass
class Cluster:
    """One cluster the probe reads: its API, its cache, and the change it waits to see."""

    kubeconfig: str
    config: GpuopsConfig
    gateway: KubeGateway = field(init=False)
    cache: FleetCache | None = None
    services: Services | None = None
    awaited: tuple[str, str, str] | None = None  # resource, name, value of CHANGE_KEY
    seen: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.gateway = KubeGateway.connect(kubeconfig=self.kubeconfig)

    def start(self, *, watch: bool) -> FleetCache:
        """A new cache (the last one stopped), listed and, with `watch`, watching."""
        self.stop()
        self.cache = FleetCache(self.gateway, settings=self.config.inventory_settings()).start(watch=watch)
        self.cache.add_listener(self._heard)
        self.services = Services(config=self.config, fleet=self.cache)
        return self.cache

    def stop(self) -> None:
        if self.cache is not None:
            self.cache.stop()

    def _heard(self, resource: str, kind: str, view: object) -> None:
        if self.awaited is None or self.awaited[:2] != (resource, getattr(view, "name", "")):
            return
        marks = {**getattr(view, "labels", {}), **getattr(view, "annotations", {})}
        if marks.get(CHANGE_KEY) == self.awaited[2]:
            self.seen.set()

    def watching(self) -> bool:
        """Every resource there is (an optional CRD may not be installed) has a watch open:
        from then on a change reaches the cache."""
        assert self.cache is not None
        return all(self.cache.watches(state.resource) >= 1 for state in self.cache.states() if state.available)

    def change(self, resource: str, path: str, name: str, value: str) -> None:
        """One real change (a merge patch of a node's annotation or a pod's label); `applied`
        waits until the cache holds it."""
        self.seen.clear()
        self.awaited = (resource, name, value)
        where = "annotations" if resource == "nodes" else "labels"
        self.gateway.request("PATCH", path, body={"metadata": {where: {CHANGE_KEY: value}}},
                             content_type="application/merge-patch+json")

    def applied(self, what: str) -> None:
        assert self.seen.wait(SETTLE_TIMEOUT_S), f"{self.kubeconfig}: the cache did not see {what}"


def _wait_watching(clusters: list[Cluster]) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not all(cluster.watching() for cluster in clusters):
        assert time.monotonic() < deadline, "the caches' watches did not open"
        time.sleep(0.02)


def _start_all(clusters: list[Cluster], *, watch: bool) -> None:
    """Every cluster's cache started side by side, each with its first fleet view."""
    def start(cluster: Cluster) -> None:
        cluster.start(watch=watch).fleet(dt.datetime.now(dt.timezone.utc))

    if len(clusters) == 1:
        start(clusters[0])
        return
    with ThreadPoolExecutor(max_workers=len(clusters)) as starts:
        list(starts.map(start, clusters))


def _list_all(clusters: list[Cluster], lists: ThreadPoolExecutor, **schemas: object) -> list[tuple[int, int]]:
    """Each cluster's nodes and pods listed side by side, as its cache lists them (each
    paged), one cluster after another; (nodes, pods) a cluster.

    NB: one cluster at a time, as three clusters' parsed lists held at once would take
    some 5 GB at 3 x 75,000 pods, beside three control planes on a 24 GiB machine."""
    counts = []
    for cluster in clusters:
        nodes = lists.submit(cluster.gateway.list, NODES, schema=schemas.get("nodes"))
        pods = lists.submit(cluster.gateway.list, PODS, schema=schemas.get("pods"))
        counts.append((len(nodes.result().items), len(pods.result().items)))
        del nodes, pods  # freed before the next cluster's lists
    return counts


def _rss_only(clusters: list[Cluster]) -> None:
    """The bot's memory, apart from the baseline's: freed JSON lists stay in the probe's
    heap (CPython keeps its arenas), so the probe's own RSS overstates it."""
    _start_all(clusters, watch=True)
    for cluster in clusters:
        reply = dispatch("status", actor=ACTOR, services=cluster.services, now=dt.datetime.now(dt.timezone.utc))
        assert reply.ok
    # Read once the watches are open, the cache's whole state as the bot holds it.
    _wait_watching(clusters)
    now = dt.datetime.now(dt.timezone.utc)
    json.dump({"rss_mib": _status_mib("VmRSS"), "rss_peak_mib": _status_mib("VmHWM"),
               "gpu_nodes_in_fleet": [len(c.cache.fleet(now).nodes) for c in clusters if c.cache]}, sys.stdout)
    for cluster in clusters:
        cluster.stop()


def _renders_by_database(cluster: Cluster, databases: dict[str, Database], renders: int) -> dict[str, object]:
    """`/gpu status` of `cluster` on each database in turn (the first alternating), from its
    warm cache as the bot renders it (services on the database): median and p99 each."""
    assert cluster.cache is not None
    services = {name: Services.on_database(config=cluster.config, fleet=cluster.cache, database=db)
                for name, db in databases.items()}
    timed: dict[str, list[float]] = {name: [] for name in databases}
    names = list(databases)
    for name in names:  # once each first, unmeasured: the connections' first statements prepared
        dispatch("status", actor=ACTOR, services=services[name], now=dt.datetime.now(dt.timezone.utc))
    for index in range(renders):
        for name in names if index % 2 == 0 else names[::-1]:
            now = dt.datetime.now(dt.timezone.utc)
            started = time.perf_counter()
            reply = dispatch("status", actor=ACTOR, services=services[name], now=now)
            text = render_text(reply)
            timed[name].append(time.perf_counter() - started)
            assert reply.ok, text
    out: dict[str, object] = {}
    for name, seconds in timed.items():
        median, p99 = _median_p99(seconds)
        out[name] = {"status_median_ms": median, "status_p99_ms": p99, "renders": len(seconds)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", action="append", required=True,
                        help="a cluster to read; several: one process, one cache each")
    parser.add_argument("--renders", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=None,
                        help="(baseline, cold start) pairs; default 7, 1 with --quick")
    parser.add_argument("--churn-rate", type=float, default=300.0)
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--quick", action="store_true",
                        help="no churn, typed baseline or forced re-summaries; one pair unless --repeat")
    parser.add_argument("--database", action="append", default=[], metavar="NAME=LOCATION",
                        help="also render /gpu status on this database (a SQLite path or a postgresql:// URL)")
    parser.add_argument("--rss-only", action="store_true",
                        help="only start watching caches, render /gpu status once and report the RSS")
    args = parser.parse_args()
    config = GpuopsConfig()
    clusters = [Cluster(kubeconfig, config) for kubeconfig in args.kubeconfig]
    if args.rss_only:
        _rss_only(clusters)
        return
    repeat = args.repeat or (1 if args.quick else 7)
    churn_rate = 0.0 if args.quick else args.churn_rate
    if churn_rate > 0 and len(clusters) > 1:
        parser.error("churn is for one cluster: give --quick or --churn-rate 0 with several")

    # Baseline: the raw list of every node and every pod, as bytes off the wire parsed into JSON
    # objects, paged as the cache pages it. Each cold start is timed right after its own
    # baseline and compared with it: pairs taken back to back cancel the drifting speed
    # of a shared machine (CPU steal on a VM), which best-of-N taken minutes apart does
    # not.
    pairs = []
    cpu_pairs: list[tuple[float, float]] = []  # the probe's own CPU time in each (all its threads)
    listed: list[tuple[int, int]] = []
    lists = ThreadPoolExecutor(max_workers=2)
    for _ in range(repeat):
        for cluster in clusters:
            cluster.stop()
        started, cpu = time.perf_counter(), time.process_time()
        listed = _list_all(clusters, lists)
        baseline, baseline_cpu = time.perf_counter() - started, time.process_time() - cpu
        started, cpu = time.perf_counter(), time.process_time()
        _start_all(clusters, watch=False)
        pairs.append((baseline, time.perf_counter() - started))
        cpu_pairs.append((baseline_cpu, time.process_time() - cpu))
    ratios = sorted(cold / baseline for baseline, cold in pairs)
    # The cache decodes nodes into only the fields it reads (workflows.kube.wire), cheaper
    # than a whole parse. A stricter baseline is reported beside the one above: the same
    # list decoded with the cache's own node schema, timed after the pairs so as not to
    # disturb them.
    typed = []
    for _ in range(0 if args.quick else repeat):
        started = time.perf_counter()
        _list_all(clusters, lists, nodes=wire.NodeWire, pods=wire.PodWire)
        typed.append(time.perf_counter() - started)
    rss_after_cold = _status_mib("VmRSS")

    # Warm: the caches now watch, as the bot's do, so churn lands in this process.
    _start_all(clusters, watch=True)
    _wait_watching(clusters)

    def render(cpu: list[float] | None = None) -> tuple[float, str]:
        """`/gpu status` of every cluster in turn: the time of them all, the last text;
        with `cpu`, the CPU time this thread spent on them is appended to it (the wall
        time less what other threads and processes took from it)."""
        now = dt.datetime.now(dt.timezone.utc)
        elapsed, spent, text = 0.0, 0.0, ""
        for cluster in clusters:
            started, thread = time.perf_counter(), time.thread_time()
            reply = dispatch("status", actor=ACTOR, services=cluster.services, now=now)
            text = render_text(reply)
            elapsed += time.perf_counter() - started
            spent += time.thread_time() - thread
            assert reply.ok, text
        if cpu is not None:
            cpu.append(spent)
        return elapsed, text

    quiet_cpu: list[float] = []
    quiet = [render(quiet_cpu)[0] for _ in range(args.renders)]
    by_database: dict[str, object] = {}
    if args.database:
        databases = {name: open_database(location) for name, _, location in
                     (given.partition("=") for given in args.database)}
        try:
            by_database = _renders_by_database(clusters[0], databases, args.renders)
        finally:
            for db in databases.values():
                db.close()
    text = render()[1]
    # What the collector walks when renders allocate: the caches' contents should be
    # frozen out of its sight (workflows.kube.gateway.decoding.gc_paused).
    collector = {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}
    first = clusters[0]
    assert first.cache is not None
    snapshots = [c.cache.snapshot(dt.datetime.now(dt.timezone.utc)) for c in clusters if c.cache]
    gpu_pods = [next(p for p in snapshot.pods if p.gpu_requests and p.namespace != "batch") for snapshot in snapshots]
    node_names = [next(iter(snapshot.nodes)) for snapshot in snapshots]

    # Under churn: renders spread over ~10 s (a user asks now and then, not in a loop).
    churned: list[float] = []
    churn_report: dict[str, object] = {"target_per_s": 0}
    if churn_rate > 0:
        churn = subprocess.Popen([sys.executable, "-m", "tests.bench.pod_churn", "--kubeconfig", first.kubeconfig,
                                  "--rate", str(churn_rate)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert churn.stdout is not None and churn.stdin is not None
            assert churn.stdout.readline().strip() == "ready"
            warmup = json.loads(churn.stdout.readline())  # once it churns at its rate (or gave up trying)
            for _ in range(args.renders):
                churned.append(render()[0])
                time.sleep(0.1)
            churn.stdin.close()
            churn_report = {**json.loads(churn.stdout.read().strip().splitlines()[-1]), "warmup": warmup}
        finally:
            if churn.poll() is None:
                churn.kill()
            churn.wait()
        # The cache has caught up once it applied a change made after the churn's last
        # one: the same pods' watch delivers events in order.
        pod = gpu_pods[0]
        first.change("pods", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}", pod.name, "after-churn")
        first.applied("the change after the churn")
    rss_warm = _status_mib("VmRSS")

    # One change, then a render: alternately a node's annotation and a GPU pod's label
    # (one in every cluster), rendered as soon as the caches have applied them (the
    # summaries are then stale).
    after_node: list[float] = []
    after_pod: list[float] = []
    change_cpu: list[float] = []
    render()
    machine = MachineBusy()
    for step in range(args.changes):
        for cluster, node_name, pod in zip(clusters, node_names, gpu_pods, strict=True):
            if step % 2 == 0:
                cluster.change("nodes", f"/api/v1/nodes/{node_name}", node_name, str(step))
            else:
                cluster.change("pods", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}", pod.name, str(step))
        for cluster in clusters:
            cluster.applied(f"change {step}")
        (after_node if step % 2 == 0 else after_pod).append(render(change_cpu)[0])
    others_busy = machine.others_cores()

    # For continuity with earlier runs: the whole summary forced again (max_age=0).
    class Resummarized:
        def __init__(self, cache: FleetCache) -> None:
            self._cache = cache

        def fleet(self, now: dt.datetime):  # noqa: ANN201
            return self._cache.fleet(now, max_age=dt.timedelta(0))

    for cluster in clusters:
        assert cluster.cache is not None
        cluster.services = Services(config=config, fleet=Resummarized(cluster.cache))
    forced = [render()[0] for _ in range(0 if args.quick else args.renders)]
    for cluster in clusters:
        cluster.stop()
    lists.shutdown()
    own = subprocess.run([sys.executable, "-m", "tests.bench.inventory_probe", "--rss-only",
                          *(f"--kubeconfig={c.kubeconfig}" for c in clusters)],
                         capture_output=True, text=True, timeout=1800, check=True)
    bot_memory = json.loads(own.stdout)

    quiet_median, quiet_p99 = _median_p99(quiet)
    churn_median, churn_p99 = _median_p99(churned) if churned else (quiet_median, quiet_p99)
    change_median, change_p99 = _median_p99(after_node + after_pod)
    now = dt.datetime.now(dt.timezone.utc)
    per_cluster = [{"nodes_listed": nodes, "pods_listed": pods_listed,
                    "gpu_nodes_in_fleet": len(c.cache.fleet(now).nodes),
                    "gpus_advertised": sum(p.gpus_advertised for p in c.cache.fleet(now).pools),
                    "pools": len(c.cache.fleet(now).pools),
                    "pods_cached": len(c.cache.snapshot(now).pods)}
                   for c, (nodes, pods_listed) in zip(clusters, listed, strict=True) if c.cache]
    totals = {key: sum(int(one[key]) for one in per_cluster) for key in per_cluster[0]}
    report: dict[str, object] = {
        **totals,
        "clusters": len(clusters),
        "per_cluster": per_cluster,
        "baseline_list_s": statistics.median(b for b, _ in pairs),
        "baseline_method": ("every node and pod listed side by side (two threads, 500 a page), parsed into JSON "
                            "objects" + (", one cluster after another" if len(clusters) > 1 else "")),
        "cold_start_s": statistics.median(c for _, c in pairs),
        "cold_start_method": ("one cache a cluster, started side by side; until each has its first fleet view"
                              if len(clusters) > 1 else "a cache started, until its first fleet view"),
        "cold_over_baseline": statistics.median(ratios),
        "cold_over_baseline_method": f"median of {len(pairs)} back-to-back (baseline, cold start) pairs",
        "cold_over_baseline_range": [ratios[0], ratios[-1]],
        "pairs_s": [[round(b, 4), round(c, 4)] for b, c in pairs],
        "baseline_cpu_s": statistics.median(b for b, _ in cpu_pairs),
        "cold_start_cpu_s": statistics.median(c for _, c in cpu_pairs),
        "cpu_method": ("CPU time of this process (every thread) during each baseline and cold start: the "
                       "client's own work, without the wait for the API server (another process)"),
        "status_median_ms": churn_median,
        "status_p99_ms": churn_p99,
        "status_method": (f"{len(churned)} renders 0.1 s apart while pods churn (see churn)" if churned
                          else f"{len(quiet)} renders back to back, no churn"),
        "churn": churn_report,
        "status_quiet_median_ms": quiet_median,
        "status_quiet_p99_ms": quiet_p99,
        "status_after_one_change_median_ms": change_median,
        "status_after_one_change_p99_ms": change_p99,
        "status_after_one_change_method": (f"{len(after_node)} node annotation and {len(after_pod)} GPU pod label "
                                           "changes, each rendered once the cache applied it"
                                           + (" (one change in every cluster, every cluster rendered)"
                                              if len(clusters) > 1 else "")),
        "status_quiet_cpu_median_ms": _median_p99(quiet_cpu)[0],
        "status_after_one_change_cpu_median_ms": _median_p99(change_cpu)[0],
        "status_cpu_method": ("CPU time of the rendering thread (time.thread_time) in the same renders: what "
                              "the render itself costs, without time lost to other threads or processes"),
        "status_after_one_change_others_busy_cores": others_busy,
        "status_after_one_change_others_busy_method": ("cores kept busy by everything but this process (the "
                                                       "control plane(s) and kwok among them) while the changes "
                                                       f"were made and rendered, of {os.cpu_count()}, from "
                                                       "/proc/stat"),
        "status_after_node_change_median_ms": _median_p99(after_node)[0] if after_node else None,
        "status_after_pod_change_median_ms": _median_p99(after_pod)[0] if after_pod else None,
        "status_render_note": ("a render is /gpu status of every cluster in turn, timed together"
                               if len(clusters) > 1 else "a render is one /gpu status"),
        "renders": len(quiet),
        "gc_objects_after_warm_start": collector,
        "rss_mib": bot_memory["rss_mib"],
        "rss_peak_mib": bot_memory["rss_peak_mib"],
        "rss_gpu_nodes_in_fleet": bot_memory["gpu_nodes_in_fleet"],
        "rss_method": ("a fresh process: watching " + ("caches" if len(clusters) > 1 else "cache")
                       + " started, /gpu status rendered once, VmRSS once every watch is open"),
        "rss_probe_after_cold_start_mib": rss_after_cold,
        "rss_probe_after_churn_mib": rss_warm,
        "rss_probe_peak_mib": _status_mib("VmHWM"),
        "rss_probe_note": "this process also held the baseline's parsed lists: an upper bound",
        "status_first_line": text.splitlines()[2] if len(text.splitlines()) > 2 else "",
    }
    if by_database:
        report["status_by_database"] = by_database
        report["status_by_database_method"] = (
            f"{args.renders} renders of /gpu status on each database, one after the other (the first "
            "alternating), from the same warm cache with nothing changing, as the bot renders it: the change "
            "freezes in force, the unfinished runs and the drain history read (a fresh database: none stored); "
            "beside status_quiet_median_ms, the same render without a database")
    if typed:
        report["typed_baseline_list_s"] = statistics.median(typed)
        report["cold_over_typed_baseline"] = statistics.median(c for _, c in pairs) / statistics.median(typed)
        report["cold_over_typed_baseline_method"] = ("median cold start over the median of as many typed lists "
                                                     "(NodeWire, PodWire)")
    if forced:
        report["status_forced_resummary_median_ms"], report["status_forced_resummary_p99_ms"] = _median_p99(forced)
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
