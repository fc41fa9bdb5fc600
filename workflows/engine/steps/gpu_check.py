"""The canary check: a pod on the node whose exit code decides whether the change
works there (`gpu-check`; `workflows.engine.check_pod` builds and reads the pod), or, for
a `diag` check, DCGM's JSON report test by test (`workflows.engine.dcgm_diag`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any

from storage.step_params import GpuCheckParams
from workflows.engine import check_pod, dcgm_diag
from workflows.engine import messages as say
from workflows.engine.steps.contract import (
    Done,
    Failed,
    Outcome,
    StepContext,
    StepParamsError,
    Waiting,
    pod_ref,
    params_of,
)
from workflows.kube.errors import Conflict, KubeError, NotFound
from workflows.kube.objects import PodObject


class RunGpuCheck:
    """Run the upgrade's canary pod on the node and let its exit code decide: a pod in
    `namespace` bound to the node, asking for one `resource` and running `command` in
    `image` (`check_pod` builds it). Exit 0: the pod is deleted and the step is done. Any
    other end (non-zero exit, the kubelet refusing it, its `timeout_s` deadline) fails the
    step with the pod's own words, and the pod is kept for its logs.

    The pod's name is fixed by run and node: after a restart the step finds its pod (or
    the record that it passed) instead of starting a second one. A namespace that does not
    exist fails the step. The step allows `timeout_s` plus a minute; the pod's own
    deadline normally ends it first.

    A `diag` check holds every GPU the node advertises and passes only when its JSON
    (read from the pod's log, capped; where the log cannot be read, from its termination
    message) reads and every test passed on every GPU: a failed test, a DCGM runtime
    error or output that does not read fails the step, quoting the failed tests."""

    params = GpuCheckParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, GpuCheckParams).timeout(300, kind=ctx.kind) + dt.timedelta(seconds=check_pod.STEP_GRACE_SECONDS)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        spec = check_pod.CheckSpec.from_params(params_of(ctx, GpuCheckParams))
        if spec is None:
            raise StepParamsError(say.gpu_check_params())
        return {"pod": f"{spec.namespace}/{check_pod.pod_name(ctx.run_id, ctx.node, purpose=spec.purpose)}"}

    def advance(self, ctx: StepContext) -> Outcome:
        spec = check_pod.CheckSpec.from_params(params_of(ctx, GpuCheckParams))
        assert spec is not None  # prepare refused anything else
        namespace, name = pod_ref(ctx.intent["pod"])
        shown = check_pod.shown_check(spec)
        try:
            found = ctx.gateway.get_pod(namespace, name)
        except NotFound:
            found = None
        if ctx.recorded("gpu-check.passed"):
            # It passed before a restart: the pod goes (if the restart came before its
            # delete), and is never run again.
            if found is not None and not found.pod.deleting:
                ctx.act()
                with contextlib.suppress(NotFound, Conflict):
                    ctx.gateway.delete_pod(namespace, name, uid=found.uid, dry_run=False)
            return Done(say.gpu_check_passed(ctx.intent["pod"], shown))
        if found is None:
            count = check_pod.held_count(spec, ctx.node_inventory() if spec.count == "all" else None)
            if count is None:
                return Waiting(say.gpu_check_no_devices(ctx.intent["pod"], spec.resource), retry_in=2.0)
            manifest = check_pod.manifest(spec, name=name, node=ctx.node, run_id=ctx.run_id, count=count)
            if not ctx.dry_run:
                ctx.record(key="gpu-check.start", action="gpu-check.start", target=f"pod {ctx.intent['pod']}",
                           detail={"node": ctx.node, "image": spec.image, "command": list(spec.command),
                                   "resource": spec.resource, "count": count})
            ctx.act()
            try:
                ctx.gateway.create_pod(namespace, manifest, dry_run=ctx.dry_run)
            except Conflict:
                pass  # created before a restart; read it next time
            except NotFound:
                return Failed(say.gpu_check_no_namespace(namespace), code="gpu-check-no-namespace")
            if ctx.dry_run:
                return Done(say.would_run_gpu_check(ctx.intent["pod"], shown))
            return Waiting(say.gpu_check_started(ctx.intent["pod"], shown), retry_in=2.0)
        pod = found.pod
        if pod.deleting:
            # Deleted by someone before it answered: start it again once it is gone.
            return Waiting(say.gpu_check_deleted_meanwhile(ctx.intent["pod"]), retry_in=2.0)
        result = check_pod.result_of(pod)
        if result is None:
            return Waiting(say.gpu_check_running(ctx.intent["pod"], shown, check_pod.waiting_reason(pod)),
                           retry_in=2.0)
        passed_note = say.gpu_check_passed(ctx.intent["pod"], shown)
        if spec.diag is not None:
            read = _diag_read(ctx, pod, result, namespace=namespace, name=name, shown=shown)
            if isinstance(read, Failed):
                return read
            passed_note = say.diag_passed(ctx.intent["pod"], shown, tests=len({r.test for r in read.results}),
                                          gpus=len(read.gpus),
                                          version=read.version)
        elif not result.passed:
            return Failed(say.gpu_check_failed(ctx.node, ctx.intent["pod"], shown, exit_code=result.exit_code,
                                               reason=result.reason, message=result.message),
                          {"exit_code": result.exit_code, "reason": result.reason, "message": result.message},
                          code="gpu-check-failed")
        ctx.record(key="gpu-check.passed", action="gpu-check.passed", target=f"pod {ctx.intent['pod']}",
                   detail={"node": ctx.node, "exit_code": result.exit_code})
        ctx.act()
        with contextlib.suppress(NotFound, Conflict):
            ctx.gateway.delete_pod(namespace, name, uid=found.uid, dry_run=False)
        return Done(passed_note)


def _diag_read(ctx: StepContext, pod: PodObject, result: check_pod.CheckResult, *,
               namespace: str, name: str, shown: str) -> Failed | dcgm_diag.DiagReport:
    """Why a finished diag check fails the node, or its report when it passed."""
    try:
        output: str | None = ctx.gateway.read_pod_log(namespace, name, container=check_pod.CONTAINER,
                                                       limit_bytes=dcgm_diag.LOG_LIMIT_BYTES)
    except KubeError:
        # NB: no log (no pods/log grant, a node whose kubelet does not answer): the
        # command copied the report's first 4 KiB to its termination message.
        output = None
    if not output or "{" not in output:
        output = check_pod.termination_message(pod)
    try:
        report = dcgm_diag.parse(output)
    except dcgm_diag.DiagUnreadable as err:
        return Failed(say.diag_unreadable(ctx.node, ctx.intent["pod"], shown, str(err), exit_code=result.exit_code,
                                          reason=result.reason),
                      {"exit_code": result.exit_code, "reason": result.reason, "unreadable": str(err)},
                      code="gpu-check-failed")
    if report.passed and result.passed:
        return report
    failures = report.failures
    quoted = [say.diag_failure(f.test, f.gpu, f.warnings) for f in failures[:dcgm_diag.QUOTED]]
    if not quoted and report.runtime_error is None:
        # Every test passed but dcgmi did not exit 0: the exit code decides.
        return Failed(say.gpu_check_failed(ctx.node, ctx.intent["pod"], shown, exit_code=result.exit_code,
                                           reason=result.reason, message=result.message),
                      {"exit_code": result.exit_code, "reason": result.reason}, code="gpu-check-failed")
    return Failed(say.diag_failed(ctx.node, ctx.intent["pod"], shown, quoted,
                                  more=max(0, len(failures) - len(quoted)), runtime_error=report.runtime_error),
                  {"exit_code": result.exit_code, "dcgm": report.version, "shape": report.shape,
                   "failed": [{"test": f.test, "gpu": f.gpu, "status": f.status} for f in failures]},
                  code="gpu-check-failed")
