"""The GPU Operator's settings that reach a node: the ClusterPolicy in effect, the
NVIDIADriver CRs and the nodes each selects, whether a driver upgrades on its own and which
object says so, the toolkit's container runtime, the driver DaemonSets' templates, and the
objects whose driver version reaches each pool (`DriverManager`).

`fleet_context(snapshot)` reads these cluster-level objects once per snapshot, not per
node; the node assessment (`fleet.assessment`) reads them from the `FleetContext`. The
wording of what was seen lives in the "Evidence wording" section at the bottom."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeAlias

from workflows.fleet.loose_values import mapping_of, str_or_none
from workflows.fleet.pods import image_tag, version_of_tag
from workflows.fleet.settings import InventorySettings
from workflows.fleet.version_owner import VersionOwner, judge_version_owner
from workflows.kube.labels import ANNOTATION_OWNER, LABEL_DRIVER_CR_OWNER, LABEL_POD_TEMPLATE_GENERATION
from workflows.kube.objects import ClusterSnapshot, CustomObject, DriverTemplate, PodObject, PoolName

AutoUpgradeState: TypeAlias = Literal["on", "off", "unknown"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoUpgradeSetting:
    """Whether the operator upgrades a driver on its own, and which object says so."""

    state: AutoUpgradeState
    source: str  # "ClusterPolicy cluster-policy", "NVIDIADriver h100-driver"
    # The object leaves autoUpgrade unset, so the CRD default decided.
    defaulted: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class NvidiaDriverRef:
    """The parts of an NVIDIADriver CR that say which nodes it drives and how."""

    name: str
    node_selector: Mapping[str, str]
    default: bool
    version: str | None
    auto_upgrade: AutoUpgradeSetting
    # spec.usePrecompiled: one driver image per kernel, prebuilt by NVIDIA.
    precompiled: bool = False
    # Who keeps spec.version (Argo CD, Flux, Helm or nobody); None when not judged.
    version_owner: VersionOwner | None = None

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.node_selector.items())


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolkitSetting:
    """How the container toolkit is set up for the container runtime. The operator picks
    one runtime for the whole cluster (OpenShift: cri-o; else containerd as soon as one
    GPU node runs it, else what the GPU nodes run) and writes it into the toolkit
    DaemonSet's RUNTIME variable; `spec.operator.defaultRuntime` is not what it uses
    (deprecated as unused in 26.x)."""

    enabled: bool  # ClusterPolicy spec.toolkit.enabled (unset: enabled)
    runtime: str | None  # RUNTIME of the toolkit DaemonSet; None when not seen
    daemonset: str | None  # namespace/name of that DaemonSet
    default_runtime: str | None = None  # ClusterPolicy spec.operator.defaultRuntime
    # spec.cdi.nriPluginEnabled: the toolkit injects devices through NRI and leaves the
    # runtime's configuration alone, so which runtime it was told matters not.
    nri_plugin: bool = False


NO_TOOLKIT = ToolkitSetting(enabled=False, runtime=None, daemonset=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfiguredRuntime:
    """The runtime the toolkit is set up for, and how gpuops knows."""

    runtime: str
    evidence: str  # "RUNTIME=containerd on DaemonSet gpu-operator/nvidia-container-toolkit-daemonset"


def configured_runtime(toolkit: ToolkitSetting, node_runtimes: Iterable[str]) -> ConfiguredRuntime | None:
    """What the toolkit is configured for: the DaemonSet's RUNTIME when seen; before that,
    the operator's own choice from the GPU nodes' runtimes when it is certain (containerd
    as soon as one node runs it, or the one runtime they all run). None when the toolkit
    is not the operator's (disabled), leaves the runtime alone (NRI), or it cannot be told."""
    if not toolkit.enabled or toolkit.nri_plugin:
        return None
    if toolkit.runtime:
        return ConfiguredRuntime(runtime=toolkit.runtime, evidence=_say_toolkit_runtime(toolkit))
    known = {kind for kind in node_runtimes if kind in ("docker", "containerd", "crio")}
    if "containerd" in known or len(known) == 1:
        chosen = "containerd" if "containerd" in known else next(iter(known))
        return ConfiguredRuntime(runtime=chosen, evidence=_say_toolkit_runtime_inferred(chosen))
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInfo:
    """The GPU Operator installation as a whole. A cluster without one is a valid answer."""

    crds_installed: bool
    operator_namespace: str | None
    operator_version: str | None  # tag of the operator Deployment's first image
    operator_deployment: str | None  # namespace/name
    cluster_policy: str | None  # the one in effect
    cluster_policy_state: str | None  # status.state: ready | notReady | ignored
    cluster_policy_owner: str | None
    # More than one ClusterPolicy: the operator honours one and ignores these.
    duplicate_cluster_policies: tuple[str, ...]
    uses_nvidia_driver_crds: bool
    nvidia_drivers: tuple[str, ...]
    # The driver version the ClusterPolicy in effect names (spec.driver.version).
    cluster_policy_driver_version: str | None = None
    # The API server's version ("v1.31.4"); None when it was not read.
    kubernetes_version: str | None = None
    toolkit: ToolkitSetting = NO_TOOLKIT
    # Who keeps the ClusterPolicy's spec.driver.version; None without a ClusterPolicy.
    cluster_policy_version_owner: VersionOwner | None = None

    @property
    def operator_found(self) -> bool:
        return self.crds_installed and self.operator_deployment is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetContext:
    """Everything cluster-wide that a node assessment needs; computed once per snapshot
    of the cluster-level objects, not per node."""

    cluster: ClusterInfo
    # ClusterPolicy spec.driver.enabled (unset means enabled); None without a ClusterPolicy.
    driver_enabled: bool | None
    mig_strategy: str | None  # ClusterPolicy spec.mig.strategy
    cluster_policy_auto_upgrade: AutoUpgradeSetting
    nvidia_drivers: tuple[NvidiaDriverRef, ...]
    # namespace/name of each driver DaemonSet -> what its template runs now
    driver_templates: Mapping[str, DriverTemplate] = field(default_factory=lambda: MappingProxyType({}))
    # ClusterPolicy spec.driver.usePrecompiled (for nodes no NVIDIADriver CR drives).
    cluster_policy_precompiled: bool = False

    def precompiled_for(self, labels: Mapping[str, str]) -> bool:
        """Whether the operator's driver for a node with these labels uses precompiled
        modules: its NVIDIADriver's usePrecompiled, else the ClusterPolicy's."""
        if self.cluster.uses_nvidia_driver_crds:
            driver = self.nvidia_driver_for(labels)
            return driver is not None and driver.precompiled
        return self.cluster_policy_precompiled

    @property
    def operator_namespace(self) -> str | None:
        return self.cluster.operator_namespace

    def behind_template(self, pod: PodObject) -> str | None:
        """The driver version `pod`'s DaemonSet now specifies, if the pod runs an older
        template with another driver image; None when it is up to date or unknown.

        The DaemonSet controller's own test of an up-to-date pod compares the template
        generation (or the revision hash); only a different driver image makes the next
        restart a driver change, so both must differ. A template changed and changed back
        has a new generation but the pod's image: not behind."""
        controller = pod.controller
        if controller is None or controller.kind != "DaemonSet" or not pod.images:
            return None
        template = self.driver_templates.get(f"{pod.namespace}/{controller.name}")
        if template is None or template.template_generation is None or template.driver_image is None:
            return None
        if pod.labels.get(LABEL_POD_TEMPLATE_GENERATION) == template.template_generation:
            return None
        if pod.images[0] == template.driver_image:
            return None
        return version_of_tag(image_tag(template.driver_image)) or template.driver_image

    def nvidia_driver_named(self, name: str) -> NvidiaDriverRef | None:
        return next((d for d in self.nvidia_drivers if d.name == name), None)

    def nvidia_driver_for(self, labels: Mapping[str, str]) -> NvidiaDriverRef | None:
        """The NVIDIADriver that manages a node with these labels: the one the operator
        names on the node, else a CR whose nodeSelector matches, else the default CR."""
        if not self.cluster.uses_nvidia_driver_crds:
            return None
        named = labels.get(LABEL_DRIVER_CR_OWNER)
        if named:
            found = self.nvidia_driver_named(named)
            if found is not None:
                return found
        fallback: NvidiaDriverRef | None = None
        for driver in self.nvidia_drivers:
            if driver.default or not driver.node_selector:
                fallback = fallback or driver
            elif driver.selects(labels):
                return driver
        return fallback


def fleet_context(snapshot: ClusterSnapshot, *, settings: InventorySettings) -> FleetContext:
    policy, duplicates = _policy_in_effect(snapshot.cluster_policies)
    driver_spec = mapping_of(policy.spec.get("driver")) if policy else {}
    uses_crds = bool(driver_spec.get("useNvidiaDriverCRD", False))
    deployment = snapshot.operator_deployment
    operator_image = deployment.images[0] if deployment and deployment.images else None
    owner = settings.cluster_policy_owner
    if owner is None and policy is not None:
        owner = policy.annotations.get(ANNOTATION_OWNER)
    drivers = tuple(
        sorted((_nvidia_driver_ref(cr) for cr in snapshot.nvidia_drivers), key=lambda d: d.name)
    )
    cluster = ClusterInfo(
        crds_installed=snapshot.operator_crds_installed,
        operator_namespace=snapshot.operator_namespace,
        operator_version=image_tag(operator_image) if operator_image else None,
        operator_deployment=f"{deployment.namespace}/{deployment.name}" if deployment else None,
        cluster_policy=policy.name if policy else None,
        cluster_policy_state=str_or_none(policy.status.get("state")) if policy else None,
        cluster_policy_owner=owner,
        duplicate_cluster_policies=tuple(p.name for p in duplicates),
        uses_nvidia_driver_crds=uses_crds,
        nvidia_drivers=tuple(d.name for d in drivers),
        cluster_policy_driver_version=str_or_none(driver_spec.get("version")),
        kubernetes_version=snapshot.kubernetes_version,
        toolkit=_toolkit_setting(policy, snapshot),
        cluster_policy_version_owner=judge_version_owner(policy) if policy is not None else None,
    )
    if policy is None:
        cp_auto = AutoUpgradeSetting(state="unknown", source=_say_no_cluster_policy())
        driver_enabled: bool | None = None
        mig_strategy = None
    else:
        # The ClusterPolicy CRD defaults autoUpgrade to false (Helm writes true explicitly).
        cp_auto = _auto_upgrade_from(
            mapping_of(driver_spec.get("upgradePolicy")),
            source=f"ClusterPolicy {policy.name}",
            crd_default=False,
        )
        if cp_auto.state == "on" and mapping_of(policy.spec.get("sandboxWorkloads")).get("enabled") is True:
            # NB: with sandbox workloads the operator's upgrade controller removes every
            # upgrade-state label and upgrades no driver, whatever autoUpgrade says.
            cp_auto = AutoUpgradeSetting(state="off", source=_say_sandbox_workloads(policy.name))
        # The operator treats an unset `enabled` as enabled.
        driver_enabled = driver_spec.get("enabled") is not False
        mig_strategy = str_or_none(mapping_of(policy.spec.get("mig")).get("strategy"))
    return FleetContext(
        cluster=cluster,
        driver_enabled=driver_enabled,
        mig_strategy=mig_strategy,
        cluster_policy_auto_upgrade=cp_auto,
        nvidia_drivers=drivers,
        driver_templates=MappingProxyType({f"{t.namespace}/{t.name}": t for t in snapshot.driver_templates}),
        cluster_policy_precompiled=driver_spec.get("usePrecompiled") is True,
    )


def _toolkit_setting(policy: CustomObject | None, snapshot: ClusterSnapshot) -> ToolkitSetting:
    if policy is None:
        return NO_TOOLKIT
    namespace = snapshot.operator_namespace
    templates = [t for t in snapshot.toolkit_templates if namespace is None or t.namespace == namespace]
    template = min(templates, key=lambda t: (t.namespace, t.name)) if templates else None
    return ToolkitSetting(
        enabled=mapping_of(policy.spec.get("toolkit")).get("enabled") is not False,
        runtime=template.runtime if template else None,
        daemonset=f"{template.namespace}/{template.name}" if template else None,
        default_runtime=str_or_none(mapping_of(policy.spec.get("operator")).get("defaultRuntime")),
        nri_plugin=mapping_of(policy.spec.get("cdi")).get("nriPluginEnabled") is True,
    )


def _policy_in_effect(
    policies: Sequence[CustomObject],
) -> tuple[CustomObject | None, tuple[CustomObject, ...]]:
    if not policies:
        return None, ()
    # The operator acts on one ClusterPolicy and marks the rest "ignored"; before it has
    # written a status, the oldest is the best guess of the one it keeps.
    ordered = sorted(
        policies,
        key=lambda p: (p.status.get("state") == "ignored", p.created_at, p.name),
    )
    return ordered[0], tuple(ordered[1:])


def _nvidia_driver_ref(cr: CustomObject) -> NvidiaDriverRef:
    selector = mapping_of(cr.spec.get("nodeSelector"))
    # The v26.7 NVIDIADriver CRD defaults autoUpgrade to true.
    auto = _auto_upgrade_from(
        mapping_of(cr.spec.get("upgradePolicy")),
        source=f"NVIDIADriver {cr.name}",
        crd_default=True,
    )
    return NvidiaDriverRef(
        name=cr.name,
        node_selector=MappingProxyType({str(k): str(v) for k, v in selector.items()}),
        default=cr.spec.get("default") is True,
        version=str_or_none(cr.spec.get("version")),
        auto_upgrade=auto,
        precompiled=cr.spec.get("usePrecompiled") is True,
        version_owner=judge_version_owner(cr),
    )


def _auto_upgrade_from(
    upgrade_policy: Mapping[str, object], *, source: str, crd_default: bool
) -> AutoUpgradeSetting:
    value = upgrade_policy.get("autoUpgrade")
    if isinstance(value, bool):
        return AutoUpgradeSetting(state="on" if value else "off", source=source)
    return AutoUpgradeSetting(
        state="on" if crd_default else "off", source=source, defaulted=True
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DriverManager:
    """The one object whose driver version the operator rolls out to a set of nodes: the
    ClusterPolicy (every node it deploys the driver to) or an NVIDIADriver CR (the nodes
    its nodeSelector picks). Changing its version changes every pool it drives."""

    kind: Literal["ClusterPolicy", "NVIDIADriver"]
    name: str
    version: str | None
    auto_upgrade: AutoUpgradeSetting
    pools: tuple[PoolName, ...]  # every pool with nodes it drives
    # Who keeps its version field (a GitOps tool, Helm, nobody); None when not judged.
    version_owner: VersionOwner | None = None

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.name}"


def pool_auto_upgrade(nvidia_drivers: set[str], *, context: FleetContext) -> AutoUpgradeSetting:
    """Whether the driver of a pool whose nodes the NVIDIADriver CRs `nvidia_drivers` own
    (the ClusterPolicy's, without such CRs) upgrades on its own."""
    if not context.cluster.uses_nvidia_driver_crds:
        return context.cluster_policy_auto_upgrade
    settings = [d.auto_upgrade for name in sorted(nvidia_drivers) if (d := context.nvidia_driver_named(name))]
    if not settings:
        return AutoUpgradeSetting(state="unknown", source=_say_no_driver_cr_for_pool())
    if len(settings) == 1:
        return settings[0]
    # Nodes of one pool under different CRs: any CR that upgrades on its own is the
    # risk worth showing, so "on" wins and the source names every CR.
    state: AutoUpgradeState = "on" if any(s.state == "on" for s in settings) else "off"
    return AutoUpgradeSetting(
        state=state,
        source=", ".join(f"{s.source} ({s.state})" for s in settings),
        defaulted=any(s.defaulted for s in settings),
    )


# --------------------------------------------------------------------------------------
# Evidence wording (what the inventory says it saw; findings word their own messages)


def _say_toolkit_runtime(toolkit: ToolkitSetting) -> str:
    said = f"RUNTIME={toolkit.runtime} on DaemonSet {toolkit.daemonset}"
    if toolkit.default_runtime and toolkit.default_runtime != toolkit.runtime:
        said += f" (the ClusterPolicy's defaultRuntime={toolkit.default_runtime} is not used by the operator)"
    return said


def _say_toolkit_runtime_inferred(runtime: str) -> str:
    return (f"{runtime}, as the operator chooses from the GPU nodes' runtimes (containerd when any runs it); "
            "the toolkit DaemonSet was not seen")


def _say_sandbox_workloads(policy: str) -> str:
    return (f"ClusterPolicy {policy}: autoUpgrade is on, but with sandboxWorkloads.enabled the operator "
            "upgrades no driver")


def _say_no_driver_cr_for_pool() -> str:
    return "no NVIDIADriver selects this pool's nodes"


def _say_no_cluster_policy() -> str:
    return "no ClusterPolicy"
