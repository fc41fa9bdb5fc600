"""Every sentence a person reads about requests and approvals, in one place.

Refusals are shown to the user verbatim (the commands layer puts them in its reply), and
thread messages go to the request's Slack thread through the outbox. Keep them short,
say what happened and what to do next, and never blame the reader for the system's state.
Nothing here decides anything; `workflows.requests.policy` and `workflows.requests.service` choose which
sentence applies.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

from workflows.kinds import kinds_in_force
from workflows.plans import short_hash
from workflows.wording import names, when

# ------------------------------------------------------------------ small wording pieces


def plan_ref(full_hash: str) -> str:
    return f"{short_hash(full_hash)}…"


def approvals_word(n: int) -> str:
    return "approval" if n == 1 else "approvals"


def roles_held(roles: Iterable[str]) -> str:
    held = sorted(roles)
    return ", ".join(held) if held else "no role"




def _kind_noun(kind: str) -> str:
    """"a drain": how a sentence names a request of `kind` (workflows/kinds.py)."""
    known = kinds_in_force().get(kind)
    return known.noun if known is not None else kind


# How a request in each state reads after its id ("req-7f3a2c is already approved").
_STATE_PHRASE = {
    "pending": "is waiting for approval",
    "approved": "is already approved",
    "cancelled": "was cancelled",
    "expired": "expired",
    "scheduled": "is already scheduled",
    "running": "is already running",
    "done": "is done",
    "failed": "failed",
    "missed": "missed its window",
}


def state_phrase(state: str, *, denied_by: str | None = None, deny_reason: str | None = None) -> str:
    if state == "denied":
        who = f" by {denied_by}" if denied_by else ""
        why = f" ({deny_reason})" if deny_reason else ""
        return f"was denied{who}{why}"
    return _STATE_PHRASE.get(state, f"is {state}")


# ------------------------------------------------------------------ refusals


def unknown_pool(pool: str, *, closest: Sequence[str], known: Sequence[str]) -> str:
    if closest:
        return f"There is no pool named {pool}; did you mean {' or '.join(closest)}?"
    if known:
        return f"There is no pool named {pool}; the configured pools are {', '.join(sorted(known))}."
    return f"There is no pool named {pool}: no pools are configured yet."


def pool_not_configured(request_id: str, pool: str) -> str:
    return (
        f"Pool {pool} of {request_id} is no longer in the configuration, so nobody can "
        "approve it; cancel it or restore the pool."
    )


def not_an_operator(*, pool: str, kind: str, name: str, held: Iterable[str]) -> str:
    return (
        f"Requesting {_kind_noun(kind)} on pool {pool} needs the operator role "
        f"for {pool}; {name} has {roles_held(held)}."
    )


def no_request_reason(*, pool: str, kind: str) -> str:
    return (
        f"Say why you request {_kind_noun(kind)} on pool {pool}; approvers read "
        "the reason before they approve."
    )


def not_an_approver(*, request_id: str, pool: str, verb: str, held: Iterable[str]) -> str:
    return (
        f"You cannot {verb} {request_id}: that needs the approver role for pool {pool} "
        f"(you have {roles_held(held)})."
    )


def own_request_approval(request_id: str) -> str:
    return (
        f"You requested {request_id} yourself; someone else has to approve it "
        "(two-person rule)."
    )


def own_request_deny(request_id: str) -> str:
    return f"You requested {request_id} yourself; cancel it instead of denying it."


def already_approved_by_you(request_id: str, *, plan_hash: str, still_needed: int) -> str:
    rest = (
        f"it needs {still_needed} more {approvals_word(still_needed)} from someone else"
        if still_needed > 0
        else "it needs no more approvals"
    )
    return f"You already approved {request_id} (plan {plan_ref(plan_hash)}); {rest}."


def stale_plan(request_id: str, *, current_hash: str) -> str:
    return (
        "The plan changed since you looked; approvals were reset — review the new plan "
        f"(hash {plan_ref(current_hash)}) of {request_id} and approve that one."
    )


def expired(request_id: str, *, expires_at: dt.datetime, zone: dt.tzinfo) -> str:
    return (
        f"{request_id} expired at {when(expires_at, zone)} before it had enough approvals; "
        "ask the requester to submit it again."
    )


def not_pending(
    request_id: str,
    *,
    state: str,
    verb: str,
    denied_by: str | None = None,
    deny_reason: str | None = None,
) -> str:
    """`verb` is what the reader tried, in the past participle: approved, denied, replanned."""
    phrase = state_phrase(state, denied_by=denied_by, deny_reason=deny_reason)
    advice = ""
    if verb == "replanned" and state in ("approved", "scheduled"):
        advice = "; to change the plan, cancel it and submit a new request"
    elif verb == "denied" and state in ("approved", "scheduled"):
        advice = "; the requester or an admin can still cancel it"
    else:
        advice = f"; it can no longer be {verb}"
    return f"{request_id} {phrase}{advice}."


def no_deny_reason(request_id: str) -> str:
    return f"Say why you deny {request_id}; the requester reads your reason."


def not_requester_or_admin(request_id: str, *, requester_name: str, verb: str) -> str:
    return f"Only the requester ({requester_name}) or an admin can {verb} {request_id}."


def already_finished(request_id: str, *, state: str, denied_by: str | None = None,
                     deny_reason: str | None = None) -> str:
    phrase = state_phrase(state, denied_by=denied_by, deny_reason=deny_reason)
    return f"{request_id} {phrase}; there is nothing left to cancel."


def cancel_while_running(request_id: str) -> str:
    return (
        f"{request_id} is already running; cancel cannot stop a run — abort the run "
        "instead, which stops it between steps and leaves nodes as they are."
    )


def changed_meanwhile(request_id: str) -> str:
    return f"{request_id} changed while you were acting on it; look at it again and retry."


def unknown_request(request_id: str, *, closest: Sequence[str]) -> str:
    if closest:
        return f"There is no request {request_id}; did you mean {' or '.join(closest)}?"
    return f"There is no request {request_id}."


# ------------------------------------------------------------------ thread messages


def thread_created(
    *,
    request_id: str,
    requester_name: str,
    kind: str,
    pool: str,
    nodes: int,
    waves: int,
    reason: str,
    plan_hash: str,
    approvals_required: int,
    expires_at: dt.datetime,
    zone: dt.tzinfo,
) -> str:
    what = (
        f"{requester_name} requested {_kind_noun(kind)} on pool {pool} "
        f"({nodes} {'node' if nodes == 1 else 'nodes'} in {waves} "
        f"{'wave' if waves == 1 else 'waves'}, plan {plan_ref(plan_hash)}): {reason}"
    )
    if approvals_required == 0:
        return f"{request_id}: {what}. Pool policy needs no approval, so it is approved."
    return (
        f"{request_id}: {what}. It needs {approvals_required} "
        f"{approvals_word(approvals_required)} by {when(expires_at, zone)}."
    )


def thread_approval(*, request_id: str, approver: str, counted: int, required: int) -> str:
    if counted >= required:
        return f"{approver} approved {request_id} ({counted} of {required}): it is approved."
    return f"{approver} approved {request_id} ({counted} of {required})."


def thread_denied(*, request_id: str, approver: str, reason: str) -> str:
    return f"{approver} denied {request_id}: {reason}"


def thread_cancelled(*, request_id: str, actor: str) -> str:
    return f"{actor} cancelled {request_id}."


def thread_expired(*, request_id: str, expires_at: dt.datetime, counted: int, required: int,
                   zone: dt.tzinfo) -> str:
    return (
        f"{request_id} expired at {when(expires_at, zone)} with {counted} of {required} "
        f"{approvals_word(required)}."
    )


def thread_replanned(*, request_id: str, actor: str, plan_hash: str, voided: int) -> str:
    if voided:
        voided_text = (
            f"the {voided} earlier {approvals_word(voided)} no longer "
            f"{'counts' if voided == 1 else 'count'}"
        )
    else:
        voided_text = "no approvals were given yet"
    return (
        f"{actor} changed the plan of {request_id} (now {plan_ref(plan_hash)}); "
        f"{voided_text} — approvers, please review the new plan."
    )


def thread_reopened(*, request_id: str, counted: int, required: int, lost: Sequence[str], plan_hash: str) -> str:
    """An approved request whose run did not start: its approvals no longer suffice."""
    why = []
    if lost:
        why.append(f"{names(lost)} no longer {'holds' if len(lost) == 1 else 'hold'} the approver role for its pool")
    why.append(f"the pool's rule asks for {required} {approvals_word(required)} now")
    return (f"The run of {request_id} did not start: {' and '.join(why)}, and {counted} of {required} count. "
            f"It is pending again — approvers, please review {plan_ref(plan_hash)}.")


# What ends a drain window without an end time, as every view says it.
OPEN_DRAIN_END = "until `/gpu drain done`"


def thread_missed(*, request_id: str, requester_name: str, window_start: dt.datetime | None,
                  window_end: dt.datetime | None, now: dt.datetime, zone: dt.tzinfo) -> str:
    start = when(window_start, zone) if window_start else "now"
    window = f"{start} - {when(window_end, zone)}" if window_end else f"{start} {OPEN_DRAIN_END}"
    return (f"{requester_name}, {request_id} was not started: its window ({window}) had passed or begun too long "
            f"ago when gpuops could start it ({when(now, zone)}). Nothing was drained; "
            f"request it again for a later window.")


def thread_extended(*, request_id: str, actor: str, window_end: dt.datetime | None,
                    plan_hash: str, voided: int, zone: dt.tzinfo) -> str:
    end = f"ends {when(window_end, zone)}" if window_end else f"lasts {OPEN_DRAIN_END}"
    return (f"{actor} asked for more time on {request_id}: the window now {end} "
            f"(plan {plan_ref(plan_hash)}); {voided} earlier {approvals_word(voided)} no longer "
            f"{'counts' if voided == 1 else 'count'} — approvers, please review it again.")


def not_extendable(request_id: str, *, state: str) -> str:
    return (f"{request_id} is {state}: only a request that has not started yet (pending, approved "
            f"or scheduled), or a drain whose run still holds its nodes, can get a later window end.")


# ------------------------------------------------------------------ extending a running drain


def _at(at: dt.datetime, zone: dt.tzinfo) -> str:
    return when(at, zone, style="second")


def extend_open_ended(request_id: str) -> str:
    return f"{request_id} has no window end: it lasts until `/gpu drain done {request_id}`."


def extend_no_run(request_id: str) -> str:
    return (f"{request_id} has no run holding its nodes any more; for more time, ask for a new drain "
            f"with `/gpu drain`.")


def extend_released(request_id: str) -> str:
    return (f"The hold of {request_id} was already ended with `/gpu drain done`: its nodes are being "
            f"validated and uncordoned; for more time, ask for a new drain with `/gpu drain`.")


def extend_validating(request_id: str) -> str:
    return (f"{request_id} no longer holds its nodes: its window has ended and they are being validated "
            f"and uncordoned; for more time, ask for a new drain with `/gpu drain`.")


def extend_not_later(request_id: str, *, window_end: dt.datetime, zone: dt.tzinfo) -> str:
    return f"{request_id} already ends {_at(window_end, zone)}; an extension must end later than that."


def extension_lapsed(request_id: str, *, window_end: dt.datetime, extended_to: dt.datetime,
                     zone: dt.tzinfo) -> str:
    return (f"The extension of {request_id} to {_at(extended_to, zone)} lapsed: it was not approved before its drain "
            f"window ended ({_at(window_end, zone)}), so the window ended then.")


def thread_extension_asked(*, request_id: str, actor: str, window_end: dt.datetime, extended_to: dt.datetime,
                           plan_hash: str, required: int, zone: dt.tzinfo) -> str:
    return (f"{actor} asked to hold the nodes of {request_id} until {_at(extended_to, zone)} instead of "
            f"{_at(window_end, zone)} (plan {plan_ref(plan_hash)}). It needs {required} {approvals_word(required)}: "
            f"`/gpu approve {request_id} {short_hash(plan_hash)}`. Until then the nodes are held to "
            f"{_at(window_end, zone)}; not approved by then, the extension lapses.")


def thread_extension_approval(*, request_id: str, approver: str, extended_to: dt.datetime, counted: int,
                              required: int, zone: dt.tzinfo) -> str:
    return f"{approver} approved holding {request_id} until {_at(extended_to, zone)} ({counted} of {required})."


def thread_extended_running(*, request_id: str, window_end: dt.datetime, extended_to: dt.datetime,
                            approvers: Sequence[str], zone: dt.tzinfo) -> str:
    by = (f"approved by {' and '.join(approvers)}" if approvers
          else "the pool needs no approval for drains")
    return (f"The drain window of {request_id} now ends {_at(extended_to, zone)} (was {_at(window_end, zone)}; {by}): "
            f"its nodes stay held until then, and are validated and uncordoned after.")


def rollback_unfinished(run: str, state: str) -> str:
    return f"run {run} is {state}: abort it (or let it finish) before rolling it back"


def rollback_already_asked(run: str, request: str) -> str:
    return f"a rollback of run {run} is already asked for: {request} (approve it, or cancel it and ask again)"


def rollback_while_continued(run: str, request: str) -> str:
    return (f"run {run} is being continued by {request}: cancel that request (or let its run finish and "
            f"roll that run back) before rolling run {run} back")
