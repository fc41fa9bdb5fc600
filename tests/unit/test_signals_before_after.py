"""Which GPU faults are new between a node's reading before its change and after its
check: XIDs by their last code (a reload restarts the series), double-bit ECC against
zero after a reload (the volatile count resets), row-remap failures as a state."""

from __future__ import annotations

import pytest

from workflows.signals.before_after import GpuMarks, NodeMarks, new_faults


def node(*gpus: GpuMarks) -> NodeMarks:
    return NodeMarks(gpus=gpus)


def gpu(index: str = "0", **marks) -> GpuMarks:
    return GpuMarks(gpu=index, **{"last_xid": 0, "ecc_dbe": 0, "row_remap_failed": False, **marks})


@pytest.mark.parametrize(("before", "after", "reloaded", "new"), [
    # XID: the series holds the last code.
    (gpu(last_xid=0), gpu(last_xid=79), False, ["xid"]),
    (gpu(last_xid=79), gpu(last_xid=79), False, []),  # the same last code, no reload: the old one
    (gpu(last_xid=79), gpu(last_xid=79), True, ["xid"]),  # shown again after the series restarted
    (gpu(last_xid=48), gpu(last_xid=94), False, ["xid"]),
    (gpu(last_xid=0), gpu(last_xid=13), False, []),  # an application's fault holds nothing
    # Double-bit ECC: the volatile count resets on a reload.
    (gpu(ecc_dbe=2), gpu(ecc_dbe=2), False, []),
    (gpu(ecc_dbe=2), gpu(ecc_dbe=3), False, ["ecc-dbe"]),
    (gpu(ecc_dbe=5), gpu(ecc_dbe=2), True, ["ecc-dbe"]),  # lower than before, but 2 since the reload
    (gpu(ecc_dbe=5), gpu(ecc_dbe=0), True, []),
    (gpu(ecc_dbe=2), gpu(ecc_dbe=2), True, ["ecc-dbe"]),  # equal, but counted since the reload
    (gpu(ecc_dbe=5), gpu(ecc_dbe=1), False, ["ecc-dbe"]),  # a reload gpuops did not make: against zero
    # Row remapping: a state.
    (gpu(row_remap_failed=False), gpu(row_remap_failed=True), False, ["row-remap"]),
    (gpu(row_remap_failed=True), gpu(row_remap_failed=True), True, []),
])
def test_a_fault_is_new_by_what_its_series_can_tell(before, after, reloaded, new):
    assert [f.signal for f in new_faults(node(before), node(after), reloaded=reloaded)] == new


def test_with_nothing_known_before_every_watched_fault_after_is_new():
    faults = new_faults(NodeMarks(unknown="Prometheus did not answer"),
                        node(gpu("3", last_xid=79, ecc_dbe=1, row_remap_failed=True)), reloaded=False)
    assert [f.signal for f in faults] == ["xid", "ecc-dbe", "row-remap"]
    assert faults[0].sentence == "GPU 3 raised XID 79 (GPU has fallen off the bus (PCIe); before: unknown)"


def test_not_reported_is_not_a_fault():
    assert new_faults(node(gpu()), node(GpuMarks(gpu="0")), reloaded=True) == ()


def test_marks_keep_their_readings_through_the_audit():
    marks = node(gpu("1", last_xid=48, ecc_dbe=3, throttle=("HW slowdown",)))
    assert NodeMarks.from_json(marks.to_json()) == marks
