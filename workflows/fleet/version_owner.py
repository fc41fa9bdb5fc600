"""Who keeps the driver version of a ClusterPolicy (`spec.driver.version`) or an
NVIDIADriver (`spec.version`): Argo CD or Flux applying it from Git, Helm, or nobody (people
and gpuops set it); and whether the live version drifted from what that owner applied.

Two kinds of evidence: the marks a tool leaves on what it applies (Argo CD's tracking
annotation or its default `app.kubernetes.io/instance` label, Flux's controllers' labels,
Helm's release annotation), and the field managers that own the version field in the
object's managedFields. The managers say who wrote the field, so they win when the two
disagree (an object labelled by one tool and applied by another is the second's).

Drift: the live version differs from the one in the owner's last-applied annotation, or
the owner's manager no longer owns the field because someone else wrote it (a patch by
hand, or by gpuops): the owner's next sync puts its own value back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from workflows.kube.objects import CustomObject

OwnerTool: TypeAlias = Literal["Argo CD", "Flux", "Helm"]

# Where each kind names its driver version: spec paths, dotted as managedFields are read.
VERSION_FIELDS: Mapping[str, str] = {"ClusterPolicy": "driver.version", "NVIDIADriver": "version"}

ARGO_TRACKING = "argocd.argoproj.io/tracking-id"
ARGO_INSTANCE = "app.kubernetes.io/instance"
FLUX_KUSTOMIZE = "kustomize.toolkit.fluxcd.io/name"
FLUX_HELM = "helm.toolkit.fluxcd.io/name"
HELM_RELEASE = "meta.helm.sh/release-name"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

# The field managers each tool writes as (the API server names an Update's manager after
# the client; Argo CD's server-side apply uses argocd-controller).
_TOOL_MANAGERS: Mapping[str, OwnerTool] = {
    "argocd-controller": "Argo CD",
    "argocd-application-controller": "Argo CD",
    "kustomize-controller": "Flux",
    "helm-controller": "Flux",
    "helm": "Helm",
}
# Tools whose value comes from Git and that put back what differs.
_FROM_GIT: frozenset[OwnerTool] = frozenset({"Argo CD", "Flux"})


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionOwner:
    """Who keeps one object's driver version, and what drifted."""

    object: str  # "ClusterPolicy gpu-cluster-policy"
    field: str  # "spec.driver.version"
    tool: OwnerTool | None  # None: no tool keeps it (people and gpuops set it)
    source: str | None = None  # "application gpu-operator", "Kustomization flux-system/gpu"
    # What was seen, strongest first, each short enough for one Slack line.
    evidence: tuple[str, ...] = ()
    live: str | None = None
    # The version in the owner's last-applied annotation, when it keeps one.
    last_applied: str | None = None
    # Managers other than the owner's that now own the version field (someone changed it).
    changed_by: tuple[str, ...] = ()

    @property
    def from_git(self) -> bool:
        """Argo CD or Flux: the value comes from Git and a sync puts back what differs."""
        return self.tool in _FROM_GIT

    @property
    def drifted(self) -> bool:
        return bool(self.changed_by) or (self.last_applied is not None and self.last_applied != self.live)

    @property
    def by(self) -> str | None:
        """Who applies it, in words ("Argo CD application gpu-operator"); None: nobody."""
        if self.tool is None:
            return None
        return f"{self.tool} {self.source}" if self.source else self.tool

    def text(self) -> str:
        """One sentence: "ClusterPolicy gpu-cluster-policy is applied by Argo CD
        application gpu-operator from Git"."""
        return say_version_owner(self)


def judge_version_owner(obj: CustomObject) -> VersionOwner:
    """Who keeps `obj`'s driver version: the managers owning the field when one is a
    tool's, else the tool whose marks are on the object, else nobody."""
    path = VERSION_FIELDS.get(obj.kind, "version")
    ref, field = f"{obj.kind} {obj.name}", f"spec.{path}"
    live = _spec_value(obj.spec, path)
    marked = _marked_tool(obj.labels, obj.annotations)
    managers = tuple(sorted({m.manager for m in obj.managers_of(path)}))
    by_manager = [(m, _TOOL_MANAGERS[m]) for m in managers if m in _TOOL_MANAGERS]
    evidence: list[str] = []
    if by_manager:
        manager, tool = by_manager[0]
        evidence.append(_say_manager_owns(manager, field))
        source = marked[1] if marked is not None and marked[0] == tool else None
        if marked is not None and marked[0] != tool:
            evidence.append(_say_marks_disagree(marked[0], marked[2], tool))
        elif marked is not None:
            evidence.append(marked[2])
        changed_by: tuple[str, ...] = ()
    elif marked is not None:
        tool, source = marked[0], marked[1]
        evidence.append(marked[2])
        # The tool's marks are there but its manager no longer owns the field: whoever
        # does changed it since (an object without managedFields tells nothing).
        changed_by = managers
        if changed_by:
            evidence.append(_say_changed_by(changed_by, field))
    else:
        return VersionOwner(object=ref, field=field, tool=None, live=live,
                            evidence=(_say_no_owner(managers, field),))
    last = _last_applied(obj.annotations, path)
    if last is not None and last != live:
        evidence.append(_say_last_applied(last, live))
    return VersionOwner(object=ref, field=field, tool=tool, source=source, evidence=tuple(evidence),
                        live=live, last_applied=last, changed_by=changed_by)


def _marked_tool(labels: Mapping[str, str], annotations: Mapping[str, str]) -> tuple[OwnerTool, str, str] | None:
    """The tool whose marks are on the object: (tool, source, evidence), or None."""
    tracking = annotations.get(ARGO_TRACKING)
    if tracking:
        # "<application>:<group>/<kind>:<namespace>/<name>"
        app = tracking.split(":", 1)[0]
        return "Argo CD", f"application {app}", f"annotation {ARGO_TRACKING}={tracking}"
    for key, kind in ((FLUX_KUSTOMIZE, "Kustomization"), (FLUX_HELM, "HelmRelease")):
        name = labels.get(key)
        if name:
            namespace = labels.get(key.replace("/name", "/namespace"))
            where = f"{namespace}/{name}" if namespace else name
            return "Flux", f"{kind} {where}", f"label {key}={name}"
    release = annotations.get(HELM_RELEASE)
    if release:
        return "Helm", f"release {release}", f"annotation {HELM_RELEASE}={release}"
    # NB: Helm's charts put app.kubernetes.io/instance on their objects too: the label is
    # Argo CD's only on an object Helm did not install (no release annotation, above).
    instance = labels.get(ARGO_INSTANCE)
    if instance:
        return "Argo CD", f"application {instance}", f"label {ARGO_INSTANCE}={instance}"
    return None


def _spec_value(spec: Mapping[str, object], path: str) -> str | None:
    value: object = spec
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return str(value) if value is not None else None


def _last_applied(annotations: Mapping[str, str], path: str) -> str | None:
    text = annotations.get(LAST_APPLIED)
    if not text:
        return None
    try:
        applied = json.loads(text)
    except ValueError:
        return None
    spec = applied.get("spec") if isinstance(applied, dict) else None
    return _spec_value(spec, path) if isinstance(spec, dict) else None


# --------------------------------------------------------------------------------------
# Wording (what `/gpu status <pool>` and the upgrade plan say)


def say_version_owner(owner: VersionOwner) -> str:
    if owner.tool is None:
        return f"{owner.object} is not kept by a GitOps tool: gpuops sets {owner.field} itself"
    where = " from Git" if owner.from_git else ""
    return f"{owner.object} is applied by {owner.by}{where}"


def _say_manager_owns(manager: str, field: str) -> str:
    return f"field manager {manager} owns {field}"


def _say_marks_disagree(marked: OwnerTool, mark: str, tool: OwnerTool) -> str:
    return f"{mark} names {marked}, but {tool}'s field manager owns the version"


def _say_changed_by(managers: Sequence[str], field: str) -> str:
    return f"{field} was last written by {', '.join(managers)}, not by its owner"


def _say_last_applied(last: str, live: str | None) -> str:
    return f"the owner last applied {last}; the object names {live or 'no version'}"


def _say_no_owner(managers: Sequence[str], field: str) -> str:
    if managers:
        return f"no GitOps or Helm mark, and {field} is owned by {', '.join(managers)}"
    return "no GitOps or Helm mark on the object"
