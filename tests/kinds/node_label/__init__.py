"""A kind of change only the tests have: set one label on a pool's nodes (or some of
them) inside the pool's window, node by node, after the pool's approvals; a halted run is
rolled back by putting each label it touched back.

It is added the way any kind is: its registry line (`KIND`, and `registry()`: the
product's kinds and this one), its plan (`plan`), its service (`service`: request,
preview, rollback), its commands module (`commands`: `/gpu label` and its request
button), its request form (`form`), and its step logic (`step_logic`: `set-label`); the
registry line names each. Nothing else in gpuops knows it: `in_force()` puts its registry
in force in this process (what a composition root does), and every layer finds the rest
from the line; `python -m tests.kinds.node_label.engine_process` is the engine process with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from workflows.kinds import KINDS, ChangeKind, KindRegistry, logic_in, put_in_force

# The registry line.
KIND = ChangeKind(name="label", noun="a node label", title="Node label", step_kinds=("set-label",),
                  default_approvals={"serving": 2, "training": 1}, rollback=True,
                  step_logic=logic_in("tests.kinds.node_label.step_logic"),
                  service="tests.kinds.node_label.service.LabelService", commands="tests.kinds.node_label.commands",
                  form="tests.kinds.node_label.form.LABEL_REQUEST_FORM")


def registry() -> KindRegistry:
    """The product's kinds and this one."""
    return KINDS.with_kind(KIND)


@contextmanager
def in_force() -> Iterator[KindRegistry]:
    """This kind known to the process for the `with` block: its registry in force (taken
    back after, so other tests see gpuops as it ships)."""
    kinds = registry()
    replaced = put_in_force(kinds)
    try:
        yield kinds
    finally:
        put_in_force(replaced)
