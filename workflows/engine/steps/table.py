"""Which logic runs each step kind: the engine's own for the step kinds every kind of
change shares (cordon, evict, the waits, the canary pod, uncordon), and for a step kind
only one kind of change uses, the logic that kind's registry line gives
(`ChangeKind.step_logic`, workflows/kinds.py). A new kind of change brings its step
kinds in its own package; nothing here changes."""

from __future__ import annotations

from typing import cast

from workflows.engine.steps.contract import StepLogic
from workflows.engine.steps.cordoning import Cordon, Uncordon
from workflows.engine.steps.eviction import Evict
from workflows.engine.steps.gpu_check import RunGpuCheck
from workflows.engine.steps.waiting import DEFAULT_VALIDATE, DEFAULT_WAIT_FOR, Hold, WaitFor, WaitForJobs
from workflows.kinds import KindRegistry, kinds_in_force

# The step kinds the engine runs for any kind of change.
SHARED: dict[str, StepLogic] = {
    "cordon": Cordon(),
    "evict": Evict(),
    # Plans once drained a node in one step (a retired kind runs still hold).
    "drain": Evict(default_scope="all"),
    "wait-for": WaitFor(DEFAULT_WAIT_FOR),
    "validate": WaitFor(DEFAULT_VALIDATE),
    "wait-for-jobs": WaitForJobs(),
    "gpu-check": RunGpuCheck(),
    "hold": Hold(),
    "uncordon": Uncordon(),
}


def logic_for(kind: str, *, kinds: KindRegistry | None = None) -> StepLogic:
    """The logic that runs steps of `kind`: the engine's own, else that of the kind of
    change in `kinds` (default: the registry in force) that lists it and gives its logic.
    KeyError if none does."""
    shared = SHARED.get(kind)
    if shared is not None:
        return shared
    for change in kinds if kinds is not None else kinds_in_force():
        if kind in change.step_kinds:
            logic = change.step_logic().get(kind)
            if logic is not None:
                return cast(StepLogic, logic)
    raise KeyError(f"no logic runs step kind {kind!r}")
