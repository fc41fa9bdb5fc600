"""The gpu-check step one call at a time: every state its check pod can be in (not there
yet, pending, pulling its image, running, deleted meanwhile, finished either way), every
shape of report a `diag` check's pod can give (read, cut short, malformed, oversized, a
field missing, read from the log or from the termination message), and the whole outcome
each call gives: the sentence (the one workflows.engine.messages writes), the detail and
code the run keeps, how soon it looks again, the records, the writes and the lease checks
before them, and the pod left behind or deleted.

The context is tests/unit/test_step_outcomes.py's; the pods and their logs are
tests/unit/test_gpu_check.py's, made to answer like the API server where the step's own
arguments decide the answer (namespace, container, uid, dry run)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import pytest

from storage.step_params import StepParamsError
from testenv import dcgm_diag_samples as samples
from tests.unit.test_gpu_check import DIAG, PARAMS, _PodsWithLogs
from tests.unit.test_mig_step import LeaseGoneCtx
from tests.unit.test_step_outcomes import Ctx
from workflows.engine import check_pod, dcgm_diag
from workflows.engine import messages as say
from workflows.engine.steps.contract import Done, Failed, LeaseLost, Waiting
from workflows.engine.steps.gpu_check import RunGpuCheck
from workflows.fleet.assessment import NodeInventory
from workflows.kube.errors import Conflict, KubeError, NotFound
from workflows.kube.objects import PodOnNode

NODE = "gpu-01"
NVIDIA_SMI = "nvidia-smi"
DIAG_SHOWN = "dcgmi diag -r 2 -j"
# How soon the step looks at its pod again while it waits.
SOON = 2.0


class CheckPods(_PodsWithLogs):
    """The check pods and their logs, answering as the API server does where the step's
    arguments decide: a pod is found in its own namespace only, a log is read for a
    container the pod has, a delete naming another uid is a Conflict and a dry-run
    delete deletes nothing. The races a person or a controller makes between the step's
    read and its write can be set per pod name."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted_first: set[str] = set()  # someone else deletes it just before the step does
        self.replaced_first: set[str] = set()  # a pod of the same name, another uid, takes its place
        self.created_unseen: set[str] = set()  # created (by this step before a restart) but not yet read back

    def _found(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self.pods.get(name)
        if pod is None or pod["metadata"]["namespace"] != namespace:
            raise NotFound(f'pods "{name}" not found in namespace {namespace}', status=404)
        return pod

    def get_pod(self, namespace: str, name: str) -> PodOnNode:
        self._found(namespace, name)
        return super().get_pod(namespace, name)

    def create_pod(self, namespace: str, manifest: dict[str, Any], *, dry_run: bool) -> None:
        name = manifest["metadata"]["name"]
        if name in self.created_unseen:
            self.writes.append(("create", name, dry_run))
            raise Conflict(f'pods "{name}" already exists', status=409)
        super().create_pod(namespace, manifest, dry_run=dry_run)

    def delete_pod(self, namespace: str, name: str, *, uid: str, dry_run: bool) -> None:
        self.writes.append(("delete", name, dry_run))
        if name in self.deleted_first:
            self.pods.pop(name, None)
        if name in self.replaced_first and name in self.pods:
            self.pods[name]["metadata"]["uid"] = "uid-of-another-pod"
        pod = self._found(namespace, name)
        if pod["metadata"]["uid"] != uid:
            raise Conflict(f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                           f"{pod['metadata']['uid']}", status=409)
        if not dry_run:
            del self.pods[name]

    def read_pod_log(self, namespace: str, name: str, *, container: str, limit_bytes: int) -> str:
        pod = self._found(namespace, name)
        if container not in [c["name"] for c in pod["spec"]["containers"]]:
            raise KubeError(f"container {container} is not valid for pod {name}", status=400)
        return super().read_pod_log(namespace, name, container=container, limit_bytes=limit_bytes)

    # --- what the kubelet says while the pod has not finished
    def waiting(self, name: str, *, phase: str = "Pending", container_waiting: str | None = None) -> None:
        status: dict[str, Any] = {"phase": phase}
        if container_waiting is not None:
            status["containerStatuses"] = [{"name": check_pod.CONTAINER, "image": "x", "ready": False,
                                            "restartCount": 0, "state": {"waiting": {"reason": container_waiting}}}]
        self.pods[name]["status"] = status

    def terminating(self, name: str) -> None:
        self.pods[name]["metadata"]["deletionTimestamp"] = "2026-12-04T10:01:00Z"


@dataclass
class CheckCtx(Ctx):
    """The step's context, with the node as the watch cache sees it."""

    inventory: NodeInventory | None = None

    def node_inventory(self) -> NodeInventory | None:
        return self.inventory


def prepared(gateway: CheckPods, *, params: dict[str, Any] | None = None, ctx_type: type[Ctx] = CheckCtx,
             **kw: Any) -> tuple[Ctx, str]:
    """The step's context once the engine ran `prepare`, and the pod's name."""
    ctx = ctx_type(gateway, node=NODE, kind="gpu-check", params=dict(params or PARAMS), **kw)
    ctx.intent = RunGpuCheck().prepare(ctx)  # type: ignore[arg-type]
    return ctx, ctx.intent["pod"].split("/", 1)[1]


def started(gateway: CheckPods, **kw: Any) -> tuple[Ctx, str]:
    """The step's context after its first call started the pod."""
    ctx, name = prepared(gateway, **kw)
    RunGpuCheck().advance(ctx)  # type: ignore[arg-type]
    assert name in gateway.pods
    return ctx, name


def advance(ctx: Ctx) -> Any:
    return RunGpuCheck().advance(ctx)  # type: ignore[arg-type]


# ---- the step's params and its time


def test_the_step_allows_the_pods_own_deadline_plus_a_minute():
    ctx = Ctx(CheckPods(), kind="gpu-check", params=dict(PARAMS, timeout_s=120))
    assert RunGpuCheck().timeout(ctx) == dt.timedelta(minutes=3)  # type: ignore[arg-type]


def test_a_check_without_a_timeout_of_its_own_is_allowed_five_minutes_plus_a_minute():
    params = {k: v for k, v in PARAMS.items() if k != "timeout_s"}
    ctx = Ctx(CheckPods(), kind="gpu-check", params=params)
    assert RunGpuCheck().timeout(ctx) == dt.timedelta(minutes=6)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout_s", [0, -30])
def test_a_timeout_of_no_time_is_refused_naming_the_step_kind_and_the_key(timeout_s):
    ctx = Ctx(CheckPods(), kind="gpu-check", params=dict(PARAMS, timeout_s=timeout_s))
    with pytest.raises(StepParamsError) as refused:
        RunGpuCheck().timeout(ctx)  # type: ignore[arg-type]
    assert str(refused.value) == f"gpu-check step: params.timeout_s must be more than 0, not {timeout_s}"


def test_a_timeout_that_is_not_a_number_is_refused_naming_the_step_kind():
    ctx = Ctx(CheckPods(), kind="gpu-check", params=dict(PARAMS, timeout_s="ten minutes"))
    with pytest.raises(StepParamsError, match=r"^gpu-check step: params\.timeout_s"):
        RunGpuCheck().timeout(ctx)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [{"diag": 4}, {"purpose": "warm-up"}, {"count": 0}, {"timeout_s": 1.5},
                                 {"command": []}, {"resource": ""}])
def test_a_check_whose_pod_cannot_be_built_is_refused_before_anything_starts(bad):
    gateway = CheckPods()
    ctx = Ctx(gateway, node=NODE, kind="gpu-check", params=dict(PARAMS, **bad))
    with pytest.raises(StepParamsError) as refused:
        RunGpuCheck().prepare(ctx)  # type: ignore[arg-type]
    assert str(refused.value) == say.gpu_check_params()
    assert gateway.writes == [] and ctx.acts == 0


def test_the_intent_names_the_pod_by_namespace_run_and_node_and_has_no_side_effect():
    gateway = CheckPods()
    ctx, name = prepared(gateway)
    assert ctx.intent == {"pod": f"gpuops/{check_pod.pod_name('run-2', NODE)}"}
    assert gateway.writes == [] and ctx.acts == 0 and ctx.records == {}


def test_a_later_run_on_the_same_node_starts_its_own_pod_and_never_reads_the_failed_pod_kept_for_its_logs():
    gateway = CheckPods()
    first, first_name = started(gateway)
    gateway.end(first_name, phase="Failed", exit_code=18, message="NVML: Driver/library version mismatch")
    assert isinstance(advance(first), Failed)

    again, name = prepared(gateway, run_id="run-3")
    outcome = advance(again)

    assert name != first_name
    assert outcome == Waiting(say.gpu_check_started(again.intent["pod"], NVIDIA_SMI), retry_in=SOON)
    assert set(gateway.pods) == {first_name, name}


# ---- starting the pod


def test_the_first_call_records_what_it_starts_checks_the_lease_and_creates_the_pod():
    gateway = CheckPods()
    ctx, name = prepared(gateway)

    outcome = advance(ctx)

    pod = ctx.intent["pod"]
    assert outcome == Waiting(say.gpu_check_started(pod, NVIDIA_SMI), retry_in=SOON)
    assert ctx.records == {"gpu-check.start": {"action": "gpu-check.start", "target": f"pod {pod}", "detail": {
        "node": NODE, "image": PARAMS["image"], "command": ["nvidia-smi"], "resource": "nvidia.com/gpu",
        "count": 1}}}
    assert ctx.acts == 1 and gateway.writes == [("create", name, False)]
    assert gateway.pods[name]["spec"]["nodeName"] == NODE


def test_a_replica_that_lost_the_lease_creates_no_pod():
    gateway = CheckPods()
    ctx, _ = prepared(gateway, ctx_type=LeaseGoneCtx)
    with pytest.raises(LeaseLost):
        advance(ctx)
    assert gateway.writes == [] and gateway.pods == {}


def test_a_pod_created_before_a_restart_but_not_read_back_yet_is_not_created_twice():
    gateway = CheckPods()
    ctx, name = prepared(gateway)
    gateway.created_unseen.add(name)

    assert advance(ctx) == Waiting(say.gpu_check_started(ctx.intent["pod"], NVIDIA_SMI), retry_in=SOON)
    assert gateway.writes == [("create", name, False)]


def test_a_dry_run_has_the_api_server_admit_the_pod_and_records_and_creates_nothing():
    gateway = CheckPods()
    ctx, name = prepared(gateway, dry_run=True)

    assert advance(ctx) == Done(say.would_run_gpu_check(ctx.intent["pod"], NVIDIA_SMI))
    assert gateway.writes == [("create", name, True)] and gateway.pods == {}
    assert ctx.records == {} and ctx.acts == 1


def test_a_missing_namespace_fails_the_step_with_its_own_code_and_says_what_to_create():
    gateway = CheckPods()
    gateway.namespaces = ()
    ctx, _ = prepared(gateway)

    assert advance(ctx) == Failed(say.gpu_check_no_namespace("gpuops"), code="gpu-check-no-namespace")


@pytest.mark.parametrize("advertised", [{"nvidia.com/gpu": "0"}, None], ids=["advertises-none", "node-unknown"])
def test_a_check_on_every_gpu_waits_to_start_while_the_node_advertises_none_or_is_not_known(make, advertised):
    gateway = CheckPods()
    inventory = None if advertised is None else make.assess(
        make.node(NODE, capacity=advertised, allocatable=advertised))
    ctx, _ = prepared(gateway, params=DIAG, inventory=inventory)

    outcome = advance(ctx)

    assert outcome == Waiting(say.gpu_check_no_devices(ctx.intent["pod"], "nvidia.com/gpu"), retry_in=SOON)
    assert gateway.writes == [] and ctx.records == {} and ctx.acts == 0


# ---- while the pod has not finished


@pytest.mark.parametrize(("phase", "container_waiting", "said"), [
    ("Pending", None, None),
    ("Pending", "ContainerCreating", "ContainerCreating"),
    ("Pending", "ErrImagePull", "ErrImagePull"),
    ("Pending", "ImagePullBackOff", "ImagePullBackOff"),
    ("Running", None, None),
    ("Unknown", None, None),
])
def test_a_pod_that_has_not_finished_keeps_the_step_waiting_in_the_kubelets_words(phase, container_waiting, said):
    gateway = CheckPods()
    ctx, name = started(gateway)
    gateway.waiting(name, phase=phase, container_waiting=container_waiting)

    outcome = advance(ctx)

    assert outcome == Waiting(say.gpu_check_running(ctx.intent["pod"], NVIDIA_SMI, said), retry_in=SOON)
    assert gateway.writes == [("create", name, False)] and ctx.acts == 1


def test_an_image_that_never_pulls_ends_at_the_pods_deadline_and_fails_the_step():
    gateway = CheckPods()
    ctx, name = started(gateway)
    gateway.waiting(name, container_waiting="ImagePullBackOff")
    assert isinstance(advance(ctx), Waiting)
    gateway.end(name, phase="Failed", reason="DeadlineExceeded",
                status_message="Pod was active on the node longer than the specified deadline")

    outcome = advance(ctx)

    assert outcome == Failed(
        say.gpu_check_failed(NODE, ctx.intent["pod"], NVIDIA_SMI, exit_code=None, reason="DeadlineExceeded",
                             message="Pod was active on the node longer than the specified deadline"),
        {"exit_code": None, "reason": "DeadlineExceeded",
         "message": "Pod was active on the node longer than the specified deadline"},
        code="gpu-check-failed")
    assert name in gateway.pods


def test_a_pod_someone_deleted_before_it_answered_is_waited_out_then_started_again():
    gateway = CheckPods()
    ctx, name = started(gateway)
    gateway.terminating(name)

    assert advance(ctx) == Waiting(say.gpu_check_deleted_meanwhile(ctx.intent["pod"]), retry_in=SOON)
    assert gateway.writes == [("create", name, False)]

    del gateway.pods[name]
    assert advance(ctx) == Waiting(say.gpu_check_started(ctx.intent["pod"], NVIDIA_SMI), retry_in=SOON)
    assert gateway.writes == [("create", name, False), ("create", name, False)]


# ---- a command check: its exit code decides


def test_a_check_that_exits_0_is_recorded_deletes_its_pod_after_checking_the_lease_and_is_done():
    gateway = CheckPods()
    ctx, name = started(gateway)
    gateway.end(name, phase="Succeeded", exit_code=0)

    outcome = advance(ctx)

    pod = ctx.intent["pod"]
    assert outcome == Done(say.gpu_check_passed(pod, NVIDIA_SMI))
    assert ctx.records["gpu-check.passed"] == {"action": "gpu-check.passed", "target": f"pod {pod}",
                                               "detail": {"node": NODE, "exit_code": 0}}
    assert gateway.writes == [("create", name, False), ("delete", name, False)] and gateway.pods == {}
    assert ctx.acts == 2


def test_a_pod_that_succeeded_without_a_container_status_passes_as_exit_0():
    gateway = CheckPods()
    ctx, name = started(gateway)
    gateway.end(name, phase="Succeeded")

    assert advance(ctx) == Done(say.gpu_check_passed(ctx.intent["pod"], NVIDIA_SMI))
    assert ctx.records["gpu-check.passed"]["detail"] == {"node": NODE, "exit_code": 0}


@pytest.mark.parametrize("race", ["deleted_first", "replaced_first"])
def test_a_passed_pod_someone_else_removes_or_replaces_at_the_moment_of_its_delete_still_passes(race):
    gateway = CheckPods()
    ctx, name = started(gateway)
    gateway.end(name, phase="Succeeded", exit_code=0)
    getattr(gateway, race).add(name)

    assert advance(ctx) == Done(say.gpu_check_passed(ctx.intent["pod"], NVIDIA_SMI))
    assert ctx.recorded("gpu-check.passed")


@pytest.mark.parametrize(("ended", "exit_code", "reason", "message"), [
    ({"phase": "Failed", "exit_code": 18, "message": "Failed to initialize NVML: Driver/library version mismatch"},
     18, "Error", "Failed to initialize NVML: Driver/library version mismatch"),
    ({"phase": "Failed", "exit_code": 1}, 1, "Error", None),
    ({"phase": "Failed", "reason": "UnexpectedAdmissionError",
      "status_message": "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu"},
     None, "UnexpectedAdmissionError",
     "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu"),
], ids=["nvml-mismatch", "bare-exit-1", "kubelet-refused"])
def test_a_check_that_fails_fails_the_step_in_the_pods_own_words_and_keeps_the_pod(ended, exit_code, reason, message):
    gateway = CheckPods()
    ctx, name = started(gateway)
    gateway.end(name, **ended)

    outcome = advance(ctx)

    assert outcome == Failed(
        say.gpu_check_failed(NODE, ctx.intent["pod"], NVIDIA_SMI, exit_code=exit_code, reason=reason,
                             message=message),
        {"exit_code": exit_code, "reason": reason, "message": message}, code="gpu-check-failed")
    assert name in gateway.pods and gateway.writes == [("create", name, False)]
    assert not ctx.recorded("gpu-check.passed") and ctx.acts == 1


# ---- after a restart: the record of a pass decides


def lease_lost_after_the_pass(gateway: CheckPods) -> tuple[Ctx, str]:
    """The pass was recorded, then the lease was lost before the pod was deleted; the
    context of the replica that takes over (the same records)."""
    ctx, name = started(gateway)
    gateway.end(name, phase="Succeeded", exit_code=0)
    gone = LeaseGoneCtx(gateway, node=NODE, kind="gpu-check", params=dict(PARAMS), intent=ctx.intent,
                        records=ctx.records)
    with pytest.raises(LeaseLost):
        advance(gone)
    assert ctx.recorded("gpu-check.passed") and name in gateway.pods
    return CheckCtx(gateway, node=NODE, kind="gpu-check", params=dict(PARAMS), intent=ctx.intent,
                    records=ctx.records), name


def test_a_pass_recorded_before_a_restart_deletes_the_pod_left_behind_and_never_runs_the_check_again():
    gateway = CheckPods()
    ctx, name = lease_lost_after_the_pass(gateway)

    assert advance(ctx) == Done(say.gpu_check_passed(ctx.intent["pod"], NVIDIA_SMI))
    assert gateway.pods == {} and ctx.acts == 1
    assert gateway.writes == [("create", name, False), ("delete", name, False)]


@pytest.mark.parametrize("race", ["deleted_first", "replaced_first"])
def test_a_pass_recorded_before_a_restart_is_done_even_when_its_pod_goes_or_is_replaced_meanwhile(race):
    gateway = CheckPods()
    ctx, name = lease_lost_after_the_pass(gateway)
    getattr(gateway, race).add(name)

    assert advance(ctx) == Done(say.gpu_check_passed(ctx.intent["pod"], NVIDIA_SMI))
    assert gateway.writes == [("create", name, False), ("delete", name, False)]


def test_a_pass_recorded_before_a_restart_leaves_a_pod_already_terminating_alone():
    gateway = CheckPods()
    ctx, name = lease_lost_after_the_pass(gateway)
    gateway.terminating(name)

    assert advance(ctx) == Done(say.gpu_check_passed(ctx.intent["pod"], NVIDIA_SMI))
    assert gateway.writes == [("create", name, False)] and ctx.acts == 0


def test_a_pass_recorded_before_a_restart_whose_pod_is_gone_is_done_without_a_write():
    gateway = CheckPods()
    ctx, name = lease_lost_after_the_pass(gateway)
    del gateway.pods[name]

    assert advance(ctx) == Done(say.gpu_check_passed(ctx.intent["pod"], NVIDIA_SMI))
    assert gateway.writes == [("create", name, False)] and ctx.acts == 0


# ---- a diag check: DCGM's report decides


def diag_started(gateway: CheckPods, make, *, gpus: int = 8) -> tuple[Ctx, str]:
    return started(gateway, params=DIAG, inventory=make.assess(make.node(NODE, gpus=gpus)))


def unreadable(ctx: Ctx, why: str, *, exit_code: int | None, reason: str | None) -> Failed:
    """The step's answer to output that holds no report it can read."""
    return Failed(say.diag_unreadable(NODE, ctx.intent["pod"], DIAG_SHOWN, why, exit_code=exit_code, reason=reason),
                  {"exit_code": exit_code, "reason": reason, "unreadable": why}, code="gpu-check-failed")


def test_a_diag_report_is_read_from_the_check_containers_log_in_the_pods_namespace_not_its_cut_copy(make):
    gateway = CheckPods()
    ctx, name = diag_started(gateway, make)
    gateway.logs[name] = samples.dcgm4_text(gpus=8, level=3)
    # The command copied the report's first 4 KiB to the termination message: cut short.
    gateway.end(name, phase="Succeeded", exit_code=0, message=samples.dcgm4_compact(gpus=8, level=3)[:4096])

    outcome = advance(ctx)

    assert outcome == Done(say.diag_passed(ctx.intent["pod"], DIAG_SHOWN, tests=6, gpus=8,
                                           version=samples.DCGM4_VERSION))
    assert gateway.log_reads == [dcgm_diag.LOG_LIMIT_BYTES] and gateway.pods == {}
    assert ctx.records["gpu-check.passed"]["detail"] == {"node": NODE, "exit_code": 0}


@pytest.mark.parametrize("log", [None, "", "Error: unable to connect to the host engine\n"],
                         ids=["log-forbidden", "log-empty", "log-without-json"])
def test_a_diag_report_the_log_cannot_give_is_read_from_the_termination_message(make, log):
    gateway = CheckPods()
    ctx, name = diag_started(gateway, make, gpus=2)
    gateway.logs[name] = log
    gateway.end(name, phase="Succeeded", exit_code=0, message=samples.dcgm4_compact(gpus=2, level=2))

    assert advance(ctx) == Done(say.diag_passed(ctx.intent["pod"], DIAG_SHOWN, tests=3, gpus=2,
                                                version=samples.DCGM4_VERSION))


def _deep() -> str:
    return '{"DCGM Diagnostic": ' + "[" * 100_000 + "]" * 100_000 + "}"


def _oversized() -> str:
    document = samples.dcgm4_document(gpus=8, level=2)
    document["metadata"]["notes"] = "x" * dcgm_diag.LOG_LIMIT_BYTES
    return json.dumps(document)


@pytest.mark.parametrize(("log", "why"), [
    ("Error: unable to connect to the host engine\n", "no JSON in the output"),
    (samples.dcgm4_text(gpus=8, level=3)[:3000], "the JSON is cut short"),
    (_oversized(), "the JSON is cut short"),
    ('{"DCGM Diagnostic": {}}', "dcgm4: no test_categories list"),
    ('{"DCGM Diagnostic": "all passed"}', "dcgm4: the diagnostic is not an object"),
    ('{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": []}]}}',
     "dcgm4: no test result in the output"),
    ('{"DCGM GPU Diagnostic": {"test_categories": "memory"}}', "dcgm3: no test_categories list"),
    ('{"report": {"passed": true}}',
     "neither 'DCGM Diagnostic' (DCGM 4) nor 'DCGM GPU Diagnostic' (DCGM 3) at the top (found: report)"),
    (_deep(), "not JSON (nested too deep)"),
    ('{"DCGM Diagnostic": {"test_categories": [}}', "not JSON (Expecting value: line 1 column 42 (char 41))"),
], ids=["no-json", "cut-short", "oversized", "no-categories", "not-an-object", "no-result", "dcgm3-categories-text",
        "unknown-shape", "nested-too-deep", "malformed"])
def test_a_diag_output_of_any_other_shape_fails_the_node_saying_why_it_reads_no_result(make, log, why):
    gateway = CheckPods()
    ctx, name = diag_started(gateway, make)
    gateway.logs[name] = log
    gateway.end(name, phase="Succeeded", exit_code=0)

    assert advance(ctx) == unreadable(ctx, why, exit_code=0, reason="Completed")
    assert name in gateway.pods and not ctx.recorded("gpu-check.passed")


def test_a_diag_whose_log_and_termination_message_both_hold_nothing_fails_on_the_exit_code_it_gave(make):
    gateway = CheckPods()
    ctx, name = diag_started(gateway, make)
    gateway.end(name, phase="Failed", exit_code=127)

    assert advance(ctx) == unreadable(ctx, "no JSON in the output", exit_code=127, reason="Error")


def test_a_diag_that_runs_out_of_time_says_so_and_that_no_report_came(make):
    gateway = CheckPods()
    ctx, name = diag_started(gateway, make)
    gateway.logs[name] = ""
    gateway.end(name, phase="Failed", reason="DeadlineExceeded", status_message="Pod was active too long")

    assert advance(ctx) == unreadable(ctx, "no JSON in the output", exit_code=None, reason="DeadlineExceeded")


def test_a_failed_test_fails_the_node_quoting_the_test_the_gpu_and_dcgms_words_with_the_report_in_the_detail(make):
    gateway = CheckPods()
    ctx, name = diag_started(gateway, make)
    gateway.logs[name] = samples.dcgm4_text(gpus=8, level=2, failing={3: "memory"})
    gateway.end(name, phase="Failed", exit_code=226)

    outcome = advance(ctx)

    assert outcome == Failed(
        say.diag_failed(NODE, ctx.intent["pod"], DIAG_SHOWN, [say.diag_failure("memory", "3", (samples.MEMORY_FAILURE,))],
                        more=0, runtime_error=None),
        {"exit_code": 226, "dcgm": samples.DCGM4_VERSION, "shape": "dcgm4",
         "failed": [{"test": "memory", "gpu": "3", "status": "Fail"}]},
        code="gpu-check-failed")
    assert name in gateway.pods and gateway.writes == [("create", name, False)]


def test_more_failures_than_a_thread_quotes_are_counted_after_the_quoted_ones(make):
    gateway = CheckPods()
    ctx, name = diag_started(gateway, make)
    gateway.logs[name] = samples.dcgm4_text(gpus=8, level=2, failing={gpu: "pcie" for gpu in range(8)})
    gateway.end(name, phase="Failed", exit_code=226)

    outcome = advance(ctx)

    quoted = [say.diag_failure("pcie", str(gpu), (f"pcie failed on GPU {gpu}",)) for gpu in range(dcgm_diag.QUOTED)]
    assert outcome == Failed(
        say.diag_failed(NODE, ctx.intent["pod"], DIAG_SHOWN, quoted, more=8 - dcgm_diag.QUOTED, runtime_error=None),
        {"exit_code": 226, "dcgm": samples.DCGM4_VERSION, "shape": "dcgm4",
         "failed": [{"test": "pcie", "gpu": str(gpu), "status": "Fail"} for gpu in range(8)]},
        code="gpu-check-failed")
    assert outcome.reason.endswith(f"; and 2 more; {NODE} stays cordoned and the pod {ctx.intent['pod']} is kept "
                                   "for its logs")


def test_dcgm_that_could_not_run_fails_the_node_in_dcgms_words(make):
    gateway = CheckPods()
    ctx, name = diag_started(gateway, make)
    gateway.logs[name] = json.dumps({"DCGM Diagnostic": {"runtime_error": "Unable to connect to the host engine"},
                                     "metadata": {"version": "4.2.0"}})
    gateway.end(name, phase="Failed", exit_code=1)

    outcome = advance(ctx)

    assert outcome == Failed(
        say.diag_failed(NODE, ctx.intent["pod"], DIAG_SHOWN, [], more=0,
                        runtime_error="Unable to connect to the host engine"),
        {"exit_code": 1, "dcgm": "4.2.0", "shape": "dcgm4", "failed": []}, code="gpu-check-failed")
    assert 'DCGM could not run: "Unable to connect to the host engine"' in outcome.reason


def test_a_diag_whose_every_test_passed_but_dcgmi_exited_non_zero_fails_on_the_exit_code_in_the_pods_words(make):
    gateway = CheckPods()
    ctx, name = diag_started(gateway, make, gpus=2)
    copied = samples.dcgm4_compact(gpus=2, level=1)  # what the command copied to the termination message
    gateway.logs[name] = samples.dcgm4_text(gpus=2, level=1)
    gateway.end(name, phase="Failed", exit_code=1, message=copied)

    outcome = advance(ctx)

    assert outcome == Failed(
        say.gpu_check_failed(NODE, ctx.intent["pod"], DIAG_SHOWN, exit_code=1, reason="Error", message=copied),
        {"exit_code": 1, "reason": "Error"}, code="gpu-check-failed")
    assert name in gateway.pods and not ctx.recorded("gpu-check.passed")
