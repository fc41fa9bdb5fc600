"""Names the GPU Operator, GFD, the MIG manager and gpuops itself put on Kubernetes
objects: labels, annotations, pod selectors and the values gpuops compares against. One
definition each (shared/reference/gpu-operator/FACTS.md is where they come from); every
package reads them from here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

LABEL_GPU_PRESENT = "nvidia.com/gpu.present"
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
LABEL_DRIVER_VERSION_FULL = "nvidia.com/cuda.driver-version.full"
LABELS_DRIVER_VERSION_PARTS = (
    "nvidia.com/cuda.driver-version.major",
    "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision",
)
# Older GFD releases, still seen on 25.x clusters.
LABELS_DRIVER_VERSION_PARTS_OLD = (
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
)
LABEL_MIG_CAPABLE = "nvidia.com/mig.capable"
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
LABEL_MIG_CONFIG = "nvidia.com/mig.config"
LABEL_MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
LABEL_DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
LABEL_DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"
LABEL_DEPLOY_OPERANDS = "nvidia.com/gpu.deploy.operands"
LABEL_UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
# The upgrade controller leaves a node labelled `true` in upgrade-required (it never starts it).
LABEL_UPGRADE_SKIP = "nvidia.com/gpu-driver-upgrade.skip"
LABEL_DRIVER_CR_OWNER = "nvidia.com/gpu-operator.driver.owner"

ANNOTATION_CORDONED_BY = "gpuops.io/cordoned-by"
ANNOTATION_UPGRADE_STATE_SINCE = "gpuops.io/upgrade-state-since"
ANNOTATION_MIG_STATE_SINCE = "gpuops.io/mig-state-since"
ANNOTATION_OWNER = "gpuops.io/owner"
# The run that set LABEL_UPGRADE_SKIP on the node to gate the operator's upgrade (a skip
# label without it is a person's, and gpuops never removes that one).
ANNOTATION_UPGRADE_HELD_BY = "gpuops.io/driver-upgrade-held-by"
# The upgrade controller's note that the node was cordoned before its upgrade: it then
# leaves the uncordon to whoever cordoned it (here gpuops, after its own validation).
ANNOTATION_UPGRADE_INITIAL_UNSCHEDULABLE = "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
# The upgrade controller's own start times (unix seconds), used when gpuops has not
# recorded when the state began.
ANNOTATION_WAIT_FOR_JOBS_START = "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time"
ANNOTATION_VALIDATION_START = "nvidia.com/gpu-driver-upgrade-validation-start-time"

POD_SELECTOR_DRIVER = ("app.kubernetes.io/component", "nvidia-driver")
POD_SELECTOR_DEVICE_PLUGIN = ("app", "nvidia-device-plugin-daemonset")
POD_SELECTOR_VALIDATOR = ("app", "nvidia-operator-validator")
# The operator's dcgm-exporter DaemonSet labels its pods app=<its name>.
POD_SELECTOR_DCGM_EXPORTER = ("app", "nvidia-dcgm-exporter")
# Set by the DaemonSet controller: the template generation on the DaemonSet and on its pods.
ANNOTATION_TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"
LABEL_POD_TEMPLATE_GENERATION = "pod-template-generation"
DRIVER_CONTAINER = "nvidia-driver-ctr"
# The container toolkit's DaemonSet and container; the operator writes the runtime it
# configures into the container's environment (RUNTIME, CONTAINERD_RUNTIME_CLASS).
TOOLKIT_SELECTOR = ("app", "nvidia-container-toolkit-daemonset")
TOOLKIT_CONTAINER = "nvidia-container-toolkit-ctr"
ENV_TOOLKIT_RUNTIME = "RUNTIME"
ENV_TOOLKIT_RUNTIME_CLASS = "CONTAINERD_RUNTIME_CLASS"
# NFD's label of a node's full kernel version: the operator makes one precompiled driver
# DaemonSet per value, selecting nodes by it.
LABEL_KERNEL_VERSION_FULL = "feature.node.kubernetes.io/kernel-version.full"

PRE_INSTALLED = "pre-installed"
PAUSED_PREFIX = "paused-for-"
PAUSED_FOR_MIG_CHANGE = "paused-for-mig-change"


# A pod label that says "this pod uses GPUs although it requests none" (e.g. a
# monitoring agent that mounts every device): evicted like a GPU pod.
LABEL_GPU_USER = "gpuops.io/gpu-user"
# The kubelet's mark on a static (mirror) pod, which eviction cannot move.
ANNOTATION_MIRROR = "kubernetes.io/config.mirror"

# Labels set by discovery (GFD and NFD) and the operator live under these prefixes; the
# operator's knobs among them are set by people on purpose and are not "hand-set".
DISCOVERED_PREFIXES = ("nvidia.com/", "feature.node.kubernetes.io/")
KNOB_PREFIXES = (LABEL_DEPLOY_PREFIX, LABEL_MIG_CONFIG, "nvidia.com/device-plugin.config",
                 "nvidia.com/gpu.workload.config", LABEL_UPGRADE_STATE, LABEL_UPGRADE_SKIP,
                 LABEL_DRIVER_CR_OWNER)
# Field managers of the tools people label nodes with (kubectl label/edit/patch/apply,
# k9s, dashboards in a browser, Lens): the API server names a manager after the client.
HUMAN_MANAGERS = ("kubectl", "k9s", "Mozilla", "Lens", "OpenLens", "Headlamp")


def hand_set_labels(labels: Mapping[str, tuple[str, Sequence[str]]]) -> dict[str, tuple[str, str]]:
    """The discovery labels of a node that a person set (a person's tool owns the field in
    the node's managedFields), from label -> (value, managers): label -> (value, the
    people's managers). `gpu.present` is the operator's mark of a GPU node and never
    counts: without it the operator stops deploying there."""
    found: dict[str, tuple[str, str]] = {}
    for key, (value, managers) in labels.items():
        if (not key.startswith(DISCOVERED_PREFIXES) or key.startswith(KNOB_PREFIXES)
                or key == LABEL_GPU_PRESENT):
            continue
        people = sorted(m for m in managers if m.startswith(HUMAN_MANAGERS))
        if people:
            found[key] = (value, ", ".join(people))
    return found
