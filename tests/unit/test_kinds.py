"""The registry of change kinds (workflows/kinds.py) is what every layer reads: the steps a
kind lists are steps the engine runs (its own, or the logic the kind's registry line
gives), a kind is registered once, and a pool's approvals default to its kind's."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from workflows.engine.steps.contract import Done, Outcome, StepContext
from workflows.engine.steps.driver import Driver, SetDriverVersion
from workflows.engine.steps.host_driver import HostDriverByHand
from workflows.engine.steps.mig import Mig
from workflows.engine.steps.table import SHARED, logic_for
from workflows.kinds import KINDS, ChangeKind, KindRegistry
from workflows.pools.config import PoolConfig


def test_every_step_a_kind_lists_has_logic_the_engine_runs():
    for step_kind in KINDS.step_kinds:
        assert logic_for(step_kind) is not None, step_kind
    assert isinstance(logic_for("driver"), Driver) and isinstance(logic_for("driver-version"), SetDriverVersion)
    assert isinstance(logic_for("mig"), Mig)
    installed, removed = logic_for("host-driver-installed"), logic_for("host-driver-removed")
    assert isinstance(installed, HostDriverByHand) and installed.install
    assert isinstance(removed, HostDriverByHand) and not removed.install


def test_a_kinds_own_step_logic_neither_shadows_the_engines_nor_another_kinds():
    given: dict[str, str] = {}
    for kind in KINDS:
        own = kind.step_logic()
        assert not set(own) & set(SHARED), kind.name
        assert set(own) <= set(kind.step_kinds), kind.name  # logic for a step its plans never use is dead
        for step_kind in own:
            assert given.setdefault(step_kind, kind.name) == kind.name, step_kind


class _SetLabel:
    """The step logic of a kind only this test knows."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return None

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        return {}

    def advance(self, ctx: StepContext) -> Outcome:
        return Done("label set")


def test_a_kind_brings_its_own_step_kind_and_logic_through_its_registry_line_alone():
    set_label = _SetLabel()
    label = ChangeKind(name="node-label", noun="a node label", title="Node label",
                       step_kinds=("cordon", "set-label", "uncordon"), default_approvals={"serving": 1, "training": 0},
                       step_logic=lambda: {"set-label": set_label})
    wider = KINDS.with_kind(label)
    assert logic_for("set-label", kinds=wider) is set_label
    assert "set-label" in wider.storage_kinds().step_kinds
    # The engine's own steps and the other kinds' are still found through the wider registry.
    assert logic_for("cordon", kinds=wider) is logic_for("cordon")
    assert isinstance(logic_for("mig", kinds=wider), Mig)
    with pytest.raises(KeyError, match="set-label"):
        logic_for("set-label")


def test_a_kind_registered_twice_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        KINDS.with_kind(ChangeKind(name="drain", noun="a drain", title="Drain", step_kinds=(),
                                   default_approvals={"serving": 1, "training": 0}))
    assert "node-label" not in KINDS
    wider = KINDS.with_kind(ChangeKind(name="node-label", noun="a node label", title="Node label",
                                       step_kinds=("node-labels",), default_approvals={"serving": 1, "training": 0}))
    assert wider.names == (*KINDS.names, "node-label") and isinstance(wider, KindRegistry)


@pytest.mark.parametrize(("pool_kind", "expected"), [
    ("serving", {"drain": 1, "upgrade": 2, "mig": 2, "migrate": 2}),
    ("training", {"drain": 0, "upgrade": 1, "mig": 1, "migrate": 1}),
])
def test_a_pool_without_approvals_of_its_own_takes_each_kinds_default(pool_kind, expected):
    pool = PoolConfig.model_validate({"kind": pool_kind, "windows": []})
    assert {kind: pool.approvals_required(kind) for kind in KINDS.names} == expected


def test_a_pool_naming_approvals_for_no_kind_of_change_is_refused_with_the_kinds_it_may_name():
    with pytest.raises(ValueError, match="'reboot' is no kind of change; use one of drain, upgrade, mig, migrate"):
        PoolConfig.model_validate({"kind": "serving", "windows": [], "approvals": {"reboot": 1}})
