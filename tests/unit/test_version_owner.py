"""Who keeps the driver version of a ClusterPolicy or NVIDIADriver (Argo CD, Flux, Helm or
nobody), read from the marks the tools leave and the field managers that own the version
field (managers win when they disagree), and the drift: a version the owner did not apply.
Shown in `/gpu status <pool>`, in the upgrade plan and as a finding."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from commands.catalog import dispatch
from commands.services import Services
from fleet_builder import NOW
from storage.database import open_database
from workflows.config import GpuopsConfig
from workflows.fleet.version_owner import judge_version_owner
from workflows.kube.gateway.decoding import custom_object_from_json
from workflows.kube.objects import CustomObject, FieldManager
from workflows.pools.config import PoolConfig
from workflows.upgrade.plan import RollbackOf, UpgradeAsk, plan_upgrade

OLD, NEW = "580.95.05", "580.105.08"
TRACKING = "gpu-operator:nvidia.com/ClusterPolicy:/gpu-cluster-policy"


def _policy(*, labels=None, annotations=None, managers=(), version=OLD) -> CustomObject:
    return CustomObject(kind="ClusterPolicy", name="gpu-cluster-policy", labels=labels or {},
                        annotations=annotations or {}, spec={"driver": {"version": version}}, status={},
                        created_at=NOW, field_managers=tuple(managers))


def _owns_version(manager: str, operation: str = "Apply") -> FieldManager:
    return FieldManager(manager=manager, operation=operation, spec_fields=frozenset({"driver.version", "driver.enabled"}))


@pytest.mark.parametrize(("labels", "annotations", "said"), [
    ({}, {"argocd.argoproj.io/tracking-id": TRACKING},
     "ClusterPolicy gpu-cluster-policy is applied by Argo CD application gpu-operator from Git"),
    ({"app.kubernetes.io/instance": "gpu-platform"}, {},
     "ClusterPolicy gpu-cluster-policy is applied by Argo CD application gpu-platform from Git"),
    ({"kustomize.toolkit.fluxcd.io/name": "gpu", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"}, {},
     "ClusterPolicy gpu-cluster-policy is applied by Flux Kustomization flux-system/gpu from Git"),
    ({"helm.toolkit.fluxcd.io/name": "gpu-operator", "app.kubernetes.io/instance": "gpu-operator"},
     {"meta.helm.sh/release-name": "gpu-operator"},
     "ClusterPolicy gpu-cluster-policy is applied by Flux HelmRelease gpu-operator from Git"),
    # Helm's chart sets app.kubernetes.io/instance too: with its release mark, that is Helm's.
    ({"app.kubernetes.io/instance": "gpu-operator"}, {"meta.helm.sh/release-name": "gpu-operator"},
     "ClusterPolicy gpu-cluster-policy is applied by Helm release gpu-operator"),
])
def test_the_tools_marks_name_who_applies_the_object(labels, annotations, said):
    owner = judge_version_owner(_policy(labels=labels, annotations=annotations))

    assert owner.text() == said
    assert owner.from_git == ("from Git" in said)
    assert not owner.drifted


def test_an_object_without_marks_or_a_tools_manager_is_kept_by_nobody():
    owner = judge_version_owner(_policy(managers=[_owns_version("kubectl-edit", "Update")]))

    assert owner.tool is None and not owner.from_git and not owner.drifted
    assert owner.evidence == ("no GitOps or Helm mark, and spec.driver.version is owned by kubectl-edit",)


def test_the_manager_owning_the_version_wins_over_labels_that_name_another_tool():
    # Labelled by a Helm chart Argo CD renders, but applied by Flux's kustomize-controller.
    owner = judge_version_owner(_policy(labels={"app.kubernetes.io/instance": "gpu-operator"},
                                        managers=[_owns_version("kustomize-controller")]))

    assert owner.tool == "Flux" and owner.from_git
    assert owner.evidence[0] == "field manager kustomize-controller owns spec.driver.version"
    assert "names Argo CD, but Flux's field manager owns the version" in owner.evidence[1]


def test_a_tools_manager_alone_names_the_owner_without_any_label():
    owner = judge_version_owner(_policy(managers=[_owns_version("argocd-controller")]))

    assert owner.text() == "ClusterPolicy gpu-cluster-policy is applied by Argo CD from Git"


def test_a_version_someone_else_wrote_over_the_tools_is_drift_naming_who():
    owner = judge_version_owner(_policy(
        annotations={"argocd.argoproj.io/tracking-id": TRACKING},
        managers=[FieldManager(manager="argocd-controller", operation="Apply", spec_fields=frozenset({"driver.enabled"})),
                  _owns_version("kubectl-patch", "Update")]))

    assert owner.tool == "Argo CD" and owner.drifted
    assert owner.changed_by == ("kubectl-patch",)


def test_a_live_version_other_than_the_last_applied_one_is_drift():
    applied = json.dumps({"spec": {"driver": {"version": OLD}}})
    owner = judge_version_owner(_policy(
        annotations={"argocd.argoproj.io/tracking-id": TRACKING,
                     "kubectl.kubernetes.io/last-applied-configuration": applied}, version=NEW))

    assert owner.drifted and owner.last_applied == OLD and owner.live == NEW
    assert f"the owner last applied {OLD}; the object names {NEW}" in owner.evidence


def test_the_version_fields_managers_are_read_from_the_api_servers_managed_fields():
    obj = custom_object_from_json({"kind": "NVIDIADriver", "metadata": {"name": "h100", "managedFields": [
        {"manager": "kustomize-controller", "operation": "Apply",
         "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}},
                      "f:spec": {".": {}, "f:version": {}, "f:nodeSelector": {"f:pool": {}}}}},
        {"manager": "kubectl-edit", "operation": "Update", "fieldsV1": {"f:spec": {"f:env": {}}}}]},
        "spec": {"version": NEW}})

    assert [m.manager for m in obj.managers_of("version")] == ["kustomize-controller"]
    owner = judge_version_owner(obj)
    assert owner.field == "spec.version" and owner.tool == "Flux" and owner.live == NEW


# --------------------------------------------------------------------------------------
# Where a person sees it: the pool's status, its findings, the upgrade plan


def _fleet(make, policy_kw):
    nodes = [make.node(n, pool="train-a") for n in ("a1", "a2")]
    pods = [p for n in nodes for p in make.operands(n.name)]
    policy = make.cluster_policy(driver={"enabled": True, "version": OLD, "upgradePolicy": {"autoUpgrade": False}},
                                 **policy_kw)
    return make.fleet(nodes, pods, policies=[policy])


class _StaticFleet:
    def __init__(self, fleet) -> None:
        self.value = fleet

    def fleet(self, now: dt.datetime):
        return self.value


CONFIG = GpuopsConfig.model_validate({"pools": {"train-a": {"kind": "training", "windows": "always"}},
                                      "access": {"users": {"U0DAVE": ["viewer"]}}})


def _status(make, tmp_path: Path, policy_kw) -> dict[str, str]:
    database = open_database(tmp_path / "gpuops.db")
    services = Services.on_database(config=CONFIG, fleet=_StaticFleet(_fleet(make, policy_kw)), database=database)
    reply = dispatch("status train-a", actor=CONFIG.actor("U0DAVE"), services=services, now=NOW)
    database.close()
    texts = {f.label: f.value for s in reply.sections for f in (s.facts or ())}
    texts["findings"] = str([n for s in reply.sections for n in (s.notices or ())])
    return texts


def test_the_pools_status_names_the_git_tool_that_applies_its_driver_object(make, tmp_path):
    status = _status(make, tmp_path, {"annotations": {"argocd.argoproj.io/tracking-id": TRACKING}})

    assert status["Driver version kept by"] == (
        "ClusterPolicy cluster-policy is applied by Argo CD application gpu-operator from Git")
    assert "driver-version-drift" not in status["findings"]


def test_a_pool_whose_driver_object_nobody_keeps_shows_no_keeper(make, tmp_path):
    assert "Driver version kept by" not in _status(make, tmp_path, {})


def test_a_version_patched_over_argo_cds_is_a_finding_in_the_pools_status(make, tmp_path):
    status = _status(make, tmp_path, {
        "annotations": {"argocd.argoproj.io/tracking-id": TRACKING},
        "field_managers": [_owns_version("kubectl-patch", "Update")]})

    assert "changed to 580.95.05 by kubectl-patch, not by Argo CD application gpu-operator" in status["findings"]
    assert "was last written by kubectl-patch" in status["Driver version kept by"]


def _plan(make, policy_kw, **pool):
    fleet = _fleet(make, policy_kw)
    return plan_upgrade(UpgradeAsk(pool="train-a", version=NEW), fleet=fleet, now=NOW, requested_by="U0ALICE",
                        policy=PoolConfig.model_validate({"kind": "training", "windows": "always", **pool}))


FLUX = {"labels": {"kustomize.toolkit.fluxcd.io/name": "gpu"}}


def test_a_plan_that_patches_a_git_owned_object_says_the_next_sync_puts_it_back(make):
    planned = _plan(make, FLUX, driver_version_source="patch")

    notes = planned.plan.summary.notes
    assert any(n.startswith("ClusterPolicy cluster-policy is applied by Flux Kustomization gpu from Git")
               and "put back by the next sync" in n for n in notes), notes
    set_version = planned.plan.waves[0].steps[0]
    assert (set_version.kind, "git" in set_version.params) == ("driver-version", False)


@pytest.mark.parametrize(("policy_kw", "source"), [(FLUX, "auto"), ({}, "git")])
def test_in_git_mode_the_plan_waits_for_git_instead_of_patching(make, policy_kw, source):
    planned = _plan(make, policy_kw, driver_version_source=source)

    canary = planned.plan.waves[0]
    forward, back = [s for s in canary.steps if s.kind == "driver-version"]
    assert forward.params["git"] is True and back.params["git"] is True and back.params["set_back"] is True
    # The steps of each node are today's: Git mode only changes how the version is set.
    assert [s.kind for s in canary.steps][:4] == ["driver-version", "cordon", "evict", "driver"]
    notes = planned.plan.summary.notes
    assert notes[0].startswith(f"Git mode: gpuops does not patch ClusterPolicy cluster-policy. Once the run starts, "
                               f"its thread says to change spec.driver.version from {OLD} to {NEW} in Git"), notes
    assert not any("put back by the next sync" in n for n in notes)


def test_a_pool_set_to_patch_or_an_object_nobody_keeps_in_git_is_patched_as_today(make):
    for planned in (_plan(make, {}), _plan(make, {"annotations": {"meta.helm.sh/release-name": "gpu"}})):
        (forward, _) = [s for s in planned.plan.waves[0].steps if s.kind == "driver-version"]
        assert "git" not in forward.params
        assert planned.plan.summary.notes[0].startswith("ClusterPolicy cluster-policy is set to")


def test_a_rollback_in_git_mode_says_to_set_the_version_back_in_git(make):
    nodes = [make.node(n, pool="train-a") for n in ("a1", "a2")]
    pods = [p for n in nodes for p in (make.driver_pod(n.name, version=NEW), make.device_plugin_pod(n.name),
                                       make.validator_pod(n.name))]
    policy = make.cluster_policy(driver={"enabled": True, "version": NEW, "upgradePolicy": {"autoUpgrade": False}},
                                 **FLUX)
    planned = plan_upgrade(UpgradeAsk(pool="train-a", version=OLD), fleet=make.fleet(nodes, pods, policies=[policy]),
                           policy=PoolConfig.model_validate({"kind": "training", "windows": "always"}), now=NOW,
                           requested_by="U0ALICE", rollback=RollbackOf(run="run-old", nodes=("a1",), version=OLD))

    (forward,) = [s for s in planned.plan.waves[0].steps if s.kind == "driver-version"]
    assert forward.params["git"] is True and forward.params["version"] == OLD
    assert planned.plan.summary.notes[0].startswith(
        f"Git mode: gpuops does not patch ClusterPolicy cluster-policy. Once the run starts, its thread says to set "
        f"spec.driver.version back to {OLD} in Git")


def test_a_version_patched_over_a_helm_releases_is_information_not_a_warning(make):
    fleet = _fleet(make, {"annotations": {"meta.helm.sh/release-name": "gpu-operator"},
                          "field_managers": [_owns_version("gpuops", "Update")]})
    git = _fleet(make, {"annotations": {"argocd.argoproj.io/tracking-id": TRACKING},
                        "field_managers": [_owns_version("gpuops", "Update")]})

    assert [(f.code, f.severity) for f in fleet.findings if f.code == "driver-version-drift"] == [
        ("driver-version-drift", "info")]
    assert [(f.code, f.severity) for f in git.findings if f.code == "driver-version-drift"] == [
        ("driver-version-drift", "warning")]
