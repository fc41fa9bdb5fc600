"""`/gpu quotas` on the real control plane, as the bot's ServiceAccount (deploy/rbac.yaml):
a fleet with a tainted serving pool and a training pool, GPU pods and ResourceQuotas
made through the API, and the figures and flags a user reads: a namespace with no quota
that can take the serving pool's last free GPUs, quotas that together promise the
training pool more than it has, a quota larger than anything its namespace can reach, and
a quota entry Kubernetes accepts but never enforces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.wiring import Runtime, build_runtime
from commands.catalog import dispatch
from testenv import fleet as fl
from testenv.install import wait_until
from tests.integration import engine_harness as h
from tests.integration.desk import grant_bot_rbac, operator_namespace_as_found, revoke_bot_rbac
from workflows.config import GpuopsConfig


SPEC = fl.FleetSpec(name="quotas", system_nodes=0, operator=fl.OperatorSpec(installed=False), pools=(
    fl.PoolSpec(name="serve", kind="serving", nodes=2, gpus_per_node=8),
    fl.PoolSpec(name="train", kind="training", nodes=2, gpus_per_node=4),
))
CONFIG = GpuopsConfig.model_validate({
    "pools": {"serve": {"kind": "serving", "windows": "always"}, "train": {"kind": "training", "windows": "always"}},
    "access": {"users": {"U0DAVE": ["viewer"]}}})
SERVING_TAINT = {"key": "dedicated", "value": "serving", "effect": "NoSchedule"}
NAMESPACES = ("inference", "adhoc", "research", "vision", "batch", "legacy")


def pod(namespace: str, name: str, gpus: int, *, selector: dict | None = None, tolerate: bool = False,
        pools: tuple[str, ...] = ()) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "registry.example/app:1",
                                  "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                  "terminationGracePeriodSeconds": 0}
    if selector:
        spec["nodeSelector"] = selector
    if tolerate:
        spec["tolerations"] = [{**SERVING_TAINT, "operator": "Equal"}]
    if pools:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": fl.POOL_LABEL, "operator": "In", "values": list(pools)}]}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def quota(installer, namespace: str, hard: dict[str, str]) -> None:
    installer.call("POST", f"/api/v1/namespaces/{namespace}/resourcequotas", body={
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": namespace},
        "spec": {"hard": hard}})


@pytest.fixture
def runtime(cluster, fleet, tmp_path: Path) -> Iterator[Runtime]:
    installer = cluster.installer()
    fleet(SPEC, simulate=False, advertise=True)
    for node in fl.pool_node_names(SPEC.pools[0]):
        installer.call("PATCH", f"/api/v1/nodes/{node}", body={"spec": {"taints": [SERVING_TAINT]}},
                       content_type="application/merge-patch+json")
    for namespace in NAMESPACES:
        installer.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, exist_ok=True)
    # Pods first: without the quota controller (not run here) a quota's status stays empty,
    # and the quota admission refuses new pods of its namespace until it is filled in.
    for obj in (
        pod("inference", "llm-0", 6, selector={fl.POOL_LABEL: "serve"}, tolerate=True),
        pod("adhoc", "notebook-0", 9, tolerate=True),  # more than any node has: stays Pending
        pod("research", "trainer-0", 2, pools=("train",)),
        pod("vision", "trainer-0", 2, selector={fl.POOL_LABEL: "train"}),
    ):
        installer.create(obj)
    quota(installer, "inference", {"requests.nvidia.com/gpu": "16"})
    quota(installer, "research", {"requests.nvidia.com/gpu": "6", "requests.cpu": "64"})
    quota(installer, "vision", {"requests.nvidia.com/gpu": "6"})
    quota(installer, "batch", {"requests.nvidia.com/gpu": "24"})
    quota(installer, "legacy", {"nvidia.com/gpu": "4"})
    with operator_namespace_as_found(installer):
        context = grant_bot_rbac(installer)
        built = build_runtime(CONFIG, kubeconfig=str(cluster.kubeconfig), context=context,
                              database=tmp_path / "gpuops.db")
        try:
            yield built
        finally:
            built.close()
            revoke_bot_rbac(installer)
            for namespace in NAMESPACES:
                installer.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, grace=0)


def rows(reply, title: str) -> dict[str, tuple[str, ...]]:
    (section,) = [s for s in reply.sections if s.title == title]
    return {row[0]: row for row in section.table.rows}


def test_quotas_as_the_bot_reads_them_against_the_pools_their_namespaces_can_land_on(runtime):
    def ask(text: str):
        return dispatch(text, actor=CONFIG.actor("U0DAVE"), services=runtime.services(), now=h.now())

    def settled() -> bool:
        reply = ask("quotas")
        if not reply.ok or not reply.sections:
            return False
        table = rows(reply, "Namespaces")
        # The serving pod is bound (it counts against the pool's free GPUs) and every namespace is in.
        return set(NAMESPACES) <= set(table) and "10 free" in " ".join(n.text for n in reply.all_notices())

    wait_until(settled, timeout=60, what="the bot's cache to see the GPU pods and the serving pod bound")
    reply = ask("quotas")
    table = rows(reply, "Namespaces")
    assert table["inference"] == ("inference", "16 GPUs", "6 GPUs", "serve", "16 GPUs", "-")
    assert table["adhoc"] == ("adhoc", "none", "9 GPUs", "serve and train", "24 GPUs", "no quota, serving pool")
    assert table["research"] == ("research", "6 GPUs", "2 GPUs", "train", "8 GPUs", "overcommitted")
    assert table["vision"] == ("vision", "6 GPUs", "2 GPUs", "train", "8 GPUs", "overcommitted")
    assert table["batch"] == ("batch", "24 GPUs", "0 GPUs", "train (no GPU pods: any pool)", "8 GPUs",
                              "overcommitted, exceeds pools")
    assert table["legacy"][1:3] == ("none", "-") and table["legacy"][5] == "entry not enforced"
    assert [n.text for n in reply.all_notices()] == [
        "adhoc has no GPU quota and can land on serving pool serve: nothing keeps it from taking the pool's last "
        "10 free GPUs",
        "Overcommitted: the quotas on nvidia.com/gpu of batch (24), research (6) and vision (6) add to 36, more "
        "than the 8 that the pools they can land on advertise (train)",
        "batch: its quota of 24 GPUs exceeds the 8 the pools it can land on advertise (train); it has no GPU pods, "
        "so this counts every pool a pod without constraints could land on",
        "legacy: `nvidia.com/gpu` in quota gpu is not enforced: Kubernetes counts an extended resource only as "
        "`requests.nvidia.com/gpu`",
    ]
    assert reply.summary == "6 namespaces with a GPU quota or GPU pods · 5 ResourceQuotas on GPUs · 4 flags"

    serve = ask("quotas serve")
    assert sorted(rows(serve, "Namespaces that can land here")) == ["adhoc", "inference"]
    facts = {f.label: f.value for s in serve.sections for f in s.facts}
    assert facts["Advertises"] == "16 GPUs" and facts["Free"] == "10 GPUs"

    research = ask("quotas research")
    (trainer,) = rows(research, "Pods that decide where it can land").values()
    assert trainer[4] == f"affinity: {fl.POOL_LABEL} In (train)" and trainer[5] == "train"

    missing = ask("quotas reserch")
    assert not missing.ok and missing.summary.startswith("No pool or namespace named `reserch`. Closest: `research`")
