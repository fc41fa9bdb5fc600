"""Where Git owns the driver object, on the real control plane and the real GPU Operator,
with a stand-in GitOps controller (testenv.gitops_standin: it behaves as Argo CD's
self-heal does, applying the object's version with its own field manager and marks and
putting back foreign changes within seconds).

Today's upgrade patches the version directly: the stand-in puts it back at its next sync
(why upgrades of a Git-owned object must go through Git). The inventory names the owner
from the object's real managedFields, and a version someone else wrote over it is a
finding naming who, until the owner's next sync."""

from __future__ import annotations

import pytest

from storage import audit
from testenv import fleet as fl
from testenv.gitops_standin import STANDIN_MANAGER, StandInGitOpsController
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration import observe
from tests.integration.desk import bot_granted_for_the_test
from tests.integration.inventory_helpers import wait_fleet
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave

OLD, NEW = "580.95.05", "580.105.08"
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
