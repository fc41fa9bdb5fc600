"""What a person reads when a run stops short: a step failed and the run halted (with the
wave's fallback step's note), a wave that can no longer start, a run aborted, and the
nodes each leaves cordoned for a person to check. Nothing here decides anything."""

from __future__ import annotations

from collections.abc import Sequence

from workflows.engine.phrases import listed


def halted(node: str, kind: str, reason: str, *, left_cordoned: Sequence[str], after: str | None = None) -> str:
    """`after`: what the wave's step that runs on a failure did (a driver version set back)."""
    text = f"{node}: {kind} failed: {reason}. The run stopped; no further steps or waves"
    return text + "." + (f" Then: {after}." if after else "") + _left_cordoned(left_cordoned)


def fallback_failed(kind: str, reason: str) -> str:
    return f"the {kind} step that runs on a failure failed too: {reason}"


def halted_before_wave(reason: str, *, left_cordoned: Sequence[str]) -> str:
    return f"{reason}. The run stopped; no further waves." + _left_cordoned(left_cordoned)


def halted_elsewhere(node: str) -> str:
    return f"stopped because {node} failed"


def _left_cordoned(nodes: Sequence[str]) -> str:
    if not nodes:
        return " No node is left cordoned by this run."
    if len(nodes) == 1:
        return (f" Left cordoned by this run: {nodes[0]} (once you have checked it, "
                f"`/gpu uncordon {nodes[0]}` gives it back).")
    return (f" Left cordoned by this run: {listed(nodes, limit=20)} (once you have checked them, "
            "`/gpu uncordon <node>` gives each back).")


def run_aborted(run_id: str, actor: str, *, left_cordoned: Sequence[str]) -> str:
    return (f"{actor} aborted {run_id}: nothing more will be done and nodes are left as they "
            "are." + _left_cordoned(left_cordoned))


def aborted_step(actor: str) -> str:
    return f"aborted by {actor}"
