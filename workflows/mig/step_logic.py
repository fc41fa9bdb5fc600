"""The step kind only MIG changes use, the engine logic that runs it (the `mig` line
of workflows/kinds.py names this module), and the params record it reads (MIG plans
build it)."""

from __future__ import annotations

from collections.abc import Mapping

from workflows.engine.steps.contract import StepLogic
from workflows.engine.steps.mig import Mig, MigParams

__all__ = ["STEP_LOGIC", "MigParams"]

STEP_LOGIC: Mapping[str, StepLogic] = {
    "mig": Mig(),
}
