"""What a wait-for or validate step waits for: each condition it can name checks what its
name says (it holds on a node where that is so, and waits on one where only that is not),
and the default conditions of `wait-for` and `validate` each keep a node that fails them
from being given back."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_engine_steps import _Ctx

from workflows.engine.steps.contract import Done, Waiting
from workflows.engine.steps.table import logic_for
from workflows.engine.steps.waiting import WaitFor
from workflows.fleet.assessment import NodeInventory

NODE = "gpu-h100-01"
HOST_DRIVER = {"nvidia.com/gpu.deploy.driver": "false"}


def _operands(make, *, driver: bool = True, driver_ready: bool = True, plugin_ready: bool = True,
              validator_ready: bool = True) -> list:
    pods = [make.device_plugin_pod(NODE, ready=plugin_ready), make.validator_pod(NODE, ready=validator_ready)]
    return ([make.driver_pod(NODE, ready=driver_ready)] if driver else []) + pods


# condition -> (a node where it holds, a node where only it does not)
NODES: dict[str, tuple[Callable[..., NodeInventory], Callable[..., NodeInventory]]] = {
    "node-ready": (lambda make: make.assess(make.node()),
                   lambda make: make.assess(make.node(ready=False))),
    "gpus-advertised": (lambda make: make.assess(make.node()),
                        lambda make: make.assess(make.node(allocatable={"nvidia.com/gpu": "7"}))),
    "device-plugin-ready": (lambda make: make.assess(make.node()),
                            lambda make: make.assess(make.node(), _operands(make, plugin_ready=False))),
    "validator-ready": (lambda make: make.assess(make.node()),
                        lambda make: make.assess(make.node(), _operands(make, validator_ready=False))),
    # A host driver is a driver: the node need not run the operator's driver pod.
    "driver-ready": (lambda make: make.assess(make.node(labels=HOST_DRIVER), _operands(make, driver=False)),
                     lambda make: make.assess(make.node(), _operands(make, driver_ready=False))),
    "operator-driver-ready": (lambda make: make.assess(make.node()),
                              lambda make: make.assess(make.node(labels=HOST_DRIVER), _operands(make, driver=False))),
    "no-operator-driver": (lambda make: make.assess(make.node(labels=HOST_DRIVER), _operands(make, driver=False)),
                           lambda make: make.assess(make.node())),
    "mig-success": (lambda make: make.assess(make.node()),
                    lambda make: make.assess(make.node(labels={"nvidia.com/mig.config.state": "failed"}))),
}


@pytest.mark.parametrize("condition", sorted(NODES))
def test_each_condition_holds_where_it_is_so_and_waits_where_only_it_is_not(make, condition):
    holds, fails = NODES[condition]
    step = WaitFor((condition,))

    assert step.advance(_Ctx(inventory=holds(make))) == Done(f"holds: {condition}")  # type: ignore[arg-type]
    waiting = step.advance(_Ctx(inventory=fails(make)))  # type: ignore[arg-type]
    assert isinstance(waiting, Waiting), waiting


@pytest.mark.parametrize(("kind", "conditions"), [
    ("wait-for", ("node-ready", "gpus-advertised", "device-plugin-ready", "validator-ready")),
    ("validate", ("node-ready", "driver-ready", "device-plugin-ready", "validator-ready", "gpus-advertised")),
])
def test_a_node_failing_any_default_condition_of_wait_for_or_validate_is_not_given_back(make, kind, conditions):
    step = logic_for(kind)
    healthy = make.assess(make.node())

    assert step.advance(_Ctx(inventory=healthy)) == Done(f"holds: {', '.join(conditions)}")  # type: ignore[arg-type]
    for condition in conditions:
        outcome = step.advance(_Ctx(inventory=NODES[condition][1](make)))  # type: ignore[arg-type]
        assert isinstance(outcome, Waiting), (condition, outcome)
