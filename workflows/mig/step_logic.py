"""The step kind only MIG changes use, and the engine logic that runs it (the `mig` line
of workflows/kinds.py names this module)."""

from __future__ import annotations

from collections.abc import Mapping

from workflows.engine.steps.contract import StepLogic
from workflows.engine.steps.mig import Mig

STEP_LOGIC: Mapping[str, StepLogic] = {
    "mig": Mig(),
}
