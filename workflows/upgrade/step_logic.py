"""The step kinds only driver upgrades use, and the engine logic that runs each (the
`upgrade` line of workflows/kinds.py names this module)."""

from __future__ import annotations

from collections.abc import Mapping

from workflows.engine.steps.contract import StepLogic
from workflows.engine.steps.driver import Driver, SetDriverVersion
from workflows.engine.steps.operator_upgrade import OperatorHold, OperatorUpgrade

STEP_LOGIC: Mapping[str, StepLogic] = {
    "driver": Driver(),
    "driver-version": SetDriverVersion(),
    "operator-hold": OperatorHold(),
    "operator-upgrade": OperatorUpgrade(),
}
