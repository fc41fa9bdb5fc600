"""Run as its own process (the bot's read path and nothing else): time the raw node
list, the cache's cold start and warm `/gpu status` renders, and report its RSS.

    python -m tests.bench.inventory_probe --kubeconfig PATH --renders 100
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from workflows.access import Actor, Role, UserId
from workflows.config import GpuopsConfig
from workflows.fleet.watchcache import FleetCache
from workflows.kube import wire
from workflows.kube.gateway import NODES, KubeGateway


def _status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--renders", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    gateway = KubeGateway.connect(kubeconfig=args.kubeconfig)
    config = GpuopsConfig()

    # Baseline: the raw list of every node, as bytes off the wire parsed into JSON
    # objects, paged as the cache pages it. Each cold start is timed right after its own
    # baseline and compared with it: pairs taken back to back cancel the drifting speed
    # of a shared machine (CPU steal on a VM), which best-of-N taken minutes apart does
    # not.
    pairs = []
    cache = None
    for _ in range(args.repeat):
        if cache is not None:
            cache.stop()
            cache = None
        started = time.perf_counter()
        result = gateway.list(NODES)
        baseline = time.perf_counter() - started
        nodes = len(result.items)
        del result
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
        gateway.list(NODES, schema=wire.NodeWire)
        typed.append(time.perf_counter() - started)
    rss_after_cold = _status_mib("VmRSS")

    services = Services(config=config, fleet=cache)
    actor = Actor(user_id=UserId("bench"), name="bench", roles=frozenset({Role.VIEWER}), via="cli")
    renders = []
    for _ in range(args.renders):
        now = dt.datetime.now(dt.timezone.utc)
        started = time.perf_counter()
        reply = dispatch("status", actor=actor, services=services, now=now)
        text = render_text(reply)
        renders.append(time.perf_counter() - started)
    assert reply.ok, text
    renders.sort()

    # Worst warm case: something changed since the last render, so the fleet view is
    # summarized again (one pass over 5,000 assessed nodes) before rendering.
    class Resummarized:
        def fleet(self, now: dt.datetime):  # noqa: ANN201
            return cache.fleet(now, max_age=dt.timedelta(0))

    changed = []
    services = Services(config=config, fleet=Resummarized())
    for _ in range(args.renders):
        now = dt.datetime.now(dt.timezone.utc)
        started = time.perf_counter()
        render_text(dispatch("status", actor=actor, services=services, now=now))
        changed.append(time.perf_counter() - started)
    changed.sort()
    json.dump({
        "nodes_listed": nodes,
        "gpu_nodes_in_fleet": len(fleet.nodes),
        "gpus_advertised": sum(p.gpus_advertised for p in fleet.pools),
        "pools": len(fleet.pools),
        "pods_cached": len(cache.snapshot(dt.datetime.now(dt.timezone.utc)).pods),
        "baseline_list_s": statistics.median(b for b, _ in pairs),
        "cold_start_s": statistics.median(c for _, c in pairs),
        "cold_over_baseline": statistics.median(ratios),
        "cold_over_baseline_method": f"median of {len(pairs)} back-to-back (baseline, cold start) pairs",
        "cold_over_baseline_range": [ratios[0], ratios[-1]],
        "pairs_s": [[round(b, 4), round(c, 4)] for b, c in pairs],
        "typed_baseline_list_s": statistics.median(typed),
        "cold_over_typed_baseline": statistics.median(c for _, c in pairs) / statistics.median(typed),
        "cold_over_typed_baseline_method": "median cold start over the median of as many typed lists",
        "status_median_ms": statistics.median(renders) * 1000,
        "status_p99_ms": renders[max(0, int(len(renders) * 0.99) - 1)] * 1000,
        "status_after_change_median_ms": statistics.median(changed) * 1000,
        "status_after_change_p99_ms": changed[max(0, int(len(changed) * 0.99) - 1)] * 1000,
        "renders": len(renders),
        "rss_mib": rss_after_cold,
        "rss_peak_mib": _status_mib("VmHWM"),
        "status_first_line": text.splitlines()[2] if len(text.splitlines()) > 2 else "",
    }, sys.stdout)


if __name__ == "__main__":
    main()
