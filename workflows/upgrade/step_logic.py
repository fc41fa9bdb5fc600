"""The step kinds only driver upgrades use, the engine logic that runs each (the
`upgrade` line of workflows/kinds.py names this module), and the params record each
reads (the logic's `params`; upgrade plans build these)."""

from __future__ import annotations

from collections.abc import Mapping

from workflows.engine.steps.contract import StepLogic
from workflows.engine.steps.driver import Driver, DriverParams, DriverVersionParams, SetDriverVersion
from workflows.engine.steps.operator_upgrade import (
    OperatorHold,
    OperatorHoldParams,
    OperatorUpgrade,
    OperatorUpgradeParams,
)

__all__ = ["STEP_LOGIC", "DriverParams", "DriverVersionParams", "OperatorHoldParams", "OperatorUpgradeParams"]

STEP_LOGIC: Mapping[str, StepLogic] = {
    "driver": Driver(),
    "driver-version": SetDriverVersion(),
    "operator-hold": OperatorHold(),
    "operator-upgrade": OperatorUpgrade(),
}
