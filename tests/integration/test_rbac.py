"""The bot's RBAC (deploy/rbac.yaml), split by what each grant does, as the real API
server's authorizer answers for the bot's ServiceAccount: it reads the fleet, patches
nodes, evicts anywhere, deletes pods only in the operator's namespace (driver pods) and
its own (canary pods), creates pods only in its own; deleting pods anywhere else is the
opt-in deploy/rbac-pod-delete.yaml, without which the bot refuses to start when a pool
asks for it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bot.wiring import check_permissions
from testenv.install import wait_until
from tests.integration.desk import grant_bot_rbac, operator_namespace_as_found, revoke_bot_rbac
from workflows.config import ConfigError, GpuopsConfig
from workflows.kube.errors import Forbidden
from workflows.kube.gateway import KubeGateway


POD_DELETE = Path(__file__).resolve().parents[2] / "deploy" / "rbac-pod-delete.yaml"

# (verb, resource, group, namespace or None for every namespace) -> allowed
GRANTS = [
    (("list", "nodes", "", None), True),
    (("watch", "pods", "", None), True),
    (("patch", "nodes", "", None), True),
    (("create", "pods/eviction", "", "ml-team"), True),
    (("list", "poddisruptionbudgets", "policy", None), True),
    (("list", "resourcequotas", "", None), True),  # /gpu quotas
    (("patch", "clusterpolicies", "nvidia.com", None), True),
    (("patch", "nvidiadrivers", "nvidia.com", None), True),
    (("delete", "pods", "", "gpu-operator"), True),  # driver pods
    (("create", "pods", "", "gpuops"), True),  # canary pods
    (("delete", "pods", "", "gpuops"), True),
    (("update", "leases", "coordination.k8s.io", "gpuops"), True),
    (("create", "events", "events.k8s.io", "default"), True),  # what it did, as Events
    (("patch", "events", "events.k8s.io", "default"), True),  # their series
    # What it must not do.
    (("delete", "pods", "", None), False),
    (("delete", "pods", "", "ml-team"), False),
    (("create", "pods", "", "ml-team"), False),
    (("delete", "nodes", "", None), False),
    (("update", "nodes", "", None), False),
    (("get", "secrets", "", "gpuops"), False),
    (("list", "configmaps", "", "gpu-operator"), False),
    (("patch", "daemonsets", "apps", "gpu-operator"), False),
    (("patch", "deployments", "apps", "gpu-operator"), False),
    (("delete", "clusterpolicies", "nvidia.com", None), False),
    (("update", "resourcequotas", "", "ml-team"), False),
    (("update", "leases", "coordination.k8s.io", "kube-system"), False),
    (("delete", "events", "events.k8s.io", "default"), False),
    (("list", "events", "events.k8s.io", None), False),
    (("create", "events", "", "default"), False),
]


@pytest.fixture
def bot(cluster):
    installer = cluster.installer()
    with operator_namespace_as_found(installer):
        grant_bot_rbac(installer)
        gateway = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context="bot")
        try:
            yield gateway
        finally:
            gateway.close()
            revoke_bot_rbac(installer)


def test_the_bot_may_do_what_its_runs_do_and_nothing_else(bot):
    answers = {ask: bot.may(ask[0], ask[1], group=ask[2], namespace=ask[3]) for ask, _ in GRANTS}
    assert answers == {ask: allowed for ask, allowed in GRANTS}


def test_deleting_pods_anywhere_is_an_opt_in_the_bot_checks_before_it_starts(cluster, bot):
    installer = cluster.installer()
    installer.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml-team"}}, exist_ok=True)
    installer.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job-1", "namespace": "ml-team"},
                      "spec": {"containers": [{"name": "main", "image": "registry.example/app:1"}]}}, exist_ok=True)
    config = GpuopsConfig.model_validate({"pools": {
        "train": {"kind": "training", "windows": "always"},
        "serve": {"kind": "serving", "windows": "always", "allow_delete": True, "pdb_timeout_action": "delete"}}})

    with pytest.raises(ConfigError) as refused:
        check_permissions(config, bot)
    assert str(refused.value).startswith(f"{bot.identity} may not delete pods in every namespace, but pool serve "
                                         "sets pdb_timeout_action: delete"), refused.value
    with pytest.raises(Forbidden):  # the authorizer's answer is what a real call gets
        pod = installer.get({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job-1", "namespace": "ml-team"}})
        bot.delete_pod("ml-team", "job-1", uid=pod["metadata"]["uid"], dry_run=True)
    check_permissions(GpuopsConfig.model_validate({"pools": {"train": {"kind": "training"}}}), bot)  # none asks

    opt_in = list(yaml.safe_load_all(POD_DELETE.read_text()))
    try:
        for doc in opt_in:
            installer.create(doc, exist_ok=True)
        # The API server's RBAC authorizer learns of a new binding from its own watch: wait
        # for it to answer with the grant, then the start-up check must pass.
        wait_until(lambda: bot.may("delete", "pods"), timeout=30, what="the authorizer to see the pod-delete grant")
        check_permissions(config, bot)
        assert bot.may("delete", "pods") and bot.may("delete", "pods", namespace="ml-team")
    finally:
        for doc in opt_in:
            installer.delete(doc)
        installer.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml-team"}})
