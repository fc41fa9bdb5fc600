"""The step kinds only moves from a host driver to the operator use, the engine logic
that runs each (the `migrate` line of workflows/kinds.py names this module), and the params
record each reads (migrate plans build these)."""

from __future__ import annotations

from collections.abc import Mapping

from workflows.engine.steps.contract import StepLogic
from workflows.engine.steps.host_driver import (
    HostDriverByHand,
    HostDriverParams,
    NodeLabelsParams,
    Restore,
    RestoreParams,
    SetNodeLabels,
    Snapshot,
)

__all__ = ["STEP_LOGIC", "HostDriverParams", "NodeLabelsParams", "RestoreParams"]

STEP_LOGIC: Mapping[str, StepLogic] = {
    "snapshot": Snapshot(),
    "host-driver-removed": HostDriverByHand(install=False),
    "host-driver-installed": HostDriverByHand(install=True),
    "node-labels": SetNodeLabels(),
    "restore": Restore(),
}
