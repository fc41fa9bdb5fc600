"""Run as its own process (the bot's read path and nothing else): time the raw list
of nodes and pods, the cache's cold start, warm `/gpu status` renders (quiet, and while
tests.bench.pod_churn churns pods in a process of its own), `/gpu status` right after a
single node or pod change, and report its RSS.

    python -m tests.bench.inventory_probe --kubeconfig PATH --renders 100 --churn-rate 300
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from workflows.access import Actor, Role, UserId
from workflows.config import GpuopsConfig
from workflows.fleet.watchcache import FleetCache
from workflows.kube import wire
from workflows.kube.gateway import NODES, PODS, KubeGateway


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


def _list_both(gateway: KubeGateway, lists: ThreadPoolExecutor, **schemas: object) -> tuple[int, int]:
    """Nodes and pods listed side by side, as the cache lists them (each paged)."""
    nodes = lists.submit(gateway.list, NODES, schema=schemas.get("nodes"))
    pods = lists.submit(gateway.list, PODS, schema=schemas.get("pods"))
    return len(nodes.result().items), len(pods.result().items)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--renders", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--churn-rate", type=float, default=300.0)
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--rss-only", action="store_true",
                        help="only start a watching cache, render /gpu status once and report the RSS")
    args = parser.parse_args()
    gateway = KubeGateway.connect(kubeconfig=args.kubeconfig)
    config = GpuopsConfig()
    actor = Actor(user_id=UserId("bench"), name="bench", roles=frozenset({Role.VIEWER}), via="cli")
    if args.rss_only:
        # The bot's memory, apart from the baseline's: freed JSON lists stay in this
        # process's heap (CPython keeps its arenas), so the probe's own RSS overstates it.
        cache = FleetCache(gateway, settings=config.inventory_settings()).start(watch=True)
        reply = dispatch("status", actor=actor, services=Services(config=config, fleet=cache),
                         now=dt.datetime.now(dt.timezone.utc))
        assert reply.ok
        time.sleep(2)
        json.dump({"rss_mib": _status_mib("VmRSS"), "rss_peak_mib": _status_mib("VmHWM")}, sys.stdout)
        cache.stop()
        return

    # Baseline: the raw list of every node and every pod, as bytes off the wire parsed into JSON
    # objects, paged as the cache pages it. Each cold start is timed right after its own
    # baseline and compared with it: pairs taken back to back cancel the drifting speed
    # of a shared machine (CPU steal on a VM), which best-of-N taken minutes apart does
    # not.
    pairs = []
    cache = None
    lists = ThreadPoolExecutor(max_workers=2)
    for _ in range(args.repeat):
        if cache is not None:
            cache.stop()
            cache = None
        started = time.perf_counter()
        nodes, pods_listed = _list_both(gateway, lists)
        baseline = time.perf_counter() - started
        started = time.perf_counter()
        cache = FleetCache(gateway, settings=config.inventory_settings()).start(watch=False)
        fleet = cache.fleet(dt.datetime.now(dt.timezone.utc))
        pairs.append((baseline, time.perf_counter() - started))
    assert cache is not None
    ratios = sorted(cold / baseline for baseline, cold in pairs)
    # The cache decodes nodes into only the fields it reads (workflows.kube.wire), cheaper
    # than a whole parse. A stricter baseline is reported beside the one above: the same
    # list decoded with the cache's own node schema, timed after the pairs so as not to
    # disturb them.
    typed = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        _list_both(gateway, lists, nodes=wire.NodeWire, pods=wire.PodWire)
        typed.append(time.perf_counter() - started)
    rss_after_cold = _status_mib("VmRSS")

    # Warm: the cache now watches, as the bot's does, so churn lands in this process.
    cache.stop()
    cache = FleetCache(gateway, settings=config.inventory_settings()).start(watch=True)
    seen = threading.Event()
    awaited: list[tuple[str, str]] = []

    def heard(resource: str, kind: str, view: object) -> None:
        if awaited and (resource, getattr(view, "name", "")) == awaited[0]:
            seen.set()

    cache.add_listener(heard)
    time.sleep(2)  # the watches open
    services = Services(config=config, fleet=cache)

    def render() -> tuple[float, str]:
        now = dt.datetime.now(dt.timezone.utc)
        started = time.perf_counter()
        reply = dispatch("status", actor=actor, services=services, now=now)
        text = render_text(reply)
        assert reply.ok, text
        return time.perf_counter() - started, text

    quiet = [render()[0] for _ in range(args.renders)]
    text = render()[1]

    # Under churn: renders spread over ~10 s (a user asks now and then, not in a loop).
    churned: list[float] = []
    churn_report: dict[str, object] = {"target_per_s": 0}
    if args.churn_rate > 0:
        churn = subprocess.Popen([sys.executable, "-m", "tests.bench.pod_churn", "--kubeconfig", args.kubeconfig,
                                  "--rate", str(args.churn_rate)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        try:
            assert churn.stdout is not None and churn.stdin is not None
            assert churn.stdout.readline().strip() == "ready"
            time.sleep(3)  # up to speed
            for _ in range(args.renders):
                churned.append(render()[0])
                time.sleep(0.1)
            churn.stdin.close()
            churn_report = json.loads(churn.stdout.read().strip().splitlines()[-1])
        finally:
            if churn.poll() is None:
                churn.kill()
            churn.wait()
        time.sleep(3)  # the cache catches up
    rss_warm = _status_mib("VmRSS")

    # One change, then a render: alternately a node's annotation and a GPU pod's label,
    # each rendered as soon as the cache has applied it (the summary is then stale).
    snapshot = cache.snapshot(dt.datetime.now(dt.timezone.utc))
    gpu_pod = next(p for p in snapshot.pods if p.gpu_requests and p.namespace != "batch")
    node_name = next(iter(snapshot.nodes))
    after_node: list[float] = []
    after_pod: list[float] = []
    render()
    for step in range(args.changes):
        seen.clear()
        if step % 2 == 0:
            awaited[:] = [("nodes", node_name)]
            gateway.request("PATCH", f"/api/v1/nodes/{node_name}",
                            body={"metadata": {"annotations": {"bench.gpuops.io/step": str(step)}}},
                            content_type="application/merge-patch+json")
        else:
            awaited[:] = [("pods", gpu_pod.name)]
            gateway.request("PATCH", f"/api/v1/namespaces/{gpu_pod.namespace}/pods/{gpu_pod.name}",
                            body={"metadata": {"labels": {"bench.gpuops.io/step": str(step)}}},
                            content_type="application/merge-patch+json")
        assert seen.wait(30), f"the cache did not see change {step}"
        (after_node if step % 2 == 0 else after_pod).append(render()[0])

    # For continuity with earlier runs: the whole summary forced again (max_age=0).
    class Resummarized:
        def fleet(self, now: dt.datetime):  # noqa: ANN201
            return cache.fleet(now, max_age=dt.timedelta(0))

    services = Services(config=config, fleet=Resummarized())
    forced = [render()[0] for _ in range(args.renders)]
    cache.stop()
    lists.shutdown()
    own = subprocess.run([sys.executable, "-m", "tests.bench.inventory_probe", "--kubeconfig", args.kubeconfig,
                          "--rss-only"], capture_output=True, text=True, timeout=600, check=True)
    bot_memory = json.loads(own.stdout)

    quiet_median, quiet_p99 = _median_p99(quiet)
    churn_median, churn_p99 = _median_p99(churned) if churned else (quiet_median, quiet_p99)
    change_median, change_p99 = _median_p99(after_node + after_pod)
    forced_median, forced_p99 = _median_p99(forced)
    fleet = cache.fleet(dt.datetime.now(dt.timezone.utc))
    json.dump({
        "nodes_listed": nodes,
        "pods_listed": pods_listed,
        "gpu_nodes_in_fleet": len(fleet.nodes),
        "gpus_advertised": sum(p.gpus_advertised for p in fleet.pools),
        "pools": len(fleet.pools),
        "pods_cached": len(cache.snapshot(dt.datetime.now(dt.timezone.utc)).pods),
        "baseline_list_s": statistics.median(b for b, _ in pairs),
        "baseline_method": "nodes and pods listed side by side (two threads, 500 a page), parsed into JSON objects",
        "cold_start_s": statistics.median(c for _, c in pairs),
        "cold_over_baseline": statistics.median(ratios),
        "cold_over_baseline_method": f"median of {len(pairs)} back-to-back (baseline, cold start) pairs",
        "cold_over_baseline_range": [ratios[0], ratios[-1]],
        "pairs_s": [[round(b, 4), round(c, 4)] for b, c in pairs],
        "typed_baseline_list_s": statistics.median(typed),
        "cold_over_typed_baseline": statistics.median(c for _, c in pairs) / statistics.median(typed),
        "cold_over_typed_baseline_method": "median cold start over the median of as many typed lists "
                                           "(NodeWire, PodWire)",
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
                                           "changes, each rendered once the cache applied it"),
        "status_after_node_change_median_ms": _median_p99(after_node)[0],
        "status_after_pod_change_median_ms": _median_p99(after_pod)[0],
        "status_forced_resummary_median_ms": forced_median,
        "status_forced_resummary_p99_ms": forced_p99,
        "renders": len(quiet),
        "rss_mib": bot_memory["rss_mib"],
        "rss_peak_mib": bot_memory["rss_peak_mib"],
        "rss_method": "a fresh process: watching cache started, /gpu status rendered once, VmRSS 2 s later",
        "rss_probe_after_cold_start_mib": rss_after_cold,
        "rss_probe_after_churn_mib": rss_warm,
        "rss_probe_peak_mib": _status_mib("VmHWM"),
        "rss_probe_note": "this process also held the baseline's parsed lists: an upper bound",
        "status_first_line": text.splitlines()[2] if len(text.splitlines()) > 2 else "",
    }, sys.stdout)

if __name__ == "__main__":
    main()
