"""A label and an annotation set on a GPU node with kubectl and left there, on the real
control plane: `/gpu node` reads who set them from the node's managedFields, gpuops ages
them from its own first-seen record, and after `inventory.forgotten_after` (7 days) with
no run and no note they are a `restriction-forgotten` finding, until a note says why. A
label set by hand on every node of the pool alike is the pool's design, not a node's."""

from __future__ import annotations

import dataclasses
import datetime as dt

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from testenv import fleet as fl
from testenv.install import wait_until
from tests.integration.inventory_helpers import CONFIG, _now, wait_fleet
from workflows.kube.gateway import KubeGateway

HAND = fl.FleetSpec(name="hand", system_nodes=0, pools=(fl.PoolSpec(name="train", nodes=2),))
NODE = "train-01"
DAY = dt.timedelta(days=1)


def _by_hand(installer, node: str, manager: str, meta: dict) -> None:
    """What `kubectl label node ...` / `kubectl annotate node ...` send."""
    installer.call("PATCH", f"/api/v1/nodes/{node}", query=[("fieldManager", manager)],
                   content_type="application/merge-patch+json", body={"metadata": meta})


def test_a_label_and_an_annotation_left_by_hand_for_a_week_are_forgotten_until_a_note_says_why(
        fleet, cluster, fleet_cache, tmp_path):
    fleet(HAND)
    installer = cluster.installer()
    cache = fleet_cache()
    wait_fleet(cache, lambda f: {NODE, "train-02"} <= set(f.nodes), "both nodes to be seen", timeout=120)
    _by_hand(installer, NODE, "kubectl-label", {"labels": {"team": "vision", "site": "a"}})
    _by_hand(installer, "train-02", "kubectl-label", {"labels": {"site": "a"}})
    _by_hand(installer, NODE, "kubectl-annotate", {"annotations": {"ops.example/why": "PSU swap"}})
    wait_until(lambda: (cache.node("train-02") is not None
                        and cache.node("train-02").labels.get("site") == "a"),  # type: ignore[union-attr]
               timeout=30, what="the watch cache to see the pool-wide label")

    gateway = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context="admin")
    services = dataclasses.replace(
        Services.on_database(config=CONFIG, fleet=cache, database=open_database(tmp_path / "gpuops.db")),
        node_reads=gateway)
    start = _now()

    def node_at(now: dt.datetime) -> str:
        reply = dispatch(f"node {NODE}", actor=CONFIG.actor("U0DAVE"), services=services, now=now)
        assert reply.ok, render_text(reply)
        return render_text(reply)

    first = node_at(start)
    assert "kubectl-annotate" in first and "kubectl-label" in first  # who set them, from managedFields
    assert "by hand for at least" not in first  # first seen now: not forgotten yet

    week_on = node_at(start + 8 * DAY)
    assert (f"{NODE} has been given annotation ops.example/why, label team=vision by hand for at least 8d, "
            "with no gpuops run on it and no note") in week_on
    assert "label site=a" not in week_on  # every node of the pool carries it alike

    noted = dispatch(f"note {NODE} PSU swap, ticket HW-9 for 3d", actor=CONFIG.actor("U0ALICE"),
                     services=services, now=start + 8 * DAY)
    assert noted.ok, render_text(noted)
    assert "by hand for at least" not in node_at(start + 9 * DAY)
    assert "by hand for at least 11d" in node_at(start + 11 * DAY + dt.timedelta(hours=1))
