"""`make bench`: the read path at 5,000 GPU nodes (40,000 GPUs, 8 pools).

Measured in one run, as ratios against a baseline from the same run: the raw API list
of every node (baseline), the watch cache's cold start, `/gpu status` from a warm cache
(median and p99 over 100 renders) and the bot process's resident memory. Results go to
tests/bench/results/ with the machine described. Targets are reported, not asserted.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from kubernetes import client, config

from testenv import fleet as fl
from testenv.controlplane import KWOK_ANNOTATION
from testenv.install import Installer

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tests" / "bench" / "results"
POOLS = 8
NODES_PER_POOL = 625
TARGETS = {"cold_over_baseline": 2.0, "status_median_ms": 50.0, "rss_mib": 300.0}


def _machine() -> dict[str, object]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(memory, 1), "python": platform.python_version(),
            "kernel": platform.release()}


def _bench_fleet() -> fl.FleetSpec:
    products = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"]
    return fl.FleetSpec(name="bench", system_nodes=0, operator=fl.OperatorSpec(stand_in=(
        "5,000 nodes created straight through the API, Ready and advertising, with no kwok and no operator: "
        "their heartbeats and reconciles would be the load, not the inventory")), pools=tuple(
        fl.PoolSpec(name=f"pool-{i}", kind="serving" if i < 4 else "training", nodes=NODES_PER_POOL,
                    product=products[i % 4], gpus_per_node=8)
        for i in range(POOLS)))


def _node(spec: fl.FleetSpec, pool: fl.PoolSpec, name: str) -> dict:
    node = fl.node_object(spec, pool, name, advertise=True)
    # No kwok for 5,000 nodes (its lease heartbeats would be the load): the node is
    # created Ready, with its GPUs advertised and GFD's driver labels.
    node["metadata"]["annotations"].pop(KWOK_ANNOTATION)
    node["metadata"]["labels"].update(fl.driver_version_labels(spec.operator.driver_version))
    node["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                     "message": "bench", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    return node


def _driver_pod(spec: fl.FleetSpec, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"nvidia-driver-daemonset-{node}", "namespace": spec.operator.namespace,
                         "labels": {"app": "nvidia-driver-daemonset",
                                    "app.kubernetes.io/component": "nvidia-driver"}},
            "spec": {"nodeName": node, "containers": [
                {"name": "nvidia-driver-ctr", "image": fl.driver_image(spec.operator.driver_version)}]}}


def test_inventory_at_5000_nodes(gpu_operator_crds):
    env = gpu_operator_crds
    spec = _bench_fleet()
    api = config.new_client_from_config(config_file=str(env.kubeconfig))
    api.configuration.connection_pool_maxsize = 16
    installer = Installer(api)
    installer.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.operator.namespace}},
                     exist_ok=True)
    installer.create(fl.cluster_policy_object(spec), exist_ok=True)
    installer.create(fl.operator_deployment(spec), exist_ok=True)
    objects = [_node(spec, pool, name) for pool in spec.pools for name in fl.pool_node_names(pool)]
    objects += [_driver_pod(spec, n["metadata"]["name"]) for n in list(objects)]
    started = dt.datetime.now(dt.timezone.utc)
    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(lambda obj: installer.create(obj, exist_ok=True), objects))
    created_s = (dt.datetime.now(dt.timezone.utc) - started).total_seconds()
    assert len(installer.list("Node", selector=f"{fl.FLEET_LABEL}=bench")) == POOLS * NODES_PER_POOL

    probe = subprocess.run([sys.executable, "-m", "tests.bench.inventory_probe", "--kubeconfig",
                            str(env.kubeconfig), "--renders", "100"], cwd=ROOT, capture_output=True,
                           text=True, timeout=900)
    assert probe.returncode == 0, probe.stderr
    measured = json.loads(probe.stdout)
    verdicts = {key: ("met" if measured[key] <= limit else "MISSED") + f" (target <= {limit})"
                for key, limit in TARGETS.items()}
    report = {"benchmark": "inventory read path", "when": started.isoformat(timespec="seconds"),
              "machine": _machine(), "fleet": {"gpu_nodes": POOLS * NODES_PER_POOL, "pools": POOLS,
                                               "gpus": POOLS * NODES_PER_POOL * 8, "driver_pods": POOLS * NODES_PER_POOL},
              "setup_seconds": round(created_s, 1), "kubernetes": client.VersionApi(api).get_code().git_version,
              "results": measured, "targets": verdicts}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "inventory-5000-nodes.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
