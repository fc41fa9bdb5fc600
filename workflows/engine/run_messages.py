"""What a person reads about a run's progress: a step started, done, resumed or timed out,
the API's answers while a step runs, a run created, started, moved to its next wave,
paused, resumed, finished; a node left out; `drain done` and a confirmed host driver.
Nothing here decides anything; the engine (workflows.engine.loop, .transitions, .waves)
and `RunService` (workflows.engine.runs) choose."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from workflows.engine.phrases import listed, span


def step_label(kind: str, node: str) -> str:
    return f"{node}: {kind}"


def step_started(kind: str, node: str, *, dry_run: bool) -> str:
    return f"{step_label(kind, node)} started" + (" (dry run)" if dry_run else "")


def step_done(kind: str, node: str, note: str) -> str:
    return f"{step_label(kind, node)} done: {note}"


def step_timed_out(timeout: dt.timedelta | None, reason: str) -> str:
    return f"timed out after {span(timeout)}; last: {reason}"


def step_resumed(kind: str, node: str, replica: str) -> str:
    return f"{step_label(kind, node)} resumed by {replica} after a restart or lease change; checking the cluster first"


def api_refused(error: str) -> str:
    return f"the Kubernetes API refused: {error}"


def api_unreachable(error: str) -> str:
    return f"the Kubernetes API did not answer: {error}; trying again"


def bad_params(error: str) -> str:
    return f"the plan's parameters for this step cannot be used: {error}"


def run_started(run_id: str, request_id: str, nodes: int, waves: int, *, dry_run: bool) -> str:
    what = "Dry run" if dry_run else "Run"
    return (f"{what} {run_id} of {request_id} started: {nodes} node{'s' if nodes != 1 else ''} in "
            f"{waves} wave{'s' if waves != 1 else ''}")


def run_created(run_id: str, request_id: str, *, dry_run: bool) -> str:
    return f"{'Dry run' if dry_run else 'Run'} {run_id} of {request_id} is queued for the engine"


def wave_started(index: int, nodes: Sequence[str], *, position: int = 1, waves: int = 1, nodes_done: int = 0,
                 nodes_total: int = 0, eta: dt.timedelta | None = None) -> str:
    """`position` is the wave's place in the run (1-based), `waves` how many there are."""
    text = f"wave {position} of {waves} started: {listed(nodes)}"
    if nodes_total:
        text += f" ({nodes_done}/{nodes_total} nodes done"
        text += f"; about {span(eta)} left at the pace of the waves so far)" if eta is not None else ")"
    return text


def run_succeeded(run_id: str, *, dry_run: bool, left_cordoned: Sequence[str],
                  left_out: Sequence[str] = ()) -> str:
    text = f"{'Dry run' if dry_run else 'Run'} {run_id} finished: every step done"
    if left_out:
        text = (f"{'Dry run' if dry_run else 'Run'} {run_id} finished without {listed(left_out)} "
                f"(left out, see the thread); every other step done")
    if left_cordoned:
        text += f". Still cordoned, as they were before the run: {listed(left_cordoned)}"
    return text


def dry_run_wave_would_wait(reason: str) -> str:
    return f"(dry run) {reason}; a real run would wait here, the dry run goes on"


def node_left_out(reason: str, *, uncordon_next: bool) -> str:
    return reason + ("" if uncordon_next else ". Its plan has no uncordon step: it stays as it is now")


def run_paused(run_id: str, actor: str) -> str:
    return f"{actor} paused {run_id}: steps in flight finish, nothing new starts"


def run_resumed(run_id: str, actor: str) -> str:
    return f"{actor} resumed {run_id}"


def hold_released(run_id: str, actor: str, *, nodes: Sequence[str]) -> str:
    return (f"{actor} said drain done: the hold of run {run_id} ends now for {listed(nodes)}; "
            f"the nodes are validated and uncordoned next")


def host_driver_confirmed_by(run_id: str, actor: str, nodes: Sequence[str], *, install: bool) -> str:
    if install:
        return (f"{actor} confirmed the host driver is installed on {listed(nodes)}: run {run_id} checks "
                f"{'it' if len(nodes) == 1 else 'them'} and gives {'it' if len(nodes) == 1 else 'them'} back next")
    return (f"{actor} confirmed the host driver is gone from {listed(nodes)}: run {run_id} hands "
            f"{'it' if len(nodes) == 1 else 'them'} to the GPU Operator next")
