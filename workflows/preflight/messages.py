"""Every sentence a pre-flight check says in a plan: what it found, about which nodes or
budgets, and what the run will do about it. Each says what happens and what a person can
do instead. Nothing here decides anything."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from workflows.wording import duration_text, names, plural

PREFLIGHT_TITLE = "Pre-flight"

# ------------------------------------------------------------------ nodes with findings

# What a node's open finding means for a run that changes it anyway, by finding code.
_IF_INCLUDED = {
    "advertised-mismatch": "validation waits for every GPU it should advertise",
    "unhealthy-gpus": "validation waits for every GPU to be healthy",
    "device-plugin-no-gpus": "validation waits for the GPUs its device plugin does not advertise",
    "second-device-plugin": "two device plugins advertise its GPUs, so validation may never agree",
    "driver-conflict": "a host driver and the operator's both claim it, so its driver pod cannot settle",
    "driver-crash-loop": "its driver pod keeps failing, so validation waits for a driver that does not start",
    "upgrade-failed": "its last driver upgrade failed, so validation waits for a driver that may not start",
    "upgrade-stuck": "the operator's upgrade of it is stuck, so validation waits for it",
    "mig-change-failed": "its last MIG change failed, so validation waits for GPUs it may not advertise",
    "mig-change-stuck": "its MIG change is stuck, so validation waits for GPUs it may not advertise",
    "node-not-ready": "validation waits for it to be Ready",
    "canary-failed": "the canary pod failed on it before and is likely to fail again",
}
_IF_INCLUDED_OTHERWISE = "validation may not pass on it"


def finding_line(code: str, message: str) -> str:
    """One open finding of a node, as the pre-flight lists it."""
    return f"{code}: {message}"


def node_kept_out(node: str, *, codes: Sequence[str], what: str) -> str:
    return (f"{node} is left out of the {what}: it has {_open(codes)} the {what} does not fix. "
            f"Ask again with `--include {node}` to change it anyway: {_consequence(codes)}; if it does not pass, "
            f"the run halts at the end of validate_timeout with {node} cordoned, after the waves before it.")


def canary_left_out(node: str, *, codes: Sequence[str], what: str, pool: str) -> str:
    return (f"{node}, the canary of pool {pool}, has {_open(codes)} the {what} does not fix, and the {what} "
            f"starts with its canary: fix it first, name another canary in the pool's configuration, or ask "
            f"with `--include {node}` ({_consequence(codes)}; if it does not pass, the run halts there "
            f"before any other node changes).")


def _consequence(codes: Sequence[str]) -> str:
    return "; ".join(dict.fromkeys(_IF_INCLUDED.get(code, _IF_INCLUDED_OTHERWISE) for code in codes))


def node_included(node: str, *, codes: Sequence[str], what: str) -> str:
    return (f"{node} is in the {what} as the request names it, although it has {_open(codes)} the {what} "
            f"does not fix: {_consequence(codes)}; if it does not pass, the run halts there with {node} cordoned.")


def node_fixed_by_change(node: str, *, codes: Sequence[str], what: str) -> str:
    return f"{node} stays in the {what}: it has {_open(codes)} the {what} is expected to clear ({', '.join(codes)})."


def include_not_planned(nodes: Sequence[str], *, what: str, pool: str) -> str:
    return (f"`--include` names {names(nodes)}, which {'is' if len(nodes) == 1 else 'are'} not among the nodes "
            f"this {what} of pool {pool} changes; name nodes of the pool the {what} reaches, or leave it out.")


def every_node_left_out(pool: str, *, what: str, nodes: Sequence[str]) -> str:
    return (f"every node the {what} of pool {pool} would change has an open finding it does not fix "
            f"({names(nodes)}); fix them first, or name the ones to change anyway with `--include <node>`.")


def _open(codes: Sequence[str]) -> str:
    return f"an open finding ({', '.join(codes)})" if len(codes) == 1 else f"open findings ({', '.join(codes)})"


# ------------------------------------------------------------------ budgets

# What the run does when a budget still refuses an eviction at the end of drain_timeout,
# by the pool's `pdb_timeout_action`.
BUDGET_ACTIONS = {
    "halt": "halts the run with the node cordoned, for a person to decide",
    "wait": "halts the run with the node cordoned, for a person to decide",
    "skip": "leaves the node out of the drain (uncordoned, its pods keep running)",
    "delete": "deletes the pods in spite of the PDB",
}


def budget_blocks(budget: str, *, allowed: int, needed: int, pods: Sequence[str], timeout: dt.timedelta,
                  action: str, by_operator: bool) -> str:
    how = ("the GPU Operator deletes them per its upgradePolicy (its own drain settings decide)" if by_operator
           else f"each eviction is retried for up to {duration_text(timeout)}, then gpuops "
                f"{BUDGET_ACTIONS.get(action, action)}")
    return (f"PodDisruptionBudget {budget} allows {plural(allowed, 'disruption')} now, but a wave moves {needed} "
            f"of the GPU pods it protects ({names(pods, at_most=4)}): {how}.")


# ------------------------------------------------------------------ the plan view


def preflight_line(severity: str, sentence: str) -> str:
    """One pre-flight note as the plan view lists it, what matters most marked."""
    return sentence if severity == "info" else f"{severity.capitalize()}: {sentence}"
