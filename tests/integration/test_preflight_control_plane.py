"""Pre-flight on the real control plane, against the demo fleet: an upgrade of the MIG
pool (mixed strategy: its nodes advertise nvidia.com/mig-1g.10gb, never nvidia.com/gpu)
whose canary pod would ask for the default nvidia.com/gpu is refused before anyone
approves it, naming the resource the pool advertises, and nothing is stored; with the
example configuration as shipped (the pool's check asks for its MIG device) it is
planned."""

from __future__ import annotations

import yaml

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from tests.integration.inventory_helpers import ROOT, _now, wait_fleet
from workflows.config import GpuopsConfig

MIG = "nvidia.com/mig-1g.10gb"


def _config(*, own_check: bool) -> GpuopsConfig:
    raw = yaml.safe_load((ROOT / "deploy" / "config.example.yaml").read_text())
    # The demo's ClusterPolicy drives every pool: an upgrade of one names the others.
    raw["upgrades"]["cluster_policy_scope"] = "all-pools"
    if not own_check:
        # Nobody wrote a resource: the fleet's check asks for the default, nvidia.com/gpu.
        del raw["upgrades"]["gpu_check"]["resource"]
        del raw["pools"]["inference-mig"]["gpu_check"]
    return GpuopsConfig.model_validate(raw)


def test_a_mig_pool_upgrade_without_a_check_resource_is_refused_naming_what_the_pool_advertises(
        demo_fleet, fleet_cache, tmp_path):
    config = _config(own_check=False)
    cache = fleet_cache(config=config)
    wait_fleet(cache, lambda f: len(f.pool("inference-mig").nodes) == 6 if f.pool("inference-mig") else False,
               "the MIG pool's six nodes")
    with open_database(tmp_path / "gpuops.db") as db:
        services = Services.on_database(config=config, fleet=cache, database=db)
        reply = dispatch("upgrade inference-mig to 580.105.08 driver CVE",
                         actor=config.actor("U0ALICE"), services=services, now=_now())
        text = render_text(reply)

        assert not reply.ok
        assert "gpu-check-resource-unset" in text
        assert "asks for one nvidia.com/gpu by default (no `gpu_check.resource` is configured)" in text
        assert f"inference-mig's nodes advertise {MIG}: name the one the check should use" in text
        assert f"set `pools.inference-mig.gpu_check.resource` to {MIG}" in text
        assert db.execute("SELECT count(*) FROM requests").fetchone()[0] == 0

        # The example configuration as shipped: the pool's check asks for its MIG device.
        shipped = _config(own_check=True)
        services = Services.on_database(config=shipped, fleet=cache, database=db)
        reply = dispatch("upgrade inference-mig to 580.105.08 driver CVE",
                         actor=shipped.actor("U0ALICE"), services=services, now=_now())
        assert reply.ok, render_text(reply)
        assert f"one {MIG}" in render_text(reply)
        assert db.execute("SELECT count(*) FROM requests").fetchone()[0] == 1
