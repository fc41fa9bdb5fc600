"""A driver upgrade run, "gpuops drives" (autoUpgrade off), on the real GPU Operator with
one NVIDIADriver per pool, as the bot's ServiceAccount: the run sets the version on the
pool's NVIDIADriver once (audited, with the version it found), then canary first, wave by
wave, restarts each node's driver pod into the new version; the other pool is untouched.
A canary whose new driver crash-loops halts the run before the next wave.

The first two plans are written by hand (as the engine tests do); the last test asks for
the upgrade with `/gpu upgrade`, has it approved by two people and started as the
scheduler starts it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from commands.catalog import dispatch
from commands.services import Services
from storage import audit
from storage.database import open_database
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunService
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration import observe
from tests.integration.inventory_helpers import ROOT
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave

pytestmark = pytest.mark.controlplane

OLD, NEW = "580.95.05", "580.105.08"


def _fleet(**faults) -> fl.FleetSpec:
    return fl.FleetSpec(
        name="upg", system_nodes=0, operator=fl.OperatorSpec(use_nvidia_driver_crd=True),
        pools=(fl.PoolSpec(name="upg", nodes=2, driver_version=OLD, auto_upgrade=False),
               fl.PoolSpec(name="other", nodes=1, driver_version=OLD, auto_upgrade=False)),
        **faults)


NODE_STEPS = [("cordon", {}), ("evict", {}), ("driver", {"version": NEW, "timeout_s": 120}),
              ("wait-for", {"timeout_s": 120}), ("uncordon", {})]


def _upgrade_plan() -> Plan:
    """Canary upg-01 (the version set first), then upg-02."""
    set_version = ("driver-version", {"object": "NVIDIADriver", "name": "upg-driver", "version": NEW})
    waves = [(["upg-01"], [set_version, *NODE_STEPS]), (["upg-02"], NODE_STEPS)]
    return Plan(kind="upgrade", pool="upg", created_for=h.ALICE.user_id, summary=PlanSummary(), waves=tuple(
        Wave(index, tuple(NodeName(n) for n in nodes), tuple(NodeStep(k, NodeName(n), p) for n in nodes for k, p in steps))
        for index, (nodes, steps) in enumerate(waves)))


@pytest.fixture
def db(tmp_path: Path):
    database = open_database(tmp_path / "gpuops.db")
    yield database
    database.close()


@pytest.fixture
def as_bot(cluster):
    installer = cluster.installer()
    installer.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuops"}}, exist_ok=True)
    for doc in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()):
        installer.create(doc, exist_ok=True)
    return "bot"


def _driver_version(installer, name: str) -> str:
    return installer.get({"kind": "NVIDIADriver", "metadata": {"name": name}})["spec"]["version"]


def _gfd_version(installer, node: str) -> str | None:
    return observe.node(installer, node)["metadata"]["labels"].get("nvidia.com/cuda.driver-version.full")


def _converged(installer, nodes) -> None:
    wait_until(lambda: all(advertised(observe.node(installer, n)) == 8 for n in nodes), timeout=120,
               what="every node to advertise its GPUs")


def test_the_run_sets_the_pools_nvidia_driver_once_and_moves_the_pool_node_by_node(fleet, cluster, db, as_bot):
    fleet(_fleet())
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02", "other-01"])
    (other_pod,) = observe.driver_pods(installer, "other-01")

    run = h.start_run(db, _upgrade_plan())
    with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
        finished = h.wait_run(db, run.id, timeout=240)

    assert finished.state == "succeeded", finished.halted_reason
    assert _driver_version(installer, "upg-driver") == NEW
    assert _driver_version(installer, "other-driver") == OLD
    for node in ("upg-01", "upg-02"):
        assert _gfd_version(installer, node) == NEW
        assert not h.unschedulable(installer, node)
    # The other pool's NVIDIADriver and driver pod were left alone.
    assert _gfd_version(installer, "other-01") == OLD
    (still,) = observe.driver_pods(installer, "other-01")
    assert still["metadata"]["uid"] == other_pod["metadata"]["uid"]
    # One audited patch, with the version it replaced.
    patches = [r for r in audit.for_run(db, run.id) if r.action == "driver-version.set"]
    assert [(r.target, r.detail["from"], r.detail["to"]) for r in patches] == [("NVIDIADriver upg-driver", OLD, NEW)]
    assert audit.verify(db).ok


def test_a_canary_whose_new_driver_crash_loops_halts_the_run_before_the_next_wave(fleet, cluster, db, as_bot):
    fleet(_fleet(crashloop_driver_versions=(NEW,)))
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])

    run = h.start_run(db, _upgrade_plan())
    with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
        finished = h.wait_run(db, run.id, timeout=240)

    assert finished.state == "failed"
    assert "upg-01" in (finished.halted_reason or "") and "CrashLoopBackOff" in (finished.halted_reason or "")
    # The canary stays cordoned for a person; the next wave never started.
    assert h.unschedulable(installer, "upg-01")
    assert not h.unschedulable(installer, "upg-02") and _gfd_version(installer, "upg-02") == OLD


UPG_CONFIG = GpuopsConfig.model_validate({
    "pools": {"upg": {"kind": "serving", "windows": "always", "max_unavailable": 1, "upgrade_soak": "1s"}},
    "access": {"users": {"U0ALICE": ["operator"], "U0BOB": ["approver"], "U0CAROL": ["approver"]},
               "names": {"U0ALICE": "alice", "U0BOB": "bob", "U0CAROL": "carol"}},
})


def test_an_upgrade_asked_for_and_approved_by_two_people_moves_the_pool_canary_first(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(_fleet())
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])
    services = Services.on_database(config=UPG_CONFIG, fleet=fleet_cache(user=as_bot), database=db)

    def say(who: str, text: str):
        return dispatch(text, actor=UPG_CONFIG.actor(who), services=services, now=h.now(), channel="C0OPS")

    asked = say("U0ALICE", f"upgrade upg to {NEW} driver CVE")
    assert asked.ok, asked.summary
    (request,) = services.requests.open_requests("upg")  # type: ignore[union-attr]
    # Approvals name the exact plan (its hash); the requester cannot approve.
    assert not say("U0ALICE", f"approve {request.id} {request.short_hash}").ok
    for approver in ("U0BOB", "U0CAROL"):
        answer = say(approver, f"approve {request.id} {request.short_hash}")
        assert answer.ok, answer.summary
    run = RunService(db).start(request.id, dry_run=False, now=h.now(), plan_hash=request.plan_hash)

    with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
        finished = h.wait_run(db, run.id, timeout=240)

    assert finished.state == "succeeded", finished.halted_reason
    assert _driver_version(installer, "upg-driver") == NEW
    assert _driver_version(installer, "other-driver") == OLD
    assert {_gfd_version(installer, n) for n in ("upg-01", "upg-02")} == {NEW}
    assert _gfd_version(installer, "other-01") == OLD



def test_a_halted_upgrade_rolled_back_puts_the_old_version_back_and_gives_the_canary_back(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(_fleet(crashloop_driver_versions=(NEW,)))
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])
    services = Services.on_database(config=UPG_CONFIG, fleet=fleet_cache(user=as_bot), database=db)

    def say(who: str, text: str):
        return dispatch(text, actor=UPG_CONFIG.actor(who), services=services, now=h.now(), channel="C0OPS")

    def approve_and_run(request_id: str):
        view = services.requests.get(request_id)  # type: ignore[union-attr]
        for approver in ("U0BOB", "U0CAROL"):
            answer = say(approver, f"approve {view.id} {view.short_hash}")
            assert answer.ok, answer.summary
        run = RunService(db).start(view.id, dry_run=False, now=h.now(), plan_hash=view.plan_hash)
        with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
            return h.wait_run(db, run.id, timeout=240)

    assert say("U0ALICE", f"upgrade upg to {NEW} driver CVE").ok
    (request,) = services.requests.open_requests("upg")  # type: ignore[union-attr]
    halted = approve_and_run(request.id)
    assert halted.state == "failed" and h.unschedulable(installer, "upg-01")
    assert _driver_version(installer, "upg-driver") == NEW

    asked = say("U0ALICE", f"rollback {halted.id}")
    assert asked.ok, asked.summary
    assert any(f"a rollback of run {halted.id}: upg-01 go back to {OLD}" in b for b in asked.sections[1].bullets)
    assert [row[1] for row in asked.sections[1].table.rows] == ["upg-01"]  # only what the run changed
    back = approve_and_run(next(r for r in services.requests.open_requests("upg")  # type: ignore[union-attr]
                                if r.reason == f"rollback of {halted.id}").id)

    assert back.state == "succeeded", back.halted_reason
    assert _driver_version(installer, "upg-driver") == OLD
    assert _gfd_version(installer, "upg-01") == OLD
    assert not h.unschedulable(installer, "upg-01")  # taken over from the halted run, and given back
    assert [r.detail["to"] for r in audit.for_run(db, back.id) if r.action == "driver-version.set"] == [OLD]
    # A request for a new upgrade is still refused while a node shows two driver sources;
    # none does now.
    assert fleet_cache(user=as_bot).fleet(h.now()).nodes["upg-01"].driver.owner == "operator"
