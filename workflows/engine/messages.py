"""Every sentence a person reads about what a step does: its notes (in the step's detail,
shown by `/gpu request`), what it waits for, its notices in the request's thread, and the
refusals of its params. Say what happened to which node, and what is left for a person
to do. Nothing here decides anything; `workflows.engine.steps` chooses.

The engine's other sentences live by topic beside it: a run's progress (`run_messages`),
halts and aborts (`halt_messages`), why a request or run waits (`wait_messages`), refusals
about runs (`refusal_messages`), continuing a halted run (`continue_messages`) and cordon
marks outside a run (`cordon_messages`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from workflows.engine.phrases import listed, span
from workflows.wording import names, when


# --- cordon and uncordon -------------------------------------------------------------------

def cordoned(*, prior_unschedulable: bool, dry_run: bool) -> str:
    if prior_unschedulable:
        return ("already cordoned by someone else: " + ("would mark" if dry_run else "marked")
                + " it, and it will stay cordoned at the end")
    return "would cordon it (it was schedulable)" if dry_run else "cordoned (it was schedulable)"


def cordon_in_place(prior_unschedulable: bool) -> str:
    return ("this run's cordon mark is in place (it was cordoned before this run, and stays so)"
            if prior_unschedulable else "cordoned by this run (found in place)")


def cordoned_by_other_run(run: str, by: str) -> str:
    return (f"already cordoned by gpuops run {run} ({by}); left to that run: this run will not "
            "uncordon it")


def node_in_other_run(node: str, run: str, by: str) -> str:
    return (f"{node} is cordoned by gpuops run {run} ({by}), which has not finished; two runs must not "
            "change one node at once. Let that run finish, or abort it, then start this one again")


def node_changed_meanwhile(node: str) -> str:
    return f"{node} changed while gpuops was changing it; reading it again"


def not_ours_to_uncordon(unschedulable: bool) -> str:
    state = "cordoned" if unschedulable else "schedulable"
    return f"not cordoned by this run: left as it is ({state})"


def stays_cordoned() -> str:
    return "stays cordoned: it was cordoned before this run; only gpuops' mark was removed"


def uncordoned() -> str:
    return "uncordoned"


def would_uncordon() -> str:
    return "would uncordon it"


# --- evict ------------------------------------------------------------------------------

def requests_gpus(resources: Mapping[str, int]) -> str:
    return "uses GPUs: " + ", ".join(f"{name}={n}" for name, n in sorted(resources.items()))


def visible_devices(value: str) -> str:
    return (f"uses GPUs without requesting them (env NVIDIA_VISIBLE_DEVICES={value}): evicted, or "
            "the driver could not unload")


def gpu_user_label(label: str) -> str:
    return f"uses GPUs without requesting them (label {label}=true)"


def already_terminating() -> str:
    return "already terminating: waited for, not evicted"


def finished_pod(phase: str) -> str:
    return f"finished ({phase}): holds nothing, left alone"


def mirror_pod() -> str:
    return "a static (mirror) pod: the kubelet owns it, so it cannot be evicted; left alone"


def daemonset_pod(daemonset: str, gpu: str | None) -> str:
    text = f"DaemonSet {daemonset} pod: not evicted, its controller would put it straight back"
    return text + (f" (NB: it {gpu})" if gpu else "")


def drain_scope() -> str:
    return "uses no GPU; evicted because a drain empties the node (scope all)"


def not_a_gpu_pod() -> str:
    return "uses no GPU: left running (scope gpu)"


def evicted(count: int, skipped: Sequence[str], *, dry_run: bool) -> str:
    """`skipped`: the pods left alone, named (the step's detail is nothing a person can open)."""
    text = f"{'would evict' if dry_run else 'evicted'} {count} pod{'s' if count != 1 else ''}"
    return text + (f"; {len(skipped)} left alone ({names(skipped, at_most=3)})" if skipped else "")


def would_evict(count: int, blocked: Mapping[str, str], skipped: Sequence[str]) -> str:
    text = evicted(count, skipped, dry_run=True)
    if blocked:
        text += "; a PodDisruptionBudget would block " + listed(sorted(blocked)) + " right now"
    return text


def eviction_blocked(blocked: Mapping[str, str]) -> str:
    pod, why = sorted(blocked.items())[0]
    more = f" (and {len(blocked) - 1} more)" if len(blocked) > 1 else ""
    return f"eviction of {pod}{more} is blocked by a PodDisruptionBudget: {why}"


def eviction_throttled(throttled: Mapping[str, str]) -> str:
    pod, why = sorted(throttled.items())[0]
    more = f" (and {len(throttled) - 1} more)" if len(throttled) > 1 else ""
    return f"the API server asked to slow down the eviction of {pod}{more} (429, not a PodDisruptionBudget): {why}"


def eviction_blocked_timeout(node: str, blocked: Mapping[str, str], timeout: dt.timedelta | None) -> str:
    return (f"{node}: {eviction_blocked(blocked)}; gave up after {span(timeout)}. Free the "
            "budget (scale the workload up elsewhere) or move the pod by hand, then start a new run")


_THEN = {"fail": "the run halts with the node cordoned, for a person to decide",
         "skip": "the node is left out of the run and uncordoned",
         "delete": "the blocked pods are deleted, bypassing the budget"}


def pdb_blocking(node: str, blocked: Mapping[str, str], *, deadline: dt.datetime | None, then: str | None,
                 zone: dt.tzinfo) -> str:
    """`then`: the step's on_timeout (None or unknown: fail)."""
    until = f"until {when(deadline, zone, style='second')}" if deadline is not None else "for now"
    return (f"{node}: {eviction_blocked(blocked)}. Retrying {until}; then "
            f"{_THEN.get(then or 'fail', _THEN['fail'])}. Scaling the workload up elsewhere frees the budget")


def left_out_blocked(node: str, blocked: Mapping[str, str], timeout: dt.timedelta | None) -> str:
    return (f"{node} is left out of this run: {eviction_blocked(blocked)} still, after "
            f"{span(timeout)}. Its remaining pods keep running; it is uncordoned and the run "
            "goes on with the other nodes")


def window_ending(until: dt.datetime, *, request_id: str, zone: dt.tzinfo) -> str:
    return (f"The drain window ends at {when(until, zone, style='second')}: the nodes are then validated and uncordoned. "
            f"Need longer? `/gpu drain extend {request_id} <duration>`")


def open_drain_limit_ending(until: dt.datetime, *, zone: dt.tzinfo) -> str:
    return (f"This drain has no end of its own and reaches the pool's limit for open-ended drains "
            f"(open_drain_max) at {when(until, zone, style='second')}: the nodes are then validated and uncordoned.")


def watching_for_return() -> str:
    return ("the evicted pods are gone; they tolerate the cordon, so gpuops looks a few seconds more for "
            "replacements that land on this node again")


def pod_and_owner(pod: str, owner: str | None) -> str:
    return f"{pod} ({owner})" if owner else pod


def pods_returned(node: str, pods: Sequence[str], retries: int) -> str:
    return (f"{listed(pods)} came back to {node} right after eviction: {'they tolerate' if len(pods) > 1 else 'it tolerates'} "
            f"node.kubernetes.io/unschedulable, so the scheduler places {'them' if len(pods) > 1 else 'it'} on the "
            f"cordoned node again. gpuops evicts again up to {retries} time{'s' if retries != 1 else ''}, then halts "
            "the run with the node cordoned")


def pods_keep_returning(node: str, pods: Sequence[str], retries: int) -> str:
    return (f"{listed(pods)} kept coming back to {node} after {retries} more eviction{'s' if retries != 1 else ''} "
            "(they tolerate node.kubernetes.io/unschedulable): remove that toleration from their owners, or scale "
            "them down, then start a new run")


def waiting_for_pods_to_go(pods: Sequence[str]) -> str:
    return f"waiting for {listed(pods)} to terminate"


def pods_would_not_go(pods: Sequence[str]) -> str:
    return f"{listed(pods)} did not terminate within 2 minutes of being deleted"


def escalated(why: str) -> str:
    return f"deleted despite its PodDisruptionBudget (on_timeout: delete) after: {why}"


def deleted_blocked_pods(pods: Sequence[str]) -> str:
    return f"eviction timed out; deleted {listed(pods)} despite the budget (on_timeout: delete)"


# --- wait-for -----------------------------------------------------------------------------

def node_ready_text(ready: bool | None) -> str:
    return {True: "node Ready", False: "node NotReady", None: "node readiness unknown"}[ready]


def advertised_text(advertised: int, allocatable: int, expected: int | None) -> str:
    if expected is None:
        return f"{advertised} GPUs advertised, expected count unknown (no GFD labels)"
    return f"{advertised}/{expected} GPUs advertised ({allocatable} allocatable)"


def host_driver() -> str:
    return "host driver"


def mig_state_text(config: str | None, state: str | None) -> str:
    return f"MIG {config or 'not configured'} ({state or 'no state'})"


def unknown_conditions(unknown: Sequence[str], known: Sequence[str]) -> str:
    if not unknown:
        return "wait-for needs at least one condition: " + ", ".join(known)
    return f"unknown condition {', '.join(unknown)}; use: {', '.join(known)}"


def node_not_in_cache(node: str) -> str:
    return f"{node} is not in the fleet view (not a GPU node, or deleted)"


def conditions_hold(names: Sequence[str]) -> str:
    return "holds: " + ", ".join(names)


def waiting_on_conditions(unmet: Sequence[str]) -> str:
    return "waiting: " + "; ".join(unmet)


def would_wait_for(unmet: Sequence[str]) -> str:
    return "would wait, now: " + "; ".join(unmet)


def jobs_finished(selector: str) -> str:
    return f"no pod matching {selector} runs here"


def waiting_for_jobs(running: Sequence[str]) -> str:
    return f"waiting for {listed(running)} to finish"


def would_wait_for_jobs(running: Sequence[str]) -> str:
    return f"would wait for {listed(running)} to finish"


def jobs_still_running_continue(running: Sequence[str]) -> str:
    return f"time is up; carrying on although {listed(running)} still run (on_timeout: continue)"


# --- driver and MIG --------------------------------------------------------------------------

def gpu_pods_in_the_way(pods: Sequence[str], change: str) -> str:
    return (f"not {change} while GPU pods still run here: {listed(pods)} (they came back or were never "
            "evicted; evict them, or set allow_gpu_pods)")


def no_driver_pod(node: str) -> str:
    return (f"{node} runs no GPU Operator driver pod (a host driver, or the operator does not manage "
            "it): gpuops does not change host drivers")


def driver_already_at(version: str) -> str:
    return f"the driver pod already runs {version} and is Ready: not restarted"


def would_restart_driver(pod: str) -> str:
    return f"would delete driver pod {pod}; its DaemonSet would start a new one from the current template"


def driver_deleted(pod: str) -> str:
    return f"deleted driver pod {pod}; waiting for its DaemonSet to start a new one"


def waiting_for_new_driver_pod() -> str:
    return "waiting for the DaemonSet to start a new driver pod"


def new_driver_failing(pod: str, text: str) -> str:
    return f"the new driver pod {pod} is failing: {text}"


def new_driver_not_ready(pod: str, text: str) -> str:
    return f"waiting for the new driver pod {pod} to be Ready (now: {text})"


def new_driver_wrong_version(pod: str, version: str | None, wanted: str) -> str:
    return (f"the new driver pod {pod} runs {version or 'an unknown version'}, not {wanted}: update "
            "the ClusterPolicy (or NVIDIADriver) driver version first")


def driver_restarted(pod: str, version: str | None) -> str:
    return f"new driver pod {pod} is Ready" + (f" ({version})" if version else "")


def would_set_mig(config: str, prior: str | None) -> str:
    return f"would set nvidia.com/mig.config to {config} (now {prior or 'unset'})"


def would_leave_mig(config: str, state: str | None, advertised: str) -> str:
    return (f"would leave nvidia.com/mig.config at {config}, already set (the MIG manager reports "
            f"{state or 'nothing yet'}; advertising {advertised})")


def mig_requested(config: str) -> str:
    return f"asked the MIG manager for {config}; waiting for it to start"


def mig_applied(config: str) -> str:
    return f"MIG layout {config} applied"


def mig_failed(node: str, config: str) -> str:
    return (f"the MIG manager on {node} reports failed for {config} (nvidia.com/mig.config.state=failed); "
            "its log says why")


def mig_waiting(config: str, state: str | None, paused: Sequence[str] = (), advertised: str | None = None) -> str:
    text = f"waiting for the MIG manager to apply {config} (state: {state or 'not started'})"
    if paused:
        text += f"; operands still paused-for-mig-change: {', '.join(paused)}"
    if advertised is not None:
        text += f"; advertising {advertised}"
    return text


def mig_not_advertised(config: str, advertised: str, expected: str) -> str:
    return f"MIG layout {config} applied; waiting for the node to advertise {expected} (now {advertised})"


def held_until(until: dt.datetime | None, *, dry_run: bool, zone: dt.tzinfo, open_ended: bool = False) -> str:
    if until is None and open_ended:
        return "would hold until someone says `drain done`"
    if until is None:
        return "nothing to hold for (no window end)"
    at = when(until, zone, style='second')
    return f"would hold until {at}" if dry_run else f"held until {at}"


def holding_until_released() -> str:
    return "holding until someone says `drain done`"


def holding_until(until: dt.datetime, *, zone: dt.tzinfo) -> str:
    return f"holding until {when(until, zone, style='second')}"


def driver_version_params() -> str:
    return ('a driver-version step needs params.object (ClusterPolicy or NVIDIADriver), params.name and '
            'params.version')


def driver_version_set(ref: str, prior: str | None, version: str) -> str:
    return f"{ref}: driver version {prior or 'unset'} -> {version}"


def driver_version_already(ref: str, version: str) -> str:
    return f"{ref} already names driver {version}: not changed"


def would_set_driver_version(ref: str, prior: str | None, version: str) -> str:
    return f"would set {ref}'s driver version {prior or 'unset'} -> {version}"


def driver_version_changed_meanwhile(ref: str, prior: str | None, current: str | None, version: str) -> str:
    return (f"{ref} changed since the step began ({prior or 'unset'} -> {current or 'unset'}, by someone else): "
            f"not setting {version} over it; check who changed it before running again")


def driver_version_set_back(ref: str, run_set: str, back: str | None, nodes_wait: str) -> str:
    if back is None:
        return (f"{ref} names no driver version again, as before this run ({run_set} taken away): a driver pod "
                f"that restarts now takes the driver it took before the run; {nodes_wait}")
    return (f"{ref} set back from {run_set} to {back}, the version this run replaced: a driver pod that restarts "
            f"now takes {back} again; {nodes_wait}")


def set_back_nodes_wait(node: str, run: str) -> str:
    return f"{node}, already changed, stays as it is for a rollback (`/gpu rollback {run}`)"


def set_back_nothing(ref: str) -> str:
    return f"{ref}: this run changed no driver version, nothing to set back"


def set_back_already(ref: str, back: str | None) -> str:
    return f"{ref} names {back or 'no version'} again already (set back by someone else): not changed"


def set_back_left_alone(ref: str, current: str | None, run_set: str) -> str:
    return (f"{ref} names {current or 'no version'} now, not {run_set} as this run set it: someone changed it "
            "since, so gpuops leaves it as it is")


def set_back_in_git(ref: str, owner: str, field: str, run_set: str, back: str | None, nodes_wait: str) -> str:
    change = (f"Set {field} back from {run_set} to {back} in Git" if back is not None
              else f"Take {field} ({run_set}) out again in Git, where it named no version before this run")
    return (f"{ref} is kept by {owner}: gpuops did not change it (a sync would put {run_set} back). {change}: "
            f"until then any node whose driver pod restarts installs {run_set}; {nodes_wait}")


def would_set_back(ref: str, run_set: str, back: str | None) -> str:
    if back is None:
        return f"would take {ref}'s driver version {run_set} away again (it named none before this run)"
    return f"would set {ref}'s driver version back from {run_set} to {back}"


def set_back_reading_again(ref: str) -> str:
    return f"{ref} changed while its version was being set back; reading it again"


def git_owner_argo(tracking: str) -> str:
    return f"Argo CD ({tracking})"


def git_owner_flux(controller: str, name: str, namespace: str | None) -> str:
    return f"Flux ({controller} {namespace + '/' if namespace else ''}{name})"


def git_owner_unnamed() -> str:
    return "the GitOps tool that applies it"


def change_in_git(ref: str, owner: str, field: str, prior: str | None, version: str) -> str:
    return (f"Git mode: change {field} of {ref} from {prior or 'no version'} to {version} in Git; {owner} applies "
            f"it. Waiting (inside the window) for {ref} to name {version}; the nodes stay as they are meanwhile")


def git_applied(ref: str, owner: str, version: str) -> str:
    return f"{ref} names {version} now, applied from Git by {owner}"


def git_applied_other(ref: str, owner: str, current: str | None, version: str, prior: str | None) -> str:
    return (f"{ref} names {current or 'no version'}, applied by {owner}, not the approved {version}: the run stops "
            f"before any node moves. Set it in Git to {version} and ask again, or back to {prior or 'what it was'}")


def git_window_ended(ref: str, field: str, version: str, released: list[str]) -> str:
    back = f"; {len(released)} held node(s) given back to the operator" if released else ""
    return (f"the window ended before Git changed {field} of {ref} to {version}: no node was changed{back}. "
            "Continue the run in a later window once Git names it, or close it")


def would_wait_for_git(ref: str, owner: str, field: str, version: str) -> str:
    return f"would ask for {field} of {ref} to be set to {version} in Git and wait for {owner} to apply it"


def driver_template_not_yet(version: str, behind: list[str]) -> str:
    return (f"waiting for the GPU Operator to put driver {version} into the DaemonSet that runs this node's "
            f"driver (now: {', '.join(behind)}) before restarting the pod")


def no_driver_daemonset() -> str:
    return "no driver DaemonSet selects this node"


def cordon_taken_over(run: str, *, prior_unschedulable: bool) -> str:
    then = "it was cordoned before that run, so it stays cordoned" if prior_unschedulable else \
        "it is given back at the end"
    return f"took over the cordon run {run} left: {then}"


# ---- gating the GPU Operator's own upgrade (autoUpgrade on)

_SKIP = "nvidia.com/gpu-driver-upgrade.skip=true"
# What the operator's upgrade controller is doing in each of its states.
_OPERATOR_STATES = {
    "upgrade-required": "queued: it starts the node when it next looks (at least every 2 minutes)",
    "cordon-required": "cordoning",
    "wait-for-jobs-required": "waiting for the selected jobs to finish",
    "pod-deletion-required": "deleting the node's GPU pods",
    "drain-required": "draining",
    "pod-restart-required": "restarting the driver pod",
    "validation-required": "waiting for the validator",
    "uncordon-required": "finishing",
    "upgrade-done": "done, but the node's driver pod is not the new one yet",
    "upgrade-failed": "failed",
}


def operator_held(nodes: Sequence[str], *, dry_run: bool = False) -> str:
    verb = "would hold" if dry_run else "held"
    return (f"{verb} {len(nodes)} node(s) back from the GPU Operator's own upgrade ({_SKIP}) until their "
            f"turn: {listed(nodes)}" if nodes else "no node to hold back from the GPU Operator's upgrade")


def operator_released(nodes: Sequence[str], *, dry_run: bool = False) -> str:
    verb = "would give" if dry_run else "gave"
    return (f"{verb} {len(nodes)} node(s) held by gpuops back to the GPU Operator's upgrade controller: "
            f"{listed(nodes)}" if nodes else "no node held by gpuops to give back")


def operator_hold_params() -> str:
    return "an operator-hold step needs params.nodes, a list of node names"


def operator_upgrade_params() -> str:
    return "an operator-upgrade step needs the driver version in params.version"


def operator_let_go(node: str, *, dry_run: bool = False) -> str:
    return (f"{'would remove' if dry_run else 'removed'} {_SKIP} from {node}: the GPU Operator's upgrade "
            "controller may now upgrade it (gpuops gives the node back after its own checks)")


def operator_skip_by_person(node: str) -> str:
    return (f"someone labelled {node} {_SKIP}: the GPU Operator will not upgrade it while that stays; "
            "remove the label to let the run go on, or abort the run")


def operator_not_following(node: str) -> str:
    return (f"{node} has no nvidia.com/gpu-driver-upgrade-state label: the GPU Operator's upgrade controller "
            "is not following it (is autoUpgrade still on?)")


def operator_upgrading(state: str) -> str:
    return f"the GPU Operator is upgrading this node: {state} ({_OPERATOR_STATES.get(state, 'a state gpuops does not know')})"


def operator_upgrade_failed(node: str, pod_text: str | None) -> str:
    text = (f"the GPU Operator marked {node} upgrade-failed" + (f" (driver pod: {pod_text})" if pod_text else "")
            + "; the node stays cordoned, the nodes not yet upgraded stay held back")
    return text


def operator_restarting_failed_pod(pod: str) -> str:
    return (f"deleted the failed driver pod {pod}: the operator does not replace a pod on an upgrade-failed "
            "node itself")


def operator_upgraded(pod: str, version: str) -> str:
    return f"the GPU Operator upgraded the node: driver pod {pod} runs {version} and is Ready (upgrade-done)"


def would_follow_operator(node: str, version: str) -> str:
    return f"would let the GPU Operator upgrade {node} to {version} and follow it"


# ---- the canary pod (gpu-check)


def gpu_check_params() -> str:
    return ("a gpu-check step needs params namespace, image, command (a list), resource and timeout_s; "
            "the plan writes them from the configuration's gpu_check")


def gpu_check_started(pod: str, command: str) -> str:
    return f"started the check pod {pod} (`{command}`)"


def would_run_gpu_check(pod: str, command: str) -> str:
    return f"would run the check pod {pod} (`{command}`); the API server accepted it (dry run)"


def gpu_check_running(pod: str, command: str, waiting: str | None) -> str:
    return f"waiting for the check pod {pod} (`{command}`) to finish" + (f": {waiting}" if waiting else "")


def gpu_check_deleted_meanwhile(pod: str) -> str:
    return f"the check pod {pod} was deleted before it answered; it starts again once it is gone"


def gpu_check_no_namespace(namespace: str) -> str:
    return (f"the check pod's namespace {namespace} does not exist: create it (with the bot's pod-create Role, "
            "as in deploy/rbac.yaml) or set gpu_check.namespace, then roll back or retry")


def gpu_check_passed(pod: str, command: str) -> str:
    return f"the check pod {pod} (`{command}`) exited 0"


def gpu_check_failed(node: str, pod: str, command: str, *, exit_code: int | None, reason: str | None,
                     message: str | None) -> str:
    how = f"exited {exit_code}" if exit_code is not None else "did not run to the end"
    if reason:
        how += f" ({reason})"
    text = f"the check pod on {node} failed: `{command}` {how}"
    if message:
        text += f': "{" / ".join(line.strip() for line in message.splitlines() if line.strip())}"'
    return text + f"; {node} stays cordoned and the pod {pod} is kept for its logs"


def gpu_check_no_devices(pod: str, resource: str) -> str:
    return f"waiting to start the check pod {pod}: the node advertises no {resource} to hold yet"


def diag_passed(pod: str, command: str, *, tests: int, gpus: int, version: str | None) -> str:
    dcgm = f" (DCGM {version})" if version else ""
    return f"the check pod {pod} (`{command}`){dcgm} passed {tests} tests on {gpus} GPUs"


def diag_failed(node: str, pod: str, command: str, failures: Sequence[str], *, more: int,
                runtime_error: str | None) -> str:
    if runtime_error:
        what = f'DCGM could not run: "{runtime_error.strip()}"'
    else:
        what = "failed " + "; ".join(failures) + (f"; and {more} more" if more else "")
    return f"the diagnostics on {node} (`{command}`) {what}; {node} stays cordoned and the pod {pod} is kept for its logs"


def diag_failure(test: str, gpu: str, warnings: Sequence[str]) -> str:
    where = "" if gpu == "all" else f" on GPU {gpu}"
    said = f': "{warnings[0]}"' if warnings else ""
    return f"{test}{where}{said}"


def diag_unreadable(node: str, pod: str, command: str, why: str, *, exit_code: int | None,
                    reason: str | None) -> str:
    ended = (f"it ran out of time ({reason})" if reason == "DeadlineExceeded"
             else f"it exited {exit_code}" if exit_code is not None else f"it did not run to the end ({reason})")
    return (f"the diagnostics on {node} (`{command}`) gave no result gpuops can read ({why}); {ended}; "
            f"{node} stays cordoned and the pod {pod} is kept for its logs")


# ---- moving a node from a host driver to the operator


def snapshot_taken(node: str, labels: int, taints: int) -> str:
    return f"recorded {node}'s {labels} labels, its annotations and {taints} taints: what a rollback puts back"


def operator_driver_state(present: bool, text: str, owner: str) -> str:
    if not present:
        return f"no GPU Operator driver pod yet (driver owner: {owner})"
    return f"operator driver pod {text} (driver owner: {owner})"


def host_driver_by_hand(node: str, *, run: str, request: str, install: bool) -> str:
    if install:
        what = ("the operator's driver is off it. Someone with access to it: install the host's NVIDIA driver "
                "packages (and reboot if they say so), then press *Host driver installed*")
    else:
        what = ("someone with access to it: remove the host's NVIDIA driver packages (and reboot if they say so), "
                "then press *Host driver removed*")
    return (f"{node} is cordoned and drained; {what} on `/gpu request {request}` or type `/gpu migrate confirm "
            f"{run}`. gpuops cannot log into nodes")


def waiting_for_host_driver(node: str, *, install: bool) -> str:
    return f"waiting for a person to {'install' if install else 'remove'} the host driver {'on' if install else 'from'} {node} and confirm it"


def would_wait_for_host_driver(node: str, *, install: bool) -> str:
    return "would wait " + waiting_for_host_driver(node, install=install).removeprefix("waiting ")


def host_driver_confirmed(node: str, who: str, *, install: bool = False) -> str:
    return f"{who} confirmed the host driver is {'installed on' if install else 'gone from'} {node}"


def host_driver_evidence(node: str, *, install: bool, validator: str, advertised: int) -> str:
    """What the node shows once its driver changed by hand (no operator driver pod)."""
    if install:
        return (f"{node} has a working driver and no operator driver pod: validator {validator}, "
                f"{advertised} GPUs advertised")
    return (f"{node} no longer has a working driver: no operator driver pod, validator {validator} "
            f"(waiting for a driver), {advertised} GPUs advertised")


def host_driver_detected(evidence: str, *, install: bool) -> str:
    return f"the host driver is {'installed' if install else 'gone'}, by the node's evidence: {evidence}"


def host_driver_evidence_seen(evidence: str, *, install: bool) -> str:
    what = "are installed" if install else "are gone (a driver that stopped is not proof: a leftover install loads again at the next boot)"
    return f"{evidence}; confirm once its packages {what}"


def host_driver_no_before(node: str, *, install: bool) -> str:
    was = "already had a working driver" if install else "had no working host driver"
    return (f"{node} {was} when this step began, so its evidence cannot tell the change: "
            "waiting for a person to confirm")


def node_labels_params() -> str:
    return "a node-labels step needs params.labels, a map of label to value (null removes it)"


def labels_set(node: str, labels: Mapping[str, str | None], *, dry_run: bool) -> str:
    shown = ", ".join(f"{k}={v}" if v is not None else f"{k} removed" for k, v in sorted(labels.items()))
    return f"{'would set' if dry_run else 'set'} on {node}: {shown}"


def restore_params() -> str:
    return "a restore step needs params labels (the snapshot's), keys (the labels to put back) and taints"


def restored(node: str, labels: Mapping[str, str | None], taints: int) -> str:
    shown = ", ".join(f"{k}={v}" if v is not None else f"{k} removed" for k, v in sorted(labels.items()))
    return (f"{node} is back as its snapshot had it: {shown}; {taints} taint{'s' if taints != 1 else ''}; "
            "it stays cordoned")


def restore_conflict(node: str) -> str:
    return f"{node} changed while it was being restored; reading it again"
