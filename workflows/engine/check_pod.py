"""The canary pod of a change (step kind `gpu-check`), as plain values: its name, its
manifest and what its end says. No I/O here; `steps.gpu_check` creates, reads and deletes
it through the gateway.

The pod is bound to the node by `spec.nodeName`, which bypasses the scheduler and so the
run's own cordon (the node is checked before it is given back), tolerates every taint,
asks for `count` of one GPU resource (one, or all the node advertises: a `diag` check,
whose command `dcgm_diag` builds, or a pool's burn-in), never restarts, has no API token,
and carries its own deadline (`activeDeadlineSeconds`), so a check that hangs ends as
DeadlineExceeded rather than holding a GPU. Its termination message falls back to the
tail of its log, which is how a failure's own words (nvidia-smi's "Failed to initialize
NVML: Driver/library version mismatch") reach the run's thread; a `diag` check's JSON
report is read from its log (and copied by its command to its termination message).

`params_for`, `burn_in_params` and `check_steps` turn a pool's `gpu_check` into the steps
a plan writes."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from storage.step_params import GpuCheckParams
from workflows.engine import dcgm_diag
from workflows.fleet.assessment import NodeInventory
from workflows.kube.objects import PodObject, is_gpu_resource
from workflows.plans import NodeName, NodeStep
from workflows.pools.config import GpuCheck

LABEL_GPU_CHECK = "gpuops.io/gpu-check"
ANNOTATION_CHECK_RUN = "gpuops.io/run"
ANNOTATION_CHECK_NODE = "gpuops.io/node"
CONTAINER = "check"
# The pod's deadline; the step allows this much more before it gives up itself.
STEP_GRACE_SECONDS = 60
_NAME_LIMIT = 63  # kept a DNS label, so it is also a valid hostname
_NOT_NAME = re.compile(r"[^a-z0-9-]+")
DIAG_LEVELS = (1, 2, 3)
BURN_IN = "burn-in"


def pod_name(run_id: str, node: str, *, purpose: str | None = None) -> str:
    """One pod per run, node and purpose, the same after a restart:
    "gpuops-check-<node>-<hash>" ("gpuops-burn-in-..." for a burn-in), the hash over run and
    node (and purpose) keeping it unique when a long node name is cut."""
    key = f"{run_id}/{node}" if purpose is None else f"{run_id}/{node}/{purpose}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    readable = _NOT_NAME.sub("-", node.lower()).strip("-")
    head = f"gpuops-{'check' if purpose is None else _NOT_NAME.sub('-', purpose)}-{readable}"
    head = head[: _NAME_LIMIT - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"


@dataclass(frozen=True, slots=True)
class CheckSpec:
    namespace: str
    image: str
    command: tuple[str, ...]
    resource: str
    timeout_s: int
    # How many of `resource` the pod holds: a number, or "all" the node advertises.
    count: int | Literal["all"] = 1
    # DCGM's diagnostics level whose JSON decides (None: the exit code alone).
    diag: int | None = None
    # "burn-in" for the pool's burn-in pod (None: the check).
    purpose: str | None = None

    @classmethod
    def from_params(cls, params: GpuCheckParams) -> CheckSpec | None:
        """The spec a plan wrote, or None when a value is missing or not whole seconds."""
        namespace, image, resource, timeout = params.namespace, params.image, params.resource, params.timeout_s
        diag = params.diag
        if diag is not None and diag not in DIAG_LEVELS:
            return None
        command = dcgm_diag.command(diag) if diag is not None else params.command
        count: int | Literal["all"] | None = 1 if params.count is None else (
            "all" if params.count == "all" else params.count if isinstance(params.count, int) else None)
        if not (namespace and image and command and resource and count
                and isinstance(timeout, int) and timeout > 0):
            return None
        if params.purpose not in (None, BURN_IN):
            return None
        return cls(namespace=namespace, image=image, command=tuple(command), resource=resource, timeout_s=timeout,
                   count=count, diag=diag, purpose=params.purpose)


def params_for(check: GpuCheck | None) -> GpuCheckParams | None:
    """The gpu-check step's params for a configured (and enabled) check; None for none."""
    if check is None or not check.enabled:
        return None
    return GpuCheckParams(namespace=check.namespace, image=check.image,
                          command=dcgm_diag.command(check.diag) if check.diag is not None else tuple(check.command),
                          resource=check.resource, timeout_s=int(check.timeout.total_seconds()),
                          count=None if check.count == 1 else check.count, diag=check.diag)


def burn_in_params(check: GpuCheck | None) -> GpuCheckParams | None:
    """The second gpu-check step's params: the pool's burn-in (None: it has none)."""
    if check is None or not check.enabled or check.burn_in is None:
        return None
    burn = check.burn_in
    return GpuCheckParams(namespace=check.namespace, image=burn.image, command=tuple(burn.command),
                          resource=check.resource, timeout_s=int(burn.timeout.total_seconds()), count="all",
                          purpose=BURN_IN)


def check_steps(node: str, check: GpuCheck | None, *,
                resources: Mapping[str, int] | None = None) -> list[NodeStep]:
    """The checks a drain or a MIG change runs on `node` before giving it back: the pool's
    check and its burn-in when the check runs after every kind (`GpuCheck.every_kind`: it
    has `diag` or a burn-in; none otherwise: those kinds ran no check pod before, and a
    plain command check stays the upgrades' and moves'). A MIG change gives the node's
    `resources` after it: the checks hold all of its new devices (the configured resource
    if the layout has it, else the MIG profile it makes most of)."""
    if check is None or not check.every_kind:
        return []
    found = [p for p in (params_for(check), burn_in_params(check)) if p is not None]
    if resources:
        present = {r: n for r, n in resources.items() if n and is_gpu_resource(r)}
        if present and check.resource not in present:
            resource = sorted(present, key=lambda r: (-present[r], r))[0]
            found = [dataclasses.replace(p, resource=resource, count="all") for p in found]
    return [NodeStep.of("gpu-check", NodeName(node), p) for p in found]


def held_count(spec: CheckSpec, inventory: NodeInventory | None) -> int | None:
    """How many of its resource the pod asks for on the node: `count`, or for "all" what
    the node advertises (None: it advertises none, or is not known)."""
    if spec.count != "all":
        return spec.count
    if inventory is None:
        return None
    # NB: allocatable, what the device plugin can hand out: the validation before the
    # check already waited for every GPU the node has to be advertised.
    found = next((r for r in inventory.resources if r.resource == spec.resource), None)
    return (found.allocatable if found is not None else 0) or None


def manifest(spec: CheckSpec, *, name: str, node: str, run_id: str, count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": spec.namespace,
            "labels": {LABEL_GPU_CHECK: "true", "app.kubernetes.io/managed-by": "gpuops"},
            "annotations": {ANNOTATION_CHECK_RUN: run_id, ANNOTATION_CHECK_NODE: node},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": spec.timeout_s,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 5,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": CONTAINER,
                "image": spec.image,
                "command": list(spec.command),
                "resources": {"limits": {spec.resource: str(count)}, "requests": {spec.resource: str(count)}},
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
        },
    }


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What a finished check pod says: passed (exit 0) or not, and why in the pod's words."""

    passed: bool
    exit_code: int | None
    reason: str | None
    message: str | None


def result_of(pod: PodObject) -> CheckResult | None:
    """The finished pod's answer, or None while it has not finished."""
    if pod.phase not in ("Succeeded", "Failed"):
        return None
    container = next((c for c in pod.containers if c.name == CONTAINER), None)
    ended = container.terminated if container is not None else None
    if pod.phase == "Succeeded":
        return CheckResult(True, ended.exit_code if ended else 0, ended.reason if ended else None, None)
    if ended is not None:
        return CheckResult(False, ended.exit_code, ended.reason or pod.status_reason,
                           _tail(ended.message) or pod.status_message)
    # Failed before the container ran (the kubelet refused it, or its deadline passed).
    return CheckResult(False, None, pod.status_reason, pod.status_message)


def waiting_reason(pod: PodObject) -> str | None:
    """Why the pod has not finished yet, in the kubelet's word (ContainerCreating,
    ErrImagePull, ...), or None when it is running."""
    container = next((c for c in pod.containers if c.name == CONTAINER), None)
    if container is None:
        return pod.status_reason
    return container.waiting_reason


def _tail(text: str | None, lines: int = 5, limit: int = 600) -> str | None:
    if not text or not text.strip():
        return None
    kept = "\n".join(text.strip().splitlines()[-lines:])
    return kept[-limit:]


def shown_command(command: Sequence[str]) -> str:
    return " ".join(command)


def shown_check(spec: CheckSpec) -> str:
    """The check's command as a thread shows it (a diag check's, not its shell script)."""
    return f"dcgmi diag -r {spec.diag} -j" if spec.diag is not None else shown_command(spec.command)


def termination_message(pod: PodObject) -> str | None:
    """The check container's whole termination message (a diag check copies its JSON there)."""
    container = next((c for c in pod.containers if c.name == CONTAINER), None)
    ended = container.terminated if container is not None else None
    return ended.message if ended is not None else None
