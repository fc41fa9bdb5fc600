"""`/gpu status` and `/gpu findings` over plain fleet values and a real SQLite run
service: what the summary line says about cordoned capacity and MIG slices, and the
finding for a node a finished run left cordoned."""

from __future__ import annotations

import json
from pathlib import Path

from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from fleet_builder import NOW
from workflows.config import GpuopsConfig
from workflows.kube.labels import ANNOTATION_CORDONED_BY

CONFIG = GpuopsConfig.model_validate({
    "pools": {"train-a": {"kind": "training", "windows": "always"}},
    "access": {"users": {"U0DAVE": ["viewer"]}}})


class StaticFleet:
    def __init__(self, fleet) -> None:
        self.value = fleet

    def fleet(self, now):
        return self.value


def mark(run: str) -> dict[str, str]:
    return {ANNOTATION_CORDONED_BY: json.dumps({"run": run, "by": "gpuops for alice", "prior_unschedulable": False,
                                               "at": "2025-06-07T10:00:00.000000Z"})}


def services_for(make, tmp_path: Path) -> Services:
    nodes = [
        make.node("gpu-a-01"),
        make.node("gpu-a-02", unschedulable=True, annotations=mark("run-0ld000")),  # left by a finished run
        make.node("gpu-a-03", unschedulable=True),  # by hand
        # A MIG node: 8 physical GPUs advertised as 56 1g.10gb slices (mixed strategy).
        make.node("gpu-a-04", labels={"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-1g.10gb",
                                      "nvidia.com/mig-1g.10gb.count": "56"},
                  capacity={"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"}),
    ]
    pods = [p for n in nodes for p in make.operands(n.name)]
    return Services.on_database(config=CONFIG, fleet=StaticFleet(make.fleet(nodes, pods)),
                                database=open_database(tmp_path / "gpuops.db"))


def test_the_status_line_counts_cordoned_capacity_by_who_and_physical_gpus_apart_from_mig_slices(make, tmp_path):
    services = services_for(make, tmp_path)
    reply = dispatch("status", actor=CONFIG.actor("U0DAVE"), services=services, now=NOW)

    summary = reply.summary or ""
    assert "4/4 GPU nodes Ready" in summary
    assert "2 cordoned, 16 GPUs out (1 by gpuops (run-0ld000); 1 by hand)" in summary
    assert "32 physical GPUs" in summary
    assert "80/80 advertised, 56 of them MIG slices" in summary, summary
    services.database.close()  # type: ignore[union-attr]


def test_a_node_a_finished_run_left_cordoned_is_a_finding_with_who_since_when_and_how_to_give_it_back(
        make, tmp_path):
    services = services_for(make, tmp_path)
    reply = dispatch("findings gpu-a-02", actor=CONFIG.actor("U0DAVE"), services=services, now=NOW)

    texts = [b for s in reply.sections for b in (s.bullets or ())] + [
        " ".join(row) for s in reply.sections if s.table for row in s.table.rows]
    joined = "\n".join(texts) + "\n" + str([n.text for s in reply.sections for n in (s.notices or ())])
    assert "gpu-a-02 has been cordoned by gpuops for alice for 2h in run-0ld000, which is no longer running" in joined
    assert "/gpu uncordon gpu-a-02" in joined
    services.database.close()  # type: ignore[union-attr]


def test_a_persons_cordon_a_run_keeps_stays_the_persons_in_the_status_line_and_the_node_table(make, tmp_path):
    kept = {ANNOTATION_CORDONED_BY: json.dumps({"run": "run-n0w000", "by": "gpuops for alice",
                                                "prior_unschedulable": True, "at": "2025-06-07T10:00:00.000000Z"})}
    nodes = [make.node("gpu-a-01", unschedulable=True, annotations=kept), make.node("gpu-a-02")]
    services = Services.on_database(config=CONFIG, fleet=StaticFleet(make.fleet(nodes, [
        p for n in nodes for p in make.operands(n.name)])), database=open_database(tmp_path / "gpuops.db"))

    status = dispatch("status", actor=CONFIG.actor("U0DAVE"), services=services, now=NOW)
    pool = dispatch("status train-a", actor=CONFIG.actor("U0DAVE"), services=services, now=NOW)

    assert "1 cordoned, 8 GPUs out (1 by hand)" in (status.summary or "")
    rows = [row for s in pool.sections if s.table for row in s.table.rows if row[0] == "gpu-a-01"]
    assert rows and rows[0][2] == "by hand (kept by run-n0w000)", rows
    services.database.close()  # type: ignore[union-attr]


def test_the_findings_reply_names_findings_once(make, tmp_path):
    services = services_for(make, tmp_path)
    reply = dispatch("findings", actor=CONFIG.actor("U0DAVE"), services=services, now=NOW)

    assert reply.title == "Findings"
    assert "Findings" not in [s.title for s in reply.sections]
    assert any(s.notices for s in reply.sections)
    services.database.close()  # type: ignore[union-attr]
