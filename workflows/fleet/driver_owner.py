"""Who owns the driver on a node: the operator, the host, both at once (a conflict), none,
or gpuops cannot tell; with the evidence seen, strongest first, each short enough for one
Slack line. Decided from what can be seen without exec'ing into the node: the driver pods,
the deploy labels, the driver version GFD reads, the upgrade state and the operator's
settings (shared/reference/gpu-operator/FACTS.md, "Who owns the driver on a node")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from workflows.fleet.node_changes import UpgradeStatus
from workflows.fleet.operator_settings import FleetContext, NvidiaDriverRef
from workflows.fleet.pods import PodState
from workflows.kube.labels import (
    LABEL_DEPLOY_DRIVER,
    LABEL_DEPLOY_OPERANDS,
    LABEL_DRIVER_CR_OWNER,
    LABEL_DRIVER_VERSION_FULL,
    LABEL_UPGRADE_STATE,
    LABELS_DRIVER_VERSION_PARTS,
    LABELS_DRIVER_VERSION_PARTS_OLD,
    PAUSED_PREFIX,
    PRE_INSTALLED,
)

DriverOwner: TypeAlias = Literal["operator", "host", "conflict", "none", "unknown"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DriverOwnership:
    owner: DriverOwner
    # Facts that were seen, strongest first, each short enough for one Slack line.
    evidence: tuple[str, ...]
    nvidia_driver: str | None = None  # the NVIDIADriver CR managing the node, if any


def gfd_driver_version(labels: Mapping[str, str]) -> str | None:
    full = labels.get(LABEL_DRIVER_VERSION_FULL)
    if full:
        return full
    for keys in (LABELS_DRIVER_VERSION_PARTS, LABELS_DRIVER_VERSION_PARTS_OLD):
        parts = [labels.get(key) for key in keys]
        if parts[0] and parts[1]:
            return ".".join(part for part in parts if part)
    return None


def _same_driver(loaded: str, pod_version: str) -> bool:
    """Whether the loaded driver can be the pod's: the same version, or one of the pod's
    branch (a precompiled image names its branch only, "580")."""
    return loaded == pod_version or loaded.startswith(pod_version + ".")


def judge_driver_owner(
    *,
    labels: Mapping[str, str],
    driver_pods: Sequence[PodState],
    gfd_version: str | None,
    upgrade: UpgradeStatus,
    context: FleetContext,
) -> DriverOwnership:
    """Decide the driver owner from what can be seen without exec'ing into the node.

    `driver_pods` are this node's driver pods, best (live, newest) first.
    """
    evidence: list[str] = []
    deploy_driver = labels.get(LABEL_DEPLOY_DRIVER)
    host_label = deploy_driver == PRE_INSTALLED
    cluster = context.cluster

    nvidia_driver = context.nvidia_driver_for(labels)
    owner_label = labels.get(LABEL_DRIVER_CR_OWNER)
    if owner_label:
        evidence.append(
            _say_driver_cr_label(owner_label, exists=context.nvidia_driver_named(owner_label) is not None)
        )
    elif nvidia_driver is not None:
        evidence.append(_say_driver_cr_selects(nvidia_driver))
    elif cluster.uses_nvidia_driver_crds:
        evidence.append(_say_no_driver_cr_selects())

    pod = driver_pods[0] if driver_pods else None
    live = [p for p in driver_pods if not p.deleting]
    if len(live) > 1:
        evidence.append(_say_several_driver_pods(live))
    operator_pod = pod is not None and pod.owner_kind == "DaemonSet"
    if pod is not None:
        evidence.append(_say_driver_pod(pod))
        if not operator_pod:
            evidence.append(_say_driver_pod_not_from_daemonset(pod))

    opted_out = deploy_driver == "false" or labels.get(LABEL_DEPLOY_OPERANDS) == "false"
    if deploy_driver is not None:
        evidence.append(_say_deploy_driver_label(deploy_driver))
    if labels.get(LABEL_DEPLOY_OPERANDS) == "false":
        evidence.append(_say_operands_removed())
    if context.driver_enabled is False:
        evidence.append(_say_driver_disabled(cluster.cluster_policy))
    if upgrade.in_progress:
        evidence.append(_say_upgrade_state(upgrade.state))

    def verdict(owner: DriverOwner, *why: str) -> DriverOwnership:
        return DriverOwnership(
            owner=owner,
            evidence=tuple(evidence) + why,
            nvidia_driver=nvidia_driver.name if nvidia_driver else None,
        )

    if pod is not None and operator_pod:
        gfd = (_say_gfd_version(gfd_version),) if gfd_version else ()
        if pod.condition == "healthy":
            if host_label:
                return verdict("operator", *gfd, _say_stale_pre_installed())
            return verdict("operator", *gfd)
        if pod.condition == "failing":
            if host_label:
                return verdict("conflict", *gfd, _say_two_driver_sources())
            if gfd_version and pod.version and not _same_driver(gfd_version, pod.version):
                # A working driver the failing pod cannot have loaded: the host's. The
                # driver manager missed it (a wrong deploy.driver=true label).
                return verdict("conflict", *gfd, _say_host_driver_beside_failing_pod(gfd_version, pod))
            return verdict("operator", *gfd)
        if pod.condition == "starting":
            if host_label:
                return verdict("unknown", *gfd, _say_starting_on_pre_installed())
            return verdict("operator", *gfd)
        if upgrade.in_progress:
            # The upgrade controller deletes the driver pod and its DaemonSet recreates it.
            return verdict("operator", *gfd, _say_being_replaced())
        return verdict(
            "unknown", *gfd, _say_driver_pod_stalled(pod, gfd_version, host_marked=host_label)
        )

    if deploy_driver is not None and deploy_driver.startswith(PAUSED_PREFIX):
        return verdict("operator", _say_operator_paused_driver())
    if host_label:
        return verdict(
            "host",
            _say_gfd_version(gfd_version) if gfd_version else _say_gfd_no_version(),
        )
    if gfd_version is not None:
        if opted_out or context.driver_enabled is False:
            return verdict("host", _say_gfd_version_without_driver_pod(gfd_version))
        if not cluster.operator_found:
            return verdict(
                "host", _say_gfd_version_without_driver_pod(gfd_version), _say_no_operator()
            )
        if upgrade.in_progress and pod is None:
            return verdict("operator", _say_gfd_version(gfd_version), _say_being_replaced())
        return verdict("unknown", _say_gfd_version_unexplained(gfd_version))
    if pod is not None:
        return verdict("unknown", _say_driver_pod_unexplained())
    return verdict("none", _say_no_driver_anywhere())


# --------------------------------------------------------------------------------------
# Evidence wording (what the inventory says it saw; findings word their own messages)


def _say_driver_pod(pod: PodState) -> str:
    state = "Running and Ready" if pod.condition == "healthy" else pod.text
    tag = f" (image tag {pod.image_tag})" if pod.image_tag else ""
    return f"driver pod {pod.name} is {state}{tag}"


def _say_driver_pod_not_from_daemonset(pod: PodState) -> str:
    owner = pod.owner_kind or "no controller"
    return f"driver pod {pod.name} is not run by a DaemonSet ({owner})"


def _say_several_driver_pods(pods: Sequence[PodState]) -> str:
    return f"{len(pods)} live driver pods on this node: {', '.join(p.name or '?' for p in pods)}"


def _say_deploy_driver_label(value: str) -> str:
    return f"label {LABEL_DEPLOY_DRIVER}={value}"


def _say_operands_removed() -> str:
    return f"label {LABEL_DEPLOY_OPERANDS}=false (all operands removed from this node)"


def _say_driver_disabled(policy: str | None) -> str:
    return f"ClusterPolicy {policy} spec.driver.enabled=false"


def _say_upgrade_state(state: str | None) -> str:
    return f"label {LABEL_UPGRADE_STATE}={state}"


def _say_driver_cr_label(name: str, *, exists: bool) -> str:
    if exists:
        return f"label {LABEL_DRIVER_CR_OWNER}={name} (NVIDIADriver {name} manages this node)"
    return f"label {LABEL_DRIVER_CR_OWNER}={name} but no NVIDIADriver named {name} exists"


def _say_driver_cr_selects(driver: NvidiaDriverRef) -> str:
    if driver.node_selector:
        selector = ",".join(f"{k}={v}" for k, v in sorted(driver.node_selector.items()))
        return f"NVIDIADriver {driver.name} selects this node (nodeSelector {selector})"
    return f"NVIDIADriver {driver.name} is the default driver for nodes no other CR selects"


def _say_no_driver_cr_selects() -> str:
    return "ClusterPolicy uses NVIDIADriver CRs but none selects this node"


def _say_gfd_version(version: str) -> str:
    return f"GFD reports driver {version}"


def _say_gfd_no_version() -> str:
    return "GFD reports no driver version yet"


def _say_gfd_version_without_driver_pod(version: str) -> str:
    return f"GFD reports driver {version} but no operator driver pod runs here"


def _say_gfd_version_unexplained(version: str) -> str:
    return (
        f"GFD reports driver {version} but no operator driver pod runs here and nothing "
        "marks a host driver: check the driver DaemonSet's node selector and the node's host"
    )


def _say_stale_pre_installed() -> str:
    return (
        f"{LABEL_DEPLOY_DRIVER}={PRE_INSTALLED} is stale: the operator's driver pod is "
        "Running and Ready"
    )


def _say_two_driver_sources() -> str:
    return (
        "two driver sources: a host driver is marked and the operator's driver pod keeps "
        'failing (the driver manager stops with "driver is pre-installed on host")'
    )


def _say_host_driver_beside_failing_pod(gfd_version: str, pod: PodState) -> str:
    return (
        f"two driver sources: driver {gfd_version} is loaded, yet the operator's driver pod "
        f"({pod.version}) keeps failing, so the loaded driver came from the host"
    )


def _say_starting_on_pre_installed() -> str:
    return (
        f"the operator's driver pod is still starting on a node marked {PRE_INSTALLED}: "
        "it should either become Ready (stale label) or fail (conflict)"
    )


def _say_being_replaced() -> str:
    return "the upgrade controller is replacing the operator's driver pod"


def _say_driver_pod_stalled(pod: PodState, gfd_version: str | None, *, host_marked: bool) -> str:
    if host_marked:
        return (
            f"driver pod {pod.name} is {pod.text} on a node marked {PRE_INSTALLED}: "
            "cannot tell whether the host or the operator will provide the driver"
        )
    if gfd_version:
        return (
            f"driver pod {pod.name} is {pod.text} yet GFD reports driver {gfd_version}: "
            "cannot tell which driver is loaded"
        )
    return (
        f"driver pod {pod.name} is {pod.text}, no host driver is marked and GFD reports no "
        "driver: nothing shows a driver is loaded"
    )


def _say_driver_pod_unexplained() -> str:
    return "a driver pod runs outside the operator's DaemonSets and GFD reports no driver"


def _say_operator_paused_driver() -> str:
    return "the operator paused its own driver pod on this node"


def _say_no_operator() -> str:
    return "no GPU Operator runs in this cluster, so the driver comes from the host"


def _say_no_driver_anywhere() -> str:
    return "no driver pod, no pre-installed label and no driver version from GFD"
