"""A person's cordon and taint on a real control plane, aged by the watch cache from when
it first saw them: reported as forgotten once older than `inventory.forgotten_after`
(and not before), silenced by an operator's `/gpu note`, and back when the note ends; and
`/gpu compare` reading a pool's labels and taints from the watch cache."""

from __future__ import annotations

import datetime as dt

from commands.catalog import dispatch
from commands.services import Services
from storage import audit
from storage.database import PerThreadDatabase
from tests.integration.inventory_helpers import CONFIG
from workflows.fleet.first_seen import FirstSeen

UTC = dt.timezone.utc
NODES = ("forgot-01", "forgot-02", "forgot-03")


def gpu_node(name: str, *, cordoned: bool = False, taints: list[dict[str, str]] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", "gpuops.io/pool": "serving-a"}},
            "spec": {"unschedulable": cordoned, "taints": taints or []}}


def findings(services: Services, now: dt.datetime) -> list[str]:
    reply = dispatch("findings forgot-02", actor=CONFIG.actor("U0DAVE"), services=services, now=now)
    return [n.text for s in reply.sections for n in s.notices]


def test_a_forgotten_hand_cordon_and_taint_are_found_from_the_watch_and_a_note_silences_them(
        gpu_operator_crds, fleet_cache, tmp_path):
    installer = gpu_operator_crds.installer()
    installer.create(gpu_node("forgot-01"))
    installer.create(gpu_node("forgot-02", cordoned=True,
                              taints=[{"key": "team", "value": "alice", "effect": "NoSchedule"}]))
    installer.create(gpu_node("forgot-03"))
    database = PerThreadDatabase(tmp_path / "gpuops.db")
    listed_at = dt.datetime(2026, 1, 5, 3, 0, tzinfo=UTC)
    try:
        cache = fleet_cache(first_seen=FirstSeen(database.get), clock=lambda: listed_at)
        services = Services.on_database(config=CONFIG, fleet=cache, database=database.get())

        six_days_on = findings(services, listed_at + dt.timedelta(days=6))
        eight_days_on = findings(services, listed_at + dt.timedelta(days=8))
        noted = dispatch("note forgot-02 PSU swap, ticket HW-123 for 2d", actor=CONFIG.actor("U0ALICE"),
                         services=services, now=listed_at + dt.timedelta(days=8))
        while_noted = findings(services, listed_at + dt.timedelta(days=9))
        after_the_note = findings(services, listed_at + dt.timedelta(days=10, minutes=1))
        entries = [e for e in audit.recent(database.get(), 5) if e.action == "node.note"]
    finally:
        for name in NODES:
            installer.delete({"kind": "Node", "metadata": {"name": name}})
        database.close()

    assert not any("has been cordoned by hand" in text for text in six_days_on)
    forgotten = [t for t in eight_days_on if t.startswith("forgot-02")]
    assert forgotten == ["forgot-02 has been cordoned by hand for at least 8d and tainted team=alice:NoSchedule for "
                         "at least 8d, with no gpuops run on it and no note: if it is still needed, say why with "
                         "`/gpu note forgot-02 <why> for <how long>`; if not, give the node back"], eight_days_on
    assert noted.ok, noted.summary
    assert [(e.target, e.actor) for e in entries] == [("forgot-02", "U0ALICE")]
    assert not any("cordoned by hand" in text for text in while_noted)
    assert any("cordoned by hand for at least 10d" in text for text in after_the_note)


def test_compare_reads_labels_and_taints_from_the_watch_cache(gpu_operator_crds, fleet_cache):
    installer = gpu_operator_crds.installer()
    odd = gpu_node("forgot-02", taints=[{"key": "team", "value": "alice", "effect": "NoSchedule"}])
    odd["metadata"]["labels"]["rack"] = "r9"
    for node in (gpu_node("forgot-01"), odd, gpu_node("forgot-03")):
        if node is not odd:
            node["metadata"]["labels"]["rack"] = "r1"
        installer.create(node)
    try:
        cache = fleet_cache()
        services = Services(config=CONFIG, fleet=cache)
        reply = dispatch("compare serving-a", actor=CONFIG.actor("U0DAVE"), services=services,
                         now=dt.datetime.now(UTC))
    finally:
        for name in NODES:
            installer.delete({"kind": "Node", "metadata": {"name": name}})

    rows = {row[0]: row[1:] for s in reply.sections if s.table for row in s.table.rows}
    assert rows["label rack"] == ("r1", "r9 on forgot-02")
    assert rows["taints"] == ("(none)", "team=alice:NoSchedule on forgot-02")
    assert "label kubernetes.io/hostname" not in rows
