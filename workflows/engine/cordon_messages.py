"""What a person reads about cordon marks outside a run (workflows.engine.cordons): a
stale mark cleared, and `/gpu uncordon`'s answers."""

from __future__ import annotations


def stale_mark_cleared(node: str, run: str, by: str) -> str:
    who = f" ({by})" if by else ""
    return (f"{node} was uncordoned by hand after {run}{who}; its gpuops cordon mark was stale and "
            "is removed, so a later cordon is not taken for gpuops'")


def uncordon_not_cordoned(node: str) -> str:
    return f"{node} is not cordoned; nothing to give back"


def uncordon_not_ours(node: str) -> str:
    return (f"{node} was not cordoned by gpuops (it has no gpuops cordon mark): someone cordoned it by "
            "hand, so gpuops leaves it to them (kubectl uncordon, once they agree)")


def uncordon_run_unfinished(node: str, run: str) -> str:
    return (f"{node} is held by {run}, which is still unfinished: say `drain done` for its request or "
            f"abort {run} instead, so the run gives it back itself")


def uncordon_cordoned_before(node: str, run: str) -> str:
    return (f"{node} was already cordoned by someone before {run}; gpuops only marked that cordon and "
            "does not undo it (kubectl uncordon, once whoever cordoned it agrees)")


def uncordoned_by_person(node: str, actor: str, run: str) -> str:
    return f"{actor} uncordoned {node}, which {run} had left cordoned"


def uncordon_changed(node: str) -> str:
    return f"{node} changed while gpuops was uncordoning it; nothing was changed: look at /gpu node {node} and try again"
