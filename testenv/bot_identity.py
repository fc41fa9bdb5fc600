"""The bot's own identity on the local control plane: its namespace, ServiceAccount and
least-privilege RBAC from deploy/rbac.yaml, as an install makes them. The kubeconfig's
"bot" context acts as that ServiceAccount (`controlplane.BOT_USER`), so what gpuops does
through it is allowed or refused exactly as in a cluster it is installed in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.rest import ApiException

from testenv.install import Installer, wait_until

RBAC = Path(__file__).resolve().parents[1] / "deploy" / "rbac.yaml"
# The kubeconfig context that acts as the bot's ServiceAccount.
BOT_CONTEXT = "bot"


def rbac_documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RBAC.read_text()) if d]


def grant_bot_rbac(installer: Installer) -> str:
    """The bot's namespace and deploy/rbac.yaml, as an install makes them; the kubeconfig
    context that acts as its ServiceAccount."""
    docs = rbac_documents()
    for namespace in sorted({d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")}):
        obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        _wait_terminated(installer, obj)  # a namespace on its way out takes nothing new
        installer.create(obj, exist_ok=True)
    for doc in docs:
        installer.create(doc, exist_ok=True)
    return BOT_CONTEXT


def revoke_bot_rbac(installer: Installer) -> None:
    """Take back what `grant_bot_rbac` granted (its namespaces stay: the fleet's operator
    may live in one), so a later test finds the bot with no rights again."""
    for doc in reversed(rbac_documents()):
        if installer.exists(doc):
            installer.delete(doc)


def _wait_terminated(installer: Installer, namespace: dict[str, Any]) -> None:
    """Wait out a namespace being deleted: the API server refuses new objects in it."""
    def settled() -> bool:
        try:
            return not installer.get(namespace)["metadata"].get("deletionTimestamp")
        except ApiException as err:
            if err.status == 404:
                return True
            raise
    wait_until(settled, timeout=60, what=f"namespace {namespace['metadata']['name']} to finish terminating")
