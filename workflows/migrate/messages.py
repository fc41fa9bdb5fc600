"""The sentences of host-driver migration plans and refusals."""

from __future__ import annotations

from collections.abc import Sequence

from workflows.wording import names


def pool_not_configured(pool: str) -> str:
    return f"pool {pool} has no policy in the configuration (pools.{pool}): gpuops moves nodes only in configured pools"


def only_to_operator(direction: str) -> str:
    return (f"`to {direction}` is not something gpuops does: it moves nodes from host drivers `to operator`; to put "
            "a moved node back on its host driver, roll its run back (`/gpu rollback <run>`): that restores the "
            "node's labels and taints and leaves it cordoned for the host driver to be reinstalled")


def not_host_owned(node: str, owner: str, evidence: Sequence[str]) -> str:
    return (f"{node}'s driver is not a host driver gpuops can move (driver owner: {owner}"
            + (f"; {'; '.join(evidence)}" if evidence else "") + "): leave it out")


def nothing_to_move(already: Sequence[str]) -> str:
    return f"nothing to move: {names(already)} already take{'s' if len(already) == 1 else ''} the operator's driver"


def node_note(node: str, owner: str, evidence: Sequence[str], label: str, before: str | None) -> str:
    shown = "; ".join(evidence[:2]) if evidence else "no evidence recorded"
    return f"{node}: driver owner {owner} ({shown}); {label}: {before or 'unset'} -> true"


def manual_step_note() -> str:
    return ("the one step a person does: once a node is cordoned and drained, remove the host's NVIDIA driver "
            "packages there and confirm (a button on the request, or `/gpu migrate confirm <run>`; who confirmed "
            "is audited); gpuops cannot log into nodes")


def one_at_a_time_note() -> str:
    return ("one node at a time: snapshot (labels, annotations, taints), cordon, drain GPU pods, wait for the host "
            "driver to go, let the operator deploy its driver, wait for its driver and validator, a test pod asking "
            "for one GPU, every GPU advertised, uncordon")


def already_note(nodes: Sequence[str]) -> str:
    return f"{names(nodes)} already take{'s' if len(nodes) == 1 else ''} the operator's driver: left out"


def rollback_note(run: str, nodes: Sequence[str]) -> str:
    return (f"a rollback of run {run}: {names(nodes)} get back the labels and taints recorded before it changed "
            "them, in one step each, and stay cordoned: reinstall the host driver there, then `/gpu uncordon` them")


def rollback_not_migrate(run: str, kind: str) -> str:
    return f"run {run} is a {kind}, not a move to the operator"


def rollback_nothing_changed(run: str) -> str:
    return f"run {run} changed no node's labels: there is nothing to roll back"
