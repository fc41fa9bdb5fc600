"""The canary pod of a driver upgrade (step kind `gpu-check`), as plain values: its name,
its manifest and what its end says. No I/O here; `steps.GpuCheck` creates, reads and
deletes it through the gateway.

The pod is bound to the node by `spec.nodeName`, which bypasses the scheduler and so the
run's own cordon (the node is checked before it is given back), tolerates every taint,
asks for exactly one GPU resource, never restarts, has no API token, and carries its own
deadline (`activeDeadlineSeconds`), so a check that hangs ends as DeadlineExceeded rather
than holding a GPU. Its termination message falls back to the tail of its log, which is
how a failure's own words (nvidia-smi's "Failed to initialize NVML: Driver/library version
mismatch") reach the run's thread without the bot reading pod logs."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from storage.step_params import GpuCheckParams
from workflows.kube.objects import PodObject

LABEL_GPU_CHECK = "gpuops.io/gpu-check"
ANNOTATION_CHECK_RUN = "gpuops.io/run"
ANNOTATION_CHECK_NODE = "gpuops.io/node"
CONTAINER = "check"
# The pod's deadline; the step allows this much more before it gives up itself.
STEP_GRACE_SECONDS = 60
_NAME_LIMIT = 63  # kept a DNS label, so it is also a valid hostname
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


def pod_name(run_id: str, node: str) -> str:
    """One pod per run and node, the same after a restart: "gpuops-check-<node>-<hash>",
    the hash over run and node keeping it unique when a long node name is cut."""
    digest = hashlib.sha256(f"{run_id}/{node}".encode()).hexdigest()[:10]
    readable = _NOT_NAME.sub("-", node.lower()).strip("-")
    head = f"gpuops-check-{readable}"[: _NAME_LIMIT - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"


@dataclass(frozen=True, slots=True)
class CheckSpec:
    namespace: str
    image: str
    command: tuple[str, ...]
    resource: str
    timeout_s: int

    @classmethod
    def from_params(cls, params: GpuCheckParams) -> CheckSpec | None:
        """The spec a plan wrote, or None when a value is missing or not whole seconds."""
        namespace, image, command = params.namespace, params.image, params.command
        resource, timeout = params.resource, params.timeout_s
        if not (namespace and image and command and resource
                and isinstance(timeout, int) and timeout > 0):
            return None
        return cls(namespace=namespace, image=image, command=tuple(command), resource=resource, timeout_s=timeout)


def manifest(spec: CheckSpec, *, name: str, node: str, run_id: str) -> dict[str, Any]:
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
                "resources": {"limits": {spec.resource: "1"}, "requests": {spec.resource: "1"}},
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
