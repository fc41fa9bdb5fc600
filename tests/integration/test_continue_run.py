"""A halted driver upgrade continued on the real GPU Operator (`/gpu continue`).

The pool has four nodes, two out at once: the canary, then a wave of two, then the last.
One node of the second wave loses a GPU (the device plugin marks it unhealthy), so its
validation times out and the run halts with that node cordoned; its wave mate finished.
Its cause fixed (the GPU healthy again), `/gpu continue` asks for what is left, two people
approve, and the continuation runs: the nodes done before are neither cordoned nor
evicted nor restarted again, the halted node repeats only its validation and is given
back, the last node is upgraded. With `--skip`, the halted node is left cordoned for a
person and the rest goes on."""

from __future__ import annotations

import pytest

from commands.services import Services
from storage import audit
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration import observe
from tests.integration.desk import ACCESS, Desk, bot_granted_for_the_test
from workflows.config import GpuopsConfig


OLD, NEW = "580.95.05", "580.105.08"

FLEET = fl.FleetSpec(
    name="cont", system_nodes=0, operator=fl.OperatorSpec(use_nvidia_driver_crd=True),
    pools=(fl.PoolSpec(name="cont", nodes=4, driver_version=OLD, auto_upgrade=False),))

CONFIG = GpuopsConfig.model_validate({
    "pools": {"cont": {"kind": "serving", "windows": "always", "max_unavailable": 2, "upgrade_soak": "1s",
                       # How long a node's new driver may take to validate before the run halts.
                       "validate_timeout": "45s"}},
    "access": ACCESS,
})


@pytest.fixture
def as_bot(cluster):
    yield from bot_granted_for_the_test(cluster)


def _annotate(installer, node: str, key: str, value: str | None) -> None:
    installer.call("PATCH", f"/api/v1/nodes/{node}", body={"metadata": {"annotations": {key: value}}},
                   content_type="application/merge-patch+json")


def _gfd_version(installer, node: str) -> str | None:
    return observe.node(installer, node)["metadata"]["labels"].get("nvidia.com/cuda.driver-version.full")


def _driver_pod_uid(installer, node: str) -> str:
    (pod,) = observe.driver_pods(installer, node)
    return pod["metadata"]["uid"]


def _touched(db, run_id: str) -> dict[str, list[str]]:
    """The steps the run started, per node, in order."""
    started: dict[str, list[str]] = {}
    for row in audit.for_run(db, run_id):
        if row.action == "step.running":
            started.setdefault(row.target, []).append(row.detail["kind"])
    return started


def _halted_on_second_wave(fleet, cluster, db, as_bot, fleet_cache):
    """Ask for the upgrade, make the second wave's first node lose a GPU, run it to its
    halt: (desk, halted run, the plan's waves, the halted node)."""
    fleet(FLEET)
    installer = cluster.installer()
    nodes = [f"cont-0{i}" for i in range(1, 5)]
    wait_until(lambda: all(advertised(observe.node(installer, n)) == 8 for n in nodes), timeout=120,
               what="every node to advertise its GPUs")
    services = Services.on_database(config=CONFIG, fleet=fleet_cache(user=as_bot), database=db)
    desk = Desk(cluster, db, services, CONFIG, user=as_bot)
    assert desk.say("U0ALICE", f"upgrade cont to {NEW} driver CVE").ok
    (request,) = services.requests.open_requests("cont")  # type: ignore[union-attr]
    waves = [w.nodes for w in request.plan.waves]
    assert [len(w) for w in waves] == [1, 2, 1], waves
    broken = waves[1][0]
    _annotate(installer, broken, fl.ANN_UNHEALTHY, "1")
    halted = desk.approve_and_run(request.id)
    assert halted.state == "failed", halted.halted_reason
    assert broken in (halted.halted_reason or ""), halted.halted_reason
    assert h.unschedulable(installer, broken)
    return desk, halted, waves, broken


def test_a_halted_upgrade_continued_after_its_cause_is_fixed_upgrades_the_rest_and_touches_no_node_again(
        fleet, cluster, db, as_bot, fleet_cache):
    desk, halted, waves, broken = _halted_on_second_wave(fleet, cluster, db, as_bot, fleet_cache)
    installer = cluster.installer()
    canary, mate, last = waves[0][0], waves[1][1], waves[2][0]
    assert _gfd_version(installer, mate) == NEW and not h.unschedulable(installer, mate)  # done before the halt
    before = {n: _driver_pod_uid(installer, n) for n in (canary, mate, broken)}
    # The cause, fixed: the GPU is healthy again.
    _annotate(installer, broken, fl.ANN_UNHEALTHY, None)

    asked = desk.say("U0ALICE", f"continue {halted.id}")
    assert asked.ok, asked.summary
    continuation = desk.services.requests.continuation_of(halted.id, pool="cont")  # type: ignore[union-attr]
    assert continuation is not None and continuation.approvals_required == 2
    assert [w.nodes for w in continuation.plan.waves] == [(broken,), (last,)]
    again = desk.say("U0ALICE", f"continue {halted.id}")
    assert not again.ok and "continued already" in again.summary
    finished = desk.approve_and_run(continuation.id)

    assert finished.state == "succeeded", finished.halted_reason
    touched = _touched(db, finished.id)
    # Nodes done before the halt: no cordon, no eviction, no driver restart, nothing.
    assert canary not in touched and mate not in touched, touched
    assert {n: _driver_pod_uid(installer, n) for n in (canary, mate)} == {n: before[n] for n in (canary, mate)}
    # The halted node: its cordon taken over, its validation repeated, given back; its
    # driver (restarted before the halt) is not restarted again.
    assert touched[broken] == ["cordon", "validate", "uncordon"], touched
    assert _driver_pod_uid(installer, broken) == before[broken]
    assert touched[last] == ["cordon", "evict", "driver", "validate", "uncordon"], touched
    for node in (canary, mate, broken, last):
        assert _gfd_version(installer, node) == NEW and not h.unschedulable(installer, node), node
    # The driver object was set once, by the halted run.
    assert [r for r in audit.for_run(db, finished.id) if r.action == "driver-version.set"] == []
    assert audit.verify(db).ok


def test_a_halted_upgrade_continued_without_its_halted_node_leaves_that_node_cordoned_for_a_person(
        fleet, cluster, db, as_bot, fleet_cache):
    desk, halted, waves, broken = _halted_on_second_wave(fleet, cluster, db, as_bot, fleet_cache)
    installer = cluster.installer()
    last = waves[2][0]
    mark = h.cordon_mark(installer, broken)

    asked = desk.say("U0ALICE", f"continue {halted.id} --skip {broken}")
    assert asked.ok, asked.summary
    continuation = desk.services.requests.continuation_of(halted.id, pool="cont")  # type: ignore[union-attr]
    assert continuation is not None and continuation.plan.nodes == (last,)
    assert any(f"{broken} is left out (--skip) and left cordoned for a person" in n
               for n in continuation.plan.summary.notes)
    finished = desk.approve_and_run(continuation.id)

    assert finished.state == "succeeded", finished.halted_reason
    assert set(_touched(db, finished.id)) == {last}
    assert _gfd_version(installer, last) == NEW and not h.unschedulable(installer, last)
    # Still the halted run's, for a person (`/gpu uncordon`).
    assert h.unschedulable(installer, broken) and h.cordon_mark(installer, broken) == mark
