"""Reading the simulated fleet back from the API in tests."""

from __future__ import annotations

from typing import Any

from testenv.install import Installer

OPERATOR_NS = "gpu-operator"


def node(installer: Installer, name: str) -> dict[str, Any]:
    return installer.get({"kind": "Node", "metadata": {"name": name}})


def operand_pods(installer: Installer, node_name: str, app: str) -> list[dict[str, Any]]:
    """The live (not terminating) operand pods of one DaemonSet on one node."""
    return [p for p in installer.list("Pod", namespace=OPERATOR_NS, selector=f"app={app}")
            if p["spec"].get("nodeName") == node_name and not p["metadata"].get("deletionTimestamp")]


def driver_pods(installer: Installer, node_name: str) -> list[dict[str, Any]]:
    """The live driver pods on one node, whichever DaemonSet (ClusterPolicy's or an NVIDIADriver's) runs them."""
    return [p for p in installer.list("Pod", namespace=OPERATOR_NS, selector="app.kubernetes.io/component=nvidia-driver")
            if p["spec"].get("nodeName") == node_name and not p["metadata"].get("deletionTimestamp")]


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])
