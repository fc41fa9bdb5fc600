"""The driver-version step going forward (setting the version on a ClusterPolicy or an
NVIDIADriver), one call at a time over the in-memory cluster.

It takes two minutes unless told, a day when it waits for Git (and is not a set-back),
and whatever `timeout_s` says. Params without object, name or version, or naming another
kind of object, are refused. On start it notes the object, the version asked for and the
version the object names (spec.driver.version of a ClusterPolicy, spec.version of an
NVIDIADriver; a field missing on the way is no version, a number is written as text),
touching nothing.

Then: an object already at the version is done without a patch (saying "not changed"
when it was so from the start); one someone else changed since the start fails the step
(`driver-changed-meanwhile`) without a patch. Otherwise the audit row is written, then one
merge patch of spec naming the resourceVersion read; a patch refused for a later change
waits and reads again. A dry run asks the API with dry_run and records nothing.

In Git mode nothing is patched: the thread hears once per run which field to change in
Git, to what, and the step waits for the object to name the version (done, saying who
applied it); another version fails it (`git-version-other`); the window ending first gives
back the nodes this run's operator-hold step holds (skip label and mark off, on one audit
row; a node gone or held by another run is passed over) and fails it (`git-window-ended`).
A dry run says what it would ask for and touches no node.

The cluster is tests/unit/test_operator_upgrade_steps.py's, with the two custom objects
added; the context is tests/unit/test_step_outcomes.py's, with the intents of the run's
earlier steps; the sentences are the ones workflows.engine.messages writes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.unit.fake_cluster import Write
from tests.unit.test_operator_upgrade_steps import OLD, WANTED, OperatorCluster, written
from tests.unit.test_step_outcomes import NOW, RUN, Ctx, assert_step_time
from workflows.engine.steps.contract import Done, Failed, StepNotice, StepParamsError, Waiting
from workflows.engine.steps.driver import SetDriverVersion
from workflows.kube.errors import Conflict, NotFound
from workflows.kube.gateway.paths import CLUSTER_POLICIES, NVIDIA_DRIVERS
from workflows.kube.labels import ANNOTATION_UPGRADE_HELD_BY, LABEL_UPGRADE_SKIP
from workflows.kube.objects import CustomObject

POLICY = "ClusterPolicy cluster-policy"
TO_POLICY = {"object": "ClusterPolicy", "name": "cluster-policy", "version": WANTED}
TO_DRIVER = {"object": "NVIDIADriver", "name": "h100-driver", "version": WANTED}
OWNER = "Argo CD application gpu"
IN_GIT = {**TO_POLICY, "git": True, "owner": OWNER}
OTHER = "575.51.03"


class VersionCluster(OperatorCluster):
    """The operator cluster with ClusterPolicy cluster-policy and NVIDIADriver h100-driver
    (both at OLD), read fresh and merge-patched as the API server does: a patch naming an
    old resourceVersion is a Conflict, a dry run changes nothing. `meanwhile`: a version
    someone else sets just before the next patch arrives."""

    def __init__(self, snapshot: Any) -> None:
        super().__init__(snapshot)
        self.objects: dict[tuple[str, str], CustomObject] = {}
        self.meanwhile: str | None = None

    def put(self, path: str, obj: CustomObject) -> str:
        self.objects[(path, obj.name)] = dataclasses.replace(obj, resource_version=str(next(self._versions)))
        return self.objects[(path, obj.name)].resource_version

    def set_spec(self, path: str, name: str, spec: Mapping[str, Any]) -> str:
        return self.put(path, dataclasses.replace(self.objects[(path, name)], spec=spec))

    def get_custom_object(self, path: str, name: str) -> CustomObject:
        if (path, name) not in self.objects:
            raise NotFound(f"GET {path}/{name}: not found", status=404)
        return self.objects[(path, name)]

    def patch_custom_object(self, path: str, name: str, *, spec: Mapping[str, Any], resource_version: str | None,
                            dry_run: bool) -> CustomObject:
        self.writes.append(Write("patch", f"{path}/{name}", {"spec": spec, "resource_version": resource_version,
                                                             "dry_run": dry_run}))
        found = self.get_custom_object(path, name)
        if self.meanwhile is not None:
            self.set_spec(path, name, merge_patched(found.spec, version_patch(path, self.meanwhile)))
            self.meanwhile = None
            found = self.get_custom_object(path, name)
        if resource_version and resource_version != found.resource_version:
            raise Conflict(f"PATCH {path}/{name}: the object has been modified", status=409)
        if dry_run:
            return found
        self.set_spec(path, name, merge_patched(found.spec, spec))
        return self.get_custom_object(path, name)

    def version(self, path: str, name: str) -> Any:
        spec = self.get_custom_object(path, name).spec
        return spec["version"] if path == NVIDIA_DRIVERS else spec["driver"]["version"]


def version_patch(path: str, version: str) -> dict[str, Any]:
    return {"version": version} if path == NVIDIA_DRIVERS else {"driver": {"version": version}}


def merge_patched(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with a JSON merge patch applied (RFC 7386)."""
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_patched(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class RunCtx(Ctx):
    """The step context with the intents of this run's earlier steps, by kind."""

    kind: str = "driver-version"
    intents: dict[str, dict[str, Any]] = field(default_factory=dict)

    def step_intent(self, kind: str) -> dict[str, Any] | None:
        return self.intents.get(kind)


@pytest.fixture
def objects(make) -> VersionCluster:
    """gpu-01, ClusterPolicy cluster-policy and NVIDIADriver h100-driver, both at OLD."""
    cluster = VersionCluster(make.snapshot)
    cluster.add_node(make.node("gpu-01"))
    cluster.put(CLUSTER_POLICIES, make.cluster_policy(driver={"enabled": True, "version": OLD}))
    cluster.put(NVIDIA_DRIVERS, make.nvidia_driver("h100-driver", version=OLD))
    return cluster


def begun(cluster: VersionCluster, params: dict[str, Any], **ctx: Any) -> RunCtx:
    """The context of the step with `params`, its intent written by prepare."""
    intent = SetDriverVersion().prepare(RunCtx(cluster, params=params))
    return RunCtx(cluster, params=params, intent=intent, **ctx)


def patches(cluster: VersionCluster) -> list[tuple[str, str, Any, Any, Any]]:
    return [(w.verb, w.target, w.args["spec"], w.args["resource_version"], w.args["dry_run"])
            for w in cluster.writes]


# ------------------------------------------------------------------ time and params


@pytest.mark.parametrize(("params", "seconds"), [
    ({}, 120), ({"git": False}, 120), ({"set_back": True}, 120), ({"git": True, "set_back": True}, 120),
    ({"git": True}, 86400), ({"git": True, "set_back": False}, 86400), ({"git": True, "timeout_s": 600}, 600),
], ids=["patching", "git-false", "setting-back", "setting-back-in-git", "git", "git-not-setting-back",
        "git-told"])
def test_setting_a_version_takes_two_minutes_waiting_for_git_a_day_and_either_what_timeout_s_says(
        objects, params, seconds):
    ctx = RunCtx(objects, params={**TO_POLICY, **params})

    assert SetDriverVersion().timeout(ctx) == dt.timedelta(seconds=seconds)


def test_a_driver_version_step_with_no_time_at_all_is_refused_naming_the_step(objects):
    assert_step_time(objects, SetDriverVersion(), "driver-version", 120)


@pytest.mark.parametrize("params", [
    {"name": "cluster-policy", "version": WANTED},
    {"object": "Deployment", "name": "cluster-policy", "version": WANTED},
    {"object": "ClusterPolicy", "version": WANTED},
    {"object": "ClusterPolicy", "name": "", "version": WANTED},
    {"object": "ClusterPolicy", "name": "cluster-policy"},
], ids=["no-object", "another-kind", "no-name", "empty-name", "no-version"])
def test_a_step_without_object_name_or_version_or_naming_another_kind_is_refused(objects, params):
    with pytest.raises(StepParamsError) as refused:
        SetDriverVersion().prepare(RunCtx(objects, params=params))

    assert str(refused.value) == ("a driver-version step needs params.object (ClusterPolicy or NVIDIADriver), "
                                  "params.name and params.version")
    assert objects.writes == []


# ------------------------------------------------------------------ start


@pytest.mark.parametrize(("params", "extra"), [(TO_POLICY, {}), (TO_POLICY, {"set_back": False, "git": False}),
                                               (TO_DRIVER, {})], ids=["policy", "policy-set-back-false", "driver"])
def test_the_step_notes_the_object_the_version_asked_for_and_the_version_it_names_touching_nothing(
        objects, params, extra):
    ref = f"{params['object']} {params['name']}"
    ctx = RunCtx(objects, params={**params, **extra})

    assert SetDriverVersion().prepare(ctx) == {"object": ref, "version": WANTED, "prior_version": OLD}
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


@pytest.mark.parametrize(("driver", "prior"), [
    ({"enabled": True}, None), (None, None), ("on", None), ({"version": 580}, "580"),
], ids=["no-version", "no-driver-section", "driver-not-a-mapping", "a-number"])
def test_a_version_field_missing_on_the_way_is_no_version_and_a_number_is_written_as_text(objects, driver, prior):
    objects.set_spec(CLUSTER_POLICIES, "cluster-policy", {"driver": driver})

    assert SetDriverVersion().prepare(RunCtx(objects, params=TO_POLICY))["prior_version"] == prior


def test_a_set_back_step_starts_from_what_this_runs_driver_version_step_found_and_set(objects):
    objects.set_spec(CLUSTER_POLICIES, "cluster-policy", {"driver": {"version": WANTED}})
    ctx = RunCtx(objects, params={**TO_POLICY, "set_back": True},
                 intents={"driver-version": {"object": POLICY, "version": WANTED, "prior_version": OLD}})

    assert SetDriverVersion().prepare(ctx) == {"object": POLICY, "set_back": True, "version": OLD,
                                               "run_set": WANTED, "found": WANTED, "git": None}
    assert objects.writes == []


def test_a_set_back_step_whose_run_changed_no_version_leaves_the_object_alone(objects):
    ctx = begun(objects, {**TO_POLICY, "set_back": True})

    assert SetDriverVersion().advance(ctx) == Done(f"{POLICY}: this run changed no driver version, nothing to set back")
    assert objects.writes == []


# ------------------------------------------------------------------ setting the version


@pytest.mark.parametrize(("params", "path", "spec"), [
    (TO_POLICY, f"{CLUSTER_POLICIES}/cluster-policy", {"driver": {"version": WANTED}}),
    ({**TO_POLICY, "set_back": False, "git": False}, f"{CLUSTER_POLICIES}/cluster-policy",
     {"driver": {"version": WANTED}}),
    (TO_DRIVER, f"{NVIDIA_DRIVERS}/h100-driver", {"version": WANTED}),
], ids=["policy", "policy-set-back-and-git-false", "driver"])
def test_the_version_is_set_by_one_merge_patch_naming_the_resource_version_read_on_an_audit_row_written_first(
        objects, params, path, spec):
    ref = f"{params['object']} {params['name']}"
    ctx = begun(objects, params)
    read = objects.get_custom_object(path.rsplit("/", 1)[0], params["name"]).resource_version

    assert SetDriverVersion().advance(ctx) == Done(f"{ref}: driver version {OLD} -> {WANTED}")

    assert patches(objects) == [("patch", path, spec, read, False)]
    assert ctx.records == {f"patch/{ref}": {"action": "driver-version.set", "target": ref,
                                            "detail": {"from": OLD, "to": WANTED, "node": "gpu-01"}}}
    assert ctx.acts == 1
    assert objects.version(path.rsplit("/", 1)[0], params["name"]) == WANTED
    # Looked at again (after a restart): the object names the version, nothing more is sent.
    assert SetDriverVersion().advance(ctx) == Done(f"{ref}: driver version {OLD} -> {WANTED}")
    assert len(objects.writes) == 1


def test_an_object_without_a_version_is_set_from_unset(objects):
    objects.set_spec(CLUSTER_POLICIES, "cluster-policy", {"driver": {"enabled": True}})
    ctx = begun(objects, TO_POLICY)

    assert SetDriverVersion().advance(ctx) == Done(f"{POLICY}: driver version unset -> {WANTED}")
    assert objects.get_custom_object(CLUSTER_POLICIES, "cluster-policy").spec == {
        "driver": {"enabled": True, "version": WANTED}}
    assert ctx.records[f"patch/{POLICY}"]["detail"] == {"from": None, "to": WANTED, "node": "gpu-01"}


def test_an_object_already_at_the_version_from_the_start_is_not_changed(objects):
    objects.set_spec(CLUSTER_POLICIES, "cluster-policy", {"driver": {"version": WANTED}})
    ctx = begun(objects, TO_POLICY)

    assert SetDriverVersion().advance(ctx) == Done(f"{POLICY} already names driver {WANTED}: not changed")
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


@pytest.mark.parametrize(("now", "said"), [(OTHER, OTHER), (None, "unset")], ids=["another-version", "no-version"])
def test_an_object_someone_else_changed_since_the_start_fails_the_step_and_is_not_patched(objects, now, said):
    ctx = begun(objects, TO_POLICY)
    objects.set_spec(CLUSTER_POLICIES, "cluster-policy", {"driver": {"version": now}})

    assert SetDriverVersion().advance(ctx) == Failed(
        f"{POLICY} changed since the step began ({OLD} -> {said}, by someone else): not setting {WANTED} over it; "
        "check who changed it before running again", code="driver-changed-meanwhile")
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


def test_a_patch_refused_for_a_later_change_waits_and_reads_again(objects):
    ctx = begun(objects, TO_POLICY)
    read = objects.get_custom_object(CLUSTER_POLICIES, "cluster-policy").resource_version
    objects.meanwhile = OTHER  # someone sets another version just before the patch lands

    assert SetDriverVersion().advance(ctx) == Waiting(
        f"{POLICY}: driver version {OLD} -> {WANTED} (changed meanwhile; reading again)", retry_in=1.0)

    assert patches(objects) == [("patch", f"{CLUSTER_POLICIES}/cluster-policy", {"driver": {"version": WANTED}},
                                 read, False)]
    assert objects.version(CLUSTER_POLICIES, "cluster-policy") == OTHER
    assert list(ctx.records) == [f"patch/{POLICY}"]  # written before the patch was sent
    # Read again: the later change is someone else's, and is not overwritten.
    assert SetDriverVersion().advance(ctx).code == "driver-changed-meanwhile"
    assert len(objects.writes) == 1


def test_a_dry_run_asks_the_api_with_dry_run_records_nothing_and_says_what_it_would_set(objects):
    ctx = begun(objects, TO_DRIVER, dry_run=True)
    read = objects.get_custom_object(NVIDIA_DRIVERS, "h100-driver").resource_version

    assert SetDriverVersion().advance(ctx) == Done(
        f"would set NVIDIADriver h100-driver's driver version {OLD} -> {WANTED}")

    assert patches(objects) == [("patch", f"{NVIDIA_DRIVERS}/h100-driver", {"version": WANTED}, read, True)]
    assert ctx.records == {}
    assert objects.version(NVIDIA_DRIVERS, "h100-driver") == OLD


# ------------------------------------------------------------------ Git mode


def change_in_git(field: str, ref: str, owner: str, prior: str = OLD) -> str:
    return (f"Git mode: change {field} of {ref} from {prior} to {WANTED} in Git; {owner} applies it. Waiting "
            f"(inside the window) for {ref} to name {WANTED}; the nodes stay as they are meanwhile")


@pytest.mark.parametrize(("params", "window_end", "text"), [
    (IN_GIT, None, change_in_git("spec.driver.version", POLICY, OWNER)),
    (IN_GIT, NOW + dt.timedelta(seconds=1), change_in_git("spec.driver.version", POLICY, OWNER)),
    ({**TO_DRIVER, "git": True}, NOW + dt.timedelta(hours=2),
     change_in_git("spec.version", "NVIDIADriver h100-driver", "the GitOps tool that applies it")),
], ids=["no-window", "inside-the-window", "driver-owner-unnamed"])
def test_in_git_mode_the_thread_hears_once_per_run_what_to_change_in_git_and_the_step_waits_patching_nothing(
        objects, params, window_end, text):
    ctx = begun(objects, params, window_end=window_end)
    ref = f"{params['object']} {params['name']}"

    assert SetDriverVersion().advance(ctx) == Waiting(
        text, retry_in=5.0, notice=StepNotice(f"git/{ref}", text, per_run=True))
    assert (objects.writes, ctx.records, ctx.acts) == ([], {}, 0)


def test_in_git_mode_an_object_without_a_version_is_changed_from_no_version(objects):
    objects.set_spec(CLUSTER_POLICIES, "cluster-policy", {"driver": {}})
    ctx = begun(objects, IN_GIT)

    assert SetDriverVersion().advance(ctx).reason == change_in_git("spec.driver.version", POLICY, OWNER,
                                                                   prior="no version")


@pytest.mark.parametrize(("params", "owner"), [(IN_GIT, OWNER), ({**TO_POLICY, "git": True},
                                                                  "the GitOps tool that applies it")],
                         ids=["owner-named", "owner-unnamed"])
def test_in_git_mode_the_step_is_done_once_the_object_names_the_version_saying_who_applied_it(
        objects, params, owner):
    ctx = begun(objects, params, window_end=NOW)  # applied: the window no longer matters
    objects.set_spec(CLUSTER_POLICIES, "cluster-policy", {"driver": {"version": WANTED}})

    assert SetDriverVersion().advance(ctx) == Done(
        f"{POLICY} names {WANTED} now, applied from Git by {owner}", {"git": owner, "from": OLD, "to": WANTED})
    assert (objects.writes, ctx.records) == ([], {})


def test_in_git_mode_another_version_arriving_fails_the_step_before_any_node_moves(objects):
    ctx = begun(objects, IN_GIT)
    objects.set_spec(CLUSTER_POLICIES, "cluster-policy", {"driver": {"version": OTHER}})

    assert SetDriverVersion().advance(ctx) == Failed(
        f"{POLICY} names {OTHER}, applied by {OWNER}, not the approved {WANTED}: the run stops before any node "
        f"moves. Set it in Git to {WANTED} and ask again, or back to {OLD}", code="git-version-other")
    assert (objects.writes, ctx.records) == ([], {})


def ended(released: str = "") -> Failed:
    return Failed(f"the window ended before Git changed spec.driver.version of {POLICY} to {WANTED}: no node was "
                  f"changed{released}. Continue the run in a later window once Git names it, or close it",
                  code="git-window-ended")


@pytest.fixture
def held(objects, make) -> VersionCluster:
    """gpu-02 and gpu-03 held by this run; gpu-05 held by run-1; gpu-06 free; no gpu-04."""
    for name, by in (("gpu-02", RUN), ("gpu-03", RUN), ("gpu-05", "run-1")):
        objects.add_node(make.node(name, labels={LABEL_UPGRADE_SKIP: "true"},
                                   annotations={ANNOTATION_UPGRADE_HELD_BY: by}))
    objects.add_node(make.node("gpu-06"))
    return objects


def test_the_window_ending_before_git_applies_the_version_gives_back_the_nodes_this_run_holds_and_fails(held):
    hold = {"release": False, "targets": ["gpu-04", "gpu-02", "gpu-05", "gpu-06", "gpu-03"], "left_alone": []}
    ctx = begun(held, IN_GIT, window_end=NOW, intents={"operator-hold": hold})

    assert SetDriverVersion().advance(ctx) == ended("; 2 held node(s) given back to the operator")

    assert ctx.records == {"driver-upgrade.release": {"action": "driver-upgrade.release", "target": "2 node(s)",
                                                      "detail": {"nodes": ["gpu-02", "gpu-03"]}}}
    assert written(held) == [("label", name, {LABEL_UPGRADE_SKIP: None}, {ANNOTATION_UPGRADE_HELD_BY: None}, False)
                             for name in ("gpu-02", "gpu-03")]
    assert ctx.acts == 2
    assert all(LABEL_UPGRADE_SKIP not in held.node(n).labels and ANNOTATION_UPGRADE_HELD_BY not in
               held.node(n).annotations for n in ("gpu-02", "gpu-03"))
    assert held.node("gpu-05").annotations[ANNOTATION_UPGRADE_HELD_BY] == "run-1"
    assert held.version(CLUSTER_POLICIES, "cluster-policy") == OLD


@pytest.mark.parametrize("intents", [{}, {"operator-hold": {"release": False, "targets": ["gpu-05", "gpu-06"]}}],
                         ids=["no-hold-step", "none-held-by-this-run"])
def test_the_window_ending_with_no_node_held_by_this_run_fails_the_step_writing_nothing(held, intents):
    ctx = begun(held, IN_GIT, window_end=NOW - dt.timedelta(minutes=1), intents=intents)

    assert SetDriverVersion().advance(ctx) == ended()
    assert (held.writes, ctx.records, ctx.acts) == ([], {}, 0)


@pytest.mark.parametrize("window_end", [None, NOW], ids=["no-window", "window-ended"])
def test_a_dry_run_in_git_mode_says_what_it_would_ask_for_and_touches_no_node(held, window_end):
    hold = {"release": False, "targets": ["gpu-02"], "left_alone": []}
    ctx = begun(held, IN_GIT, dry_run=True, window_end=window_end, intents={"operator-hold": hold})

    assert SetDriverVersion().advance(ctx) == Done(
        f"would ask for spec.driver.version of {POLICY} to be set to {WANTED} in Git and wait for {OWNER} to "
        "apply it")
    assert (held.writes, ctx.records, ctx.acts) == ([], {}, 0)
    assert held.node("gpu-02").annotations[ANNOTATION_UPGRADE_HELD_BY] == RUN
