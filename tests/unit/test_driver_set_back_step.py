"""The driver-version step with `set_back: true`: after a failed canary, the version this
run's own driver-version step replaced is put back on the ClusterPolicy or NVIDIADriver,
one call at a time over the in-memory cluster.

On start it notes, from this run's driver-version step, the version to put back (what that
step found) and the version the run set, the version the object names now, and who keeps
the object in Git: Argo CD (its tracking annotation, or app.kubernetes.io/instance as a
label or annotation on an object Helm did not install), Flux (its kustomize or helm
controller's label, with the namespace label when there is one), or, in Git mode, the
owner the params name or "the GitOps tool that applies it". Nothing is written then.

Then: a run that set no version (no driver-version step, no version it replaced, the same
version) has nothing to set back. The object naming the version the run set is patched
back by one merge patch of its version field (spec.driver.version, spec.version) naming
the resourceVersion read, after an audit row `set-back/<object>`; the note says which
nodes stay as they are for a rollback. Looked at again once set back (a restart), it is
done without a second patch. A 409 waits and reads again, then patches at the new
resourceVersion. An object that names the old version already (someone set it back) or
any other version (someone changed it since) is left as it is. An object Git keeps is
never patched: the thread hears which field to set back in Git. A dry run only says what
it would set back.

The cluster (with the two custom objects) and the context (with the intents of the run's
other steps) are tests/unit/test_driver_version_step.py's; the sentences are the ones
workflows.engine.messages writes.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fake_cluster import Write
from tests.unit.test_driver_version_step import RunCtx, VersionCluster
from tests.unit.test_operator_upgrade_steps import OLD, WANTED
from tests.unit.test_step_outcomes import RUN
from workflows.engine import messages as say
from workflows.engine.steps.contract import Done, Waiting
from workflows.engine.steps.driver import SetDriverVersion, git_owner
from workflows.kube.gateway.paths import CLUSTER_POLICIES, NVIDIA_DRIVERS

NEW = WANTED  # what this run's driver-version step set; OLD is what the object named before it
POLICY = "ClusterPolicy cluster-policy"
SERVE = "NVIDIADriver serve-driver"
BACK_POLICY = {"object": "ClusterPolicy", "name": "cluster-policy", "version": NEW, "set_back": True}
BACK_SERVE = {"object": "NVIDIADriver", "name": "serve-driver", "version": NEW, "set_back": True}
SET_POLICY = {"object": POLICY, "version": NEW, "prior_version": OLD}  # the driver-version step's intent
SET_SERVE = {"object": SERVE, "version": NEW, "prior_version": OLD}
NODES_WAIT = f"gpu-01, already changed, stays as it is for a rollback (`/gpu rollback {RUN}`)"
ARGO = {"argocd.argoproj.io/tracking-id": "gpu:nvidia.com/ClusterPolicy:/cluster-policy"}


@pytest.fixture
def objects(make) -> VersionCluster:
    """The ClusterPolicy at NEW (as this run's driver-version step left it) and the
    NVIDIADriver serve-driver at NEW, neither marked by a GitOps tool."""
    cluster = VersionCluster(make.snapshot)
    cluster.put(CLUSTER_POLICIES, make.cluster_policy(driver={"version": NEW}))
    cluster.put(NVIDIA_DRIVERS, make.nvidia_driver("serve-driver", version=NEW))
    return cluster


def set_policy(cluster: VersionCluster, make, *, version: str | None, **marks: Any) -> str:
    """The ClusterPolicy now names `version` (None: no version); returns its resourceVersion."""
    return cluster.put(CLUSTER_POLICIES, make.cluster_policy(driver={"version": version} if version else {}, **marks))


def started(cluster: VersionCluster, params: dict[str, Any] = BACK_POLICY, forward: dict[str, Any] | None = SET_POLICY,
            **ctx: Any) -> RunCtx:
    """The context of a set-back step, its intent written by prepare from the run's
    driver-version step's intent `forward` (None: the run has no such step)."""
    intents = {"driver-version": forward} if forward is not None else {}
    intent = SetDriverVersion().prepare(RunCtx(cluster, params=params, intents=intents))
    return RunCtx(cluster, params=params, intent=intent, intents=intents, **ctx)


def back_policy_row(node: str = "gpu-01") -> dict[str, Any]:
    return {f"set-back/{POLICY}": {"action": "driver-version.set-back", "target": POLICY,
                                   "detail": {"from": NEW, "to": OLD, "node": node}}}


# ------------------------------------------------------------------ start


def test_the_step_notes_the_version_to_put_back_the_one_the_run_set_and_the_one_the_object_names(objects):
    ctx = started(objects, forward={"object": POLICY, "version": NEW, "prior_version": OLD})

    assert ctx.intent == {"object": POLICY, "set_back": True, "version": OLD, "run_set": NEW, "found": NEW,
                          "git": None}
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


def test_a_run_without_a_driver_version_step_notes_no_version_to_put_back(objects):
    assert started(objects, forward=None).intent == {"object": POLICY, "set_back": True, "version": None,
                                                     "run_set": None, "found": NEW, "git": None}


@pytest.mark.parametrize(("labels", "annotations", "owner"), [
    ({}, ARGO, "Argo CD (gpu:nvidia.com/ClusterPolicy:/cluster-policy)"),
    ({"kustomize.toolkit.fluxcd.io/name": "gpu", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"}, {},
     "Flux (kustomize flux-system/gpu)"),
    ({"helm.toolkit.fluxcd.io/name": "gpu-operator"}, {}, "Flux (helm gpu-operator)"),
    ({}, {"app.kubernetes.io/instance": "gpu-platform"}, "Argo CD (gpu-platform)"),
    ({}, {"app.kubernetes.io/instance": "gpu-operator", "meta.helm.sh/release-name": "gpu-operator"}, None),
], ids=["argo-tracking-id", "flux-kustomize", "flux-helm", "argo-instance-annotation", "helm-release"])
def test_the_step_notes_which_gitops_tool_keeps_the_object_from_its_marks(objects, make, labels, annotations, owner):
    set_policy(objects, make, version=NEW, labels=labels, annotations=annotations)

    assert started(objects).intent == {"object": POLICY, "set_back": True, "version": OLD, "run_set": NEW,
                                       "found": NEW, "git": owner}
    assert git_owner(labels, annotations) == owner


@pytest.mark.parametrize(("git", "owner"), [
    ({"git": True, "owner": "Argo CD application gpu"}, "Argo CD application gpu"),
    ({"git": True}, "the GitOps tool that applies it"),
    ({"git": False, "owner": "Argo CD application gpu"}, None),
], ids=["owner-named", "owner-unnamed", "not-git-mode"])
def test_in_git_mode_the_owner_the_params_name_keeps_the_object(objects, git, owner):
    ctx = started(objects, params={**BACK_POLICY, **git})

    assert ctx.intent == {"object": POLICY, "set_back": True, "version": OLD, "run_set": NEW, "found": NEW,
                          "git": owner}


def test_git_mode_names_the_params_owner_over_the_objects_marks(objects, make):
    set_policy(objects, make, version=NEW, annotations=ARGO)

    assert started(objects, params={**BACK_POLICY, "git": True, "owner": "Flux gpu"}).intent["git"] == "Flux gpu"


# ------------------------------------------------------------------ nothing to set back


@pytest.mark.parametrize(("forward", "now"), [
    (None, NEW),
    ({"object": POLICY, "prior_version": OLD}, OLD),
    ({"object": POLICY, "version": OLD, "prior_version": OLD}, OLD),
], ids=["no-driver-version-step", "it-set-no-version", "it-changed-nothing"])
def test_a_run_that_changed_no_driver_version_has_nothing_to_set_back(objects, make, forward, now):
    set_policy(objects, make, version=now)
    ctx = started(objects, forward=forward)

    assert SetDriverVersion().advance(ctx) == Done(f"{POLICY}: this run changed no driver version, nothing to set back")
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


# ------------------------------------------------------------------ setting back


@pytest.mark.parametrize(("params", "forward", "path", "spec"), [
    (BACK_POLICY, SET_POLICY, CLUSTER_POLICIES, {"driver": {"version": OLD}}),
    (BACK_SERVE, SET_SERVE, NVIDIA_DRIVERS, {"version": OLD}),
], ids=["ClusterPolicy", "NVIDIADriver"])
def test_the_object_is_set_back_by_one_merge_patch_naming_its_resource_version_audited_first(
        objects, params, forward, path, spec):
    name = params["name"]
    ref = forward["object"]
    read = objects.get_custom_object(path, name).resource_version
    ctx = started(objects, params=params, forward=forward)

    done = Done(f"{ref} set back from {NEW} to {OLD}, the version this run replaced: a driver pod that restarts now "
                f"takes {OLD} again; {NODES_WAIT}", {"from": NEW, "to": OLD})
    assert SetDriverVersion().advance(ctx) == done

    assert objects.writes == [Write("patch", f"{path}/{name}", {"spec": spec, "resource_version": read,
                                                                "dry_run": False})]
    assert ctx.records == {f"set-back/{ref}": {"action": "driver-version.set-back", "target": ref,
                                               "detail": {"from": NEW, "to": OLD, "node": "gpu-01"}}}
    assert ctx.acts == 1
    assert objects.version(path, name) == OLD
    # Looked at again (say the process restarted): it is set back, nothing more is sent.
    assert SetDriverVersion().advance(ctx) == done
    assert len(objects.writes) == 1


def test_the_note_names_the_canary_node_and_the_run_a_rollback_takes(objects):
    ctx = started(objects, node="gpu-07", run_id="run-9")

    assert SetDriverVersion().advance(ctx) == Done(
        f"{POLICY} set back from {NEW} to {OLD}, the version this run replaced: a driver pod that restarts now takes "
        f"{OLD} again; gpu-07, already changed, stays as it is for a rollback (`/gpu rollback run-9`)",
        {"from": NEW, "to": OLD})
    assert ctx.records == back_policy_row("gpu-07")


def test_a_conflict_waits_and_reads_again_then_patches_at_the_new_resource_version(objects):
    first = objects.get_custom_object(CLUSTER_POLICIES, "cluster-policy").resource_version
    ctx = started(objects)
    objects.meanwhile = NEW  # someone else's change that keeps the version lands first

    assert SetDriverVersion().advance(ctx) == Waiting(
        f"{POLICY} changed while its version was being set back; reading it again", retry_in=1.0)
    assert ctx.records == back_policy_row()  # on record before it was sent
    assert objects.version(CLUSTER_POLICIES, "cluster-policy") == NEW
    second = objects.get_custom_object(CLUSTER_POLICIES, "cluster-policy").resource_version

    assert SetDriverVersion().advance(ctx) == Done(
        say.driver_version_set_back(POLICY, NEW, OLD, NODES_WAIT), {"from": NEW, "to": OLD})
    assert [(w.args["resource_version"], w.args["spec"]) for w in objects.writes] == [
        (first, {"driver": {"version": OLD}}), (second, {"driver": {"version": OLD}})]
    assert first != second
    assert objects.version(CLUSTER_POLICIES, "cluster-policy") == OLD
    assert ctx.acts == 2


# ------------------------------------------------------------------ left as it is


def test_an_object_someone_else_already_set_back_is_left_as_it_is(objects, make):
    ctx = started(objects)
    set_policy(objects, make, version=OLD)

    assert SetDriverVersion().advance(ctx) == Done(
        f"{POLICY} names {OLD} again already (set back by someone else): not changed", {"found": OLD})
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


@pytest.mark.parametrize(("now", "said"), [("595.10.01", "595.10.01"), (None, "no version")])
def test_an_object_someone_changed_since_is_left_as_it_is(objects, make, now, said):
    ctx = started(objects)
    set_policy(objects, make, version=now)

    assert SetDriverVersion().advance(ctx) == Done(
        f"{POLICY} names {said} now, not {NEW} as this run set it: someone changed it since, so gpuops leaves it "
        "as it is", {"found": now})
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


# ------------------------------------------------------------------ Git keeps it


@pytest.mark.parametrize(("forward", "change", "back"), [
    (SET_POLICY, f"Set spec.driver.version back from {NEW} to {OLD} in Git", OLD),
    ({"object": POLICY, "version": NEW, "prior_version": None},
     f"Take spec.driver.version ({NEW}) out again in Git, where it named no version before this run", None),
], ids=["to-the-version-before", "named-no-version-before"])
def test_an_object_argo_cd_keeps_is_not_patched_and_the_thread_hears_what_to_set_back_in_git(
        objects, make, forward, change, back):
    set_policy(objects, make, version=NEW, annotations=ARGO)
    ctx = started(objects, forward=forward)

    assert SetDriverVersion().advance(ctx) == Done(
        f"{POLICY} is kept by Argo CD (gpu:nvidia.com/ClusterPolicy:/cluster-policy): gpuops did not change it (a "
        f"sync would put {NEW} back). {change}: until then any node whose driver pod restarts installs {NEW}; "
        f"{NODES_WAIT}", {"git": "Argo CD (gpu:nvidia.com/ClusterPolicy:/cluster-policy)", "from": NEW, "to": back})
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


def test_in_git_mode_an_nvidiadriver_is_not_patched_and_the_thread_hears_its_version_field(objects):
    ctx = started(objects, params={**BACK_SERVE, "git": True, "owner": "Flux gpu"}, forward=SET_SERVE)

    assert SetDriverVersion().advance(ctx) == Done(
        say.set_back_in_git(SERVE, "Flux gpu", "spec.version", NEW, OLD, NODES_WAIT),
        {"git": "Flux gpu", "from": NEW, "to": OLD})
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


# ------------------------------------------------------------------ dry run


def test_a_dry_run_says_what_it_would_set_back_and_touches_nothing(objects):
    ctx = started(objects, dry_run=True)

    assert SetDriverVersion().advance(ctx) == Done(f"would set {POLICY}'s driver version back from {NEW} to {OLD}")
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)
    assert objects.version(CLUSTER_POLICIES, "cluster-policy") == NEW


# ------------------------------------------------------------------ it named no version before


UNSET_BEFORE = {"object": POLICY, "version": NEW, "prior_version": None}  # the policy named no version
TAKEN_AWAY = (f"{POLICY} names no driver version again, as before this run ({NEW} taken away): a driver pod that "
              f"restarts now takes the driver it took before the run; {NODES_WAIT}")


def test_an_object_that_named_no_version_before_the_run_has_the_field_taken_away_again(objects):
    read = objects.get_custom_object(CLUSTER_POLICIES, "cluster-policy").resource_version
    ctx = started(objects, forward=UNSET_BEFORE)
    assert ctx.intent == {"object": POLICY, "set_back": True, "version": None, "run_set": NEW, "found": NEW,
                          "git": None}

    done = Done(TAKEN_AWAY, {"from": NEW, "to": None})
    assert SetDriverVersion().advance(ctx) == done
    # A JSON merge patch's null takes the field away: the object is as it was before the run.
    assert objects.writes == [Write("patch", f"{CLUSTER_POLICIES}/cluster-policy", {
        "spec": {"driver": {"version": None}}, "resource_version": read, "dry_run": False})]
    assert objects.get_custom_object(CLUSTER_POLICIES, "cluster-policy").spec["driver"] == {}
    assert ctx.records == {f"set-back/{POLICY}": {"action": "driver-version.set-back", "target": POLICY,
                                                  "detail": {"from": NEW, "to": None, "node": "gpu-01"}}}
    # Looked at again (say the process restarted): it is set back, nothing more is sent.
    assert SetDriverVersion().advance(ctx) == done
    assert (len(objects.writes), ctx.acts) == (1, 1)


def test_an_object_someone_else_already_took_the_version_off_is_left_as_it_is(objects, make):
    ctx = started(objects, forward=UNSET_BEFORE)
    set_policy(objects, make, version=None)

    assert SetDriverVersion().advance(ctx) == Done(
        f"{POLICY} names no version again already (set back by someone else): not changed", {"found": None})
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


def test_a_dry_run_says_it_would_take_away_a_version_the_object_did_not_name_before(objects):
    ctx = started(objects, forward=UNSET_BEFORE, dry_run=True)

    assert SetDriverVersion().advance(ctx) == Done(
        f"would take {POLICY}'s driver version {NEW} away again (it named none before this run)")
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)
