"""The upgrade's canary pod (step kind gpu-check): the pod it makes, and how its end
decides the step. The pods here are the API server's JSON, read through the gateway's own
conversion, so exit codes and termination messages are read as they arrive."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest

from storage.step_params import GpuCheckParams
from testenv import dcgm_diag_samples as samples
from workflows.engine import check_pod, dcgm_diag
from workflows.engine.steps.contract import Done, Failed, StepParamsError, Waiting
from workflows.engine.steps.gpu_check import RunGpuCheck
from workflows.fleet.assessment import NodeInventory
from workflows.kube.errors import Conflict, Forbidden, NotFound
from workflows.kube.gateway.decoding import pod_on_node_from_json
from workflows.kube.objects import PodOnNode

NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
PARAMS = {"namespace": "gpuops", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
          "command": ["nvidia-smi"], "resource": "nvidia.com/gpu", "timeout_s": 120}


class _Pods:
    """The pod reads and writes the gpu-check step makes, on one namespace's pods."""

    def __init__(self, namespaces: tuple[str, ...] = ("gpuops",)) -> None:
        self.namespaces = namespaces
        self.pods: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str, bool]] = []

    def get_pod(self, namespace: str, name: str) -> PodOnNode:
        if name not in self.pods:
            raise NotFound(f'pods "{name}" not found', status=404)
        return pod_on_node_from_json(self.pods[name])

    def create_pod(self, namespace: str, manifest: dict[str, Any], *, dry_run: bool):
        name = manifest["metadata"]["name"]
        self.writes.append(("create", name, dry_run))
        if namespace not in self.namespaces:
            raise NotFound(f'namespaces "{namespace}" not found', status=404)
        if name in self.pods:
            raise Conflict(f'pods "{name}" already exists', status=409)
        if not dry_run:
            self.pods[name] = {**manifest, "metadata": {**manifest["metadata"], "uid": f"uid-{len(self.writes)}",
                                                        "creationTimestamp": "2026-12-04T10:00:00Z"},
                               "status": {"phase": "Pending"}}

    def delete_pod(self, namespace: str, name: str, *, uid: str, dry_run: bool) -> None:
        self.writes.append(("delete", name, dry_run))
        if self.pods.get(name, {}).get("metadata", {}).get("uid") != uid:
            raise NotFound("gone", status=404)
        del self.pods[name]

    def end(self, name: str, *, phase: str, exit_code: int | None = None, message: str | None = None,
            reason: str | None = None, status_message: str | None = None) -> None:
        status: dict[str, Any] = {"phase": phase}
        if exit_code is not None:
            ended = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
            if message:
                ended["message"] = message
            status["containerStatuses"] = [{"name": "check", "image": "x", "ready": False, "restartCount": 0,
                                            "state": {"terminated": ended}}]
        if reason:
            status["reason"], status["message"] = reason, status_message
        self.pods[name]["status"] = status


@dataclass
class _Ctx:
    gateway: _Pods
    kind: str = "gpu-check"
    params: dict[str, Any] = field(default_factory=lambda: dict(PARAMS))
    intent: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    now: dt.datetime = NOW
    zone: dt.tzinfo = dt.timezone.utc
    node: str = "gpu-h100-01"
    run_id: str = "run-7"
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def act(self) -> None:
        return None

    def record(self, *, key: str, action: str, target: str, detail: Any) -> None:
        self.rows.setdefault(key, {"action": action, "target": target, **detail})

    def recorded(self, key: str) -> bool:
        return key in self.rows


def _started(gateway: _Pods, **kw: Any) -> tuple[RunGpuCheck, _Ctx, str]:
    step = RunGpuCheck()
    ctx = _Ctx(gateway=gateway, **kw)
    ctx.intent = step.prepare(ctx)  # type: ignore[arg-type]
    return step, ctx, ctx.intent["pod"].split("/", 1)[1]


def test_the_check_pod_is_bound_to_its_node_asks_for_one_gpu_never_restarts_and_has_its_own_deadline():
    spec = check_pod.CheckSpec.from_params(GpuCheckParams.from_json(PARAMS, kind="gpu-check"))
    assert spec is not None
    pod = check_pod.manifest(spec, name="gpuops-check-x", node="gpu-h100-01", run_id="run-7")
    assert pod["spec"]["nodeName"] == "gpu-h100-01"  # not the scheduler: the node is cordoned
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["nvidia-smi"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["activeDeadlineSeconds"] == 120
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert pod["metadata"]["labels"]["gpuops.io/gpu-check"] == "true"


def test_the_check_pods_name_is_the_same_after_a_restart_and_fits_a_dns_label_for_any_node_name():
    assert check_pod.pod_name("run-7", "gpu-01") == check_pod.pod_name("run-7", "gpu-01")
    assert check_pod.pod_name("run-7", "gpu-01") != check_pod.pod_name("run-8", "gpu-01")
    long_a, long_b = "ip-10-0-0-1.eu-west-1.compute.internal" * 3, "ip-10-0-0-2.eu-west-1.compute.internal" * 3
    for name in (check_pod.pod_name("run-7", long_a), check_pod.pod_name("run-7", long_b)):
        assert len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert check_pod.pod_name("run-7", long_a) != check_pod.pod_name("run-7", long_b)


def test_a_check_that_exits_0_deletes_its_pod_and_stays_done_after_a_restart_without_a_second_pod():
    gateway = _Pods()
    step, ctx, name = _started(gateway)
    assert isinstance(step.advance(ctx), Waiting)  # type: ignore[arg-type]
    waiting = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(waiting, Waiting) and "to finish" in waiting.reason
    gateway.end(name, phase="Succeeded", exit_code=0)

    assert step.advance(ctx) == Done(f"the check pod gpuops/{name} (`nvidia-smi`) exited 0")  # type: ignore[arg-type]
    assert name not in gateway.pods
    # The engine calls the step again after a restart: it reads its record, not a new pod.
    assert isinstance(step.advance(ctx), Done)  # type: ignore[arg-type]
    assert gateway.writes == [("create", name, False), ("delete", name, False)]
    assert ctx.rows["gpu-check.start"]["command"] == ["nvidia-smi"]
    assert ctx.rows["gpu-check.passed"]["exit_code"] == 0


def test_a_restart_while_the_check_runs_finds_the_pod_it_started():
    gateway = _Pods()
    step, ctx, name = _started(gateway)
    step.advance(ctx)  # type: ignore[arg-type]
    again = _Ctx(gateway=gateway, intent=ctx.intent, rows=ctx.rows)  # a new process, the same records
    assert isinstance(step.advance(again), Waiting)  # type: ignore[arg-type]
    assert [w for w in gateway.writes if w[0] == "create"] == [("create", name, False)]


def test_a_check_that_exits_non_zero_fails_the_step_with_the_commands_own_words_and_keeps_the_pod():
    gateway = _Pods()
    step, ctx, name = _started(gateway)
    step.advance(ctx)  # type: ignore[arg-type]
    gateway.end(name, phase="Failed", exit_code=18,
                message="Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.105")
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed)
    assert outcome.reason == (
        "the check pod on gpu-h100-01 failed: `nvidia-smi` exited 18 (Error): \"Failed to initialize NVML: "
        "Driver/library version mismatch / NVML library version: 580.105\"; gpu-h100-01 stays cordoned and the pod "
        f"gpuops/{name} is kept for its logs")
    assert name in gateway.pods and not any(w[0] == "delete" for w in gateway.writes)
    assert "gpu-check.passed" not in ctx.rows


def test_a_check_pod_the_kubelet_refuses_fails_with_the_kubelets_reason():
    gateway = _Pods()
    step, ctx, name = _started(gateway)
    step.advance(ctx)  # type: ignore[arg-type]
    gateway.end(name, phase="Failed", reason="UnexpectedAdmissionError",
                status_message="Allocate failed due to requested number of devices unavailable for nvidia.com/gpu")
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed)
    assert "did not run to the end (UnexpectedAdmissionError)" in outcome.reason
    assert "devices unavailable for nvidia.com/gpu" in outcome.reason


def test_a_check_namespace_that_does_not_exist_fails_the_step_and_says_what_to_create():
    step, ctx, _ = _started(_Pods(namespaces=()))
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed) and outcome.reason.startswith("the check pod's namespace gpuops does not exist")


def test_a_dry_run_asks_the_api_server_to_admit_the_pod_and_creates_nothing():
    gateway = _Pods()
    step, ctx, name = _started(gateway, dry_run=True)
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Done) and outcome.note.startswith(f"would run the check pod gpuops/{name}")
    assert gateway.writes == [("create", name, True)] and gateway.pods == {} and ctx.rows == {}


def test_a_gpu_check_step_without_its_pod_is_refused_before_it_starts():
    with pytest.raises(StepParamsError, match="gpu-check step needs params namespace, image, command"):
        RunGpuCheck().prepare(_Ctx(gateway=_Pods(), params={"namespace": "gpuops"}))  # type: ignore[arg-type]


# ---- a diag check: DCGM's diagnostics on every GPU of the node

DIAG = {"namespace": "gpuops", "image": "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04",
        "command": ["/bin/sh", "-c", "dcgmi diag -r 2 -j"], "resource": "nvidia.com/gpu", "timeout_s": 1200,
        "count": "all", "diag": 2}


class _PodsWithLogs(_Pods):
    """The pods, and their logs as the API serves them (None: the log cannot be read)."""

    def __init__(self) -> None:
        super().__init__()
        self.logs: dict[str, str | None] = {}
        self.log_reads: list[int] = []

    def read_pod_log(self, namespace: str, name: str, *, container: str, limit_bytes: int) -> str:
        self.log_reads.append(limit_bytes)
        log = self.logs.get(name)
        if log is None:
            raise Forbidden('pods "x" is forbidden: cannot get resource "pods/log"', status=403)
        return log[:limit_bytes]


@dataclass
class _DiagCtx(_Ctx):
    inventory: NodeInventory | None = None

    def node_inventory(self) -> NodeInventory | None:
        return self.inventory


def _diag_started(gateway: _PodsWithLogs, make) -> tuple[RunGpuCheck, _DiagCtx, str]:
    step = RunGpuCheck()
    ctx = _DiagCtx(gateway=gateway, params=dict(DIAG), inventory=make.assess(make.node("gpu-h100-01", gpus=8)))
    ctx.intent = step.prepare(ctx)  # type: ignore[arg-type]
    return step, ctx, ctx.intent["pod"].split("/", 1)[1]


def test_a_diag_check_pod_holds_every_gpu_the_node_advertises_and_runs_dcgms_diagnostics(make):
    gateway = _PodsWithLogs()
    step, ctx, name = _diag_started(gateway, make)
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Waiting) and "`dcgmi diag -r 2 -j`" in outcome.reason
    (container,) = gateway.pods[name]["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert "nv-hostengine -n" in container["command"][2] and "dcgmi diag -r 2 -j" in container["command"][2]
    assert ctx.rows["gpu-check.start"]["count"] == 8


def test_a_diag_check_passes_when_its_report_read_from_the_log_passes_every_test_on_every_gpu(make):
    gateway = _PodsWithLogs()
    step, ctx, name = _diag_started(gateway, make)
    step.advance(ctx)  # type: ignore[arg-type]
    gateway.logs[name] = samples.dcgm4_text(gpus=8, level=2)
    gateway.end(name, phase="Succeeded", exit_code=0)
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert outcome == Done(f"the check pod gpuops/{name} (`dcgmi diag -r 2 -j`) (DCGM 4.3.1) passed 3 tests on 8 GPUs")
    assert gateway.log_reads == [dcgm_diag.LOG_LIMIT_BYTES]  # the read is capped


def test_a_dcgm_3_report_whose_tests_name_their_gpus_together_counts_each_gpu_once(make):
    gateway = _PodsWithLogs()
    step, ctx, name = _diag_started(gateway, make)
    step.advance(ctx)  # type: ignore[arg-type]
    gateway.logs[name] = samples.DCGM3_R1_PASS
    gateway.end(name, phase="Succeeded", exit_code=0)
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    tests = len({r.test for r in dcgm_diag.parse(samples.DCGM3_R1_PASS).results})
    assert outcome == Done(f"the check pod gpuops/{name} (`dcgmi diag -r 2 -j`) (DCGM 3.1.0) passed {tests} tests "
                           "on 8 GPUs")


def test_a_memory_test_failing_on_gpu_3_fails_the_node_quoting_the_test_the_gpu_and_dcgms_words(make):
    gateway = _PodsWithLogs()
    step, ctx, name = _diag_started(gateway, make)
    step.advance(ctx)  # type: ignore[arg-type]
    gateway.logs[name] = samples.dcgm4_text(gpus=8, level=2, failing={3: "memory"})
    gateway.end(name, phase="Failed", exit_code=226)
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed) and outcome.code == "gpu-check-failed"
    assert outcome.reason.startswith("the diagnostics on gpu-h100-01 (`dcgmi diag -r 2 -j`) failed memory on GPU 3: "
                                     '"Error using CUDA API cudaMemcpy')
    assert "GPU 3 had 1 memory miscompares" in outcome.reason and "stays cordoned" in outcome.reason
    assert outcome.detail["failed"] == [{"test": "memory", "gpu": "3", "status": "Fail"}]
    assert name in gateway.pods  # kept for its logs


def test_a_diag_report_the_log_cannot_give_is_read_from_the_termination_message_the_command_copied(make):
    gateway = _PodsWithLogs()
    step, ctx, name = _diag_started(gateway, make)
    step.advance(ctx)  # type: ignore[arg-type]
    gateway.logs[name] = None  # no pods/log grant: the termination message holds the report
    gateway.end(name, phase="Failed", exit_code=226, message=samples.dcgm4_compact(gpus=2, level=2, failing={1: "memory"}))
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed) and "failed memory on GPU 1" in outcome.reason


def test_a_diag_check_that_runs_out_of_time_says_so_and_that_no_report_came(make):
    gateway = _PodsWithLogs()
    step, ctx, name = _diag_started(gateway, make)
    step.advance(ctx)  # type: ignore[arg-type]
    gateway.logs[name] = ""
    gateway.end(name, phase="Failed", reason="DeadlineExceeded", status_message="Pod was active on the node longer than the specified deadline")
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed)
    assert outcome.reason == (f"the diagnostics on gpu-h100-01 (`dcgmi diag -r 2 -j`) gave no result gpuops can read "
                              f"(no JSON in the output); it ran out of time (DeadlineExceeded); gpu-h100-01 stays "
                              f"cordoned and the pod gpuops/{name} is kept for its logs")


def test_a_diag_check_whose_output_is_cut_short_fails_even_when_dcgmi_exited_0(make):
    gateway = _PodsWithLogs()
    step, ctx, name = _diag_started(gateway, make)
    step.advance(ctx)  # type: ignore[arg-type]
    gateway.logs[name] = samples.dcgm4_text(gpus=8, level=3)[:3000]
    gateway.end(name, phase="Succeeded", exit_code=0)
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed) and "(the JSON is cut short)" in outcome.reason
    assert "gpu-check.passed" not in ctx.rows


def test_a_diag_check_waits_to_start_while_the_node_advertises_no_gpu(make):
    gateway = _PodsWithLogs()
    step, ctx, name = _diag_started(gateway, make)
    ctx.inventory = make.assess(make.node("gpu-h100-01", gpus=8, capacity={"nvidia.com/gpu": "0"},
                                          allocatable={"nvidia.com/gpu": "0"}))
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Waiting) and "advertises no nvidia.com/gpu" in outcome.reason
    assert gateway.pods == {}


def test_a_burn_in_after_the_check_is_a_pod_of_its_own_on_every_gpu_whose_exit_code_decides(make):
    gateway = _PodsWithLogs()
    burn_in = {"namespace": "gpuops", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
               "command": ["all_reduce_perf", "-b", "8", "-e", "8G"], "resource": "nvidia.com/gpu",
               "timeout_s": 1800, "count": "all", "purpose": "burn-in"}
    inventory = make.assess(make.node("gpu-h100-01", gpus=8))
    check_step, check_ctx, check_name = _diag_started(gateway, make)
    step = RunGpuCheck()
    ctx = _DiagCtx(gateway=gateway, params=burn_in, inventory=inventory)
    ctx.intent = step.prepare(ctx)  # type: ignore[arg-type]
    name = ctx.intent["pod"].split("/", 1)[1]

    assert name.startswith("gpuops-burn-in-gpu-h100-01-") and name != check_name
    check_step.advance(check_ctx)  # type: ignore[arg-type]
    step.advance(ctx)  # type: ignore[arg-type]
    assert set(gateway.pods) == {check_name, name}  # neither takes the other's pod for its own
    (container,) = gateway.pods[name]["spec"]["containers"]
    assert container["command"] == ["all_reduce_perf", "-b", "8", "-e", "8G"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    gateway.end(name, phase="Failed", exit_code=1, message="# Out of bounds values : 3 FAILED")
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed)
    assert "`all_reduce_perf -b 8 -e 8G` exited 1 (Error): \"# Out of bounds values : 3 FAILED\"" in outcome.reason
    assert gateway.log_reads == []  # a command check's exit code decides; no report is read


def test_a_diag_whose_every_test_passed_but_dcgmi_exited_non_zero_fails_the_node_on_the_exit_code(make):
    gateway = _PodsWithLogs()
    step, ctx, name = _diag_started(gateway, make)
    step.advance(ctx)  # type: ignore[arg-type]
    gateway.logs[name] = samples.dcgm4_text(gpus=8, level=2)
    gateway.end(name, phase="Failed", exit_code=1)
    outcome = step.advance(ctx)  # type: ignore[arg-type]
    assert isinstance(outcome, Failed) and outcome.code == "gpu-check-failed", outcome
    assert outcome.detail["exit_code"] == 1 and name in gateway.pods
