"""A kind of change that is not in workflows/kinds.py's list (the tests' node label,
tests/kinds/node_label) is known to every layer once its registry is in force, as a
process's composition root puts it: plans take it, a pool's approvals name it and default
to it, requests and cards name it, the engine finds its step logic, the database opens
with its rows, `/gpu` has its command and `/gpu rollback` its answer, every entry point's
services have its service, and pools' status and the Home tab offer its request form, all
from its registry line. Outside that block gpuops is as it ships. And no product file
names it."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from bot import messages as bot_msg
from bot.request_forms import form_of, form_opened_by, forms_in_force, home_buttons
from bot.wiring import kinds_database
from commands.catalog import dispatch
from commands.kinds import answer_of, buttons_in_force
from commands.registry import REGISTRY
from commands.services import Services
from tests.unit.static_fleet import StaticFleet
from storage.database import open_database
from tests.kinds.node_label import KIND, in_force
from tests.kinds.node_label.form import LABEL_REQUEST_FORM
from tests.kinds.node_label.service import LabelService
from tests.kinds.node_label.step_logic import SetLabel
from workflows.config import GpuopsConfig
from workflows.kinds import kinds_in_force
from workflows.engine.steps.table import logic_for
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.pools.config import PoolConfig
from workflows.requests import messages as request_say

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("bot", "commands", "workflows", "storage", "testenv", "deploy")
# The kind's step kind, its package, and the tests' kinds.
NAMES_IT = re.compile(r"\bset-label\b|\btests\.kinds\b|\bNode label\b")


def _plan() -> Plan:
    node = NodeName("lbl-01")
    return Plan(kind=KIND.name, pool="lbl", created_for="U0ALICE", summary=PlanSummary(),
                waves=(Wave(0, (node,), (NodeStep("set-label", node, {"key": "tier", "value": "gold"}),)),))


def test_a_kind_in_force_is_planned_approved_worded_stored_run_and_commanded_by_every_layer(tmp_path):
    with in_force():
        assert _plan().kind == "label"
        serving = PoolConfig.model_validate({"kind": "serving"})
        assert serving.approvals_required("label") == 2  # the kind's own default: the two-person rule
        assert PoolConfig.model_validate({"kind": "training", "approvals": {"label": 2}}).approvals_required(
            "label") == 2
        assert isinstance(logic_for("set-label"), SetLabel)
        assert bot_msg.request_card_title("label", "req-1", "lbl") == "Node label request req-1 · pool lbl"
        assert request_say.no_request_reason(pool="lbl", kind="label").startswith("Say why you request a node label")
        assert ("label",) in REGISTRY.commands and answer_of("label") is not None
        database = kinds_database(tmp_path / "gpuops.db")
        try:
            kinds = {row[0] for row in database.get().execute("SELECT name FROM request_kinds")}
            steps = {row[0] for row in database.get().execute("SELECT name FROM step_kinds")}
        finally:
            database.close()
        assert "label" in kinds and "set-label" in steps


ACCESS = {"users": {"U0ALICE": ["operator"], "U0BOB": ["approver"], "U0CAROL": ["approver"]}}
CONFIG = {"pools": {"lbl": {"kind": "serving", "windows": "always", "max_unavailable": 1}}, "access": ACCESS}
NOW = dt.datetime(2025, 6, 7, 12, tzinfo=dt.timezone.utc)


def _services(tmp_path, make) -> Services:
    nodes = [make.node("lbl-01", pool="lbl")]
    stored = kinds_in_force().storage_kinds()  # the database as a composition root opens it
    database = open_database(tmp_path / "gpuops.db", request_kinds=stored.request_kinds, step_kinds=stored.step_kinds)
    return Services.on_database(config=GpuopsConfig.model_validate(CONFIG),
                                fleet=StaticFleet(make.fleet(nodes, make.operands("lbl-01"))), database=database)


def test_a_kind_from_its_own_package_gets_its_service_command_and_form_from_its_registry_line(tmp_path, make):
    with in_force():
        services = _services(tmp_path, make)
        # The service hook: every entry point's services have it, built from the line.
        assert isinstance(services.changes["label"], LabelService)
        # The command: `/gpu label` runs, through the kind's service, to a stored request.
        reply = dispatch("label lbl-01 tier=gold for the new SKU", actor=services.config.actor("U0ALICE"),
                         services=services, now=NOW)
        assert reply.ok, reply.summary
        assert [r.kind for r in services.requests.open_requests("lbl")] == ["label"]  # type: ignore[union-attr]
        # The form: registered with the others, opened by its button, offered at Home.
        assert LABEL_REQUEST_FORM in forms_in_force() and form_of("label") is LABEL_REQUEST_FORM
        assert form_opened_by("request-label") is LABEL_REQUEST_FORM
        assert "Request a node label" in [b.label for b in home_buttons(services.config.actor("U0ALICE"))]
        assert "label" in [b.kind for b in buttons_in_force()]


def test_outside_its_block_gpuops_knows_only_its_own_kinds(tmp_path, make):
    with in_force():
        assert ("label",) in REGISTRY.commands
    with pytest.raises(ValueError, match="unknown step kind 'set-label'"):
        _plan()
    with pytest.raises(ValueError, match="label"):
        PoolConfig.model_validate({"kind": "training", "approvals": {"label": 2}})
    with pytest.raises(KeyError):
        logic_for("set-label")
    assert ("label",) not in REGISTRY.commands and answer_of("label") is None
    assert "label" not in [form.kind for form in forms_in_force()] and form_opened_by("request-label") is None
    assert "label" not in [b.kind for b in buttons_in_force()]
    assert "label" not in _services(tmp_path / "out", make).changes
    db = open_database(tmp_path / "gpuops.db")
    try:
        assert "label" not in {row[0] for row in db.execute("SELECT name FROM request_kinds")}
    finally:
        db.close()


def test_the_kind_in_its_own_package_is_named_by_no_product_file():
    named = [str(path.relative_to(ROOT)) for package in PRODUCT for path in (ROOT / package).rglob("*")
             if path.is_file() and path.suffix in (".py", ".yaml", ".j2", ".toml")
             and NAMES_IT.search(path.read_text(errors="replace"))]
    assert named == []
