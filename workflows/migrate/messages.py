"""The sentences of host-driver migration plans and refusals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workflows.wording import names


# What a move does only in a configured pool (`pools.messages.no_policy_for`).
ONLY_CONFIGURED = "gpuops moves nodes only in configured pools"


def _driver_of(to: str) -> str:
    return "the operator's driver" if to == "operator" else "a host driver"


def cannot_move(node: str, owner: str, evidence: Sequence[str], to: str) -> str:
    return (f"{node}'s driver cannot be moved to {_driver_of(to)} (driver owner: {owner}"
            + (f"; {'; '.join(evidence)}" if evidence else "") + "): leave it out")


def nothing_to_move(already: Sequence[str], to: str) -> str:
    return f"nothing to move: {names(already)} already run{'s' if len(already) == 1 else ''} {_driver_of(to)}"


def node_note(node: str, owner: str, evidence: Sequence[str], label: str, before: str | None, after: str,
              *, hand_set: Mapping[str, tuple[str, str]] | None = None) -> str:
    shown = "; ".join(evidence[:2]) if evidence else "no evidence recorded"
    change = f"already {after}" if before == after else f"{before or 'unset'} -> {after}"
    text = f"{node}: driver owner {owner} ({shown}); {label}: {change}"
    if hand_set:
        labels = ", ".join(f"{k}={v} (set by {who})" for k, (v, who) in sorted(hand_set.items()))
        text += f"; hand-set labels removed for GFD to publish its own (a rollback puts them back): {labels}"
    return text


def manual_step_note(*, install: bool, evidence: bool = False) -> str:
    what = ("once the operator's driver is off a node, install the host's NVIDIA driver packages there" if install
            else "once a node is cordoned and drained, remove the host's NVIDIA driver packages there")
    text = (f"the one step a person does: {what} and confirm (a button on the request, or `/gpu migrate confirm "
            "<run>`; who confirmed is audited); gpuops cannot log into nodes")
    if evidence:
        change = "starts working" if install else "stops working (validator waiting for a driver, no GPU advertised)"
        text += f". This pool takes the node's evidence too (host_driver_evidence): once its driver {change}, the step is done, audited"
    return text


def one_at_a_time_note(*, to: str, at_once: int = 1) -> str:
    if to == "host":
        middle = ("turn the operator's driver off, wait for its pod to go, wait for the host driver to be installed, "
                  "wait for it and the validator")
    else:
        middle = ("wait for the host driver to go, let the operator deploy its driver, wait for its driver and "
                  "validator")
    pace = "one node at a time" if at_once <= 1 else f"the first node alone, then up to {at_once} at once"
    return (f"{pace}: snapshot (labels, annotations, taints), cordon, drain GPU pods, {middle}, a test "
            "pod asking for one GPU, every GPU advertised, uncordon")


def already_note(nodes: Sequence[str], to: str) -> str:
    return f"{names(nodes)} already run{'s' if len(nodes) == 1 else ''} {_driver_of(to)}: left out"


def snapshots_back_note(run: str, nodes: Sequence[str]) -> str:
    return (f"a rollback of run {run}: {names(nodes)} get back the labels and taints recorded before it changed "
            "them, in one step each, and stay cordoned: reinstall the host driver there, then `/gpu uncordon` them")


def rollback_not_migrate(run: str, kind: str) -> str:
    return f"run {run} is a {kind}, not a move between host drivers and the operator"


# What a run of this kind changes (`pools.messages.nothing_to_roll_back`).
ROLLED_BACK = "node's labels"
