"""Refusals about runs, shown verbatim to the person who tried: a run start refused (the
request not runnable, its plan changed or not approved), a control on a run that cannot
take it, `drain done` or a host-driver confirmation that does not apply."""

from __future__ import annotations

from collections.abc import Sequence


def unknown_run(run_id: str, closest: Sequence[str]) -> str:
    if closest:
        return f"No run {run_id}. Did you mean {' or '.join(closest)}?"
    return f"No run {run_id}."


def cannot_control(run_id: str, action: str, state: str) -> str:
    return f"{run_id} is {state}: it cannot be {action}"


def request_not_runnable(request_id: str, state: str) -> str:
    return f"{request_id} is {state}: only an approved or scheduled request can start a run"


def plan_changed_since(request_id: str, *, seen: str, now: str) -> str:
    return (f"{request_id}'s plan changed (hash {seen[:8]} is now {now[:8]}) since the start was decided: "
            f"not started; it starts once its current plan is approved")


def plan_does_not_match_its_hash(request_id: str, plan_hash: str) -> str:
    return (f"{request_id}'s stored plan no longer hashes to {plan_hash[:8]}, the plan its approvals name: "
            f"not started")


def plan_not_approved(request_id: str, plan_hash: str, *, counted: int, required: int) -> str:
    return (f"{request_id}'s plan {plan_hash[:8]} has {counted} of the {required} approvals it needs: "
            f"not started")


def cannot_check_approvals(request_id: str) -> str:
    return (f"{request_id} needs approvals, and this run service cannot read who holds the approver role now: "
            f"not started")


def already_running(request_id: str) -> str:
    return f"{request_id} already has a run in progress"


def nothing_to_release(run_id: str) -> str:
    return f"Run {run_id} has no hold left to end (it already ended or never began)"


def not_allowed_to_release(request_id: str, *, pool: str) -> str:
    return f"Only an operator of pool {pool} or an admin can end the window of {request_id} early"


def not_allowed_to_confirm(run_id: str, pool: str) -> str:
    return f"Only an operator of pool {pool} or an admin can say the host driver is gone for run {run_id}"


def run_not_waiting(run_id: str, state: str) -> str:
    return f"Run {run_id} is {state}: it waits for nothing"


def name_the_node_to_confirm(run_id: str, nodes: Sequence[str]) -> str:
    return (f"Run {run_id} waits for a person at {len(nodes)} nodes ({', '.join(nodes)}): name the one whose host "
            f"driver you changed, e.g. `/gpu migrate confirm {run_id} {nodes[0]}`")


def nothing_to_confirm(run_id: str, node: str | None) -> str:
    where = f" on {node}" if node else ""
    return (f"Run {run_id} is not waiting for a person at a host driver{where} now (it waits only once the node "
            "is cordoned and drained)")


def no_run_yet(request_id: str) -> str:
    return f"{request_id} has no run yet: cancel it with `/gpu cancel {request_id}` instead"
