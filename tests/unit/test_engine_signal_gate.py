"""Each node's GPU signals before and after its change, as the real engine runs a two-wave
drain over an in-memory cluster under a frozen clock: read before the node is cordoned,
read again before it is given back; a new XID 79, a new double-bit ECC error or a
row-remap failure keeps it cordoned and halts the run with the readings; what was there
before is not new; a node whose signals cannot be read after is waited for, then halts
the run. The readings come from a stand-in reader (the real one, through Prometheus:
tests/integration/test_service_health_control_plane.py)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pytest
from freezegun import freeze_time

from storage import audit
from tests.unit.test_engine_service_health import NOW, Drain, config, now
from workflows.engine.continuing import ContinueService
from workflows.engine.runs import RunService
from workflows.requests.service import RequestService
from workflows.kube.objects import NodeName
from workflows.signals.health import GpuHealth, NodeHealth
from workflows.signals.reading import Reading

NOT_GATED = config([])


@pytest.fixture
def cluster(fake_cluster, make):
    for node in ("gpu-01", "gpu-02"):
        fake_cluster.add_node(make.node(node, pool="serve-a"))
        for index, pod in enumerate(make.operands(node)):
            fake_cluster.add_pod(pod, uid=f"uid-{pod.name}-{index}")
    return fake_cluster


@pytest.fixture
def frozen() -> Iterator[object]:
    with freeze_time(NOW, ignore=["kubernetes"]) as clock:
        yield clock


def gpu(index: str, **signals: object) -> GpuHealth:
    values: dict[str, object] = {"gpu": index, "uuid": f"GPU-{index}", "model": "T4", "last_xid": 0,
                                 "xid_message": None, "gpu_temp_c": 40.0, "memory_temp_c": None, "throttle": (),
                                 "ecc_dbe": 0, "ecc_sbe": 0, "row_remap_failed": False,
                                 "uncorrectable_remapped_rows": 0, "pcie_replays": 0}
    values.update(signals)
    return GpuHealth(**values)  # type: ignore[arg-type]


class StandInSignals:
    """Each node's GPUs as a test sets them (None: the node's exporter does not answer):
    `gpus` at the first reading of a node (before its change), `later` (where set) at
    every reading after it."""

    def __init__(self) -> None:
        self.gpus: dict[str, tuple[GpuHealth, ...] | None] = {n: (gpu("0"), gpu("1")) for n in ("gpu-01", "gpu-02")}
        self.later: dict[str, tuple[GpuHealth, ...] | None] = {}
        self.reads: list[tuple[dt.datetime, str | None]] = []

    def read(self, node: str | None = None) -> Reading:
        assert node is not None
        first = all(n != node for _, n in self.reads)
        self.reads.append((now(), node))
        gpus = self.gpus[node] if first or node not in self.later else self.later[node]
        if gpus is None:
            return Reading(source="Prometheus at http://prom:9090", unknown={NodeName(node): "its exporter is silent"})
        return Reading(source="Prometheus at http://prom:9090", nodes={NodeName(node): NodeHealth(NodeName(node), gpus)})


def halt_detail(drain: Drain) -> dict:
    rows = drain.db.query("SELECT detail FROM audit WHERE action = 'run.failed'")
    return json.loads(rows[-1]["detail"])


def test_a_new_xid_79_during_a_nodes_change_keeps_it_cordoned_and_halts_the_run_with_the_readings(
        db, cluster, frozen):
    signals = StandInSignals()
    signals.later["gpu-01"] = (gpu("0"), gpu("1", last_xid=79))  # falls off the bus while drained
    drain = Drain(db, cluster, frozen, None, cfg=NOT_GATED, signals=signals)
    drain.drive(drain.finished)

    run = drain.run()
    assert run.state == "failed"
    reason = run.halted_reason or ""
    assert "gpu-01: new GPU faults after its change: GPU 1 raised XID 79 (GPU has fallen off the bus" in reason
    assert "before: none" in reason and "It stays cordoned" in reason
    assert "After: GPU 0: last XID 0, double-bit ECC 0" in reason and "GPU 1: last XID 79" in reason
    assert halt_detail(drain)["code"] == "new-gpu-fault"
    assert drain.step("gpu-01", "uncordon") == "skipped" and cluster.node("gpu-01").unschedulable
    assert not drain.started("gpu-02")


def test_signals_are_read_before_the_node_is_cordoned(db, cluster, frozen):
    signals = StandInSignals()
    drain = Drain(db, cluster, frozen, None, cfg=NOT_GATED, signals=signals)
    drain.drive(drain.finished)

    assert drain.run().state == "succeeded", drain.run().halted_reason
    actions = [(e.action, e.target) for e in audit.for_run(db, drain.run_id)]
    for node in ("gpu-01", "gpu-02"):
        started = [i for i, (action, target) in enumerate(actions) if (action, target) == ("step.running", node)]
        # Read before its first step (the cordon) started, and after all but its last (the uncordon).
        assert actions.index(("node.signals.before", node)) < started[0]
        assert started[-2] < actions.index(("node.signals.after", node)) < started[-1]


def test_faults_there_before_the_change_are_not_new(db, cluster, frozen):
    signals = StandInSignals()
    signals.gpus["gpu-01"] = (gpu("0", last_xid=79, ecc_dbe=2), gpu("1", row_remap_failed=True))
    drain = Drain(db, cluster, frozen, None, cfg=NOT_GATED, signals=signals)
    drain.drive(drain.finished)
    assert drain.run().state == "succeeded", drain.run().halted_reason


def test_a_new_double_bit_error_or_remap_failure_halts_the_run(db, cluster, frozen):
    signals = StandInSignals()
    signals.gpus["gpu-01"] = (gpu("0", ecc_dbe=2), gpu("1"))
    signals.later["gpu-01"] = (gpu("0", ecc_dbe=3), gpu("1", row_remap_failed=True))
    drain = Drain(db, cluster, frozen, None, cfg=NOT_GATED, signals=signals)
    drain.drive(drain.finished)

    reason = drain.run().halted_reason or ""
    assert "GPU 0 counts 3 double-bit ECC errors (before: 2)" in reason
    assert "GPU 1 failed to remap a memory row" in reason
    assert cluster.node("gpu-01").unschedulable


def test_a_node_whose_signals_cannot_be_read_after_is_waited_for_then_halts_the_run(db, cluster, frozen):
    signals = StandInSignals()
    signals.later["gpu-01"] = None
    drain = Drain(db, cluster, frozen, None, cfg=NOT_GATED, signals=signals)
    drain.drive(lambda: drain.step("gpu-01", "validate") == "done")
    checked = drain.ended("gpu-01", "validate")
    drain.drive(lambda: now() >= checked + dt.timedelta(minutes=5))
    assert drain.run().state == "running" and drain.step("gpu-01", "uncordon") == "pending"
    drain.drive(drain.finished)

    assert checked + dt.timedelta(minutes=10) <= now() <= checked + dt.timedelta(minutes=11)
    reason = drain.run().halted_reason or ""
    assert "gpu-01: its GPU signals could not be read 10m after its change (its exporter is silent)" in reason
    assert halt_detail(drain)["code"] == "gpu-signals-unread" and cluster.node("gpu-01").unschedulable


def test_a_node_read_again_in_time_goes_on(db, cluster, frozen):
    signals = StandInSignals()
    signals.later["gpu-01"] = None
    drain = Drain(db, cluster, frozen, None, cfg=NOT_GATED, signals=signals)
    drain.drive(lambda: now() >= NOW + dt.timedelta(minutes=3))
    assert drain.step("gpu-01", "uncordon") == "pending"
    del signals.later["gpu-01"]
    drain.drive(drain.finished)
    assert drain.run().state == "succeeded", drain.run().halted_reason




def test_continuing_a_run_a_new_fault_halted_still_holds_that_node(db, cluster, frozen):
    """`/gpu continue` without `--skip` after a new XID: the node is compared against the
    reading before the halted run changed it, not one taken now, so the fault is still new
    and the node is not given back."""
    signals = StandInSignals()
    signals.later["gpu-01"] = (gpu("0"), gpu("1", last_xid=79))
    drain = Drain(db, cluster, frozen, None, cfg=NOT_GATED, signals=signals)
    drain.drive(drain.finished)
    halted = drain.run_id
    assert drain.run().state == "failed"

    ada = NOT_GATED.actor("U0ADA")
    continued = ContinueService(RequestService(db, NOT_GATED), pools=NOT_GATED.pools).request(
        ada, RunService(db).get(halted), fleet=cluster.fleet(now()), now=now(), channel="C0OPS")
    drain.run_id = RunService(db).start(continued.view.id, dry_run=False, now=now(), actor=ada).id
    drain.restart()
    drain.drive(drain.finished)

    assert drain.run().state == "failed"
    assert "GPU 1 raised XID 79" in (drain.run().halted_reason or "")
    assert cluster.node("gpu-01").unschedulable
    before = [e.detail for e in audit.for_run(db, drain.run_id) if e.action == "node.signals.before"]
    assert before and before[0]["carried_from"] == halted
