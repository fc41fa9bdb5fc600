"""What a person reads about continuing a halted run (workflows.engine.continuing): the
refusals, and the notes on what the continuation repeats, skips and leaves out."""

from __future__ import annotations

from collections.abc import Sequence

from workflows.wording import names

_CONTINUE_INSTEAD = {
    "paused": "resume it with `/gpu resume {run}` instead",
    "pending": "it has not stopped: only a halted run is continued",
    "running": "it has not stopped: only a halted run is continued",
    "succeeded": "nothing is left to continue",
    "aborted": "a person stopped it: ask for the change again",
}


def continue_not_halted(run_id: str, state: str) -> str:
    instead = _CONTINUE_INSTEAD.get(state, "only a halted run is continued").format(run=run_id)
    return f"run {run_id} is {state}: {instead}"


def continue_dry_run(run_id: str) -> str:
    return f"run {run_id} was a dry run: it changed nothing, so there is nothing to continue; ask for the change"


def continue_pool_not_configured(run_id: str, pool: str) -> str:
    return f"run {run_id} changed pool {pool}, which the configuration no longer has: it cannot be continued"


def continue_already(run_id: str, request_id: str, state: str) -> str:
    if state in ("done", "failed"):
        return (f"run {run_id} was continued already by {request_id} ({state}): "
                f"continue or roll back that request's run instead")
    return (f"run {run_id} is being continued already by {request_id} ({state}): "
            f"approve it, or cancel it and ask again")


def continue_while_rollback(run_id: str, request_id: str) -> str:
    return f"a rollback of run {run_id} is asked for ({request_id}): cancel it before continuing the run"


def continue_nothing_left(run_id: str, *, skipped: str | None) -> str:
    but = f" but {skipped}, which you left out" if skipped else ""
    return f"run {run_id} left no node to continue{but}: every other node is done or was left out"


def continue_skip_unknown_node(node: str, closest: Sequence[str]) -> str:
    hint = f"; did you mean {' or '.join(closest)}?" if closest else ""
    return f"no GPU node {node}{hint}"


def continue_skip_not_in_run(node: str, run_id: str, in_run: Sequence[str]) -> str:
    return f"{node} is not in run {run_id}, which changes {names(in_run)}"


def continue_skip_nothing_left(node: str, run_id: str, progress: str) -> str:
    what = "every step of it is done" if progress == "done" else "the run left it out already"
    return f"{node} has nothing left in run {run_id} ({what}): there is nothing to skip"


def continue_does_not_fit(run_id: str, wave: int, nodes: Sequence[str], reason: str) -> str:
    return (f"continuing run {run_id}: wave {wave + 1} ({names(nodes)}) does not fit the pool now: {reason}")


def continue_reason(run_id: str, reason: str, *, skipped: str | None, cordoned: bool) -> str:
    without = (f" without {skipped}" + (" (left cordoned for a person)" if cordoned else "")) if skipped else ""
    return f"continuation of {run_id}{without}" + (f": {reason}" if reason else "")


def continue_plan_note(run_id: str, nodes: Sequence[str]) -> str:
    return f"continues halted run {run_id} with what it did not finish: {names(nodes)}"


def continue_sets_version_again_note(run_id: str, version: str) -> str:
    return (f"run {run_id} set its driver object back after its canary failed: this continuation sets it to "
            f"{version} again first, and back again if its first wave fails")


def continue_done_note(run_id: str, nodes: Sequence[str]) -> str:
    return f"done in run {run_id}, not touched again (no cordon, no eviction): {names(nodes)}"


def continue_repeats_note(node: str, step: str, *, held: bool) -> str:
    if held:
        return (f"{node} stays cordoned (its cordon taken over from the halted run) and repeats its steps "
                f"from `{step}` on; the steps before it are done")
    return f"{node} repeats its steps from `{step}` on"


def continue_left_out_note(run_id: str, nodes: Sequence[str]) -> str:
    return f"left out by run {run_id}, not in this continuation: {names(nodes)}"


def continue_skipped_note(node: str, run_id: str, *, cordoned: bool) -> str:
    if cordoned:
        return f"{node} is left out (--skip) and left cordoned for a person (run {run_id}'s cordon)"
    return f"{node} is left out (--skip)"
