"""Every sentence a person reads about handovers, in one place: the checklist's items and
the lines of gpuops's own layout of it, acknowledgement answers, reminders and escalations.

Times are shown in the rotation's time zone ("Sat 07 Jun 14:00 CEST"), because the
people on shift think in it. Nothing here decides anything.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Sequence

from workflows.drain.messages import LAST_DRAINED, drained_by
from workflows.fleet.clusters import ClusterGlance
from workflows.fleet.findings import format_age
from workflows.wording import names, plural, when

# --- commands the items link to (a node's and a pool's: `fleet.findings.node_command`, `pool_command`)


def request_command(request_id: str) -> str:
    return f"/gpu request {request_id}"


def history_command(rotation: str) -> str:
    return f"/gpu handover history {rotation}"


# --- cluster ---------------------------------------------------------------------------


def operator_fact(version: str | None, namespace: str | None, found: bool) -> str:
    if not found:
        return "no GPU Operator found"
    return f"{version or 'unknown version'} in {namespace or 'an unknown namespace'}"


def cluster_policy_fact(name: str | None, state: str | None) -> str:
    if name is None:
        return "none"
    return f"{name} ({state or 'no state reported'})"


def owner_fact(owner: str | None) -> str:
    return owner or "not set (configure cluster.cluster_policy_owner)"


# --- cordons ---------------------------------------------------------------------------


def cordoned_by_hand(node: str, *, since: dt.datetime | None, now: dt.datetime,
                     zone: zoneinfo.ZoneInfo) -> str:
    if since is None:
        seen = "first seen cordoned at this handover"
    else:
        seen = f"cordoned for at least {format_age(now - since)} (seen since {when(since, zone, style='day')})"
    return f"{node} is cordoned by hand, not by gpuops; {seen}: find out why and who will uncordon it"


def cordon_left_behind(node: str, *, by: str | None, run: str | None) -> str:
    # NB: `by` is what the mark says, "gpuops for alice": not "by gpuops by gpuops".
    who = by if by and by.startswith("gpuops") else f"gpuops{f' ({by})' if by else ''}"
    what = f" in {run}, which is no longer running" if run else ""
    return (
        f"{node} is still cordoned by {who}{what}; check the run's outcome, then "
        f"`/gpu uncordon {node}` or hand it to someone"
    )


def findings_command() -> str:
    return "/gpu findings"


def _alike_on(code: str, subjects: Sequence[str], noun: str) -> str:
    return f"{code} on {plural(len(subjects), noun)} ({names(subjects, at_most=8)})"


def findings_alike(code: str, *, subjects: Sequence[str], noun: str, first: str) -> str:
    """Findings of one code and severity on several nodes (or pools), as one line."""
    return f"{_alike_on(code, subjects, noun)}; the first: {first}"


def findings_a_run_is_on(code: str, *, subjects: Sequence[str], noun: str, first: str, run: str, kind: str) -> str:
    if len(subjects) == 1:
        return f"{run} ({kind}) is in flight on it: {first}"
    return f"{run} ({kind}) is in flight on {_alike_on(code, subjects, noun)}; the first: {first}"


def cordoned_by_hand_kept_by_run(node: str, *, run: str) -> str:
    return f"{node} is cordoned by hand, from before {run}, which is in flight and leaves it cordoned when it ends"


def cordoned_for_run(node: str, *, run: str, at: dt.datetime | None, now: dt.datetime) -> str:
    since = f" for {format_age(now - at)}" if at is not None else ""
    return f"{node} is cordoned by gpuops{since} for {run}, which is in flight"


# --- requests and runs -----------------------------------------------------------------


def approval_waiting(*, request_id: str, kind: str, pool: str, counted: int, required: int,
                     expires_at: dt.datetime, window_start: dt.datetime | None, in_shift: bool,
                     now: dt.datetime, zone: zoneinfo.ZoneInfo) -> str:
    missing = max(required - counted, 0)
    if expires_at <= now:
        expiry = f"its approval deadline passed at {when(expires_at, zone, style='day')}"
    else:
        expiry = f"expires {when(expires_at, zone, style='day')} (in {format_age(expires_at - now)})"
    window = ""
    if window_start is not None:
        window = f"; window {when(window_start, zone, style='day')}" + (" (this shift)" if in_shift else "")
    return (
        f"{request_id}: {kind} of {pool} waits for {plural(missing, 'more approval')} "
        f"({counted}/{required}); {expiry}{window}"
    )


def window_coming(*, request_id: str, kind: str, pool: str, state: str, start: dt.datetime,
                  end: dt.datetime | None, approvers: Sequence[str],
                  zone: zoneinfo.ZoneInfo) -> str:
    span = when(start, zone, style='day') + (f" – {end.astimezone(zone).strftime('%H:%M')}" if end else "")
    approved = f", approved by {', '.join(approvers)}" if approvers else ""
    return f"{request_id}: {kind} of {pool}, window {span} ({state}{approved})"


def run_line(*, run_id: str, request_id: str, kind: str, pool: str, state: str, dry_run: bool,
             step: str | None, done: int, total: int, halted_reason: str | None) -> str:
    dry = " (dry run)" if dry_run else ""
    head = f"{run_id}{dry}: {kind} of {pool} for {request_id}"
    progress = f"{done}/{total} steps done"
    if state == "paused":
        why = f": {halted_reason}" if halted_reason else ""
        return f"{head} is paused{why}; {progress}. Resume or abort it"
    if state == "pending":
        return f"{head} waits to start; {progress}"
    return f"{head}: {step or 'between steps'}; {progress}"


_FAILED_HOW = {
    "halted": "halted at {step} on {node}",
    "pdb-blocked": "halted: a PodDisruptionBudget blocked the drain of {node}",
    "canary-failed": "halted: its canary failed on {node}",
    "left-out": "left {node} out: a PodDisruptionBudget still blocked its drain, so it was given back",
}


def run_failure(*, what: str, run_id: str, request_id: str, kind: str, pool: str, node: str | None,
                step: str | None, reason: str, at: dt.datetime, zone: zoneinfo.ZoneInfo,
                left_cordoned: Sequence[str], still_cordoned: Sequence[str], requester: str) -> str:
    """One run that went wrong since the last handover: what, where, why, what it left
    cordoned and who acts."""
    how = (_FAILED_HOW[what].format(step=step, node=node) if node is not None
           else "halted before a wave")
    text = f"{run_id}: {kind} of {pool} for {request_id} {how} ({when(at, zone, style='day')}): {reason.rstrip('.')}."
    if what == "left-out":
        return text + " Nothing for anyone to do unless that node still needs its drain."
    gone = sorted(set(left_cordoned) - set(still_cordoned))
    if still_cordoned:
        text += f" Still cordoned: {', '.join(still_cordoned)}."
    elif left_cordoned:
        return text + f" The nodes it left cordoned ({', '.join(gone)}) are back in service."
    else:
        return text + " It left no node cordoned."
    if gone:
        text += f" Back in service since: {', '.join(gone)}."
    undo = (f"roll it back (`/gpu rollback {run_id}`) or uncordon" if kind in ("upgrade", "mig", "migrate")
            else "uncordon")
    return text + f" {requester} (who asked) or an operator of {pool} acts: {undo} (`/gpu uncordon <node>`) or ask again."


def step_line(*, kind: str, node: str, wave: int, state: str, attempt: int,
              started_at: dt.datetime | None, now: dt.datetime, more_running: int) -> str:
    since = f" for {format_age(now - started_at)}" if started_at and state == "running" else ""
    tries = f", attempt {attempt}" if attempt > 1 else ""
    more = f" (and {more_running} more running)" if more_running else ""
    verb = "running" if state == "running" else "next"
    # Waves are counted from 1 for people, as the request view and the run's thread count them.
    return f"wave {wave + 1}, {kind} on {node} {verb}{since}{tries}{more}"


def last_drain(*, request_id: str, kind: str, at: dt.datetime, nodes: int, outcome: str,
               now: dt.datetime, zone: zoneinfo.ZoneInfo) -> str:
    return (
        f"{LAST_DRAINED} {when(at, zone, style='day')} ({format_age(now - at)} ago): "
        f"{plural(nodes, 'node')} by {drained_by(request_id=request_id, kind=kind, outcome=outcome)}"
    )


def no_drains() -> str:
    return "no drains recorded"


# --- changes since the previous handover ----------------------------------------------


def resolved(code: str, subject: str) -> str:
    return f"{code} on {subject} is resolved"


def signals_unknown(source: str, reason: str) -> str:
    return f"GPU health from DCGM is unknown for this handover: {source} {reason}"


def signals_unchecked(node: str, codes: Sequence[str]) -> str:
    return (f"{node} had {', '.join(sorted(codes))} at the last handover and its GPU health could not be read "
            "now: still open until a reading says otherwise")


# --- acknowledgements, reminders, escalations -----------------------------------------


def posted_text(*, rotation: str, shift: str, shift_start: dt.datetime, late: bool,
                needs_action: int, zone: zoneinfo.ZoneInfo) -> str:
    state = f"{needs_action} need action" if needs_action else "nothing needs action"
    lateness = " (posted late)" if late else ""
    return f"Handover to the {shift} shift of {rotation}, {when(shift_start, zone, style='day')}{lateness}: {state}"


def acknowledged(*, name: str, shift: str) -> str:
    return f"Acknowledged: {name} takes over as the {shift} shift."


def ack_not_counted(*, name: str, shift: str) -> str:
    return (
        f"Recorded, but it does not count: {name} is not on the incoming {shift} shift. "
        "Someone on that shift still needs to acknowledge."
    )


def ack_already_yours(*, name: str, acked_at: dt.datetime, zone: dt.tzinfo) -> str:
    return f"{name} acknowledged this handover already, at {when(acked_at, zone, style='day')}."


def ack_already(*, name: str, acked_by: str, acked_at: dt.datetime,
                zone: dt.tzinfo) -> str:
    return (
        f"Recorded {name}'s acknowledgement too; {acked_by} already acknowledged at "
        f"{when(acked_at, zone, style='day')}."
    )


def acknowledged_footer(*, name: str, at: dt.datetime, zone: zoneinfo.ZoneInfo) -> str:
    return f"Acknowledged by {name} at {when(at, zone, style='day')}"


def not_acknowledged_footer(*, shift: str) -> str:
    return f"Waiting for someone on the {shift} shift to acknowledge"


def audit_head_footer(head: str) -> str:
    return f"Audit chain head {head} (`gpuops audit verify --expected {head}` checks it later)"


def reminder(*, shift: str, waited: dt.timedelta) -> str:
    return (
        f"Reminder: nobody on the {shift} shift has acknowledged this handover after "
        f"{format_age(waited)}. Read it and press Acknowledge."
    )


def escalation(*, rotation: str, shift: str, waited: dt.timedelta) -> str:
    return (
        f"Escalation: the {shift} shift of {rotation} has not acknowledged its handover "
        f"after {format_age(waited)}, despite a reminder. Please make sure someone has taken over."
    )


def unknown_handover(handover_id: int) -> str:
    return f"No handover has id {handover_id}."


def unknown_rotation(name: str, known: Sequence[str]) -> str:
    listed = ", ".join(known) if known else "none are configured"
    return f"No rotation named {name!r} (rotations: {listed})."


def which_rotation(known: Sequence[str]) -> str:
    return f"Several rotations are configured; name one: {', '.join(known)}."


def no_rotations() -> str:
    return "No handover rotations are configured (add `rotations:` to the configuration)."


# --- the checklist as posted (gpuops's own layout) --------------------------------------

NEEDS_ACTION = "Needs action"
GONE_WRONG = "Gone wrong since the last handover"
IN_FLIGHT = "In flight"
WINDOWS = "Windows this shift"
SINCE_LAST = "Since the last handover"
ALSO_WORTH_KNOWING = "Also worth knowing"
LAST_DRAINS = "Last drain per pool"
CLUSTER_TITLE = "Cluster"


def checklist_title(*, shift: str, team: str) -> str:
    return f"Handover to the {shift} shift · {team}"


def checklist_counts(*, needs_action: int, gone_wrong: int, in_flight: int, windows: int,
                     start: dt.datetime, end: dt.datetime, zone: zoneinfo.ZoneInfo) -> str:
    needs = f"{needs_action} need{'s' if needs_action == 1 else ''} action" if needs_action \
        else "Nothing needs action"
    wrong = f" · {gone_wrong} gone wrong" if gone_wrong else ""
    return (f"{needs}{wrong} · {in_flight} in flight · {windows} window{'' if windows == 1 else 's'} this shift"
            f" · {when(start, zone, style='day')} until {when(end, zone, style='day')}")


def _handovers_were(missed: int) -> str:
    return f"{missed} earlier handover{' was' if missed == 1 else 's were'}"


def posted_late(*, shift_start: dt.datetime, generated_at: dt.datetime, missed: int,
                zone: zoneinfo.ZoneInfo) -> str:
    also = f"; {_handovers_were(missed)} missed and not posted" if missed else ""
    return (f"Posted late: gpuops was not running at the shift change ({when(shift_start, zone, style='day')}, "
            f"{format_age(generated_at - shift_start)} before this post){also}.")


def handovers_missed(missed: int) -> str:
    return f"{_handovers_were(missed)} missed while gpuops was not running."


def no_earlier_handover() -> str:
    return "No earlier handover to compare with."


def no_changes_since(since: dt.datetime, zone: zoneinfo.ZoneInfo) -> str:
    return f"No findings appeared or went away since {when(since, zone, style='day')}."


def finding_new(*, code: str | None, subject: str, command: str) -> str:
    return f"new: {code} on {subject} · `{command}`"


def finding_resolved(text: str) -> str:
    return f"resolved: {text}"


def pool_last_drain(*, pool: str, text: str, command: str) -> str:
    return f"{pool}: {text} · `{command}`"


def no_pools() -> str:
    return "No pools found."


def cluster_line(*, operator: str, cluster_policy: str, owner: str) -> str:
    return f"GPU Operator {operator} · ClusterPolicy {cluster_policy} · owner {owner} · `/gpu status`"


def past_handovers(command: str) -> str:
    return f"Past handovers: `{command}`"


def template_failed(problem: str) -> str:
    return (f"This rotation's own checklist template failed ({problem}), so the checklist is shown in "
            "gpuops's own layout; fix the template, or remove `template:` from the rotation.")


def template_failed_log(rotation: str, problem: str) -> str:
    return f"the checklist template of rotation {rotation} failed, showing gpuops's own layout: {problem}"


# --- the /gpu handover commands --------------------------------------------------------


def default_title(shift: str) -> str:
    return f"Handover to the {shift} shift"


def handover_usage(words: int) -> str:
    return f"handover takes at most one rotation name, got {words} words"


def history_usage() -> str:
    return "name one rotation, then optionally how many handovers to show (digits 0-9, e.g. 20)"


def history_count(count: int, *, most: int) -> str:
    return f"show between 1 and {most} handovers, not {count}"


def history_title(rotation: str) -> str:
    return f"Handovers of {rotation}"


def no_history() -> str:
    return "No handovers posted yet."


def history_summary(shown: int, *, acknowledged: int, late: int) -> str:
    return f"Last {shown}: {acknowledged} acknowledged, {late} posted late"


def history_posted(*, late: bool, missed: int, in_slack: bool) -> str:
    text = "late" if late else "on time"
    if missed:
        text += f", {missed} missed before"
    if not in_slack:
        text += " (not in Slack yet)"
    return text


def history_acks(*, counted: int, not_counted: int) -> str:
    text = f"{counted} counted"
    if not_counted:
        text += f", {not_counted} not on shift"
    return text


def nobody_yet() -> str:
    return "nobody yet"


def cluster_command(cluster: str) -> str:
    return f"/gpu status --cluster {cluster}"


def cluster_not_answering(cluster: str, *, state: str, since: dt.datetime | None, now: dt.datetime,
                          nodes: int | None, ready: int) -> str:
    age = f" for {format_age(now - since)}" if since is not None else ""
    if state == "connecting" or nodes is None:
        return f"cluster {cluster} has not answered gpuops{age}: nothing of its fleet is known"
    return (f"cluster {cluster} does not answer{age}; when last seen, {ready}/{nodes} GPU nodes were Ready. "
            "Its findings are not checked while it is away")


def cluster_glance(glance: ClusterGlance) -> str:
    problems = ", ".join(part for part in (f"{glance.critical} critical" if glance.critical else "",
                                           f"{glance.warning} warning" if glance.warning else "") if part)
    return (f"cluster {glance.cluster}: {glance.ready}/{glance.nodes} GPU nodes Ready, "
            f"{glance.advertised}/{glance.physical} GPUs advertised; findings: {problems or 'none'}")
