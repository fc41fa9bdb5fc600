"""The driver upgrade form read without Slack: the fields Slack posts, the field errors
the ack shows, the structured request it stands for, and the `/gpu upgrade` line that
asks the same (which the command reads back to the same request)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from bot.forms import FormContext, form_context
from bot.upgrade_form import read_upgrade_form, upgrade_form, upgrade_usage
from commands.upgrade import read_upgrade_words
from workflows.config import GpuopsConfig

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
SAT_0200 = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
POOLS = GpuopsConfig.model_validate({"pools": {"train-a": {"kind": "training", "windows": "always"}}}).pools


def submitted(*, pool: str = "train-a", version: str = "580.105.08", when: str = "now",
              at: dt.datetime | None = None, downgrade: bool = False, reason: str = "CVE fix") -> dict[str, Any]:
    picked = [{"text": {"type": "plain_text", "text": "x"}, "value": "downgrade"}] if downgrade else []
    return {"id": "V0FORM", "state": {"values": {
        "pool": {"pool": {"type": "plain_text_input", "value": pool or None}},
        "version": {"version": {"type": "plain_text_input", "value": version or None}},
        "when": {"when": {"type": "static_select", "selected_option": {"value": when}}},
        "time": {"time": {"type": "datetimepicker", "selected_date_time": int(at.timestamp()) if at else None}},
        "downgrade": {"downgrade": {"type": "checkboxes", "selected_options": picked}},
        "reason": {"reason": {"type": "plain_text_input", "value": reason or None}},
    }}}


def test_the_form_has_the_clicked_pool_filled_in_and_keeps_the_buttons_channel():
    view = upgrade_form("train-a", FormContext(channel="C0OPS"))
    assert view["callback_id"] == "gpuops.upgrade-request" and view["type"] == "modal"
    blocks = {b.get("block_id"): b for b in view["blocks"]}
    assert blocks["pool"]["element"]["initial_value"] == "train-a"
    assert "channel" not in blocks and form_context(view["private_metadata"]).channel == "C0OPS"
    assert "channel" in {b.get("block_id") for b in upgrade_form("", FormContext())["blocks"]}


@pytest.mark.parametrize(("form", "words"), [
    (submitted(), ["upgrade", "train-a", "to", "580.105.08", "CVE", "fix"]),
    (submitted(when="next-window"), ["upgrade", "train-a", "to", "580.105.08", "next-window", "CVE", "fix"]),
    (submitted(when="at", at=SAT_0200, downgrade=True, version="570.172.08"),
     ["upgrade", "train-a", "to", "570.172.08", "at", "2026-12-05", "02:00", "UTC", "--downgrade", "CVE", "fix"]),
])
def test_a_form_stands_for_the_upgrade_line_that_asks_the_same(form, words):
    reading = read_upgrade_form(form, now=NOW)
    assert reading.form is not None, reading.errors
    assert reading.form.command().split() == words
    # The command reads those words back to the very request the form makes.
    assert read_upgrade_words(words[1:], pools=POOLS, now=NOW) == reading.form.ask()


@pytest.mark.parametrize(("form", "field", "words"), [
    (submitted(pool=""), "pool", "Name the pool"),
    (submitted(pool="train a"), "pool", "Name one pool"),
    (submitted(version="latest"), "version", "is not a driver version"),
    (submitted(when="at"), "time", "Pick the time the upgrade starts"),
    (submitted(when="at", at=NOW - dt.timedelta(hours=1)), "time", "That time has passed"),
    (submitted(reason=""), "reason", "Say why"),
])
def test_what_the_form_can_check_itself_is_a_field_error(form, field, words):
    reading = read_upgrade_form(form, now=NOW)
    assert reading.form is None and list(reading.errors) == [field] and words in reading.errors[field]


def test_the_console_names_the_command_the_button_stands_for():
    assert upgrade_usage("train-a").startswith("upgrade train-a to <driver-version>")
    assert upgrade_usage("").startswith("upgrade <pool> to <driver-version>")
