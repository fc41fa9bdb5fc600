"""The read path's scaling curve in one run: one cluster grown to 1,000, 5,000 and 10,000
GPU nodes, then three clusters of 5,000 watched from one process; for each cost, its
exponent (cost ~ nodes^b over the one-cluster points) and whether it is linear or better.

Every point runs tests/bench/inventory_probe.py with `--quick`: the raw list of every
node and pod (baseline), the caches' cold start, `/gpu status` from a warm cache with
nothing changing (no churn: the curve is about size; churn is inventory_scale's), right
after one change, and the resident memory of a fresh process holding the cache(s).

The fleet is tests/bench/dense_fleet.py's (15 pods a node by default), in control planes
this bench starts and stops itself, not the session's: 150,000 pods must not stay behind
for the benches after it; they run without a scheduler or controllers (see
IDLE_COMPONENTS). The first cluster grows in place (its node names are given the
width of its largest size, so they stay the same). The three-cluster point is taken when
the first cluster has just reached the three-cluster size: two more control planes get a
fleet of that size, the three are measured together, and the two are stopped before the
first one grows on. So nothing is deleted, the per-cluster point and the one-cluster
point at that size are the same cluster in the same minutes, and no more than three
control planes run at once (at the default sizes 3 x 75,000 pods, fewer than a fourth
control plane beside one of 150,000 would hold). A three-cluster size not among the
sizes is measured as a one-cluster point too (the comparison needs it).

    GPUOPS_SCALING_SIZES      one-cluster sizes (default 1000,5000,10000)
    GPUOPS_SCALING_CLUSTERS   COUNTxNODES (default 3x5000; 0 for none)
    GPUOPS_BENCH_PODS_PER_NODE   (default 15)
    GPUOPS_SCALING_REPEAT     (baseline, cold start) pairs a point (default 3)
    GPUOPS_BENCH_RESULTS      where the results go (default tests/bench/results/)

Results: scaling-curve.json. Nothing is asserted about time; every point asserts that
its caches saw every node.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testenv.environment import Environment
from testenv.install import CrdsMissing
from tests.bench import dense_fleet as dense
from tests.bench.test_inventory_scale import RESULTS, ROOT, _machine

SIZES = sorted({int(n) for n in os.environ.get("GPUOPS_SCALING_SIZES", "1000,5000,10000").split(",") if n.strip()})
_CLUSTERS = os.environ.get("GPUOPS_SCALING_CLUSTERS", "3x5000").lower()
CLUSTER_COUNT, CLUSTER_NODES = (int(n) for n in _CLUSTERS.split("x")) if "x" in _CLUSTERS else (0, 0)
PODS_PER_NODE = int(os.environ.get("GPUOPS_BENCH_PODS_PER_NODE", "15"))
REPEAT = int(os.environ.get("GPUOPS_SCALING_REPEAT", "3"))
# b <= this is linear or better: a little above 1 for the noise of a shared VM.
LINEAR = 1.1
# Each cost of a point: the probe's key, its unit.
COSTS = {"baseline_list_s": "s", "cold_start_s": "s", "cold_start_cpu_s": "s", "status_quiet_median_ms": "ms",
         "status_after_one_change_median_ms": "ms", "status_quiet_cpu_median_ms": "ms",
         "status_after_one_change_cpu_median_ms": "ms", "rss_mib": "MiB"}


# Components a bench control plane stops once it runs: their informers would hold every
# pod (about a quarter of a plane's memory, some 2 GB at 75,000 pods, which three planes
# cannot spare on 24 GiB), and the bench needs neither: its pods are created bound, no
# controller owns them, and nothing is deleted.
IDLE_COMPONENTS = ("kube-scheduler", "kube-controller-manager")


def _components(env: Environment) -> dict[str, int]:
    """A control plane's components: name -> pid."""
    logs = env.plane.describe()["logs"]  # by component, in the order of `pids`
    assert isinstance(logs, dict)
    return dict(zip(logs, env.plane.pids, strict=True))


@contextlib.contextmanager
def _control_plane(folder: Path) -> Iterator[Environment]:
    """A control plane of the bench's own with the GPU Operator CRDs and no scheduler or
    controllers; stopped on the way out, however the bench ends (and its processes die
    with this one if it is killed)."""
    env = Environment(folder=folder)
    env.start()
    try:
        for name, pid in _components(env).items():
            if name in IDLE_COMPONENTS:
                os.kill(pid, signal.SIGTERM)  # reaped by env.stop()
        try:
            env.install_crds()
        except CrdsMissing as err:
            pytest.fail(str(err), pytrace=False)
        yield env
    finally:
        env.stop()


def _resident_mib(env: Environment) -> dict[str, float]:
    """Each component's resident memory in a control plane (MiB): what the machine needs
    for a fleet of this size besides gpuops."""
    figures = {}
    for name, pid in _components(env).items():
        if name in IDLE_COMPONENTS:
            continue
        with contextlib.suppress(OSError, StopIteration), open(f"/proc/{pid}/status") as status:
            figures[name] = next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))
    return {**figures, "total": sum(figures.values())}


def _probe(kubeconfigs: list[Path]) -> dict:
    probe = subprocess.run([sys.executable, "-m", "tests.bench.inventory_probe", "--quick", "--repeat", str(REPEAT),
                            "--renders", "100", *(f"--kubeconfig={k}" for k in kubeconfigs)],
                           cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert probe.returncode == 0, probe.stderr
    return json.loads(probe.stdout)


def _saw_every_node(measured: dict, nodes: int, clusters: int) -> None:
    """Correctness, the one thing asserted: every cache held every node of its cluster."""
    expected = [nodes] * clusters
    assert [c["nodes_listed"] for c in measured["per_cluster"]] == expected, measured["per_cluster"]
    assert [c["gpu_nodes_in_fleet"] for c in measured["per_cluster"]] == expected, measured["per_cluster"]
    assert measured["rss_gpu_nodes_in_fleet"] == expected


def exponent(points: list[tuple[int, float]]) -> float | None:
    """b of cost ~ nodes^b, least squares on log-log; None with fewer than two sizes."""
    xs = [math.log(n) for n, cost in points if cost > 0]
    ys = [math.log(cost) for _, cost in points if cost > 0]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _curve(single: dict[int, dict]) -> dict[str, dict]:
    """Per cost: its exponent and verdict, its cost per node at each size, and what each
    node added between two sizes (the marginal cost, free of the fixed part). The baseline
    is the API server's list, the reference rather than a cost of gpuops'; the cold start
    also has the exponent of its ratio to the baseline of the same point (how much faster
    or slower than the API's own list it grows)."""
    curve = {}
    sizes = sorted(single)
    for key, unit in COSTS.items():
        points = [(n, float(single[n][key])) for n in sizes]
        b = exponent(points)
        curve[key] = {
            "unit": unit,
            "exponent": None if b is None else round(b, 3),
            "verdict": _verdict(b, reference=key == "baseline_list_s"),
            "per_node": {str(n): cost / n for n, cost in points},
            "per_added_node": {f"{n0}-{n1}": (c1 - c0) / (n1 - n0)
                               for (n0, c0), (n1, c1) in zip(points, points[1:], strict=False)},
        }
    ratios = [(n, float(single[n]["cold_over_baseline"])) for n in sizes]
    b = exponent(ratios)
    curve["cold_over_baseline"] = {
        "unit": "ratio", "exponent": None if b is None else round(b, 3), "by_size": {str(n): r for n, r in ratios},
        "verdict": "one size only" if b is None else (
            ("no faster than the API's own list" if b <= LINEAR - 1 else "FASTER than the API's own list")
            + f" (b {b:.2f} relative to the baseline, limit {LINEAR - 1:.1f})")}
    return curve


def _verdict(b: float | None, *, reference: bool = False) -> str:
    if b is None:
        return "one size only"
    if reference:
        return f"the API server's list, the reference (b {b:.2f})"
    return ("linear or better" if b <= LINEAR else "WORSE than linear") + f" (b {b:.2f}, limit {LINEAR})"


def _against_apart(together: dict, single: dict, count: int) -> dict[str, dict]:
    """The clusters in one process against `count` times one cluster of the same size."""
    compared = {}
    for key, unit in COSTS.items():
        apart = count * float(single[key])
        ratio = float(together[key]) / apart if apart else math.nan
        compared[key] = {"unit": unit, "together": together[key], f"{count}x_one": apart, "ratio": round(ratio, 3),
                         "verdict": ("linear or better" if ratio <= LINEAR else "WORSE than linear")
                         + f" (ratio {ratio:.2f}, limit {LINEAR})"}
    return compared


def _point(measured: dict, nodes: int, growth: dense.Growth | None) -> dict:
    figures = {key: measured[key] for key in COSTS}
    return {"nodes": nodes, "pods": nodes * PODS_PER_NODE, **figures,
            "cold_over_baseline": measured["cold_over_baseline"],
            "setup_seconds": None if growth is None else {
                "created_nodes": growth.nodes_created, "create": round(growth.create_s, 1),
                "create_and_status": round(growth.create_and_status_s, 1)},
            "probe": measured}


@pytest.mark.timeout(3 * 3600)  # about 30 minutes at the default sizes; the suite's 600 s is per test
def test_scaling_curve_in_one_run(tmp_path_factory):
    started = dt.datetime.now(dt.timezone.utc)
    sizes = sorted(set(SIZES) | ({CLUSTER_NODES} if CLUSTER_COUNT > 1 else set()))
    width = dense.name_width(sizes[-1])
    single: dict[int, dict] = {}
    together: dict | None = None
    with _control_plane(tmp_path_factory.mktemp("scaling-1")) as first:
        have = 0
        for nodes in sizes:
            growth = dense.grow(first.kubeconfig, nodes=nodes, have=have, width=width, pods_per_node=PODS_PER_NODE)
            have = nodes
            measured = _probe([first.kubeconfig])
            _saw_every_node(measured, nodes, 1)
            single[nodes] = {**_point(measured, nodes, growth), "control_plane_rss_mib": _resident_mib(first)}
            print(f"scaling: {nodes} nodes: " + ", ".join(f"{k} {measured[k]:.4g}" for k in COSTS), flush=True)
            if nodes == CLUSTER_NODES and CLUSTER_COUNT > 1:
                with contextlib.ExitStack() as planes:
                    others = [planes.enter_context(_control_plane(tmp_path_factory.mktemp(f"scaling-{i}")))
                              for i in range(2, CLUSTER_COUNT + 1)]
                    setups = [dense.grow(other.kubeconfig, nodes=nodes, pods_per_node=PODS_PER_NODE)
                              for other in others]
                    measured = _probe([first.kubeconfig, *(other.kubeconfig for other in others)])
                    planes_rss = [_resident_mib(env) for env in (first, *others)]
                _saw_every_node(measured, nodes, CLUSTER_COUNT)
                together = {**_point(measured, nodes, None), "clusters": CLUSTER_COUNT,
                            "setup_seconds_of_the_others": [round(s.create_and_status_s, 1) for s in setups],
                            "control_plane_rss_mib": planes_rss}
                print(f"scaling: {CLUSTER_COUNT}x{nodes} nodes: "
                      + ", ".join(f"{k} {measured[k]:.4g}" for k in COSTS), flush=True)

    report: dict[str, object] = {
        "benchmark": "read path scaling curve",
        "when": started.isoformat(timespec="seconds"),
        "seconds": round((dt.datetime.now(dt.timezone.utc) - started).total_seconds()),
        "machine": _machine(),
        "fleet": {"pools": dense.POOLS, "gpus_per_node": 8, "pods_per_node": PODS_PER_NODE,
                  "pods_per_node_by_kind": dense.describe(PODS_PER_NODE)},
        "sizes": sizes,
        "clusters": {"count": CLUSTER_COUNT, "nodes_each": CLUSTER_NODES} if CLUSTER_COUNT > 1 else None,
        "method": {
            "probe": "tests/bench/inventory_probe.py --quick, a process of its own at each point",
            "baseline_list_s": "raw list of every node and pod (side by side, paged, parsed into JSON); with "
                               "several clusters one cluster after another (memory), so it is their sum",
            "cold_start_s": f"median of {REPEAT} cold starts, each right after its own baseline",
            "cold_start_cpu_s": "the probe's own CPU time in those cold starts (median): gpuops' work without "
                                "the wait for the API server's list",
            "status_quiet_median_ms": "100 renders of /gpu status from a warm cache, nothing changing (no churn)",
            "status_after_one_change_median_ms": "20 node and 20 pod changes, each rendered once the cache applied it",
            "status_quiet_cpu_median_ms": "the CPU time of the rendering thread in those quiet renders",
            "status_after_one_change_cpu_median_ms": ("the CPU time of the rendering thread in those renders "
                                                      "after one change: the render's own cost, without what "
                                                      "other processes (the control planes) took from it"),
            "rss_mib": "a fresh process holding the watching cache(s), after one /gpu status each",
            "control_plane_rss_mib": "VmRSS of each control plane component right after the point's probe",
            "exponent": f"least squares of log(cost) on log(nodes) over the one-cluster points; "
                        f"linear or better when b <= {LINEAR}",
            "clusters": ("the first cluster at that size and the others, each its own control plane, read from "
                         "one process, caches started side by side; renders and changes are every cluster's, "
                         "summed; compared with that many times the one-cluster point of the same size "
                         f"(ratio <= {LINEAR}: linear or better)"),
        },
        "points": [single[n] for n in sizes],
        "curve": _curve(single),
    }
    if together is not None:
        report["clusters_point"] = together
        report["clusters_against_apart"] = _against_apart(together, single[CLUSTER_NODES], CLUSTER_COUNT)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scaling-curve.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("curve", "clusters_against_apart") if k in report}, indent=2))
