"""The registry of change kinds (workflows/kinds.py) is what every layer reads: the steps a
kind lists are steps the engine runs and storage names, a kind is registered once, and a
pool's approvals default to its kind's."""

from __future__ import annotations

from typing import get_args

import pytest

from storage.steps import StepKind
from workflows.engine.steps.table import LOGIC
from workflows.kinds import KINDS, ChangeKind, KindRegistry
from workflows.pools.config import PoolConfig


def test_every_step_a_kind_lists_is_one_the_engine_runs_and_storage_names():
    for kind in KINDS:
        assert set(kind.step_kinds) <= set(LOGIC), kind.name
        assert set(kind.step_kinds) <= set(get_args(StepKind)), kind.name
    assert set(KINDS.step_kinds) <= set(LOGIC)


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
