"""A plain-text summary of the simulated fleet, read back from the API server."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from testenv import fleet as fl
from testenv.install import Installer, wait_until


def _installer(kubeconfig: Path) -> Installer:
    return Installer(config.new_client_from_config(config_file=str(kubeconfig)))


def advertised(node: dict[str, Any]) -> int:
    capacity = (node.get("status") or {}).get("capacity") or {}
    return sum(int(v) for k, v in capacity.items() if k.startswith("nvidia.com/"))


def _expected_dark(node: dict[str, Any]) -> bool:
    ann = node["metadata"].get("annotations") or {}
    return ann.get(fl.ANN_ADVERTISE) == "0" or fl.ANN_MIG_STUCK in ann or fl.ANN_NOT_READY in ann


def wait_converged(kubeconfig: Path, *, timeout: float) -> None:
    """Wait until every GPU node that should advertise GPUs does."""
    installer = _installer(kubeconfig)

    def converged() -> bool:
        nodes = installer.list("Node", selector="nvidia.com/gpu.present=true")
        return bool(nodes) and all(advertised(n) > 0 or _expected_dark(n) for n in nodes)

    wait_until(converged, timeout=timeout, what="every GPU node to advertise its GPUs")


def _notes(node: dict[str, Any]) -> str:
    labels = node["metadata"].get("labels") or {}
    ann = node["metadata"].get("annotations") or {}
    notes = []
    if node.get("spec", {}).get("unschedulable"):
        notes.append("cordoned")
    if labels.get("nvidia.com/gpu.deploy.driver") == "pre-installed":
        notes.append("host driver")
    elif fl.ANN_HOST_DRIVER in ann:
        notes.append("host + operator driver (conflict)")
    if fl.ANN_ADVERTISE in ann:
        notes.append(f"advertises {ann[fl.ANN_ADVERTISE]} (fault)")
    if labels.get("nvidia.com/mig.config"):
        notes.append(f"MIG {labels['nvidia.com/mig.config']} ({labels.get('nvidia.com/mig.config.state', '?')})")
    return ", ".join(notes)


def print_summary(kubeconfig: Path, *, fleet: str) -> None:
    installer = _installer(kubeconfig)
    nodes = installer.list("Node", selector=f"{fl.FLEET_LABEL}={fleet}")
    gpu_nodes = [n for n in nodes if (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.present") == "true"]
    pods = {}
    for pod in installer.list("Pod"):
        node = pod["spec"].get("nodeName")
        if node and pod["metadata"]["namespace"] not in ("gpu-operator",):
            pods.setdefault(node, []).append(f"{pod['metadata']['namespace']}/{pod['metadata']['name'].rsplit('-', 2)[0]}")
    rows = [("NODE", "POOL", "PRODUCT", "GPUS adv/phys", "DRIVER", "NOTES")]
    for node in sorted(gpu_nodes, key=lambda n: n["metadata"]["name"]):
        labels = node["metadata"]["labels"]
        physical = int(labels.get("nvidia.com/gpu.count", "0"))
        notes = _notes(node)
        if node["metadata"]["name"] in pods:
            notes = ", ".join(filter(None, [notes, "runs " + " ".join(pods[node["metadata"]["name"]])]))
        rows.append((
            node["metadata"]["name"], labels.get(fl.POOL_LABEL, "-"),
            labels.get("nvidia.com/gpu.product", "-"), f"{advertised(node)}/{physical}",
            labels.get("nvidia.com/cuda.driver-version.full", "-"), notes,
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    print(f"Fleet {fleet!r}: {len(gpu_nodes)} GPU nodes, {len(nodes) - len(gpu_nodes)} system nodes")
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    version = client.VersionApi(installer.api).get_code()
    print(f"\nKubernetes {version.git_version} (kube-apiserver, etcd, kube-controller-manager, "
          "kube-scheduler, kwok) on 127.0.0.1")
    with contextlib.suppress(ApiException):
        for policy in installer.list("ClusterPolicy", selector=f"{fl.FLEET_LABEL}={fleet}"):
            state = (policy.get("status") or {}).get("state", "not reconciled yet")
            print(f"GPU Operator ClusterPolicy {policy['metadata']['name']}: {state}")
