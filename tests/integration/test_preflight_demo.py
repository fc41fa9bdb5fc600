"""Pre-flight on the demo fleet, read from a real control plane: every kind's dry run,
planned in one go against the demo's special nodes, names the node that advertises 7 of
its 8 GPUs and leaves it out unless included, names the budget that allows no disruption,
keeps the node whose two driver sources a move to the operator clears, names a namespace's
quota on the MIG slice a MIG change of the pool takes away, and a dry run has the hash of
the request made from the same words."""

from __future__ import annotations

import pytest

from commands.services import Services
from storage.database import open_database
from tests.integration import engine_harness as h
from tests.integration.desk import ACCESS
from tests.integration.inventory_helpers import wait_fleet
from commands.catalog import dispatch
from workflows.config import GpuopsConfig
from workflows.kube.gateway import KubeGateway
from workflows.quotas.service import QuotaService

pytestmark = pytest.mark.controlplane

CONFIG = GpuopsConfig.model_validate({
    "pools": {name: {"kind": kind, "windows": "always", "max_unavailable": 2}
              for name, kind in (("serving-a", "serving"), ("training-a", "training"),
                                 ("inference-mig", "serving"))},
    "upgrades": {"allowed_versions": ["580.95.05", "580.105.08"], "cluster_policy_scope": "all-pools"},
    "access": ACCESS,
})


def _preflight(reply) -> tuple[str, ...]:
    return next((s.bullets for s in reply.sections if s.title == "Pre-flight"), ())


def _waves(reply) -> str:
    return " | ".join(", ".join(row[1:2]) for s in reply.sections if s.table is not None and s.title
                      and ("Wave" in s.title or "node at a time" in s.title) for row in s.table.rows)


def test_every_kind_plans_around_the_demo_fleets_special_nodes(demo_fleet, fleet_cache, tmp_path):
    cache = fleet_cache()
    wait_fleet(cache, lambda f: "serving-a-05" in f.nodes and f.nodes["serving-a-05"].advertised_gpus == 7
               and f.nodes["training-a-10"].driver.owner == "conflict", "the demo's special nodes")
    gateway = KubeGateway.connect(kubeconfig=demo_fleet.kubeconfig, context="admin")
    # A namespace with no pods yet whose quota counts on the MIG pool's 1g.10gb slices.
    installer = demo_fleet.installer()
    planning = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "capacity-planning"}}
    installer.create(planning, exist_ok=True)
    installer.call("POST", "/api/v1/namespaces/capacity-planning/resourcequotas", body={
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": "capacity-planning"},
        "spec": {"hard": {"requests.nvidia.com/mig-1g.10gb": "8"}}})
    quotas = QuotaService(reader=gateway, cluster=cache, settings=CONFIG.inventory_settings())
    db = open_database(tmp_path / "g.db")
    services = Services.on_database(config=CONFIG, fleet=cache, database=db, readers=(gateway, quotas))

    def say(text: str):
        reply = dispatch(text, actor=CONFIG.actor("U0ALICE"), services=services, now=h.now(), channel="C0OPS")
        assert reply.ok, (text, reply.summary, reply.sections)
        return reply

    try:
        # A driver upgrade: serving-a-05 (7 of 8 GPUs) left out, the llm-serving budget named.
        upgrade = say("upgrade serving-a to 580.105.08 --dry-run CVE fix")
        notes = _preflight(upgrade)
        assert any(n.startswith("Critical: serving-a-05 is left out of the driver upgrade") for n in notes), notes
        assert any("PodDisruptionBudget serving/llm-serving allows 0 disruptions now" in n
                   and "serving-a-02" not in n for n in notes), notes
        assert "serving-a-05" not in _waves(upgrade)
        included = say("upgrade serving-a to 580.105.08 --include serving-a-05 --dry-run")
        assert "serving-a-05" in _waves(included)
        assert any("serving-a-05 is in the driver upgrade as the request names it" in n
                   for n in _preflight(included))

        # A drain of a pool (asked for: drains have no dry run): training-a-10, whose driver
        # pod crash-loops beside a host driver, left out; a drain fixes nothing.
        drain = say("drain training-a for 1h rack maintenance")
        assert any(n.startswith("Critical: training-a-10 is left out of the drain") for n in _preflight(drain)), (
            _preflight(drain))
        assert "training-a-10" not in _waves(drain)

        # A move to the operator: training-a-10's two driver sources are what it clears.
        move = say("migrate training-a-09 training-a-10 to operator --dry-run")
        assert any("training-a-10 stays in the move" in n for n in _preflight(move)), _preflight(move)

        # A MIG change of the MIG pool: no node with findings, nothing left out.
        mig = say("mig inference-mig all-2g.20gb --dry-run")
        assert not any("left out" in n for n in _preflight(mig)), _preflight(mig)
        # The quota on 1g.10gb slices fits the pool today; after the change it advertises none.
        # (With no pods yet, the namespace can land on every pool: the quota report's reach.)
        assert any(n.startswith("Warning: namespace capacity-planning's quota of 8 nvidia.com/mig-1g.10gb no longer "
                                "fits: inference-mig, serving-a and training-a advertise 0 after this change")
                   for n in _preflight(mig)), _preflight(mig)

        # The request made from the dry run's words has the dry run's hash.
        dry_hash = (upgrade.summary or "").split("plan ")[1][:8]
        asked = say("upgrade serving-a to 580.105.08 CVE fix")
        (view,) = services.requests.open_requests("serving-a")  # type: ignore[union-attr]
        assert dry_hash == view.short_hash, (upgrade.summary, asked.summary)
    finally:
        db.close()
        installer.delete(planning, grace=0)
