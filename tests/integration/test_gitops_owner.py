"""Where Git owns the driver object, on the real control plane and the real GPU Operator,
with a stand-in GitOps controller (testenv.gitops_standin: it behaves as Argo CD's
self-heal does, applying the object's version with its own field manager and marks and
putting back foreign changes within seconds).

Today's upgrade patches the version directly: the stand-in puts it back at its next sync
(why upgrades of a Git-owned object must go through Git). The inventory names the owner
from the object's real managedFields, and a version someone else wrote over it is a
finding naming who, until the owner's next sync."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from commands.services import Services
from storage import audit
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunService
from testenv import fleet as fl
from testenv.gitops_standin import STANDIN_MANAGER, StandInGitOpsController
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration import observe
from tests.integration.desk import ACCESS, Desk, bot_granted_for_the_test
from tests.integration.inventory_helpers import wait_fleet
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave

OLD, NEW, OTHER = "580.95.05", "580.105.08", "580.105.09"
DRIVER = "upg-driver"
FLEET = fl.FleetSpec(
    name="gitops", system_nodes=0, operator=fl.OperatorSpec(use_nvidia_driver_crd=True),
    pools=(fl.PoolSpec(name="upg", nodes=1, driver_version=OLD, auto_upgrade=False),))


@pytest.fixture
def as_bot(cluster):
    yield from bot_granted_for_the_test(cluster)


def _driver(installer) -> dict:
    return installer.get({"kind": "NVIDIADriver", "metadata": {"name": DRIVER}})


def _version_managers(obj: dict) -> set[str]:
    return {e["manager"] for e in obj["metadata"].get("managedFields") or ()
            if "f:version" in ((e.get("fieldsV1") or {}).get("f:spec") or {})}


def _owner(view):
    (manager,) = view.pool("upg").driver_managers
    return manager.version_owner


def test_todays_direct_patch_of_a_git_owned_nvidia_driver_is_put_back_by_the_next_sync(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(FLEET)
    installer = cluster.installer()
    wait_until(lambda: advertised(observe.node(installer, "upg-01")) == 8, timeout=120,
               what="upg-01 to advertise its GPUs")
    set_version = NodeStep("driver-version", NodeName("upg-01"),
                           {"object": "NVIDIADriver", "name": DRIVER, "version": NEW})
    plan = Plan(kind="upgrade", pool="upg", created_for=h.ALICE.user_id, summary=PlanSummary(),
                waves=(Wave(0, (NodeName("upg-01"),), (set_version,)),))

    with StandInGitOpsController(cluster.installer(), kind="NVIDIADriver", name=DRIVER, version=OLD) as git:
        view = wait_fleet(fleet_cache(user=as_bot), lambda v: _owner(v).tool == "Argo CD",
                          "the inventory to name Argo CD as the driver object's owner")
        assert _owner(view).text() == f"NVIDIADriver {DRIVER} is applied by Argo CD application gpu-operator from Git"
        run = h.start_run(db, plan)
        with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
            finished = h.wait_run(db, run.id, timeout=120)
        assert finished.state == "succeeded", finished.halted_reason
        # gpuops's patch landed (on record) ...
        patches = [r for r in audit.for_run(db, run.id) if r.action == "driver-version.set"]
        assert [(r.detail["from"], r.detail["to"]) for r in patches] == [(OLD, NEW)]
        # ... and the stand-in's next sync put Git's version back, its manager owning the field again.
        wait_until(lambda: _driver(installer)["spec"]["version"] == OLD, timeout=10,
                   what="the stand-in GitOps controller to put Git's version back")
        assert _version_managers(_driver(installer)) == {STANDIN_MANAGER}
        assert git.git_version == OLD


def test_a_version_someone_patched_over_gits_is_a_drift_finding_until_the_owner_syncs(
        fleet, cluster, as_bot, fleet_cache):
    fleet(FLEET)
    installer = cluster.installer()
    # A slow resync: the patch below stays until the test asks the stand-in to sync.
    with StandInGitOpsController(cluster.installer(), kind="NVIDIADriver", name=DRIVER, version=OLD,
                                 resync=3600) as git:
        cache = fleet_cache(user=as_bot)
        wait_fleet(cache, lambda v: _owner(v).tool == "Argo CD", "the inventory to name Argo CD")
        installer.call("PATCH", f"/apis/nvidia.com/v1alpha1/nvidiadrivers/{DRIVER}",
                       content_type="application/merge-patch+json", body={"spec": {"version": NEW}},
                       query=[("fieldManager", "kubectl-patch")])

        view = wait_fleet(cache, lambda v: any(f.code == "driver-version-drift" for f in v.findings),
                          "the drift finding")
        (found,) = [f for f in view.findings if f.code == "driver-version-drift"]
        assert found.pool == "upg" and found.severity == "warning"
        assert (f"spec.version was changed to {NEW} by kubectl-patch, not by Argo CD application gpu-operator"
                in found.message), found.message

        git.sync()
        wait_fleet(cache, lambda v: not any(f.code == "driver-version-drift" for f in v.findings),
                   "the finding to clear once the owner synced")
        assert _driver(installer)["spec"]["version"] == OLD


# --------------------------------------------------------------------------------------
# Git mode: the run says what to change in Git and waits for the object to name it

GIT_CONFIG = GpuopsConfig.model_validate({
    "pools": {"upg": {"kind": "serving", "windows": "always", "max_unavailable": 1, "upgrade_soak": "1s"}},
    "access": ACCESS})
TWO = fl.FleetSpec(
    name="gitops", system_nodes=0, operator=fl.OperatorSpec(use_nvidia_driver_crd=True),
    pools=(fl.PoolSpec(name="upg", nodes=2, driver_version=OLD, auto_upgrade=False),))
NODES = ("upg-01", "upg-02")


def _pods(installer) -> dict[str, str]:
    return {n: observe.driver_pods(installer, n)[0]["metadata"]["uid"] for n in NODES}


def _ask_and_run_with_git(cluster, db, as_bot, fleet_cache, git: StandInGitOpsController, *, applies: str,
                          ref: str = f"NVIDIADriver {DRIVER}"):
    """Ask for NEW, approve, start the run; when its thread says what to change in Git,
    merge `applies` there (as a person would), and wait for the run to end."""
    desk = Desk(cluster, db, Services.on_database(config=GIT_CONFIG, fleet=fleet_cache(user=as_bot), database=db),
                GIT_CONFIG, user=as_bot)
    wait_fleet(desk.services.fleet, lambda v: _owner(v).tool == "Argo CD", "the inventory to name Argo CD")
    asked = desk.say("U0ALICE", f"upgrade upg to {NEW} driver CVE")
    assert asked.ok, asked.summary
    assert any(b.startswith(f"Git mode: gpuops does not patch {ref}")
               for s in asked.sections for b in (s.bullets or ())), asked.sections
    (request,) = desk.services.requests.open_requests("upg")  # type: ignore[union-attr]
    view = desk.services.requests.get(request.id)  # type: ignore[union-attr]
    for approver in ("U0BOB", "U0CAROL"):
        assert desk.say(approver, f"approve {view.id} {view.short_hash}").ok
    run = RunService(db, requests=desk.services.requests).start(view.id, dry_run=False, now=h.now(),
                                                                 plan_hash=view.plan_hash)
    told: list[str] = []
    with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
        wait_until(lambda: _heard(db, told, "Git mode: change spec."), timeout=60,
                   what="the thread to say what to change in Git")
        git.commit(applies)
        return h.wait_run(db, run.id, timeout=240), told


def _heard(db, told: list[str], text: str) -> bool:
    told.extend(json.dumps(m) for m in h.thread_messages(db))
    return any(text in m for m in told)


def test_in_git_mode_the_run_says_what_to_change_in_git_waits_for_it_then_moves_the_pool_wave_by_wave(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(TWO)
    installer = cluster.installer()
    wait_until(lambda: all(advertised(observe.node(installer, n)) == 8 for n in NODES), timeout=120,
               what="every node to advertise its GPUs")
    with StandInGitOpsController(cluster.installer(), kind="NVIDIADriver", name=DRIVER, version=OLD) as git:
        finished, told = _ask_and_run_with_git(cluster, db, as_bot, fleet_cache, git, applies=NEW)
        versions = _version_managers(_driver(installer))

    assert finished.state == "succeeded", finished.halted_reason
    assert any(f"Git mode: change spec.version of NVIDIADriver {DRIVER} from {OLD} to {NEW} in Git; Argo CD "
               "application gpu-operator applies it" in m for m in told), told
    # gpuops never patched the object: Git's tool applied it, and still owns the field.
    assert not [r for r in audit.for_run(db, finished.id) if r.action == "driver-version.set"]
    assert _driver(installer)["spec"]["version"] == NEW and versions == {STANDIN_MANAGER}
    for node in NODES:
        assert observe.node(installer, node)["metadata"]["labels"].get("nvidia.com/cuda.driver-version.full") == NEW
        assert not h.unschedulable(installer, node)


def test_in_git_mode_another_version_arriving_halts_the_run_before_any_node_moves(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(TWO)
    installer = cluster.installer()
    wait_until(lambda: all(advertised(observe.node(installer, n)) == 8 for n in NODES), timeout=120,
               what="every node to advertise its GPUs")
    before = _pods(installer)
    with StandInGitOpsController(cluster.installer(), kind="NVIDIADriver", name=DRIVER, version=OLD) as git:
        finished, _ = _ask_and_run_with_git(cluster, db, as_bot, fleet_cache, git, applies=OTHER)

    assert finished.state == "failed"
    assert f"names {OTHER}, applied by Argo CD application gpu-operator, not the approved {NEW}" in (
        finished.halted_reason or ""), finished.halted_reason
    (halt,) = [m for m in h.thread_messages(db) if m["event"] == "run.failed"]
    assert halt["halted_on"] == "git-version-other"
    assert _pods(installer) == before
    assert not any(h.unschedulable(installer, n) for n in NODES)


def _ends_waiting_for_git(cluster, db, as_bot):
    """A hand-made Git-mode plan (hold both nodes, wait for Git, cordon the canary) whose
    window ends a few seconds in, with Git never changing."""
    git_step = {"object": "NVIDIADriver", "name": DRIVER, "version": NEW, "git": True,
                "owner": "Argo CD application gpu-operator"}
    steps = (NodeStep("operator-hold", NodeName("upg-01"), {"nodes": list(NODES)}),
             NodeStep("driver-version", NodeName("upg-01"), git_step),
             NodeStep("cordon", NodeName("upg-01"), {}), NodeStep("uncordon", NodeName("upg-01"), {}))
    plan = Plan(kind="upgrade", pool="upg", created_for=h.ALICE.user_id, summary=PlanSummary(),
                waves=(Wave(0, (NodeName("upg-01"),), steps),))
    start = h.now()
    run = h.start_run(db, plan, window=(start, start + dt.timedelta(seconds=8)))
    with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
        return h.wait_run(db, run.id, timeout=90)


def _held_by(installer, node: str) -> str | None:
    return observe.node(installer, node)["metadata"].get("annotations", {}).get("gpuops.io/driver-upgrade-held-by")


def test_in_git_mode_a_window_that_ends_before_git_changes_gives_every_node_back_untouched(
        fleet, cluster, db, as_bot):
    fleet(TWO)
    installer = cluster.installer()
    wait_until(lambda: all(advertised(observe.node(installer, n)) == 8 for n in NODES), timeout=120,
               what="every node to advertise its GPUs")
    before = _pods(installer)

    with StandInGitOpsController(cluster.installer(), kind="NVIDIADriver", name=DRIVER, version=OLD):
        finished = _ends_waiting_for_git(cluster, db, as_bot)

    assert finished.state == "failed"
    assert "the window ended before Git changed spec.version" in (finished.halted_reason or ""), finished.halted_reason
    (halt,) = [m for m in h.thread_messages(db) if m["event"] == "run.failed"]
    assert halt["halted_on"] == "git-window-ended"
    # Every node as it was: the same driver pods, not cordoned, no hold left.
    assert _pods(installer) == before
    for node in NODES:
        labels = observe.node(installer, node)["metadata"]["labels"]
        assert "nvidia.com/gpu-driver-upgrade.skip" not in labels and not h.unschedulable(installer, node)
    released = [r for r in audit.for_run(db, finished.id) if r.action == "driver-upgrade.release"]
    assert [sorted(r.detail["nodes"]) for r in released] == [list(NODES)]


def test_a_run_that_ended_waiting_for_git_continues_by_holding_the_nodes_again_before_it_waits(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(TWO)
    installer = cluster.installer()
    wait_until(lambda: all(advertised(observe.node(installer, n)) == 8 for n in NODES), timeout=120,
               what="every node to advertise its GPUs")
    with StandInGitOpsController(cluster.installer(), kind="NVIDIADriver", name=DRIVER, version=OLD) as git:
        halted = _ends_waiting_for_git(cluster, db, as_bot)
        assert halted.state == "failed" and not any(_held_by(installer, n) for n in NODES)
        desk = Desk(cluster, db, Services.on_database(config=GIT_CONFIG, fleet=fleet_cache(user=as_bot),
                                                      database=db), GIT_CONFIG, user=as_bot)
        asked = desk.say("U0ALICE", f"continue {halted.id}")
        assert asked.ok, asked.summary
        (request,) = desk.services.requests.open_requests("upg")  # type: ignore[union-attr]
        view = desk.services.requests.get(request.id)  # type: ignore[union-attr]
        assert [s.kind for s in view.plan.waves[0].steps][:2] == ["operator-hold", "driver-version"]
        for approver in ("U0BOB", "U0CAROL"):
            assert desk.say(approver, f"approve {view.id} {view.short_hash}").ok
        run = RunService(db, requests=desk.services.requests).start(view.id, dry_run=False, now=h.now(),
                                                                     plan_hash=view.plan_hash)
        with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
            # Held again before the continuation waits for Git.
            wait_until(lambda: all(_held_by(installer, n) == run.id for n in NODES), timeout=60,
                       what="the continuation to hold the nodes again")
            git.commit(NEW)
            finished = h.wait_run(db, run.id, timeout=120)

    assert finished.state == "succeeded", finished.halted_reason
    assert _driver(installer)["spec"]["version"] == NEW


def test_in_git_mode_with_auto_upgrade_on_every_node_is_held_until_its_wave_once_git_names_the_version(
        fleet, cluster, db, as_bot, fleet_cache):
    # The nudge wakes the operator's upgrade controller as its next 2-minute look would.
    gated = fl.FleetSpec(name="gitops", system_nodes=1, nudge_upgrade_controller=True,
                         operator=fl.OperatorSpec(auto_upgrade=True, driver_version=OLD),
                         pools=(fl.PoolSpec(name="upg", nodes=2),))
    policy = gated.operator.cluster_policy_name
    fleet(gated)
    installer = cluster.installer()
    wait_until(lambda: all(advertised(observe.node(installer, n)) == 8 for n in NODES), timeout=120,
               what="every node to advertise its GPUs")
    with StandInGitOpsController(cluster.installer(), kind="ClusterPolicy", name=policy, version=OLD) as git:
        finished, told = _ask_and_run_with_git(cluster, db, as_bot, fleet_cache, git, applies=NEW,
                                               ref=f"ClusterPolicy {policy}")

    assert finished.state == "succeeded", finished.halted_reason
    assert any(f"change spec.driver.version of ClusterPolicy {policy} from {OLD} to {NEW} in Git" in m
               for m in told), told
    assert not [r for r in audit.for_run(db, finished.id) if r.action == "driver-version.set"]
    # Held before Git changed, then let go wave by wave: the operator upgraded each node in its turn.
    holds = [r for r in audit.for_run(db, finished.id) if r.action == "driver-upgrade.hold"]
    assert [sorted(r.detail["nodes"]) for r in holds] == [list(NODES)]
    for node in NODES:
        assert observe.node(installer, node)["metadata"]["labels"].get("nvidia.com/cuda.driver-version.full") == NEW
        assert not _held_by(installer, node) and not h.unschedulable(installer, node)
