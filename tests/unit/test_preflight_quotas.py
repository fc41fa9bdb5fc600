"""Pre-flight names the quotas a MIG change will no longer fit: a namespace whose enforced
quota on a MIG device the pool advertises enough of today is named when the change takes
that device away. The MIG service reads the quotas through the reader it is handed (the
quota service, among the entry point's readers); quotas it cannot read are said to be
unread, not taken for none, and the change is still planned."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from tests.unit.static_fleet import StaticFleet
from tests.unit.test_preflight_touches import REFERENCE, SMALL, _mig_node, _policy
from workflows.config import GpuopsConfig
from workflows.kube.errors import Forbidden
from workflows.kube.objects import ResourceQuotaObject
from workflows.mig.layouts import MigLayouts
from workflows.mig.plan import MigAsk, plan_mig
from workflows.preflight.facts import QuotaLimit, QuotaReading
from workflows.quotas.service import QuotaService

NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
CONFIG = GpuopsConfig.model_validate({
    "pools": {"inf": {"kind": "serving", "windows": "always", "max_unavailable": 2}},
    "access": {"users": {"U0ALICE": ["operator"]}}})
MIG_CONFIG = yaml.safe_load((REFERENCE / "default-mig-parted-config.yaml").read_text())["data"]["config.yaml"]
QUOTA_SENTENCE = (f"namespace serving's quota of 100 {SMALL} no longer fits: inf advertise 0 after this change "
                  "(112 now)")


class Cluster:
    """The cluster as the gateway and the watch cache would answer: the ClusterPolicy, the MIG
    manager's ConfigMap, the GPU pods, the ResourceQuotas (or the error listing them raises)."""

    identity = "system:serviceaccount:gpuops:gpuops"

    def __init__(self, make, nodes, pods, quotas=(), error: Exception | None = None) -> None:
        self.make, self.nodes, self.pods, self.quotas, self.error = make, nodes, list(pods), list(quotas), error

    def get_cluster_policy(self, name: str):
        return self.make.cluster_policy(name, mig_strategy="mixed")

    def get_config_map_data(self, namespace: str, name: str):
        return {"config.yaml": MIG_CONFIG}

    def list_gpu_pods(self):
        return list(self.pods)

    def list_resource_quotas(self):
        if self.error is not None:
            raise self.error
        return self.quotas

    def snapshot(self, now):
        return self.make.snapshot(self.nodes, self.pods, policies=[self.make.cluster_policy(mig_strategy="mixed")])


def _quota(namespace: str, count: int) -> ResourceQuotaObject:
    return ResourceQuotaObject(namespace=namespace, name="gpu", hard={f"requests.{SMALL}": str(count)}, used={})


def _services(make, tmp_path: Path, cluster: Cluster, *, with_quotas: bool = True) -> Services:
    quotas = QuotaService(reader=cluster, cluster=cluster, settings=CONFIG.inventory_settings())
    fleet = StaticFleet(make.fleet(cluster.nodes, cluster.pods,
                                   policies=[make.cluster_policy(mig_strategy="mixed")]))
    return Services.on_database(config=CONFIG, fleet=fleet, database=open_database(tmp_path / "gpuops.db"),
                                readers=(cluster, quotas) if with_quotas else (cluster,))


def _pre_flight(services: Services) -> tuple[str, ...]:
    reply = dispatch("mig inf all-3g.40gb bigger slices --dry-run", actor=CONFIG.actor("U0ALICE"), services=services,
                     now=NOW)
    services.database.close()  # type: ignore[union-attr]
    assert reply.ok, render_text(reply)
    (section,) = [s for s in reply.sections if s.title == "Pre-flight"]
    return section.bullets


def _fleet(make):
    nodes = [_mig_node(make, "n1"), _mig_node(make, "n2")]
    # A pod of namespace serving on the pool, asking for the slice the change takes away.
    small = make.workload("n1", gpus=1, resource=SMALL, name="small-0", namespace="serving")
    return nodes, [p for n in nodes for p in make.operands(n.name)] + [small]


def test_a_mig_plan_names_a_quota_that_fits_today_and_not_after_the_change(make):
    nodes, pods = _fleet(make)
    fleet = make.fleet(nodes, pods)
    quotas = QuotaReading(limits=(QuotaLimit(namespace="serving", resource=SMALL, hard=100, pools=("inf",)),))
    layouts = MigLayouts.parse(MIG_CONFIG, source="ConfigMap gpu-operator/default-mig-parted-config")

    planned = plan_mig(MigAsk(targets=("inf",), layout="all-3g.40gb"), fleet=fleet, policy_of={"inf": _policy()},
                       layouts=layouts, strategy="mixed", now=NOW, requested_by="U0ALICE", gpu_pods=pods,
                       quotas=quotas)

    (note,) = [n for n in planned.plan.summary.preflight if n.code == "quota-no-longer-fits"]
    assert (note.check, note.severity, note.sentence) == ("touches", "warning", QUOTA_SENTENCE)


def test_a_mig_change_asked_for_names_the_quota_the_quota_service_reads(make, tmp_path):
    nodes, pods = _fleet(make)
    cluster = Cluster(make, nodes, pods, quotas=[_quota("serving", 100), _quota("batch", 500)])

    said = _pre_flight(_services(make, tmp_path, cluster))

    # serving's 100 fit the 112 slices today, none after; batch's 500 never fit: not the change's doing.
    assert f"Warning: {QUOTA_SENTENCE}" in said
    assert not any("batch" in line for line in said)


def test_without_a_quota_reader_a_mig_change_names_no_quota(make, tmp_path):
    nodes, pods = _fleet(make)
    cluster = Cluster(make, nodes, pods, quotas=[_quota("serving", 100)])

    said = _pre_flight(_services(make, tmp_path, cluster, with_quotas=False))

    assert not any("quota" in line for line in said)


def test_quotas_that_cannot_be_read_are_said_unread_and_the_change_is_still_planned(make, tmp_path):
    nodes, pods = _fleet(make)
    refused = Forbidden("GET /api/v1/resourcequotas: forbidden", status=403,
                        api_message='resourcequotas is forbidden: User "system:serviceaccount:gpuops:gpuops" cannot '
                                    'list resource "resourcequotas"')
    cluster = Cluster(make, nodes, pods, error=refused)

    said = _pre_flight(_services(make, tmp_path, cluster))

    (line,) = [line for line in said if "quota" in line]
    assert line.startswith("GPU quotas could not be read, so this plan names none that would no longer fit after the "
                           "change: gpuops (system:serviceaccount:gpuops:gpuops) may not list ResourceQuotas")
