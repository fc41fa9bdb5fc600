"""`/gpu quotas` as a user reads it, over plain node, pod and ResourceQuota values: the
table of namespaces with their flags, one pool's namespaces, one namespace's pods and
what decides their reach, and the answers when a name is unknown, nothing has a quota,
the quotas cannot be read, or there is no Kubernetes API at all."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from fleet_builder import NOW
from workflows.config import GpuopsConfig
from workflows.kube.errors import Forbidden, Unavailable
from workflows.kube.objects import Placement, ResourceQuotaObject, Taint, Toleration
from workflows.quotas.service import QuotaService

CONFIG = GpuopsConfig.model_validate({
    "pools": {"serving-a": {"kind": "serving", "windows": "always"},
              "train-a": {"kind": "training", "windows": "always"}},
    "access": {"users": {"U0DAVE": ["viewer"]}}})
SERVING_TAINT = Taint("dedicated", "serving", "NoSchedule")
TOLERATES_SERVING = Toleration("dedicated", "Equal", "serving", "NoSchedule")


class Quotas:
    """What the gateway would list (or the error it would raise)."""

    identity = "system:serviceaccount:gpuops:gpuops"

    def __init__(self, quotas=(), error=None) -> None:
        self.quotas, self.error = list(quotas), error

    def list_resource_quotas(self):
        if self.error is not None:
            raise self.error
        return self.quotas


class Cluster:
    def __init__(self, snapshot) -> None:
        self.value = snapshot

    def snapshot(self, now):
        return self.value


class Fleet:
    def __init__(self, fleet) -> None:
        self.value = fleet

    def fleet(self, now):
        return self.value


def quota(namespace, gpus, *, key="requests.nvidia.com/gpu", used=None):
    return ResourceQuotaObject(namespace=namespace, name="gpu", hard={key: str(gpus)},
                               used={key: str(used)} if used is not None else {})


def cluster(make):
    """serving-a: 2 x 8 GPUs, tainted for serving; train-a: 2 x 8 GPUs."""
    nodes = [dataclasses.replace(make.node(f"serving-a-0{i}", pool="serving-a"), taints=(SERVING_TAINT,))
             for i in (1, 2)] + [make.node(f"train-a-0{i}", pool="train-a") for i in (1, 2)]
    serving = Placement(node_selector={"gpuops.io/pool": "serving-a"}, tolerations=(TOLERATES_SERVING,))
    pods = [
        dataclasses.replace(make.workload("serving-a-01", gpus=8, namespace="inference", name="llm-0"),
                            placement=serving),
        dataclasses.replace(make.workload("serving-a-02", gpus=2, namespace="adhoc", name="notebook-0"),
                            placement=Placement(tolerations=(TOLERATES_SERVING,))),
        make.workload("train-a-01", gpus=4, namespace="research", name="trainer-0"),
        dataclasses.replace(make.pod(node=None, namespace="research", name="trainer-1", phase="Pending",
                                     gpu_requests={"nvidia.com/gpu": 4}, owner_kind="Job")),
    ]
    return nodes, pods


def services(make, tmp_path: Path, *, quotas: Quotas | None, nodes=None, pods=None) -> Services:
    if nodes is None:
        nodes, pods = cluster(make)
    found = Services.on_database(config=CONFIG, fleet=Fleet(make.fleet(nodes, pods)),
                                 database=open_database(tmp_path / "gpuops.db"))
    if quotas is not None:
        found.quotas = QuotaService(reader=quotas, cluster=Cluster(make.snapshot(nodes, pods)),
                                    settings=CONFIG.inventory_settings())
    return found


def ask(services: Services, text: str):
    reply = dispatch(text, actor=CONFIG.actor("U0DAVE"), services=services, now=NOW)
    services.database.close()  # type: ignore[union-attr]
    return reply


def rows(reply, title):
    (section,) = [s for s in reply.sections if s.title == title]
    return {row[0]: row for row in section.table.rows}


def notices(reply):
    return [n.text for n in reply.all_notices()]


def test_the_overview_shows_each_namespaces_quota_use_reach_and_capacity_with_its_flags(make, tmp_path):
    # The quota controller has not counted research's pending pod yet.
    quotas = Quotas([quota("inference", 16, used=8), quota("research", 24, used=4)])
    reply = ask(services(make, tmp_path, quotas=quotas), "quotas")

    assert reply.ok and reply.title == "GPU quotas"
    assert reply.summary == ("3 namespaces with a GPU quota or GPU pods · 2 ResourceQuotas on GPUs · 2 flags")
    table = rows(reply, "Namespaces")
    assert table["inference"] == ("inference", "16 GPUs", "8 GPUs", "serving-a", "16 GPUs", "-")
    assert table["research"] == ("research", "24 GPUs", "8 GPUs (quota status: 4)", "train-a", "16 GPUs",
                                 "exceeds pools")
    assert table["adhoc"] == ("adhoc", "none", "2 GPUs", "serving-a and train-a", "32 GPUs",
                              "no quota, serving pool")
    assert notices(reply) == [
        "adhoc has no GPU quota and can land on serving pool serving-a: nothing keeps it from taking the pool's "
        "last 6 free GPUs",
        "research: its quota of 24 GPUs exceeds the 16 the pools it can land on advertise (train-a)"]
    assert [n.command for n in reply.all_notices()] == ["/gpu quotas serving-a", "/gpu quotas research"]


def test_a_pool_lists_the_namespaces_that_can_land_on_it(make, tmp_path):
    reply = ask(services(make, tmp_path, quotas=Quotas([quota("inference", 16)])), "quotas serving-a")

    assert reply.title == "GPU quotas · pool serving-a"
    facts = {f.label: f.value for s in reply.sections for f in s.facts}
    assert facts["Kind"] == "serving" and facts["Advertises"] == "16 GPUs" and facts["Free"] == "6 GPUs"
    assert sorted(rows(reply, "Namespaces that can land here")) == ["adhoc", "inference"]
    assert any("adhoc has no GPU quota" in text for text in notices(reply))


def test_a_namespace_shows_the_pods_that_decide_where_it_can_land(make, tmp_path):
    reply = ask(services(make, tmp_path, quotas=Quotas([quota("inference", 16, used=8)])), "quotas inference")

    assert reply.title == "GPU quotas · namespace inference"
    pods = rows(reply, "Pods that decide where it can land")
    assert pods["llm-0"] == ("llm-0", "Running", "serving-a-01", "8 GPUs",
                             "nodeSelector gpuops.io/pool=serving-a; tolerates dedicated=serving:NoSchedule",
                             "serving-a")
    entries = rows(reply, "ResourceQuotas")
    assert entries["gpu"] == ("gpu", "requests.nvidia.com/gpu", "16", "8", "-")


def test_an_entry_kubernetes_does_not_enforce_is_named_so(make, tmp_path):
    quotas = Quotas([quota("research", 8, key="nvidia.com/gpu")])
    reply = ask(services(make, tmp_path, quotas=quotas), "quotas research")
    assert rows(reply, "ResourceQuotas")["gpu"][1] == "nvidia.com/gpu (not enforced)"
    assert ("research: `nvidia.com/gpu` in quota gpu is not enforced: Kubernetes counts an extended resource only as "
            "`requests.nvidia.com/gpu`") in notices(reply)


def test_an_unknown_name_answers_with_the_closest_pools_and_namespaces(make, tmp_path):
    reply = ask(services(make, tmp_path, quotas=Quotas()), "quotas reserch")
    assert not reply.ok and reply.title == "Not found"
    assert reply.summary == "No pool or namespace named `reserch`. Closest: `research`."


def test_nothing_with_a_quota_or_gpu_pods_says_so(make, tmp_path):
    nodes = [make.node("train-a-01", pool="train-a")]
    reply = ask(services(make, tmp_path, quotas=Quotas(), nodes=nodes, pods=[]), "quotas")
    assert reply.ok and reply.summary == "No namespace has a GPU quota or GPU pods." and reply.sections == ()


def test_a_forbidden_list_of_quotas_says_what_to_grant(make, tmp_path):
    refused = Forbidden('GET /api/v1/resourcequotas: resourcequotas is forbidden: User "system:serviceaccount:'
                        'gpuops:gpuops" cannot list resource "resourcequotas"', status=403,
                        api_message='resourcequotas is forbidden: User "system:serviceaccount:gpuops:gpuops" cannot '
                                    'list resource "resourcequotas"')
    reply = ask(services(make, tmp_path, quotas=Quotas(error=refused)), "quotas")
    assert not reply.ok and reply.title == "Cannot read GPU quotas"
    assert reply.summary.startswith("gpuops (system:serviceaccount:gpuops:gpuops) may not list ResourceQuotas: grant "
                                    "`list` on `resourcequotas` (deploy/rbac.yaml, role gpuops-fleet-reader)")


def test_an_api_that_does_not_answer_is_said_plainly(make, tmp_path):
    reply = ask(services(make, tmp_path, quotas=Quotas(error=Unavailable("GET /api/v1/resourcequotas: timed out"))),
                "quotas")
    assert not reply.ok and reply.summary == ("The Kubernetes API did not answer the list of ResourceQuotas: "
                                              "GET /api/v1/resourcequotas: timed out")


def test_without_a_kubernetes_api_quotas_are_not_available_here(make, tmp_path):
    reply = ask(services(make, tmp_path, quotas=None), "quotas")
    assert not reply.ok and "not available here" in reply.summary


def test_help_lists_quotas_for_a_viewer(make, tmp_path):
    reply = ask(services(make, tmp_path, quotas=None), "help")
    assert any(row[0] == "/gpu quotas" for s in reply.sections if s.table for row in s.table.rows)


def test_a_name_close_to_nothing_says_how_many_pools_and_namespaces_there_are(make, tmp_path):
    reply = ask(services(make, tmp_path, quotas=Quotas()), "quotas zzz")
    assert reply.summary == ("No pool or namespace named `zzz` (2 pools and 3 namespaces with a GPU quota or GPU "
                             "pods known).")
