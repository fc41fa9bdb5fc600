"""The MIG change form read without Slack: the fields Slack posts, the field errors the
ack shows, the structured request it stands for, and the `/gpu mig` line that asks the
same (which the command reads back to the same request)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from bot.forms import FormContext, form_context
from bot.mig_form import mig_form, mig_usage, read_mig_form
from commands.mig import read_mig_words
from commands.registry import Call
from commands.services import Services
from tests.unit.static_fleet import StaticFleet
from workflows.config import GpuopsConfig

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
SAT_0200 = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
CONFIG = GpuopsConfig.model_validate({"pools": {"inf": {"kind": "serving", "windows": "always"}},
                                      "access": {"users": {"U0ALICE": ["operator"]}}})


def submitted(*, targets: str = "inf", layout: str = "all-3g.40gb", when: str = "now",
              at: dt.datetime | None = None, reason: str = "bigger slices") -> dict[str, Any]:
    return {"id": "V0FORM", "state": {"values": {
        "targets": {"targets": {"type": "plain_text_input", "value": targets or None}},
        "layout": {"layout": {"type": "plain_text_input", "value": layout or None}},
        "when": {"when": {"type": "static_select", "selected_option": {"value": when}}},
        "time": {"time": {"type": "datetimepicker", "selected_date_time": int(at.timestamp()) if at else None}},
        "reason": {"reason": {"type": "plain_text_input", "value": reason or None}},
    }}}


def test_the_form_has_the_clicked_pool_filled_in_and_keeps_the_buttons_channel():
    view = mig_form("inf", FormContext(channel="C0OPS"))
    assert view["callback_id"] == "gpuops.mig-request" and view["type"] == "modal"
    blocks = {b.get("block_id"): b for b in view["blocks"]}
    assert blocks["targets"]["element"]["initial_value"] == "inf"
    assert "channel" not in blocks and form_context(view["private_metadata"]).channel == "C0OPS"
    assert "channel" in {b.get("block_id") for b in mig_form("", FormContext())["blocks"]}


@pytest.mark.parametrize(("form", "words"), [
    (submitted(), ["mig", "inf", "all-3g.40gb", "bigger", "slices"]),
    (submitted(targets="inf-01, inf-02", when="next-window"),
     ["mig", "inf-01", "inf-02", "all-3g.40gb", "next-window", "bigger", "slices"]),
    (submitted(when="at", at=SAT_0200), ["mig", "inf", "all-3g.40gb", "at", "2026-12-05", "02:00", "UTC", "bigger",
                                         "slices"]),
])
def test_a_form_stands_for_the_mig_line_that_asks_the_same(make, form, words):
    reading = read_mig_form(form, now=NOW)
    assert reading.form is not None, reading.errors
    assert reading.form.command().split() == words
    nodes = [make.node(n, pool="inf") for n in ("inf-01", "inf-02")]
    fleet = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)])
    call = Call(actor=CONFIG.actor("U0ALICE"), now=NOW, services=Services(config=CONFIG, fleet=StaticFleet(fleet)))
    # The command reads those words back to the very request the form makes.
    assert read_mig_words(words[1:], call=call, fleet=fleet) == reading.form.ask()


@pytest.mark.parametrize(("form", "field", "words"), [
    (submitted(targets=""), "targets", "Name the pool"),
    (submitted(targets="inf/*"), "targets", "Name one pool or nodes of one pool"),
    (submitted(layout="all 1g"), "layout", "Name one layout"),
    (submitted(when="at"), "time", "Pick the time the change starts"),
    (submitted(when="at", at=NOW - dt.timedelta(hours=1)), "time", "That time has passed"),
    (submitted(reason=""), "reason", "Say why"),
])
def test_what_the_form_can_check_itself_is_a_field_error(form, field, words):
    reading = read_mig_form(form, now=NOW)
    assert reading.form is None and list(reading.errors) == [field] and words in reading.errors[field]


def test_the_console_names_the_command_the_button_stands_for():
    assert mig_usage("inf").startswith("mig inf <layout>")
    assert mig_usage("").startswith("mig <pool|node...> <layout>")
