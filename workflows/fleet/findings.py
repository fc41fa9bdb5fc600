"""Findings: what in the fleet needs a human, how urgently, and what to look at.

Node checks (`node_findings`) depend on one node's inventory and `now`, so a cache can
keep them per node; pool and cluster checks run once per summary. Every sentence an
on-call engineer reads lives in the "Messages" section at the bottom of this module.

This module only reads the assessment's values (`fleet.assessment`, `fleet.pool`); the summary
(`fleet.summary`) calls these checks.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from workflows.fleet.assessment import GpuResource, NodeInventory
from workflows.fleet.operator_settings import ClusterInfo, ConfiguredRuntime
from workflows.fleet.pool import PoolInventory
from workflows.fleet.restrictions import Restricted, ToleratedAround
from workflows.fleet.settings import InventorySettings
from workflows.fleet.canaries import CanaryVerdict
from workflows.fleet.platform import (
    KubeMinor,
    KubernetesRange,
    is_known_runtime,
    minor_of,
    minor_text,
    release_line,
    runtime_of,
)
from workflows.kube.objects import NodeName

Severity: TypeAlias = Literal["critical", "warning", "info"]
SEVERITY_ORDER: dict[Severity, int] = {"critical": 0, "warning": 1, "info": 2}

FindingCode: TypeAlias = Literal[
    "advertised-mismatch",
    "unhealthy-gpus",
    "driver-conflict",
    "driver-crash-loop",
    "device-plugin-no-gpus",
    "second-device-plugin",
    "upgrade-stuck",
    "upgrade-failed",
    "mig-change-stuck",
    "mig-change-failed",
    "serving-auto-upgrade",
    "mixed-driver-versions",
    "driver-pods-behind-template",
    "unpooled-nodes",
    "duplicate-cluster-policy",
    "cluster-policy-not-ready",
    "no-gpu-operator",
    "node-not-ready",
    "cordon-left-behind",
    "workload-misplaced",
    "kubernetes-unsupported",
    "kubernetes-support-unknown",
    "runtime-mismatch",
    "precompiled-kernel",
    "precompiled-kernels-mixed",
    "canary-failed",
    "restriction-forgotten",
    "placement-tolerated",
    "driver-version-drift",
    # GPU health from DCGM (workflows.signals)
    "gpu-xid",
    "gpu-ecc-uncorrectable",
    "gpu-ecc-correctable",
    "gpu-row-remap-failed",
    "gpu-hot",
    "gpu-memory-hot",
    "gpu-throttled",
    "gpu-pcie-replays",
    "gpu-health-unknown",
]

CLUSTER_SUBJECT = "cluster"


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    severity: Severity
    code: FindingCode
    subject: str  # a node name, a pool name, or "cluster"
    pool: str | None
    message: str  # one line: what is wrong and what to check or do
    command: str | None = None  # where to look next, e.g. "/gpu node gpu-h100-07"


def sort_findings(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    return tuple(
        sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.subject, f.code))
    )


# --------------------------------------------------------------------------------------
# Node checks


def node_findings_depend_on_time(inv: NodeInventory) -> bool:
    """Whether `node_findings` of `inv` may say something else at another time: a node
    not Ready (its age), an upgrade failed or under way (its age, stuck after a while),
    a MIG change the operands pause for (stuck after a while). Every other finding of a
    node reads only its inventory, so a cache may keep them until the node changes."""
    return (inv.ready is not True or inv.upgrade.failed or inv.upgrade.in_progress
            or inv.paused_for_mig_change)


def node_findings(
    inv: NodeInventory, *, settings: InventorySettings, now: dt.datetime
) -> tuple[Finding, ...]:
    found: list[Finding] = []

    def add(severity: Severity, code: FindingCode, message: str) -> None:
        found.append(
            Finding(
                severity=severity,
                code=code,
                subject=inv.name,
                pool=inv.pool,
                message=message,
                command=node_command(inv.name),
            )
        )

    if inv.ready is not True:
        add("warning", "node-not-ready", msg_node_not_ready(inv, now=now))

    if inv.driver.owner == "conflict":
        add("critical", "driver-conflict", msg_driver_conflict(inv))
    elif inv.driver_pod.present and inv.driver_pod.crash_looping:
        # A conflict already names the failing pod; one finding per cause.
        add("critical", "driver-crash-loop", msg_driver_crash_loop(inv))

    upgrade_age = inv.upgrade.age(now)
    if inv.upgrade.failed:
        # Not terminal: it flips back to upgrade-done on its own (gpu-operator#2549),
        # so it is worth a look every time it is seen.
        add("critical", "upgrade-failed", msg_upgrade_failed(inv, age=upgrade_age))
    elif (
        inv.upgrade.in_progress
        and upgrade_age is not None
        and upgrade_age > settings.upgrade_stuck_after
    ):
        add("warning", "upgrade-stuck", msg_upgrade_stuck(inv, age=upgrade_age))

    zero_explained = False
    if inv.mig.failed:
        add("critical", "mig-change-failed", msg_mig_change_failed(inv))
        zero_explained = True
    elif inv.paused_for_mig_change:
        # Aged from when the change began (gpuops notes when it first saw the state,
        # workflows.fleet.first_seen): a change that just started is not stuck, however many
        # GPUs it advertises meanwhile; without any time, no age and no finding.
        mig_age = inv.mig.age(now)
        if mig_age is not None and mig_age > settings.mig_pending_stuck_after:
            add("critical", "mig-change-stuck", msg_mig_change_stuck(inv, age=mig_age))
            zero_explained = True

    if inv.other_device_plugins and inv.operator_device_plugin:
        add("critical", "second-device-plugin", msg_second_device_plugin(inv))

    if inv.device_plugin_pod.condition == "healthy" and inv.advertised_gpus == 0 and not zero_explained:
        add("critical", "device-plugin-no-gpus", msg_device_plugin_no_gpus(inv))
        zero_explained = True

    short = [r for r in inv.resources if r.expected is not None and r.capacity < r.expected]
    extra = [r for r in inv.resources if r.expected is not None and r.capacity > r.expected]
    if short and not (zero_explained and inv.advertised_gpus == 0):
        if inv.paused_operands:
            add("info", "advertised-mismatch", msg_advertised_short_paused(inv, short))
        elif inv.changing:
            add("warning", "advertised-mismatch", msg_advertised_short_changing(inv, short))
        else:
            add("critical", "advertised-mismatch", msg_advertised_short(inv, short))
    if extra:
        add("warning", "advertised-mismatch", msg_advertised_extra(inv, extra))

    precompiled = _precompiled_kernel_check(inv)
    if precompiled is not None:
        add(*precompiled)

    unhealthy = [r for r in inv.resources if r.allocatable < r.capacity]
    if unhealthy:
        add("warning", "unhealthy-gpus", msg_unhealthy_gpus(inv, unhealthy))
    placement = settings.placement.get(inv.pool)
    for use in ("mig", "full_gpu"):
        pods = [pod for pod, used in inv.misplaced if used == use]
        rule = (placement.mig if use == "mig" else placement.full_gpu) if placement is not None else None
        if pods and rule is not None:
            add("warning", "workload-misplaced", msg_workload_misplaced(inv, pods, use, rule.text))
    return tuple(found)


# Why a container waits when its image cannot be had (the main container's, not "Init:").
_PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff"})


def _precompiled_kernel_check(inv: NodeInventory) -> tuple[Severity, FindingCode, str] | None:
    """A precompiled driver image is built for one kernel, and its tag names it
    (`<driver>-<kernel>-<os>`): a tag without the node's kernel is a driver built for
    another kernel; a tag with it that cannot be pulled is a kernel NVIDIA built none for.
    Without a driver pod, an image tag or the node's kernel, nothing is claimed."""
    pod, kernel = inv.driver_pod, inv.node_info.kernel_version
    if not inv.precompiled or not pod.present or not pod.image_tag or not kernel:
        return None
    if kernel not in pod.image_tag:
        return ("warning", "precompiled-kernel", msg_precompiled_other_kernel(inv))
    if pod.waiting_reason in _PULL_FAILURES:
        return ("critical", "precompiled-kernel", msg_precompiled_no_image(inv))
    return None


def canary_findings(inv: NodeInventory, verdict: CanaryVerdict, *, now: dt.datetime) -> tuple[Finding, ...]:
    """The device plugin looks healthy and advertises GPUs, yet gpuops' last check pod on
    the node failed and none passed since: the scheduler keeps placing GPU pods on GPUs a
    container could not use. Cordoned, no new pod lands, so it is a warning then."""
    if verdict.passed or inv.device_plugin_pod.condition != "healthy" or inv.advertised_gpus == 0:
        return ()
    return (Finding(severity="warning" if inv.cordoned else "critical", code="canary-failed", subject=inv.name,
                    pool=inv.pool, message=msg_canary_failed(inv, verdict, now=now),
                    command=node_command(inv.name)),)


# --------------------------------------------------------------------------------------
# Pool and cluster checks


def pool_findings(pool: PoolInventory, *, settings: InventorySettings,
                  toolkit: ConfiguredRuntime | None = None,
                  failed: Mapping[str, Sequence[NodeName]] | None = None) -> tuple[Finding, ...]:
    """`toolkit` is the runtime the container toolkit is set up for (None: not the
    operator's to set, or unknown), against which the pool's nodes' runtimes are read.
    `failed` is, per driver version, the nodes of the fleet where it failed (its pod
    crash-looping or failing, the operator's upgrade-failed, a failed check pod): pods
    behind a template that names such a version take it on their next restart, which is
    critical until the driver object is set back."""
    found: list[Finding] = []

    def add(severity: Severity, code: FindingCode, message: str) -> None:
        found.append(
            Finding(
                severity=severity,
                code=code,
                subject=pool.name,
                pool=pool.name,
                message=message,
                command=pool_command(pool.name),
            )
        )

    if pool.name == "unpooled":
        add("info", "unpooled-nodes", msg_unpooled_nodes(pool, label_key=settings.pool_label_key))
    if pool.kind == "serving" and pool.auto_upgrade.state == "on":
        add("warning", "serving-auto-upgrade", msg_serving_auto_upgrade(pool))
    if pool.mixed_driver_versions:
        add("warning", "mixed-driver-versions", msg_mixed_driver_versions(pool))
    if pool.driver_pods_behind:
        armed = {v: tuple(failed[v]) for v in pool.driver_pods_behind if failed and failed.get(v)}
        if armed:
            add("critical", "driver-pods-behind-template", msg_driver_pods_armed(pool, armed))
        else:
            add("warning", "driver-pods-behind-template", msg_driver_pods_behind(pool))
    if toolkit is not None:
        other = {v: nodes for v, nodes in pool.runtimes.items()
                 if (kind := runtime_of(v)) is not None and kind != toolkit.runtime}
        if other:
            add("warning", "runtime-mismatch", msg_runtime_mismatch(pool, other, toolkit))
    if len(pool.precompiled_kernels) > 1:
        add("info", "precompiled-kernels-mixed", msg_precompiled_kernels_mixed(pool))
    return tuple(found)


def support_findings(cluster: ClusterInfo, *, kubelets: Mapping[str, Sequence[NodeName]],
                     settings: InventorySettings) -> tuple[Finding, ...]:
    """The GPU Operator's release against the Kubernetes it runs on: the API server's
    version and the GPU nodes' kubelets (`kubelets`: kubelet version -> nodes), read
    against the support table. A release the table does not know is said to be unknown."""
    if not cluster.operator_found:
        return ()
    api = minor_of(cluster.kubernetes_version)
    nodes_by_minor: dict[KubeMinor, list[NodeName]] = {}
    for version, nodes in kubelets.items():
        minor = minor_of(version)
        if minor is not None:
            nodes_by_minor.setdefault(minor, []).extend(nodes)
    if api is None and not nodes_by_minor:
        return ()  # nothing to compare with

    def finding(severity: Severity, code: FindingCode, message: str) -> tuple[Finding, ...]:
        return (Finding(severity=severity, code=code, subject=CLUSTER_SUBJECT, pool=None, message=message,
                        command=CLUSTER_COMMAND),)

    line = release_line(cluster.operator_version)
    supported = settings.operator_support.get(line) if line is not None else None
    if supported is None:
        return finding("info", "kubernetes-support-unknown",
                       msg_kubernetes_support_unknown(cluster, line, api=api, kubelets=nodes_by_minor))
    outside = {minor: sorted(nodes) for minor, nodes in sorted(nodes_by_minor.items()) if not supported.contains(minor)}
    if (api is None or supported.contains(api)) and not outside:
        return ()
    return finding("warning", "kubernetes-unsupported", msg_kubernetes_unsupported(
        cluster, line or "?", supported, api=api if api is not None and not supported.contains(api) else None,
        kubelets=outside))


def cluster_findings(cluster: ClusterInfo) -> tuple[Finding, ...]:
    found: list[Finding] = []

    def add(severity: Severity, code: FindingCode, message: str) -> None:
        found.append(
            Finding(
                severity=severity,
                code=code,
                subject=CLUSTER_SUBJECT,
                pool=None,
                message=message,
                command=CLUSTER_COMMAND,
            )
        )

    if not cluster.crds_installed:
        add("info", "no-gpu-operator", msg_no_gpu_operator(reason=REASON_NO_CRDS))
        return tuple(found)
    if cluster.operator_deployment is None:
        add("info", "no-gpu-operator", msg_no_gpu_operator(reason=REASON_NO_DEPLOYMENT))
    if cluster.duplicate_cluster_policies:
        add("warning", "duplicate-cluster-policy", msg_duplicate_cluster_policies(cluster))
    if cluster.cluster_policy is not None and cluster.cluster_policy_state == "notReady":
        add("warning", "cluster-policy-not-ready", msg_cluster_policy_not_ready(cluster))
    return tuple(found)


# --------------------------------------------------------------------------------------
# Messages: every sentence a finding shows. One line each, saying what to check or do.

CLUSTER_COMMAND = "/gpu status"
REASON_NO_CRDS = "the ClusterPolicy CRD (clusterpolicies.nvidia.com) is not installed"
REASON_NO_DEPLOYMENT = "the ClusterPolicy CRD is installed but no gpu-operator Deployment runs"


def node_command(node: str) -> str:
    return f"/gpu node {node}"


def pool_command(pool: str) -> str:
    return f"/gpu status {pool}"


def format_age(age: dt.timedelta) -> str:
    """"3d 4h", "2h 5m", "45m", "30s": precise enough to act on, short enough to scan."""
    seconds = max(int(age.total_seconds()), 0)
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m"
    return f"{seconds}s"


def _counts(resources: Sequence[GpuResource]) -> str:
    return ", ".join(f"{r.capacity} of {r.expected} {r.resource}" for r in resources)


def _expected_basis(inv: NodeInventory) -> str:
    if inv.mig.strategy == "mixed" and any(r.resource.startswith("nvidia.com/mig-") for r in inv.resources):
        return "per GFD's nvidia.com/mig-<profile>.count labels"
    if inv.replicas > 1:
        return f"GFD: gpu.count x {inv.replicas} replicas"
    return "GFD: gpu.count"


def msg_node_not_ready(inv: NodeInventory, *, now: dt.datetime) -> str:
    since = (
        f" for {format_age(now - inv.ready_changed_at)}" if inv.ready_changed_at is not None else ""
    )
    state = "reports no Ready condition" if inv.ready is None else f"is NotReady{since}"
    return (
        f"GPU node {inv.name} {state}; its GPUs are unavailable: check the kubelet "
        "and `kubectl describe node`"
    )


def msg_driver_conflict(inv: NodeInventory) -> str:
    if inv.deploy_driver == "pre-installed":
        host = "it is marked pre-installed (host driver)"
    else:
        host = f"the host's driver {inv.driver_version} is loaded"
    return (
        f"{inv.name} has two driver sources: {host} and operator driver pod "
        f"{inv.driver_pod.name} is {inv.driver_pod.text}; remove the host driver or set "
        "nvidia.com/gpu.deploy.driver=false on the node"
    )


def msg_driver_crash_loop(inv: NodeInventory) -> str:
    pod = inv.driver_pod
    return (
        f"driver pod {pod.name} on {inv.name} is {pod.text}; read its logs "
        "(all containers, including init) before it takes the node's GPUs down"
    )


def msg_upgrade_failed(inv: NodeInventory, *, age: dt.timedelta | None) -> str:
    since = f" for {format_age(age)}" if age is not None else ""
    return (
        f"driver upgrade failed on {inv.name} (upgrade-failed{since}); check the driver pod "
        f"({inv.driver_pod.text}) and validator ({inv.validator_pod.text}) before it flips "
        "back to upgrade-done unattended"
    )


def msg_upgrade_stuck(inv: NodeInventory, *, age: dt.timedelta) -> str:
    return (
        f"{inv.name} has been in driver upgrade state {inv.upgrade.state} for "
        f"{format_age(age)}; check what it waits for (GPU pods that will not evict, "
        "jobs, the validator)"
    )


def msg_mig_change_failed(inv: NodeInventory) -> str:
    return (
        f"MIG reconfiguration of {inv.name} to {inv.mig.config or '?'} failed "
        "(mig.config.state=failed); read the nvidia-mig-manager pod's logs on the node"
    )


def msg_mig_change_stuck(inv: NodeInventory, *, age: dt.timedelta | None) -> str:
    state = inv.mig.config_state or "no state"
    duration = f" for {format_age(age)}" if age is not None else ""
    operands = ", ".join(sorted(k for k, v in inv.paused_operands.items() if v.endswith("mig-change")))
    return (
        f"MIG change of {inv.name} to {inv.mig.config or '?'} is stuck ({state}{duration}) "
        f"with {operands} paused and {inv.advertised_gpus} GPUs advertised; read the "
        "nvidia-mig-manager logs, then re-apply or roll back nvidia.com/mig.config"
    )


def msg_device_plugin_no_gpus(inv: NodeInventory) -> str:
    return (
        f"device plugin on {inv.name} is Ready but the node advertises 0 GPUs; check the "
        "device plugin logs and that the driver is loaded (nvidia-smi on the node)"
    )


def msg_second_device_plugin(inv: NodeInventory) -> str:
    others = ", ".join(f"{p.name} ({p.text}, image {p.image or '?'})" for p in inv.other_device_plugins)
    ours = (f"the operator's {inv.device_plugin_pod.name} ({inv.device_plugin_pod.text})"
            if inv.device_plugin_pod.present else "the operator's, which its deploy label asks for")
    return (
        f"{inv.name} runs a second NVIDIA device plugin beside {ours}: {others}; two plugins register the "
        "same GPUs with the kubelet, so pods are placed on GPUs another pod holds: remove the hand-installed "
        "one (its DaemonSet or Helm release), or set nvidia.com/gpu.deploy.device-plugin=false on the node "
        "to keep it instead of the operator's"
    )


def msg_advertised_short(inv: NodeInventory, short: Sequence[GpuResource]) -> str:
    return (
        f"{inv.name} advertises {_counts(short)} ({_expected_basis(inv)}); GPUs are "
        "missing: check the device plugin pod and nvidia-smi on the node"
    )


def msg_advertised_short_paused(inv: NodeInventory, short: Sequence[GpuResource]) -> str:
    paused = ", ".join(f"{k}={v}" for k, v in sorted(inv.paused_operands.items()))
    return (
        f"{inv.name} advertises {_counts(short)} while operands are paused ({paused}); "
        "expected until the change finishes"
    )


def msg_advertised_short_changing(inv: NodeInventory, short: Sequence[GpuResource]) -> str:
    change = (
        f"driver upgrade state {inv.upgrade.state}"
        if inv.upgrade.in_progress
        else f"MIG config state {inv.mig.config_state}"
    )
    return (
        f"{inv.name} advertises {_counts(short)} during {change}; recheck once it finishes"
    )


def msg_advertised_extra(inv: NodeInventory, extra: Sequence[GpuResource]) -> str:
    return (
        f"{inv.name} advertises more than its labels imply ({_counts(extra)}, "
        f"{_expected_basis(inv)}); check the device plugin's sharing config and GFD labels"
    )


def msg_unhealthy_gpus(inv: NodeInventory, unhealthy: Sequence[GpuResource]) -> str:
    detail = ", ".join(
        f"{r.allocatable} of {r.capacity} {r.resource} allocatable" for r in unhealthy
    )
    return (
        f"{inv.name}: {detail}; the device plugin marked devices unhealthy: look for XID "
        "errors (dcgm-exporter DCGM_FI_DEV_XID_ERRORS, dmesg) and plan a drain"
    )


def msg_workload_misplaced(inv: NodeInventory, pods: Sequence[str], use: str, rule: str) -> str:
    shown = ", ".join(pods[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
    what = "MIG slices" if use == "mig" else "whole GPUs"
    key = "workloads.mig" if use == "mig" else "workloads.full_gpu"
    return (f"{shown} use{'s' if len(pods) == 1 else ''} {what} on {inv.name}, but pool {inv.pool} keeps {what} "
            f"for {rule} ({key}): move {'it' if len(pods) == 1 else 'them'}, or document {'it' if len(pods) == 1 else 'them'} "
            "in the pool's configuration")


def msg_unpooled_nodes(pool: PoolInventory, *, label_key: str) -> str:
    count = pool.nodes_total
    nodes = "GPU node has" if count == 1 else "GPU nodes have"
    return (
        f"{count} {nodes} no {label_key} label, so no pool policy covers them; "
        "label them to bring them under a pool"
    )


def msg_serving_auto_upgrade(pool: PoolInventory) -> str:
    default = " (CRD default)" if pool.auto_upgrade.defaulted else ""
    return (
        f"serving pool {pool.name} has driver auto-upgrade on ({pool.auto_upgrade.source}"
        f"{default}); the operator may restart drivers under live traffic: set "
        "upgradePolicy.autoUpgrade=false and upgrade through gpuops"
    )


def msg_driver_pods_behind(pool: PoolInventory) -> str:
    parts = []
    for version, nodes in pool.driver_pods_behind.items():
        shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        parts.append(f"{len(nodes)} of {pool.nodes_total} nodes ({shown}) run a driver pod older than its "
                     f"DaemonSet, which now specifies {version}")
    return ("; ".join(parts) + ": with OnDelete, the next restart of such a pod or reboot of its node changes "
            "the driver unplanned; replace them on purpose, in a drain window")


def msg_driver_pods_armed(pool: PoolInventory, failed: Mapping[str, Sequence[NodeName]]) -> str:
    parts = []
    for version, where in failed.items():
        at_risk = pool.driver_pods_behind[version]
        parts.append(f"driver {version} failed on {', '.join(where)}, yet the DaemonSet still specifies it: "
                     f"{len(at_risk)} of {pool.nodes_total} nodes at risk ({', '.join(at_risk)}) take it on "
                     "their driver pod's next restart or reboot")
    return ("; ".join(parts) + ". Set the driver object (ClusterPolicy or NVIDIADriver) back to the version "
            "they run, or in Git where Git keeps it, then roll back the nodes it failed on")


def msg_mixed_driver_versions(pool: PoolInventory) -> str:
    owners = pool.driver_version_owners

    def owned(version: str) -> str:
        found = owners.get(version, ())
        return f", {'/'.join(found)}-installed" if found else ""

    versions = ", ".join(
        f"{version} ({count} node{'' if count == 1 else 's'}{owned(version)})"
        for version, count in pool.driver_versions.items()
    )
    host_only = [v for v in pool.driver_versions if owners.get(v) == ("host",)]
    # A version some host installed is no upgrade in flight, even where the operator runs it too.
    host_any = [v for v in pool.driver_versions if "host" in owners.get(v, ())]
    if host_any and len(host_only) < len(pool.driver_versions):
        advice = ("the mix comes from host-installed drivers, not an upgrade in flight: move those "
                  "nodes to the operator's driver or bring their host driver to the pool's version")
    elif host_only:
        advice = "every version is host-installed: bring the hosts to one version"
    else:
        advice = "finish or roll back the upgrade"
    return f"pool {pool.name} runs mixed driver versions: {versions}; {advice}"


def _nodes_text(nodes: Sequence[str], *, shown: int = 3) -> str:
    return ", ".join(nodes[:shown]) + (f" and {len(nodes) - shown} more" if len(nodes) > shown else "")


def msg_runtime_mismatch(pool: PoolInventory, other: Mapping[str, Sequence[str]], toolkit: ConfiguredRuntime) -> str:
    count = sum(len(nodes) for nodes in other.values())
    runs = "; ".join(f"{version} on {_nodes_text(nodes)}" for version, nodes in other.items())
    unknown = [v for v in other if not is_known_runtime(runtime_of(v))]
    why = (" (the operator recognises only docker, containerd and cri-o)" if unknown else "")
    return (f"{count} of {pool.nodes_total} nodes in pool {pool.name} run another container runtime than the "
            f"container toolkit is configured for: {runs}{why}; toolkit: {toolkit.evidence}. The operator "
            "configures one runtime for the whole cluster, so GPU containers there will not get their devices: "
            "run the GPU nodes on one runtime, or give these nodes a cluster of their own")


def msg_precompiled_other_kernel(inv: NodeInventory) -> str:
    pod = inv.driver_pod
    return (f"{inv.name} runs kernel {inv.node_info.kernel_version}, but its precompiled driver pod {pod.name} "
            f"runs image tag {pod.image_tag}, built for another kernel ({pod.text}); its modules will not load "
            "on this kernel: check the node's NFD kernel label and the driver DaemonSet for its kernel")


def msg_precompiled_no_image(inv: NodeInventory) -> str:
    pod = inv.driver_pod
    return (f"no precompiled driver image for kernel {inv.node_info.kernel_version} on {inv.name}: driver pod "
            f"{pod.name} is {pod.text} pulling tag {pod.image_tag}. NVIDIA builds precompiled drivers only for "
            "some kernel flavours and versions: move the node to a covered kernel, build the image, or turn "
            "usePrecompiled off for its driver")


def msg_precompiled_kernels_mixed(pool: PoolInventory) -> str:
    kernels = ", ".join(f"{kernel} ({plural_nodes(len(nodes))})" for kernel, nodes in pool.precompiled_kernels.items())
    return (f"pool {pool.name} runs {len(pool.precompiled_kernels)} kernels under precompiled drivers: {kernels}; "
            "each kernel needs its own precompiled image (one driver DaemonSet per kernel), and a kernel NVIDIA "
            "built none for leaves its nodes without a driver: keep the pool on one kernel, and check a new "
            "kernel is covered before rolling it out")


def plural_nodes(count: int) -> str:
    return f"{count} node{'' if count == 1 else 's'}"


def msg_canary_failed(inv: NodeInventory, verdict: CanaryVerdict, *, now: dt.datetime) -> str:
    how = f"exited {verdict.exit_code}" if verdict.exit_code is not None else "did not run to the end"
    if verdict.reason:
        how += f" ({verdict.reason})"
    if verdict.message:
        words = " / ".join(line.strip() for line in verdict.message.splitlines() if line.strip())
        how += f': "{words[-200:]}"'
    pod = f"; its pod {verdict.pod} is kept for its logs" if verdict.pod else ""
    act = ("keep it cordoned" if inv.cordoned
           else "new GPU pods land on GPUs a container cannot use: cordon it")
    return (f"device plugin on {inv.name} is Ready and advertises {inv.advertised_gpus} GPUs, but gpuops' last "
            f"check pod there failed {format_age(now - verdict.at)} ago (run {verdict.run_id}: {how}) and none has "
            f"passed since{pod}; {act}, and check the driver (nvidia-smi on the node) before giving it back")


def _kubernetes_seen(api: KubeMinor | None, kubelets: Mapping[KubeMinor, Sequence[str]]) -> str:
    parts = []
    if api is not None:
        parts.append(f"the API server runs {minor_text(api)}")
    for minor, nodes in kubelets.items():
        parts.append(f"{plural_nodes(len(nodes))}' kubelets run {minor_text(minor)} ({_nodes_text(list(nodes))})"
                     if len(nodes) > 1 else f"{nodes[0]}'s kubelet runs {minor_text(minor)}")
    return ", ".join(parts)


def msg_kubernetes_unsupported(cluster: ClusterInfo, line: str, supported: KubernetesRange, *,
                               api: KubeMinor | None, kubelets: Mapping[KubeMinor, Sequence[str]]) -> str:
    return (f"GPU Operator {cluster.operator_version} (release {line}) is supported on Kubernetes {supported.text}, "
            f"but {_kubernetes_seen(api, kubelets)}: move the operator to a release that supports this "
            "Kubernetes before the next operand or cluster upgrade (support table: inventory.operator_support)")


def msg_kubernetes_support_unknown(cluster: ClusterInfo, line: str | None, *, api: KubeMinor | None,
                                   kubelets: Mapping[KubeMinor, Sequence[str]]) -> str:
    if line is None:
        what = (f"the operator's image tag {cluster.operator_version or '(none)'} names no release, so which "
                "Kubernetes versions it supports is unknown")
        todo = "pin the operator image to a release tag"
    else:
        what = (f"GPU Operator {cluster.operator_version} (release {line}) is not in gpuops' support table, "
                "so whether it supports this Kubernetes is unknown")
        todo = f"check NVIDIA's platform support page for {line} and add it under inventory.operator_support"
    return f"{what} ({_kubernetes_seen(api, kubelets)}): {todo}"


def msg_no_gpu_operator(*, reason: str) -> str:
    return (
        f"no GPU Operator found: {reason}; gpuops shows GPU nodes but cannot manage "
        "their drivers"
    )


def msg_duplicate_cluster_policies(cluster: ClusterInfo) -> str:
    names = ", ".join(cluster.duplicate_cluster_policies)
    return (
        f"more than one ClusterPolicy: the operator uses {cluster.cluster_policy} and "
        f"ignores {names}; delete the extra ones"
    )


def msg_cluster_policy_not_ready(cluster: ClusterInfo) -> str:
    return (
        f"ClusterPolicy {cluster.cluster_policy} is notReady; check its status.conditions "
        "and the gpu-operator logs for the operand that is failing"
    )


# --------------------------------------------------------------------------------------
# Cordons a finished run left behind (needs the runs, so not part of `summarize`)


def cordons_left_behind(nodes: Iterable[NodeInventory], *, unfinished_runs: Iterable[str],
                        now: dt.datetime) -> tuple[Finding, ...]:
    """A warning per node still cordoned by gpuops for a run that is no longer running
    (a failed validation, an abort): capacity out until someone looks."""
    running = set(unfinished_runs)
    return tuple(
        Finding(severity="warning", code="cordon-left-behind", subject=inv.name, pool=inv.pool,
                message=msg_cordon_left_behind(inv, now=now), command=f"/gpu uncordon {inv.name}")
        for inv in nodes
        if inv.cordoned and inv.cordon_run is not None and inv.cordon_run not in running
    )


def msg_cordon_left_behind(inv: NodeInventory, *, now: dt.datetime) -> str:
    since = f" for {format_age(now - inv.cordoned_at)}" if inv.cordoned_at is not None else ""
    return (f"{inv.name} has been cordoned by {inv.cordoned_by or 'gpuops'}{since} in {inv.cordon_run}, which "
            f"is no longer running: {inv.advertised_gpus} GPUs out of service; check the run's outcome, "
            f"then `/gpu uncordon {inv.name}`")


# --------------------------------------------------------------------------------------
# Restrictions nobody remembers (needs gpuops' first-seen records, its runs and its notes,
# so not part of `summarize`; see workflows.fleet.restrictions)


def forgotten_restrictions(restricted: Iterable[Restricted], *, after: dt.timedelta, now: dt.datetime,
                           nodes_in_runs: Collection[str], noted: Collection[str]) -> tuple[Finding, ...]:
    """A warning per node a person cordoned or tainted more than `after` ago (as gpuops
    first saw it) that no unfinished run works on (`nodes_in_runs`) and no note in force
    explains (`noted`): capacity kept out, or kept for someone, that nobody may remember."""
    found = []
    for each in restricted:
        inv = each.inv
        if inv.name in nodes_in_runs or inv.name in noted:
            continue
        cordon_age = now - each.cordoned_since if each.cordoned_since is not None else None
        taint_age = now - each.taints_since if each.taints_since is not None and each.taints else None
        marks_age = now - each.marks_since if each.marks_since is not None and each.marks else None
        old_cordon = cordon_age is not None and cordon_age > after
        old_taints = taint_age is not None and taint_age > after
        old_marks = marks_age is not None and marks_age > after
        if not old_cordon and not old_taints and not old_marks:
            continue
        found.append(Finding(severity="warning", code="restriction-forgotten", subject=inv.name, pool=inv.pool,
                             message=msg_restriction_forgotten(
                                 inv, cordon_age=cordon_age if old_cordon else None,
                                 taints=each.taints if old_taints else (),
                                 taint_age=taint_age if old_taints else None,
                                 marks=each.marks if old_marks else (),
                                 marks_age=marks_age if old_marks else None),
                             command=note_command(inv.name)))
    return tuple(found)


def note_command(node: str) -> str:
    return f"/gpu note {node}"


def msg_restriction_forgotten(inv: NodeInventory, *, cordon_age: dt.timedelta | None, taints: Sequence[str],
                              taint_age: dt.timedelta | None, marks: Sequence[str] = (),
                              marks_age: dt.timedelta | None = None) -> str:
    parts = []
    if cordon_age is not None:
        parts.append(f"cordoned by hand for at least {format_age(cordon_age)}")
    if taint_age is not None and taints:
        parts.append(f"tainted {', '.join(taints)} for at least {format_age(taint_age)}")
    if marks_age is not None and marks:
        parts.append(f"given {', '.join(marks)} by hand for at least {format_age(marks_age)}")
    gpus = f" ({inv.advertised_gpus} GPUs)" if cordon_age is not None and inv.advertised_gpus else ""
    return (f"{inv.name}{gpus} has been {' and '.join(parts)}, with no gpuops run on it and no note: if it is "
            f"still needed, say why with `/gpu note {inv.name} <why> for <how long>`; if not, give the node back")


def placement_tolerated(inv: NodeInventory, found: Sequence[ToleratedAround], *,
                        rules: Mapping[str, str]) -> tuple[Finding, ...]:
    """A warning per GPU pod on `inv` that the pool's placement does not take and that
    reaches the node only by tolerating the taints meant to keep it off; `rules` is the
    placement's text per use ("mig", "full_gpu")."""
    return tuple(Finding(severity="warning", code="placement-tolerated", subject=inv.name, pool=inv.pool,
                         message=msg_placement_tolerated(inv, each, rule=rules.get(each.use, "?")),
                         command=node_command(inv.name))
                 for each in found)


def msg_placement_tolerated(inv: NodeInventory, found: ToleratedAround, *, rule: str) -> str:
    what = "MIG slices" if found.use == "mig" else "whole GPUs"
    key = "workloads.mig" if found.use == "mig" else "workloads.full_gpu"
    how = ("a toleration of every taint" if found.tolerates_every_taint
           else f"tolerating {', '.join(found.taints)}")
    return (f"{found.pod} holds {what} on {inv.name} by {how}, though pool {inv.pool} keeps {what} for {rule} "
            f"({key}): {'its taints do' if len(found.taints) > 1 else 'its taint does'} not keep the pod "
            "out; narrow the pod's tolerations (or give it a node selector), or document it in the pool's "
            "configuration")
