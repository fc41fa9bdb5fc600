"""The sentences the /gpu commands say; those of change freezes, GPU quotas and several
clusters live in `freeze_messages`, `quota_messages` and `cluster_messages` beside it."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

from workflows.access import Actor, Role, effective_roles, public_name, unread_note
from workflows.drain.messages import LAST_DRAINED
from workflows.requests.messages import OPEN_DRAIN_END
from workflows.fleet.pool import PoolInventory

HELP_COLUMNS = ("command", "what it does", "role")


def usage_title(usage: str) -> str:
    return f"Usage: /gpu {usage}"


def examples_line(examples: tuple[str, ...]) -> str:
    return "Examples: " + " · ".join(f"`{e}`" for e in examples)


def example(text: str) -> str:
    return f"`{text}`"


def cannot_read_command() -> str:
    return "Could not read that command"


def unbalanced_quotes(detail: str) -> str:
    return f"The quotes do not pair up ({detail}). Quote a reason like \"driver reset\"."


def unknown_command(words: str) -> str:
    return f"Unknown command: {words}"


def did_you_mean(names: list[str]) -> str:
    if not names:
        return "No command is close to that."
    return "Did you mean " + " or ".join(f"`/gpu {n}`" for n in names) + "?"


def see_help() -> str:
    return "`/gpu help` lists every command."


def not_allowed_title() -> str:
    return "Not allowed"


def not_found_title() -> str:
    return "Not found"


def held_roles(actor: Actor) -> str:
    return ", ".join(sorted(effective_roles(actor.roles))) or "no role"


def needs_role(command: str, role: Role, actor: Actor) -> str:
    return f"`/gpu {command}` needs the {role} role; {actor.name} has {held_roles(actor)}{unread_note(actor)}."


def no_role(actor: Actor) -> str:
    return f"{actor.name} has no gpuops role. Ask a gpuops admin to add you to the configuration."


def role_needed(role: Role, held: bool) -> str:
    return f"Needs the {role} role" + (" (you have it)." if held else " (you do not have it).")


# /gpu help fits a 100-column terminal: the command's name (its usage is one `/gpu help
# <command>` away), what it does wrapped onto rows of its own, and the role.
HELP_WIDTH = 100
_HELP_NAME_WIDTH = 22
_HELP_ROLE_WIDTH = 8


def help_rows(name: str, summary: str, role: str) -> list[tuple[str, str, str]]:
    width = HELP_WIDTH - _HELP_NAME_WIDTH - _HELP_ROLE_WIDTH - 4  # two spaces between columns
    lines = textwrap.wrap(summary, width) or [""]
    return [(f"/gpu {name}" if i == 0 else "", line, role if i == 0 else "") for i, line in enumerate(lines)]


def help_title() -> str:
    return "gpuops: GPU fleet operations"


def help_summary() -> str:
    return "Commands you can run. `/gpu help <command>` shows its words and examples."


# --- fleet -----------------------------------------------------------------------------

def chart_from_prometheus(url: str) -> str:
    return f"Prometheus at {url}"


def chart_from_samples(why_not_prometheus: str | None = None) -> str:
    return "gpuops' samples" + (f"; {why_not_prometheus}" if why_not_prometheus else "")


def chart_no_prometheus_series() -> str:
    return "Prometheus has no gpuops_pool_gpus series for this pool"


def chart_needs_pool() -> str:
    return "--chart draws one pool's capacity: name the pool, e.g. status serving-a --chart"


def unknown_name(kind: str, name: str, closest: list[str], known: int) -> str:
    if closest:
        return f"No {kind} named `{name}`. Closest: " + ", ".join(f"`{c}`" for c in closest) + "."
    return f"No {kind} named `{name}` ({known} {kind}s known)."


def no_operator() -> str:
    return "No GPU Operator found in this cluster (no ClusterPolicy CRD or operator Deployment)."


def status_title(pool: str | None = None) -> str:
    return f"GPU pool {pool}" if pool else "GPU fleet status"


def fleet_summary(*, nodes: int, ready: int, cordoned: Sequence[tuple[str | None, int]], physical: int,
                  advertised: int, expected: int, slices: int, critical: int, warning: int) -> str:
    """The status line. `cordoned`: (the gpuops run that cordoned it, or None for a person;
    its advertised GPUs) per cordoned node."""
    problems = []
    if critical:
        problems.append(f"{critical} critical")
    if warning:
        problems.append(f"{warning} warning{'s' if warning != 1 else ''}")
    health = ", ".join(problems) if problems else "no problems found"
    parts = [f"{ready}/{nodes} GPU nodes Ready"]
    if cordoned:
        runs = sorted({run for run, _ in cordoned if run})
        by_gpuops = sum(1 for run, _ in cordoned if run)
        by_hand = len(cordoned) - by_gpuops
        who = []
        if by_gpuops:
            who.append(f"{by_gpuops} by gpuops ({', '.join(runs[:3])}{', …' if len(runs) > 3 else ''})")
        if by_hand:
            who.append(f"{by_hand} by hand")
        parts.append(f"{len(cordoned)} cordoned, {sum(g for _, g in cordoned)} GPUs out ({'; '.join(who)})")
    parts.append(f"{physical} physical GPUs")
    slices_text = f", {slices} of them MIG slices" if slices else ""
    parts.append(f"{advertised}/{expected} advertised{slices_text}")
    parts.append(health)
    return " · ".join(parts)


def cordon_cell(*, by: str | None, run: str | None, by_hand: bool) -> str:
    """Who a cordoned node's cordon belongs to. `by_hand`: a person cordoned it before
    the run named by the mark (if any), which keeps it cordoned and leaves it so."""
    if by_hand:
        return f"by hand (kept by {run})" if run else "by hand"
    return f"by {by}" if by else "by hand"


def no_gpu_nodes() -> str:
    return "No GPU nodes found (no node has nvidia.com/gpu.present=true, GFD labels or GPU capacity)."


def more_findings(count: int) -> str:
    return f"and {count} more: `/gpu findings`"


def findings_title(scope: str | None) -> str:
    return f"Findings for {scope}" if scope else "Findings"


def no_findings(scope: str | None) -> str:
    return f"No findings for {scope}." if scope else "No findings: the fleet looks healthy."


def node_title(name: str) -> str:
    return f"GPU node {name}"


OPERAND_COLUMNS = ("operand", "pod", "state", "restarts", "version")
GPU_POD_COLUMNS = ("pod", "owner", "GPUs", "disruption budget")
HAND_SET_COLUMNS = ("what", "key", "value", "set by", "that tool's last write")


def operands_title() -> str:
    return "Operator's pods on the node"


def no_operands(namespace: str | None) -> str:
    return (f"No pod of the operator's namespace {namespace} runs on this node." if namespace
            else "No GPU Operator found, so no operand pods.")


def other_device_plugins_title() -> str:
    return "Device plugins not the operator's"


def gpu_pods_title() -> str:
    return "GPU pods"


def no_gpu_pods() -> str:
    return "No pod holds a GPU on this node."


def bare_pod() -> str:
    return "none (a bare pod)"


def no_budget() -> str:
    return "none"


def budget_unknown() -> str:
    return "unknown"


def hand_set_title() -> str:
    return "Set by a person's tool (labels, taints, annotations)"


def nothing_hand_set() -> str:
    return "Nothing: no label, taint or annotation here is owned by kubectl or another person's tool."


def node_reads_unavailable() -> str:
    return "Not read: this entry point has no Kubernetes API (who set what, and the budgets, need a read of it)."


def hand_set_unknown(reason: str) -> str:
    return f"Who set the node's labels, taints and annotations is unknown: {reason}."


def budgets_unknown_notice(reason: str) -> str:
    return f"The disruption budgets covering these pods are unknown: {reason}."


def uncordoned_title(name: str) -> str:
    return f"Uncordoned {name}"


def uncordon_usage() -> str:
    return "name one node a gpuops run left cordoned, e.g. `/gpu uncordon serving-a-05`"


def request_upgrade_label() -> str:
    return "Request a driver upgrade"


def request_mig_label() -> str:
    return "Request a MIG change"


def request_drain_label() -> str:
    return "Request a drain"


POOL_COLUMNS = ("pool", "kind", "nodes ready", "GPUs adv/expected", "in use", "driver", "auto-upgrade", "problems")
NODE_COLUMNS = ("node", "ready", "cordon", "GPUs adv/expected", "in use", "driver", "owner", "state")
FINDING_COLUMNS = ("severity", "subject", "finding")


# --- requests, runs and the audit log (commands/requests.py) ---------------------------------

REQUEST_COLUMNS = ("request", "kind", "pool", "state", "requester", "approvals", "plan", "expires")
STEP_COLUMNS = ("wave", "node", "step", "state", "note")
# An audit row's "what" cell, at most this long: the whole entry stays in the log.
AUDIT_WHAT_MAX = 200


def audit_what(what: str, *, step: str | None = None) -> str:
    """An audit row's "what": a step's entry names its step ("evict: pending → running")."""
    text = f"{step}: {what}" if step else what
    return text if len(text) <= AUDIT_WHAT_MAX else text[:AUDIT_WHAT_MAX - 1] + "…"


def run_not_started(nodes: Sequence[str], *, first_wave: int, last_wave: int) -> str:
    waves = f"wave {first_wave}" if first_wave == last_wave else f"waves {first_wave}-{last_wave}"
    shown = ", ".join(nodes[:6]) + (f" and {len(nodes) - 6} more" if len(nodes) > 6 else "")
    return f"Not started ({len(nodes)} node{'s' if len(nodes) != 1 else ''}, {waves}): {shown}"


AUDIT_COLUMNS = ("seq", "at", "who", "action", "target", "what")
WAVE_COLUMNS = ("wave", "nodes", "steps per node")


def requests_title(pool: str | None) -> str:
    return f"Open requests in {pool}" if pool else "Open requests"


def no_open_requests(pool: str | None) -> str:
    return f"No open requests in {pool}." if pool else "No open requests."


def open_requests_summary(count: int, waiting_for_you: int) -> str:
    text = f"{count} open"
    return text + (f" · {waiting_for_you} waiting for your approval" if waiting_for_you else "")


def request_title(request_id: str, kind: str, pool: str) -> str:
    return f"{request_id}: {kind} on {pool}"


def request_summary(state: str, counted: int, required: int, short_hash: str) -> str:
    return f"{state} · {counted} of {required} approvals · plan {short_hash}"


def approvals_line(name: str, decision: str, short_hash: str, counts: bool, reason: str | None) -> str:
    text = f"{name} {'approved' if decision == 'approve' else 'denied'} plan {short_hash}"
    if reason:
        text += f": {reason}"
    return text + ("" if counts or decision != "approve" else " (no longer counts: the plan changed)")


def run_section_title(run_id: str, state: str, dry_run: bool) -> str:
    return f"Run {run_id}{' (dry run)' if dry_run else ''}: {state}"


def run_left_cordoned(nodes: tuple[str, ...]) -> str:
    return "Left cordoned by this run: " + ", ".join(nodes)


def approve_needs_hash(request_id: str, short_hash: str) -> str:
    return (f"Approvals are for one exact plan. Review it below, then run "
            f"`/gpu approve {request_id} {short_hash}` to approve that plan.")


def approve_title(request_id: str) -> str:
    return f"Approve {request_id}?"


def approved_title(request_id: str) -> str:
    return f"Approved {request_id}"


def denied_title(request_id: str) -> str:
    return f"Denied {request_id}"


def cancelled_title(request_id: str) -> str:
    return f"Cancelled {request_id}"


def refused_title() -> str:
    return "Refused"


def not_available(what: str) -> str:
    return f"{what} are not available here: this gpuops has no database configured."


def run_control_title(run_id: str, action: str) -> str:
    return f"{run_id} {action}"


def audit_title(scope: str | None) -> str:
    return f"Audit log for {scope}" if scope else "Audit log"


def audit_empty(scope: str | None) -> str:
    return f"Nothing recorded for {scope}." if scope else "The audit log is empty."


def audit_summary(count: int, newest_first: bool) -> str:
    return f"{count} {'entry' if count == 1 else 'entries'}, {'newest' if newest_first else 'oldest'} first"


def audit_count_limit(limit: int) -> str:
    return f"the number of entries must be between 1 and {limit}"


def deny_needs_reason() -> str:
    return "say why you deny it, e.g. `/gpu deny req-7f3a2c \"window clashes with the launch\"`"


def name_one(what: str) -> str:
    return f"name one {what}"


def at_most_one_pool() -> str:
    return "requests takes at most one pool name"


def approve_usage() -> str:
    return "name the request, then the plan hash you reviewed"


def audit_usage() -> str:
    return "give a number of entries (digits 0-9, e.g. `/gpu audit 50`) or one request id"


DRAIN_WAVE_COLUMNS = ("wave", "nodes", "GPUs out", "nodes unavailable", "ready GPUs left")
DRAIN_WORKLOAD_COLUMNS = ("node", "workload", "GPUs", "owner", "PDBs")


def drain_title(request_id: str, pool: str) -> str:
    return f"Drain {request_id} · {pool}"


def drain_summary(state: str, counted: int, required: int, short_hash: str) -> str:
    if state == "approved":
        return f"approved (the pool needs no approval) · plan {short_hash}"
    return f"{state} · {counted} of {required} approvals · plan {short_hash}"


def drain_window(start: str, end: str | None) -> str:
    return f"{start} - {end}" if end else f"{start} {open_window_end('drain')}"


def open_window_end(kind: str) -> str:
    """What ends a window that has no end time: a drain holds until someone says so; the
    other kinds' pools allow changes at any time."""
    return OPEN_DRAIN_END if kind == "drain" else "with no end (the pool's windows: always)"


def request_window(kind: str, start: str | None, end: str | None) -> str:
    """A request's window as every view writes it (the times already written with their zone)."""
    if start is None:
        return "as soon as approved"
    return f"{start} - {end}" if end else f"{start} {open_window_end(kind)}"


def drain_wave_capacity(unavailable: int, allowed: int) -> str:
    return f"{unavailable} of {allowed} allowed"


def drain_ready_gpus(ready: int, floor: int) -> str:
    return f"{ready} (floor {floor})"


def drain_no_workloads(known: bool) -> str:
    if known:
        return "Nothing to evict: no workload pods on these nodes."
    return "Workloads are not known here (no pod source); the engine evicts whatever runs then."


def drain_pdb_line(ref: str, allowed: int, pods: int, may_block: bool) -> str:
    line = f"{ref}: allows {allowed} disruption(s), selects {pods} pod(s) to evict"
    return line + " — may block eviction" if may_block else line


def drain_refused_title(rule: str) -> str:
    return f"Drain refused ({rule})"


def drain_done_title(run_id: str) -> str:
    return f"Drain window of {run_id} ended early"


def drain_extended_title(request_id: str) -> str:
    return f"Drain {request_id}: more time asked"


def drain_held_longer_title(request_id: str) -> str:
    return f"Drain {request_id}: its nodes are held longer"


def drain_extension_summary(*, window_end: str, extended_to: str, counted: int, required: int,
                            short_hash: str) -> str:
    return (f"the window end {extended_to} waits for approval ({counted} of {required} approvals · plan "
            f"{short_hash}); until then the nodes are held to {window_end}")


def drain_extended_summary(*, was: str, window_end: str) -> str:
    return f"the window now ends {window_end} (was {was}); the nodes stay held until then"


def request_extension(*, window_end: str, counted: int, required: int, short_hash: str, lapses: str) -> str:
    return (f"to {window_end}, {counted} of {required} approvals (plan {short_hash}); "
            f"lapses at {lapses} if not approved")


def drain_extend_usage() -> str:
    return "Name the request and how much longer, e.g. `/gpu drain extend req-7f3a2c 2h`."


def drain_extend_open_ended(request_id: str) -> str:
    return f"{request_id} has no window end: it lasts until `/gpu drain done {request_id}`."


def drain_not_a_drain(request_id: str, kind: str) -> str:
    return f"{request_id} is a {kind} request, not a drain."


def last_drains_title() -> str:
    return "Drains"


# When nodes of each pool were last drained, in the words the handover uses.
DRAIN_HISTORY_COLUMNS = ("pool", LAST_DRAINED, "by", "nodes", "active drain windows")


def drain_active(request_id: str, state: str, window: str) -> str:
    return f"{request_id} {state} {window}"


# The words of /gpu drain, as the registry, the help, the form and every usage error show them.
DRAIN_USAGE = "drain <node...|pool> [at <time>|next-window] [for <duration>] [--include <node>,...] [reason]"


def drain_needs_target() -> str:
    return f"Say which nodes or pool to drain: /gpu {DRAIN_USAGE}"


def repeated_clause(word: str) -> str:
    return f"Say `{word}` once: /gpu {DRAIN_USAGE}"


def bad_duration(text: str) -> str:
    got = f", not {text!r}" if text else ""
    return f"`for` needs how long the drain lasts, like 2h, 90m or 1h30m{got}."


def bad_time(text: str) -> str:
    got = f"Cannot read the time {text!r}" if text else "`at` needs a time"
    return (f"{got}; write at 2026-12-05 02:00, at sat 02:00, at tomorrow 03:00 or next-window, "
            "optionally followed by a zone such as Europe/Berlin.")


def driver_managers(pool: PoolInventory) -> str:
    """Which object's version reaches the pool's driver pods, and who else it reaches."""
    if not pool.driver_managers:
        return "nothing in the GPU Operator (no node here takes the operator's driver)"
    shared = pool.shares_driver_with()
    names = ", ".join(f"{m.ref} ({m.version or 'no version set'})" for m in pool.driver_managers)
    if not shared:
        return f"{names}, for this pool only"
    them = "that pool" if len(shared) == 1 else "those pools"
    how = ("the operator rolls it out there itself (autoUpgrade on)"
           if any(m.auto_upgrade.state == "on" for m in pool.driver_managers)
           else "on each driver pod's next restart (autoUpgrade off)")
    return f"{names}, shared with {', '.join(shared)}: a version change there reaches {them} too, {how}"


def driver_version_keepers(pool: PoolInventory) -> str | None:
    """Who keeps the version of the objects that set the pool's driver, when a GitOps tool
    or Helm does ("ClusterPolicy gpu-cluster-policy is applied by Argo CD application
    gpu-operator from Git"), with the drift seen; None when nobody but gpuops does."""
    kept = [m.version_owner for m in pool.driver_managers
            if m.version_owner is not None and m.version_owner.tool is not None]
    if not kept:
        return None
    return "; ".join(o.text() + (f" ({'; '.join(o.evidence)})" if o.drifted else "") for o in kept)


UPGRADE_USAGE = ("upgrade <pool> to <driver-version> [at <time> | next-window] [--also <pool>,...] [--downgrade] "
                 "[--include <node>,...] [--dry-run] [reason]")
UPGRADE_WAVE_COLUMNS = ("wave", "nodes", "GPUs out")


MIG_USAGE = "mig <pool|node...> <layout> [at <time> | next-window] [--include <node>,...] [--dry-run] [reason]"
MIG_NODE_COLUMNS = ("node", "advertises now", "after", "GPU pods moved off")
MIG_WAVE_COLUMNS = ("wave", "nodes")


def operator_names(entries: Sequence[str], names: Mapping[str, str]) -> list[str]:
    """A pool's `operators` as people read them: people by their configured name or a
    mention, user groups by id."""
    return [e.removeprefix("group:") + " (user group)" if e.startswith("group:") else public_name(e, names=names)
            for e in entries]


def who_may_operate(pool: str, own: Sequence[str], *, fleet_operators: bool) -> str:
    """Who may act on `pool` with the operator role, as a refusal ends."""
    who = [*own, *(("the fleet's operators",) if fleet_operators else ()), "admins"]
    listed = who[0] if len(who) == 1 else f"{', '.join(who[:-1])} and {who[-1]}"
    return f"Who may act on pool {pool}: {listed}."


def access_refused(reason: str, who: str | None) -> str:
    """A refusal for a missing role, with who may act instead when that is known."""
    if who is None:
        return reason
    return f"{reason} {who}" if reason.endswith(".") else f"{reason}. {who}"


def pool_operators(own: list[str], *, fleet_operators: bool) -> str:
    """Who may ask for and control the pool's changes."""
    listed = ", ".join(own)
    if fleet_operators:
        return f"{listed} and the fleet's operators" if own else "the fleet's operators"
    return f"{listed} only (not the fleet's operators)" if own else "admins only (not the fleet's operators)"


def pool_workloads(mig: str | None, full_gpu: str | None) -> str:
    return "; ".join([f"MIG slices for {mig or 'any workload'}", f"whole GPUs for {full_gpu or 'any workload'}"])


MIGRATE_USAGE = ("migrate <pool|node...> to operator|host [at <time> | next-window] [--include <node>,...] [--dry-run] "
                 "[reason]")
# A move's title by where it goes ("rollback": back to the snapshots its run took).
_MOVE_TITLES = {"operator": "Move to the operator", "host": "Move back to host drivers",
                "rollback": "Rollback of a driver move"}


def migrate_needs_words() -> str:
    return f"Say which pool (or nodes of one pool) and where their driver goes: /gpu {MIGRATE_USAGE}"


def migrate_title(request_id: str, pool: str, direction: str) -> str:
    return f"{_MOVE_TITLES.get(direction, direction)} {request_id} · {pool}"


def migrate_preview_title(pool: str, direction: str) -> str:
    return f"{_MOVE_TITLES.get(direction, direction)}, plan (dry run) · {pool}"


def migrate_refused_title(code: str) -> str:
    return f"Driver move refused ({code})"


def host_driver_by_hand_label(node: str, *, install: bool) -> str:
    return f"Host driver {'installed' if install else 'removed'}: {node}"[:75]


def migrate_confirmed_title(run_id: str) -> str:
    return f"Host driver removed · {run_id}"


def mig_needs_words() -> str:
    return f"Say which pool (or nodes of one pool) and which MIG layout: /gpu {MIG_USAGE}"


def mig_title(request_id: str, pool: str) -> str:
    return f"MIG change {request_id} · {pool}"


def mig_preview_title(pool: str) -> str:
    return f"MIG change plan (dry run) · {pool}"


def mig_refused_title(code: str) -> str:
    return f"MIG change refused ({code})"


def upgrade_needs_words() -> str:
    return f"Say which pool and which driver version: /gpu {UPGRADE_USAGE}"


CONTINUE_USAGE = "continue <run> [--skip <node>]"


def continue_title(request_id: str, pool: str, kind: str) -> str:
    return f"Continuation {request_id} · {kind} · {pool}"


def continue_of(run_id: str, request_id: str) -> str:
    return f"halted run {run_id} (of {request_id})"


def continue_refused_title(code: str) -> str:
    return f"Continue refused ({code})"


def continue_skip_one_node() -> str:
    return "`--skip` names one node to leave out, e.g. `/gpu continue run-4b1d9e --skip gpu-07`"


def continue_usage_words(word: str) -> str:
    return f"`{word}` is not something `continue` takes: name the halted run, and at most one `--skip <node>`"


def upgrade_title(request_id: str, pool: str) -> str:
    return f"Driver upgrade {request_id} · {pool}"


def upgrade_preview_title(pool: str) -> str:
    return f"Driver upgrade plan (dry run) · {pool}"


def upgrade_preview_summary(short_hash: str) -> str:
    return f"nothing stored · plan {short_hash} · ask without --dry-run to request it (approvals follow)"


def upgrade_refused_title(code: str) -> str:
    return f"Upgrade refused ({code})"


def upgrade_versions(current: Sequence[tuple[str, int]], target: str) -> str:
    now = ", ".join(f"{v} ({n})" for v, n in current) or "none reported"
    return f"{now} -> {target}"


def held_from_operator_upgrade(run: str) -> str:
    return f"held from the operator's upgrade by {run}"


def operator_upgrade_skipped_by_person() -> str:
    return "upgrade skip label (set by a person)"


def pool_run(request: str, run: str, kind: str, state: str, wave: int | None, waves: int) -> str:
    where = f", wave {wave + 1} of {waves}" if wave is not None else ", not started"
    return f"{kind} run {run} ({state}{where}): /gpu request {request}"


# ---- a node's host and its last GPU check (/gpu node)


def not_reported() -> str:
    return "not reported by the kubelet"


def precompiled_driver_note() -> str:
    return "; the operator's driver here is precompiled for one kernel"


def last_gpu_check(*, passed: bool, age: str, run: str) -> str:
    return f"{'passed' if passed else 'failed'} {age} ago (run {run})"


def unknown_pool_or_namespace(name: str, closest: list[str], *, pools: int, namespaces: int) -> str:
    if closest:
        return unknown_name("pool or namespace", name, closest, pools + namespaces)
    return (f"No pool or namespace named `{name}` ({pools} pool{'s' if pools != 1 else ''} and {namespaces} "
            f"namespace{'s' if namespaces != 1 else ''} with a GPU quota or GPU pods known).")


# The request view's fact saying why a request or its run waits (workflows.engine.waits).
WAITS_LABEL = "Why it waits"


def approver_group(name: str) -> str:
    return f"a member of {name}"


def run_held_by_freeze(line: str) -> str:
    return ("A change freeze holds this run: nodes under way finish, no new node starts, and it goes on by itself "
            f"when the freeze ends. {line}")


def include_needs_node() -> str:
    return ("`--include` names the node to change in spite of its open findings, e.g. "
            "`--include gpu-node-05` (several: `--include a,b`)")
