"""Which logic runs each step kind.
"""

from __future__ import annotations

from workflows.engine.steps.contract import StepLogic
from workflows.engine.steps.cordoning import Cordon, Uncordon
from workflows.engine.steps.driver import Driver, SetDriverVersion
from workflows.engine.steps.eviction import Evict
from workflows.engine.steps.gpu_check import RunGpuCheck
from workflows.engine.steps.host_driver import HostDriverByHand, Restore, SetNodeLabels, Snapshot
from workflows.engine.steps.mig import Mig
from workflows.engine.steps.operator_upgrade import OperatorHold, OperatorUpgrade
from workflows.engine.steps.waiting import DEFAULT_VALIDATE, DEFAULT_WAIT_FOR, Hold, WaitFor, WaitForJobs

LOGIC: dict[str, StepLogic] = {
    "cordon": Cordon(),
    "evict": Evict(),
    "drain": Evict(default_scope="all"),
    "wait-for": WaitFor(DEFAULT_WAIT_FOR),
    "validate": WaitFor(DEFAULT_VALIDATE),
    "wait-for-jobs": WaitForJobs(),
    "driver": Driver(),
    "driver-version": SetDriverVersion(),
    "operator-hold": OperatorHold(),
    "operator-upgrade": OperatorUpgrade(),
    "gpu-check": RunGpuCheck(),
    "snapshot": Snapshot(),
    "host-driver-removed": HostDriverByHand(install=False),
    "host-driver-installed": HostDriverByHand(install=True),
    "node-labels": SetNodeLabels(),
    "restore": Restore(),
    "mig": Mig(),
    "hold": Hold(),
    "uncordon": Uncordon(),
}


def logic_for(kind: str) -> StepLogic:
    return LOGIC[kind]
