"""The node's GPU driver under the operator: restarting its driver pod at the version
the operator's templates name (`driver`), and setting that version on the ClusterPolicy
or NVIDIADriver (`driver-version`, and setting it back after a failed canary), minding
a GitOps tool that keeps the object.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storage.step_params import GpuGateParams, StepParams
from workflows.engine import messages as say
from workflows.engine.steps.contract import (
    Done,
    Failed,
    Outcome,
    StepContext,
    StepNotice,
    StepParamsError,
    Waiting,
    pod_ref,
    params_of,
)
from workflows.engine.steps.eviction import gpu_pods_left
from workflows.fleet.pods import image_tag, pod_state, version_of_tag
from workflows.kube.errors import Conflict, NotFound
from workflows.kube.gateway.paths import CLUSTER_POLICIES, NVIDIA_DRIVERS
from workflows.kube.labels import ANNOTATION_UPGRADE_HELD_BY, LABEL_UPGRADE_SKIP, POD_SELECTOR_DRIVER
from workflows.kube.objects import CustomObject, PodOnNode


@dataclass(frozen=True, kw_only=True)
class DriverParams(GpuGateParams):
    """The driver `version` the node's new driver pod must run (None: any)."""

    version: str | None = None


@dataclass(frozen=True, kw_only=True)
class DriverVersionParams(StepParams):
    """Set `version` on the `object` (ClusterPolicy or NVIDIADriver) called `name`;
    `set_back`: put back the version this run's driver-version step replaced. `git`: Git
    owns the version (Git mode): say what to change there and wait for the object to name
    `version`, never patching; `owner` names who applies it ("Argo CD application gpu")."""

    object: str | None = None
    name: str | None = None
    version: str | None = None
    set_back: bool | None = None
    git: bool | None = None
    owner: str | None = None

# ---- driver and MIG


def _driver_pods(ctx: StepContext) -> list[PodOnNode]:
    key, value = POD_SELECTOR_DRIVER
    return ctx.gateway.list_pods_on_node(ctx.node, label_selector=f"{key}={value}")


def newest_driver_pod(ctx: StepContext) -> PodOnNode | None:
    live = [p for p in _driver_pods(ctx) if not p.pod.deleting]
    return max(live, key=lambda p: p.pod.created_at) if live else None


def driver_pod_intent(pod: PodOnNode | None) -> dict[str, Any] | None:
    if pod is None:
        return None
    state = pod_state(pod.pod)
    return {"pod": f"{pod.pod.namespace}/{pod.pod.name}", "uid": pod.uid, "version": state.version,
            "ready": state.condition == "healthy"}


def driver_templates_not_at(ctx: StepContext, namespace: str, wanted: str) -> list[str]:
    """The driver DaemonSets that would make this node's next driver pod at another
    version than `wanted` ("name (version)"); none at all counts as one not there."""
    labels = ctx.gateway.get_node(ctx.node).labels
    selecting = [t for t in ctx.gateway.list_driver_templates(namespace) if not t.deleting and t.selects(labels)]
    if not selecting:
        return [say.no_driver_daemonset()]
    behind = []
    for template in selecting:
        version = version_of_tag(image_tag(template.driver_image)) if template.driver_image else None
        if version != wanted:
            behind.append(f"{template.name} ({version or 'no driver image'})")
    return behind


class Driver:
    """Restart the node's GPU Operator driver pod so its OnDelete DaemonSet recreates it
    from the current template, then wait until the new pod is Running and Ready.

    The pod to delete (namespace, name, uid) is chosen when the step starts; after a
    restart, a recorded uid that is gone or terminating means the delete happened. With
    `version`, a node whose driver pod already runs it (and is Ready) is left alone, and a
    new pod that runs another version fails the step (update the ClusterPolicy or
    NVIDIADriver first). A node without an operator driver pod (a host driver) fails the
    step: gpuops does not change host drivers. GPU pods still on the node (a replica that
    tolerates the cordon came back) hold the restart until they are gone or time is up
    (`allow_gpu_pods: true` skips that gate). `timeout_s` defaults to 900."""

    params = DriverParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, DriverParams).timeout(900, kind=ctx.kind)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        return {"driver_pod": driver_pod_intent(newest_driver_pod(ctx)), "version": params_of(ctx, DriverParams).version}

    def advance(self, ctx: StepContext) -> Outcome:
        old = ctx.intent.get("driver_pod")
        wanted = ctx.intent.get("version")
        if old is None:
            return Failed(say.no_driver_pod(ctx.node), code="no-driver-pod")
        pods = _driver_pods(ctx)
        current = next((p for p in pods if p.uid == old["uid"]), None)
        if current is not None and not current.pod.deleting:
            state = pod_state(current.pod)
            if wanted and state.version == wanted and state.condition == "healthy":
                return Done(say.driver_already_at(wanted))
            if wanted and not ctx.dry_run:
                behind = driver_templates_not_at(ctx, current.pod.namespace, wanted)
                if behind:
                    # A pod deleted now would come back at the old version: the operator
                    # has not put the new one into (or replaced) its DaemonSet yet.
                    return Waiting(say.driver_template_not_yet(wanted, behind), retry_in=2.0)
            in_the_way = gpu_pods_left(ctx)
            if in_the_way and not ctx.dry_run:
                return Waiting(say.gpu_pods_in_the_way(in_the_way, "restarting the driver"), retry_in=5.0)
            namespace, name = pod_ref(old["pod"])
            ctx.act()
            try:
                ctx.gateway.delete_pod(namespace, name, uid=old["uid"], dry_run=ctx.dry_run)
            except (NotFound, Conflict):
                pass
            if ctx.dry_run:
                return Done(say.would_restart_driver(old["pod"]))
            return Waiting(say.driver_deleted(old["pod"]), retry_in=2.0)
        if ctx.dry_run:
            return Done(say.would_restart_driver(old["pod"]))
        fresh = [p for p in pods if p.uid != old["uid"] and not p.pod.deleting]
        if not fresh:
            return Waiting(say.waiting_for_new_driver_pod(), retry_in=5.0)
        state = pod_state(max(fresh, key=lambda p: p.pod.created_at).pod)
        if state.crash_looping or state.condition == "failing":
            return Failed(say.new_driver_failing(state.name or "?", state.text), code="new-driver-failing")
        if state.condition != "healthy":
            return Waiting(say.new_driver_not_ready(state.name or "?", state.text), retry_in=5.0)
        if wanted and state.version != wanted:
            return Failed(say.new_driver_wrong_version(state.name or "?", state.version, wanted),
                          code="driver-wrong-version")
        return Done(say.driver_restarted(state.name or "?", state.version))


class SetDriverVersion:
    """Set the driver version on the one object that sets it for the run's pool: a
    ClusterPolicy (`spec.driver.version`) or an NVIDIADriver (`spec.version`), by merge
    patch, once. Params: `object` (ClusterPolicy | NVIDIADriver), `name`, `version`.

    The version it found is kept in the step's intent (what a rollback restores) and on the
    audit row written before the patch. A patch that landed before a restart is not sent
    again (the object already names the version); an object someone else changed since the
    step began fails the step instead of being overwritten. The patch names the
    resourceVersion it decided on, so it cannot land on a later change (409: read again).
    The node it is planned on is the canary's; the object is cluster-wide. `timeout_s`
    defaults to 120.

    In Git mode (`git: true`) nothing is patched: the thread hears which field to change
    in Git, to what, and the step waits for the object to name the version (the GitOps
    tool applies it). Another version arriving fails the step (`git-version-other`); the
    window ending first lets go of the nodes this run held and fails the step
    (`git-window-ended`) with no node changed. It waits up to `timeout_s`, default a day,
    the window being what bounds it."""

    _PATHS = {"ClusterPolicy": (CLUSTER_POLICIES, ("driver", "version")),
              "NVIDIADriver": (NVIDIA_DRIVERS, ("version",))}

    params = DriverVersionParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        params = params_of(ctx, DriverVersionParams)
        git_wait = params.git is True and params.set_back is not True
        return params.timeout(86400 if git_wait else 120, kind=ctx.kind)

    def _where(self, ctx: StepContext) -> tuple[str, tuple[str, ...], str, str]:
        params = params_of(ctx, DriverVersionParams)
        kind, name, version = params.object, params.name, params.version
        if kind is None or kind not in self._PATHS or not name or version is None:
            raise StepParamsError(say.driver_version_params())
        path, field = self._PATHS[kind]
        return path, field, name, f"{kind} {name}"

    @staticmethod
    def _version(spec: Mapping[str, Any], field: tuple[str, ...]) -> str | None:
        value: Any = spec
        for key in field:
            value = value.get(key) if isinstance(value, Mapping) else None
        return str(value) if value is not None else None

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        path, field, name, ref = self._where(ctx)
        found = ctx.gateway.get_custom_object(path, name)
        params = params_of(ctx, DriverVersionParams)
        if params.set_back is True:
            return self._prepare_back(ctx, found, field, ref)
        return {"object": ref, "version": params.version, "prior_version": self._version(found.spec, field)}

    def advance(self, ctx: StepContext) -> Outcome:
        params = params_of(ctx, DriverVersionParams)
        if params.set_back is True:
            return self._set_back(ctx)
        if params.git is True:
            return self._wait_for_git(ctx)
        path, field, name, ref = self._where(ctx)
        version, prior = ctx.intent["version"], ctx.intent.get("prior_version")
        found = ctx.gateway.get_custom_object(path, name)
        current = self._version(found.spec, field)
        if current == version:
            return Done(say.driver_version_already(ref, version) if prior == version
                        else say.driver_version_set(ref, prior, version))
        if current != prior:
            return Failed(say.driver_version_changed_meanwhile(ref, prior, current, version),
                          code="driver-changed-meanwhile")
        if not ctx.dry_run:
            ctx.record(key=f"patch/{ref}", action="driver-version.set", target=ref,
                       detail={"from": prior, "to": version, "node": ctx.node})
        patch = _merge_patch(field, version)
        ctx.act()
        try:
            ctx.gateway.patch_custom_object(path, name, spec=patch, resource_version=found.resource_version,
                                            dry_run=ctx.dry_run)
        except Conflict:
            return Waiting(say.driver_version_set(ref, prior, version) + " (changed meanwhile; reading again)",
                           retry_in=1.0)
        if ctx.dry_run:
            return Done(say.would_set_driver_version(ref, prior, version))
        return Done(say.driver_version_set(ref, prior, version))

    # -- Git mode (`git: true`): the GitOps tool applies the version

    def _wait_for_git(self, ctx: StepContext) -> Outcome:
        """Git mode: wait for the GitOps tool to apply `version`; never patch."""
        path, field, name, ref = self._where(ctx)
        params = params_of(ctx, DriverVersionParams)
        version, prior = ctx.intent["version"], ctx.intent.get("prior_version")
        where = ".".join(("spec", *field))
        owner = params.owner or say.git_owner_unnamed()
        current = self._version(ctx.gateway.get_custom_object(path, name).spec, field)
        if current == version:
            return Done(say.git_applied(ref, owner, version), {"git": owner, "from": prior, "to": version})
        if current != prior:
            return Failed(say.git_applied_other(ref, owner, current, version, prior), code="git-version-other")
        if ctx.window_end is not None and ctx.now >= ctx.window_end and not ctx.dry_run:
            released = _release_held(ctx)
            return Failed(say.git_window_ended(ref, where, version, released), code="git-window-ended")
        if ctx.dry_run:
            return Done(say.would_wait_for_git(ref, owner, where, version))
        text = say.change_in_git(ref, owner, where, prior, version)
        return Waiting(text, retry_in=5.0, notice=StepNotice(f"git/{ref}", text, per_run=True))

    # -- set back (`set_back: true`): a failed canary's object disarmed

    def _prepare_back(self, ctx: StepContext, found: CustomObject, field: tuple[str, ...],
                      ref: str) -> dict[str, Any]:
        # What this run's own driver-version step found and set (it is the canary node's too).
        forward = ctx.step_intent("driver-version") or {}
        params = params_of(ctx, DriverVersionParams)
        git = git_owner(found.labels, found.annotations)
        if params.git is True:
            git = params.owner or say.git_owner_unnamed()
        return {"object": ref, "set_back": True, "version": forward.get("prior_version"),
                "run_set": forward.get("version"), "found": self._version(found.spec, field), "git": git}

    def _set_back(self, ctx: StepContext) -> Outcome:
        """Put back the version this run's driver-version step replaced, only while the
        object still names the version the run set (never over a later change), by one
        merge patch naming the resourceVersion it decided on; audited before it is sent.
        An object Git keeps (Argo CD, Flux) is not patched: the note says what to set back
        in Git, since a sync would put the run's version back. An object that named no
        version before the run (`version` None beside the version the run set: the operator
        ran the image as the object names it) is set back to none: the patch takes the
        field away."""
        path, field, name, ref = self._where(ctx)
        back, run_set = ctx.intent.get("version"), ctx.intent.get("run_set")
        if not run_set or back == run_set:
            return Done(say.set_back_nothing(ref))
        found = ctx.gateway.get_custom_object(path, name)
        current = self._version(found.spec, field)
        at_risk = say.set_back_nodes_wait(ctx.node, ctx.run_id)
        if current == back and ctx.recorded(f"set-back/{ref}"):
            return Done(say.driver_version_set_back(ref, run_set, back, at_risk), {"from": run_set, "to": back})
        if current != run_set:
            text = (say.set_back_already(ref, back) if current == back
                    else say.set_back_left_alone(ref, current, run_set))
            return Done(text, {"found": current})
        git = ctx.intent.get("git")
        if git:
            where = ".".join(("spec", *field))
            return Done(say.set_back_in_git(ref, str(git), where, run_set, back, at_risk),
                        {"git": git, "from": run_set, "to": back})
        if ctx.dry_run:
            return Done(say.would_set_back(ref, run_set, back))
        ctx.record(key=f"set-back/{ref}", action="driver-version.set-back", target=ref,
                   detail={"from": run_set, "to": back, "node": ctx.node})
        patch = _merge_patch(field, back)
        ctx.act()
        try:
            ctx.gateway.patch_custom_object(path, name, spec=patch, resource_version=found.resource_version,
                                            dry_run=False)
        except Conflict:
            return Waiting(say.set_back_reading_again(ref), retry_in=1.0)
        return Done(say.driver_version_set_back(ref, run_set, back, at_risk), {"from": run_set, "to": back})


def _merge_patch(field: tuple[str, ...], value: object) -> dict[str, Any]:
    """The merge patch of `spec` that sets `field` (a path of keys under spec) to `value`."""
    patch: dict[str, Any] = {field[-1]: value}
    for key in reversed(field[:-1]):
        patch = {key: patch}
    return patch


def _release_held(ctx: StepContext) -> list[str]:
    """Let go of the nodes this run's operator-hold step held (skip label and mark), so
    a run that ends waiting for Git gives every node back as it found it."""
    held = (ctx.step_intent("operator-hold") or {}).get("targets") or []
    mine = []
    for node in held:
        try:
            if ctx.gateway.get_node(node).annotations.get(ANNOTATION_UPGRADE_HELD_BY) == ctx.run_id:
                mine.append(node)
        except NotFound:
            continue
    if mine:
        ctx.record(key="driver-upgrade.release", action="driver-upgrade.release",
                   target=f"{len(mine)} node(s)", detail={"nodes": mine})
    for node in mine:
        ctx.act()
        ctx.gateway.label_node(node, labels={LABEL_UPGRADE_SKIP: None},
                               annotations={ANNOTATION_UPGRADE_HELD_BY: None}, dry_run=False)
    return mine


# The marks a GitOps tool leaves on what it applies (Argo CD's tracking annotation or
# label; Flux's kustomize and helm controllers' labels). NB: Helm puts
# app.kubernetes.io/instance on its releases' objects too: that label counts only on an
# object Helm did not install (no meta.helm.sh/release-name annotation).
_ARGO_TRACKING = "argocd.argoproj.io/tracking-id"
_ARGO_INSTANCE = "app.kubernetes.io/instance"
_FLUX_LABELS = ("kustomize.toolkit.fluxcd.io/name", "helm.toolkit.fluxcd.io/name")
_HELM_RELEASE = "meta.helm.sh/release-name"


def git_owner(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str | None:
    """Which GitOps tool keeps an object, in words ("Argo CD (tracking id gpu:...)"), from
    the obvious marks only; None when none is there. Minimal on purpose: a tool that
    leaves no such mark is not seen."""
    tracking = annotations.get(_ARGO_TRACKING)
    if tracking:
        return say.git_owner_argo(tracking)
    for key in _FLUX_LABELS:
        if labels.get(key):
            namespace = labels.get(key.replace("/name", "/namespace"))
            return say.git_owner_flux(key.split(".", 1)[0], labels[key], namespace)
    instance = labels.get(_ARGO_INSTANCE) or annotations.get(_ARGO_INSTANCE)
    if instance and _HELM_RELEASE not in annotations:
        return say.git_owner_argo(instance)
    return None

