"""Run as its own process beside the inventory probe: pod churn at a target rate, as a
busy GPU cluster has it (workloads start, move through their phases and end).

    python -m tests.bench.pod_churn --kubeconfig PATH --rate 300

Prints `ready` once it knows the fleet, then one JSON line once it churns at 90% of its
rate over the last second (`up_to_speed` true) or has not got there in WARMUP_LIMIT_S
seconds (false), churns until its stdin closes, then prints one JSON line: the API calls
made by kind, the seconds and the rate achieved. Each call is one watch event for the
cache (a pod created, its status or labels changed, a pod deleted at once, with no grace
period, as no kubelet is there to confirm it).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import random
import sys
import threading
import time

from kubernetes import config
from kubernetes.client.exceptions import ApiException

from testenv import fleet as fl
from testenv.install import Installer
from tests.bench import dense_fleet as dense

# One cycle of operations, in proportions: a quarter of them new pods, as many ended,
# and the rest changes to pods that run (a workload's labels, a new pod reaching Running).
CYCLE = ("create", "patch", "running", "patch", "delete")
# Seconds the churn may take to reach its rate before it says it did not.
WARMUP_LIMIT_S = 15.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--rate", type=float, default=300.0, help="API calls (watch events) a second")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    api = config.new_client_from_config(config_file=args.kubeconfig)
    api.configuration.connection_pool_maxsize = args.workers + 2
    installer = Installer(api)
    nodes = [n["metadata"]["name"] for n in installer.list("Node", selector=f"{fl.FLEET_LABEL}=bench")]
    workloads = [(p["metadata"]["namespace"], p["metadata"]["name"])
                 for p in installer.list("Pod", selector=f"{dense.WORKLOAD_LABEL}=bench")]
    if not nodes:
        sys.exit("no bench nodes")
    rng = random.Random(20261204)
    lock = threading.Lock()
    started_pods: collections.deque[dict] = collections.deque()
    running_pods: collections.deque[dict] = collections.deque()
    counts: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    serial = itertools.count()
    stop = threading.Event()
    tokens: collections.deque[float] = collections.deque()
    token_ready = threading.Semaphore(0)

    def operation(kind: str) -> None:
        with lock:
            index = next(serial)
            node = rng.choice(nodes)
            if kind == "running" and not started_pods:
                kind = "create"
            if kind == "delete" and not running_pods:
                kind = "create"
            if kind == "patch" and not workloads:
                kind = "create"
            pod = None
            if kind == "running":
                pod = started_pods.popleft()
            elif kind == "delete":
                pod = running_pods.popleft()
            elif kind == "patch":
                namespace, name = rng.choice(workloads)
        if kind == "create":
            pod = dense.churn_pod(node, index)
            installer.create(pod)
            with lock:
                started_pods.append(pod)
        elif kind == "running":
            assert pod is not None
            installer.patch_status(pod, dense.running_status(pod, seed=index))
            with lock:
                running_pods.append(pod)
        elif kind == "delete":
            assert pod is not None
            installer.delete(pod, grace=0)
        else:
            installer.call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}",
                           body={"metadata": {"labels": {"bench.gpuops.io/step": str(index)}}},
                           content_type="application/merge-patch+json")
        with lock:
            counts[kind] += 1

    def worker() -> None:
        kinds = itertools.cycle(CYCLE)
        while True:
            token_ready.acquire()
            if stop.is_set():
                return
            tokens.popleft()
            kind = next(kinds)
            try:
                operation(kind)
            except ApiException as err:
                with lock:
                    errors[f"{kind} {err.status}"] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.workers)]
    for thread in threads:
        thread.start()
    print("ready", flush=True)
    began = time.perf_counter()

    def pace() -> None:
        # Tokens at the target rate; a backlog beyond a second's worth is dropped, so the
        # achieved rate shows what the machine managed rather than catching up in bursts.
        interval = 1.0 / args.rate
        due = time.perf_counter()
        while not stop.is_set():
            due += interval
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if len(tokens) < args.rate:
                tokens.append(due)
                token_ready.release()

    def announce_speed() -> None:
        # The probe times renders once the churn runs at its rate: events done over the
        # last second, sampled every 0.1 s.
        samples: collections.deque[tuple[float, int]] = collections.deque()
        while not stop.wait(0.1):
            now = time.perf_counter()
            with lock:
                samples.append((now, sum(counts.values())))
            while now - samples[0][0] > 1.0:
                samples.popleft()
            span = now - samples[0][0]
            per_s = (samples[-1][1] - samples[0][1]) / span if span >= 0.9 else 0.0
            fast = per_s >= 0.9 * args.rate
            if fast or now - began > WARMUP_LIMIT_S:
                print(json.dumps({"up_to_speed": fast, "per_s": round(per_s, 1),
                                  "after_s": round(now - began, 2)}), flush=True)
                return

    pacer = threading.Thread(target=pace, daemon=True)
    pacer.start()
    threading.Thread(target=announce_speed, daemon=True).start()
    sys.stdin.read()  # until the probe closes it
    stop.set()
    elapsed = time.perf_counter() - began
    for _ in threads:
        token_ready.release()
    for thread in threads:
        thread.join(timeout=10)
    total = sum(counts.values())
    print(json.dumps({"target_per_s": args.rate, "seconds": round(elapsed, 2), "events": total,
                      "achieved_per_s": round(total / elapsed, 1) if elapsed else 0.0,
                      "by_kind": dict(counts), "errors": dict(errors), "workers": args.workers}), flush=True)


if __name__ == "__main__":
    main()
