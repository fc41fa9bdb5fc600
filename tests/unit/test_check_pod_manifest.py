"""The check pods as the cluster receives them, field by field: a pool's `gpu_check` and its
burn-in become two gpu-check steps with these params (after a MIG change, on every device of
the resource the new layout makes most of, unless it keeps the configured one); each step
creates exactly this pod (its name, namespace, labels and annotations, bound to the node,
never restarted, no API token or service links, its own deadline, five seconds to stop,
every taint tolerated, the image and command, and the GPUs it holds as both limit and
request); a pod's name fits one DNS label and reads "gpuops-<check|purpose>-<node>-<hash>"
for any run, node and purpose; a count or a timeout a pod cannot have is refused; a burn-in
on every GPU of a resource the node does not advertise waits instead of asking for one; and
a finished pod is read as a failure with its exit code, reason and the last five lines (at
most 600 characters) of what it said.

The pods, their fake API server and the step's context are tests/unit/test_gpu_check_step.py's."""

from __future__ import annotations

from typing import Any

import pytest

from storage.step_params import GpuCheckParams
from tests.unit.test_gpu_check import PARAMS
from tests.unit.test_gpu_check_step import NODE, SOON, CheckPods, advance, prepared, started
from workflows.engine import check_pod
from workflows.engine import messages as say
from workflows.engine.steps.contract import Failed, Waiting
from workflows.pools.config import GpuCheck

CHECK_IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
BURN_IN_IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
ALL_REDUCE = ["all_reduce_perf", "-b", "8", "-e", "8G", "-g", "8"]
# A pool's plain check (nvidia-smi on one GPU) with a burn-in: both run after every kind of change.
POOL_CHECK = GpuCheck.model_validate({"namespace": "gpuops", "burn_in": {"image": BURN_IN_IMAGE, "command": ALL_REDUCE}})


def _as_sent(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod the fake API server holds, as the step sent it (without the uid, creation time
    and status the server adds)."""
    added = ("uid", "creationTimestamp")
    return {**{k: v for k, v in pod.items() if k != "status"},
            "metadata": {k: v for k, v in pod["metadata"].items() if k not in added}}


def _expected_pod(*, name: str, node: str, run_id: str, image: str, command: list[str], resource: str, count: str,
                  deadline: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "gpuops",
            "labels": {"gpuops.io/gpu-check": "true", "app.kubernetes.io/managed-by": "gpuops"},
            "annotations": {"gpuops.io/run": run_id, "gpuops.io/node": node},
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": deadline,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 5,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "check",
                "image": image,
                "command": command,
                "resources": {"limits": {resource: count}, "requests": {resource: count}},
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
        },
    }


# ---- the steps a pool's check becomes


def test_a_pools_check_and_its_burn_in_become_two_gpu_check_steps_with_these_params():
    steps = check_pod.check_steps("gpu-h100-01", POOL_CHECK)

    assert [s.to_json() for s in steps] == [
        {"kind": "gpu-check", "node": "gpu-h100-01", "params": {
            "namespace": "gpuops", "image": CHECK_IMAGE, "command": ["nvidia-smi"], "resource": "nvidia.com/gpu",
            "timeout_s": 300}},
        {"kind": "gpu-check", "node": "gpu-h100-01", "params": {
            "namespace": "gpuops", "image": BURN_IN_IMAGE, "command": ALL_REDUCE, "resource": "nvidia.com/gpu",
            "timeout_s": 1800, "count": "all", "purpose": "burn-in"}},
    ]


@pytest.mark.parametrize(("after", "resource", "check_count"), [
    # Every GPU split 3x 2g.20gb + 1x 1g.10gb: the checks hold the 24 2g.20gb devices.
    ({"nvidia.com/mig-1g.10gb": 8, "nvidia.com/mig-2g.20gb": 24}, "nvidia.com/mig-2g.20gb", "all"),
    # A resource counted at none after the change is not one to hold.
    ({"nvidia.com/gpu": 0, "nvidia.com/mig-3g.40gb": 16}, "nvidia.com/mig-3g.40gb", "all"),
    # Two whole GPUs stay beside the MIG devices: the configured check is unchanged.
    ({"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 42}, "nvidia.com/gpu", None),
    # The layout leaves whole GPUs only: the configured check is unchanged.
    ({"nvidia.com/gpu": 8}, "nvidia.com/gpu", None),
], ids=["most-devices", "none-left-of-the-configured", "keeps-whole-gpus", "mig-disabled"])
def test_after_a_mig_change_the_checks_hold_every_device_the_new_layout_makes_most_of(after, resource, check_count):
    check, burn_in = check_pod.check_steps("gpu-h100-01", POOL_CHECK, resources=after)

    assert check.params.get("resource") == burn_in.params.get("resource") == resource
    assert check.params.get("count") == check_count  # unset: one, as configured
    assert burn_in.params.get("count") == "all"


# ---- the pod each step creates


def test_the_check_pod_the_step_creates_is_exactly_this_pod():
    gateway = CheckPods()
    ctx, name = started(gateway)

    assert name == "gpuops-check-gpu-01-356a990bc0"
    assert _as_sent(gateway.pods[name]) == _expected_pod(
        name=name, node=NODE, run_id=ctx.run_id, image=CHECK_IMAGE, command=["nvidia-smi"],
        resource="nvidia.com/gpu", count="1", deadline=120)


def test_a_pools_burn_in_creates_exactly_this_pod_holding_every_gpu_the_node_advertises(make):
    gateway = CheckPods()
    burn_in = check_pod.check_steps(NODE, POOL_CHECK)[1]
    ctx, name = prepared(gateway, params=dict(burn_in.params), inventory=make.assess(make.node(NODE, gpus=8)))

    advance(ctx)

    assert name == "gpuops-burn-in-gpu-01-11f74099ed"
    assert _as_sent(gateway.pods[name]) == _expected_pod(
        name=name, node=NODE, run_id=ctx.run_id, image=BURN_IN_IMAGE, command=ALL_REDUCE,
        resource="nvidia.com/gpu", count="8", deadline=1800)


@pytest.mark.parametrize(("given", "count", "deadline"), [
    ({"count": 2}, "2", 120),
    ({"timeout_s": 1}, "1", 1),
], ids=["two-gpus", "one-second"])
def test_the_check_pod_holds_the_count_and_has_the_deadline_its_params_give(given, count, deadline):
    gateway = CheckPods()
    _, name = started(gateway, params=dict(PARAMS, **given))

    (container,) = gateway.pods[name]["spec"]["containers"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": count}, "requests": {"nvidia.com/gpu": count}}
    assert gateway.pods[name]["spec"]["activeDeadlineSeconds"] == deadline


@pytest.mark.parametrize("bad", [{"count": "8"}, {"count": "two"}, {"timeout_s": 0}])
def test_a_count_in_words_or_a_deadline_of_no_time_is_refused_before_a_pod_is_built(bad):
    params = GpuCheckParams.from_json(dict(PARAMS, **bad), kind="gpu-check")
    assert check_pod.CheckSpec.from_params(params) is None


def test_a_burn_in_planned_for_mig_devices_waits_while_the_node_still_advertises_whole_gpus_only(make):
    gateway = CheckPods()
    after = {"nvidia.com/mig-1g.10gb": 8, "nvidia.com/mig-2g.20gb": 24}
    burn_in = check_pod.check_steps(NODE, POOL_CHECK, resources=after)[1]
    ctx, _ = prepared(gateway, params=dict(burn_in.params), inventory=make.assess(make.node(NODE, gpus=8)))

    outcome = advance(ctx)

    assert outcome == Waiting(say.gpu_check_no_devices(ctx.intent["pod"], "nvidia.com/mig-2g.20gb"), retry_in=SOON)
    assert gateway.pods == {} and gateway.writes == []


# ---- the pod's name


@pytest.mark.parametrize(("node", "purpose", "name"), [
    # Cut after a letter: exactly 63 characters.
    ("gke-ml-prod-cluster1-a3-highgpu-8g-pool-7f3c9a2b-x7k9", None,
     "gpuops-check-gke-ml-prod-cluster1-a3-highgpu-8g-pool-742e2b1c24"),
    # Cut just after a dash: the dash goes rather than doubling before the hash.
    ("gke-ml-prod-cluster-a3-highgpu-8g-pool-7f3c9a2b-x7k9", None,
     "gpuops-check-gke-ml-prod-cluster-a3-highgpu-8g-pool-5e45157e0d"),
    ("gke-ml-prod-cluster-a3-highgpu-8g-pool-7f3c9a2b-x7k9", "burn-in",
     "gpuops-burn-in-gke-ml-prod-cluster-a3-highgpu-8g-poo-28f53baecb"),
    # A node name that is not a DNS label itself: lower case, one dash for what is not a letter or digit, none at the ends.
    ("_GPU_01_", None, "gpuops-check-gpu-01-a1ca5e1827"),
    # So does a purpose's.
    ("gpu-01", "nccl all-reduce", "gpuops-nccl-all-reduce-gpu-01-0902deab13"),
], ids=["long-63", "long-cut-at-a-dash", "long-burn-in", "odd-characters", "purpose-in-words"])
def test_a_pods_name_is_cut_to_a_dns_label_keeping_the_run_node_and_purpose_hash(node, purpose, name):
    assert check_pod.pod_name("run-2", node, purpose=purpose) == name


# ---- how a finished pod is read


@pytest.mark.parametrize(("ended", "result"), [
    ({"exit_code": 18, "message": "Failed to initialize NVML: Driver/library version mismatch"},
     check_pod.CheckResult(False, 18, "Error", "Failed to initialize NVML: Driver/library version mismatch")),
    ({"reason": "UnexpectedAdmissionError",
      "status_message": "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu"},
     check_pod.CheckResult(False, None, "UnexpectedAdmissionError",
                           "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu")),
], ids=["exited-18", "kubelet-refused"])
def test_a_failed_pod_reads_as_not_passed_with_its_exit_code_reason_and_words(ended, result):
    gateway = CheckPods()
    _, name = started(gateway)
    gateway.end(name, phase="Failed", **ended)

    assert check_pod.result_of(gateway.get_pod("gpuops", name).pod) == result


NCCL_FAILED = "\n".join([
    "# nThread 1 nGpus 8 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20",
    "# Using devices",
    "#  Rank  0 Group  0 Pid      1 on gpu-01 device  0 [0x18] NVIDIA H100 80GB HBM3",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong",
    "  8589934592    2147483648     float     sum      -1    69863  122.95  215.17      3",
    "# Out of bounds values : 3 FAILED",
    "# Avg bus bandwidth    : 215.17",
    "#",
])


def test_a_failed_pods_own_words_are_the_last_five_lines_it_said():
    gateway = CheckPods()
    ctx, name = started(gateway)
    gateway.end(name, phase="Failed", exit_code=1, message=NCCL_FAILED)

    outcome = advance(ctx)

    assert isinstance(outcome, Failed)
    assert outcome.detail["message"] == "\n".join(NCCL_FAILED.splitlines()[-5:])
    assert outcome.detail["message"].startswith("#       size ")


def test_a_failed_pods_own_words_are_at_most_its_last_600_characters():
    lines = [f"GPU {i}: Xid 79, pid=4242, name=python, GPU has fallen off the bus. " * 2 for i in range(8)]
    message = "\n".join(lines)
    gateway = CheckPods()
    ctx, name = started(gateway)
    gateway.end(name, phase="Failed", exit_code=1, message=message)

    outcome = advance(ctx)

    assert isinstance(outcome, Failed)
    assert outcome.detail["message"] == message.strip()[-600:]
