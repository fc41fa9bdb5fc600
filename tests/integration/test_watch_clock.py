"""The watch cache reads no clock of its own: what it lists and assesses is stamped with
the time its `clock` says, so a state first seen while listing ages from that time."""

from __future__ import annotations

import datetime as dt

from storage.database import PerThreadDatabase
from workflows.fleet.first_seen import FirstSeen


UTC = dt.timezone.utc


def test_a_state_first_seen_while_listing_ages_from_the_caches_clock(gpu_operator_crds, fleet_cache, tmp_path):
    installer = gpu_operator_crds.installer()
    name = "clock-node"
    installer.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}}})
    database = PerThreadDatabase(tmp_path / "gpuops.db")
    listed_at = dt.datetime(2026, 1, 5, 3, 0, tzinfo=UTC)
    try:
        cache = fleet_cache(first_seen=FirstSeen(database.get), clock=lambda: listed_at)

        three_hours_on = cache.fleet(listed_at + dt.timedelta(hours=3)).nodes[name]
    finally:
        installer.delete({"kind": "Node", "metadata": {"name": name}})
        database.close()

    assert three_hours_on.upgrade.state == "upgrade-failed"
    assert three_hours_on.upgrade.since == listed_at
