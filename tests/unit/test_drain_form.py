"""The drain request form: the modal "Request a drain" opens (within Slack's limits, as
the fake Web API checks them), what a submission is read as (the structured request
`/gpu drain` reads its words into, and the words that ask the same) and which submissions are refused with field errors before anything runs; and
who is offered the button at all."""

from __future__ import annotations

import datetime as dt
import json
import shlex
from typing import Any

import pytest

from bot.clicks import Click, press
from bot.drain_form import (
    DURATION,
    drain_form,
    drain_usage,
    read_drain_form,
)
from bot.forms import CHANNEL, REASON, TARGETS, TIME, FormContext, form_context
from bot.home import home_view
from bot.request_forms import WantedForm, form_of
from commands.catalog import dispatch
from commands.reply import Reply
from commands.services import Services
from testenv.fakeslack import blockkit
from workflows.config import GpuopsConfig
from workflows.drain.plan import DrainAsk
from tests.unit.static_fleet import StaticFleet

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
SAT_0200 = dt.datetime(2026, 12, 5, 2, 0, tzinfo=UTC)

CONFIG = GpuopsConfig.model_validate({
    "pools": {"train-a": {"kind": "training", "windows": "always", "max_unavailable": 2}},
    "access": {"users": {"U0ALICE": ["operator"], "U0DAVE": ["viewer"], "U0ERIN": ["admin"]},
               "names": {"U0ALICE": "alice", "U0DAVE": "dave", "U0ERIN": "erin"}},
})


def submitted(*, targets: str = "gpu-a-01", when: str | None = "now", at: dt.datetime | None = None,
              duration: str = "", reason: str = "firmware") -> dict[str, Any]:
    """A view as Slack sends it on submit: `view.state.values[block_id][action_id]`."""
    values: dict[str, Any] = {
        "targets": {"targets": {"type": "plain_text_input", "value": targets}},
        "time": {"time": {"type": "datetimepicker",
                          "selected_date_time": int(at.timestamp()) if at is not None else None}},
        "duration": {"duration": {"type": "plain_text_input", "value": duration or None}},
        "reason": {"reason": {"type": "plain_text_input", "value": reason or None}},
    }
    if when is not None:
        values["when"] = {"when": {"type": "static_select",
                                   "selected_option": {"text": {"type": "plain_text", "text": when}, "value": when}}}
    return {"id": "V0FORM", "state": {"values": values}}


def words_of(view: dict[str, Any]) -> list[str]:
    reading = read_drain_form(view, now=NOW)
    assert reading.form is not None, reading.errors
    return reading.form.words()


# ------------------------------------------------------------------ the modal


def test_the_form_is_a_modal_slack_accepts_with_the_clicked_pool_filled_in():
    view = drain_form("train-a", FormContext(channel="C0OPS"))

    assert blockkit.view_errors(view, expected_type="modal") == []
    inputs = {b["block_id"]: b for b in view["blocks"] if b["type"] == "input"}
    assert list(inputs) == [TARGETS, "when", TIME, DURATION, REASON]
    assert inputs[TARGETS]["element"]["initial_value"] == "train-a" and not inputs[TARGETS].get("optional")
    assert [o["value"] for o in inputs["when"]["element"]["options"]] == ["now", "next-window", "at"]
    assert inputs["when"]["element"]["initial_option"]["value"] == "now"
    assert inputs[TIME]["element"]["type"] == "datetimepicker" and inputs[TIME]["optional"] is True
    assert inputs[DURATION]["optional"] is True and not inputs[REASON].get("optional")
    # Where to answer, and nothing else.
    assert json.loads(view["private_metadata"]) == {"channel": "C0OPS"}
    assert "<#C0OPS>" in view["blocks"][0]["text"]["text"]


def test_from_the_home_tab_the_form_is_empty_and_asks_where_the_requests_thread_goes():
    view = drain_form("", FormContext())

    assert blockkit.view_errors(view, expected_type="modal") == []
    targets = next(b for b in view["blocks"] if b.get("block_id") == TARGETS)
    assert "initial_value" not in targets["element"]
    assert json.loads(view["private_metadata"]) == {}
    assert "Pick the channel for the request's thread" in view["blocks"][0]["text"]["text"]
    channel = next(b for b in view["blocks"] if b.get("block_id") == CHANNEL)
    assert channel["element"]["type"] == "conversations_select" and not channel.get("optional")
    # Opened in a channel, the form asks for none: the thread goes where the button was.
    assert all(b.get("block_id") != CHANNEL for b in drain_form("x", FormContext(channel="C0OPS"))["blocks"])


def test_a_form_from_the_home_tab_needs_a_channel_and_carries_the_one_picked():
    def with_channel(picked: Any) -> dict[str, Any]:
        view = submitted()
        view["state"]["values"][CHANNEL] = {CHANNEL: {"type": "conversations_select",
                                                      "selected_conversation": picked}}
        return view

    assert read_drain_form(with_channel("C0OPS"), now=NOW).form.channel == "C0OPS"  # type: ignore[union-attr]
    for bad in (None, "", "#ops", "C0OPS> <!channel"):
        reading = read_drain_form(with_channel(bad), now=NOW)
        assert reading.form is None and list(reading.errors) == [CHANNEL], bad
    assert read_drain_form(submitted(), now=NOW).form.channel is None  # type: ignore[union-attr]


@pytest.mark.parametrize("metadata", ['{"channel": "C0OPS> <!channel"}', '{"channel": 7}', "not json", "[]", ""])
def test_metadata_that_is_not_what_the_form_wrote_answers_nowhere_but_the_submitter(metadata):
    assert form_context(metadata).channel is None


def test_the_metadata_the_form_wrote_reads_back():
    assert form_context(drain_form("x", FormContext(channel="C0OPS"))["private_metadata"]).channel == "C0OPS"


# ------------------------------------------------------------------ reading a submission


@pytest.mark.parametrize(("view", "words"), [
    (submitted(targets="gpu-a-01 gpu-a-02"), ["gpu-a-01", "gpu-a-02", "firmware"]),
    (submitted(targets=" gpu-a-01,gpu-a-02 ", reason="NIC  swap"), ["gpu-a-01", "gpu-a-02", "NIC", "swap"]),
    (submitted(targets="train-a", when="next-window"), ["train-a", "next-window", "firmware"]),
    (submitted(when="at", at=SAT_0200, duration="2h"),
     ["gpu-a-01", "at", "2026-12-05", "02:00", "UTC", "for", "2h", "firmware"]),
    (submitted(duration="1h 30m"), ["gpu-a-01", "for", "1h30m", "firmware"]),
    # A time picked while Start says "Now" is not used.
    (submitted(when="now", at=SAT_0200), ["gpu-a-01", "firmware"]),
    # No Start chosen (a client that sends no initial option): the picked time decides.
    (submitted(when=None, at=SAT_0200), ["gpu-a-01", "at", "2026-12-05", "02:00", "UTC", "firmware"]),
    (submitted(targets="pool=train-a"), ["pool=train-a", "firmware"]),
], ids=["nodes", "commas-and-spaces", "next-window", "at-a-time", "duration-with-a-space", "time-ignored",
        "time-without-start", "explicit-pool"])
def test_the_answer_names_the_gpu_drain_words_that_ask_the_same(view, words):
    assert words_of(view) == words


def test_the_command_line_reads_back_as_the_same_words_whatever_the_reason_says():
    reading = read_drain_form(submitted(reason='don\'t drain "serving" ; rm -rf'), now=NOW)
    assert reading.form is not None

    assert shlex.split(reading.form.command()) == ["drain", "gpu-a-01", "don't", "drain", '"serving"', ";", "rm",
                                                   "-rf"]


@pytest.mark.parametrize(("view", "field", "says"), [
    (submitted(targets="   "), TARGETS, "Name at least one GPU node, or a pool."),
    (submitted(targets="gpu-a-01 at sat"), TARGETS, "'at' belongs in Start or How long"),
    (submitted(targets="gpu-a-01 <!channel>"), TARGETS, "'<!channel>' is not a node or pool name"),
    (submitted(duration="2 hours"), DURATION, "Write how long like 2h, 90m or 1h30m, not '2 hours'."),
    (submitted(duration="h2"), DURATION, "not 'h2'"),
    (submitted(duration="0m"), DURATION, "not '0m'"),
    (submitted(when="at"), TIME, "Pick the time the drain starts"),
    (submitted(when="at", at=NOW - dt.timedelta(minutes=5)), TIME, "That time has passed; pick a later one."),
    (submitted(reason="  "), REASON, "Say why the nodes must be drained"),
], ids=["no-targets", "clause-in-targets", "not-a-name", "duration-words", "duration-backwards", "zero-duration",
        "no-time", "past-time", "no-reason"])
def test_input_that_cannot_be_read_is_refused_on_its_field_and_nothing_is_requested(view, field, says):
    reading = read_drain_form(view, now=NOW)

    assert reading.form is None
    assert list(reading.errors) == [field] and says in reading.errors[field]


def test_every_field_at_fault_is_named_at_once():
    reading = read_drain_form(submitted(targets="", when="at", duration="soon", reason=""), now=NOW)

    assert set(reading.errors) == {TARGETS, TIME, DURATION, REASON}


@pytest.mark.parametrize(("view", "ask"), [
    (submitted(targets="gpu-a-01 gpu-a-02"), DrainAsk(targets=("gpu-a-01", "gpu-a-02"), reason="firmware")),
    (submitted(targets="train-a", when="next-window", duration="2h"),
     DrainAsk(targets=("train-a",), start_from="next-window", duration=dt.timedelta(hours=2), reason="firmware")),
    (submitted(when="at", at=SAT_0200), DrainAsk(targets=("gpu-a-01",), start_from="at",
                                                  at=SAT_0200,
                                                  zone=dt.timezone.utc, reason="firmware")),
    # What only the word round trip made ambiguous is the reason, whatever it starts with.
    (submitted(reason="gpu-a-02 shows Xid 79"), DrainAsk(targets=("gpu-a-01",), reason="gpu-a-02 shows Xid 79")),
    (submitted(reason="at noon the NIC is swapped"),
     DrainAsk(targets=("gpu-a-01",), reason="at noon the NIC is swapped")),
    (submitted(reason="for 2 days"), DrainAsk(targets=("gpu-a-01",), reason="for 2 days")),
], ids=["nodes", "next-window-for-2h", "at-a-time", "reason-starting-with-a-node", "reason-starting-with-at",
        "reason-starting-with-for"])
def test_a_submission_is_the_structured_request_gpu_drain_reads_its_words_into(view, ask):
    reading = read_drain_form(view, now=NOW)
    assert reading.form is not None

    assert reading.form.ask() == ask


# ------------------------------------------------------------------ who is offered the button


@pytest.fixture
def services(make) -> Services:
    nodes = [make.node("gpu-a-01", pool="train-a"), make.node("gpu-x-01", pool="not-configured")]
    pods = [pod for node in nodes for pod in make.operands(node.name)]
    return Services(config=CONFIG, fleet=StaticFleet(make.fleet(nodes, pods)))


def buttons(reply: Reply) -> list[tuple[str, str, str]]:
    assert reply.ok, reply.summary
    return [(i.action, i.label, i.value) for i in reply.intents]


@pytest.mark.parametrize("text", ["status train-a", "node gpu-a-01"])
def test_operators_and_admins_are_offered_a_drain_of_the_pool_or_node_they_look_at(services, text):
    target = text.split()[1]
    # A pool's status offers its driver upgrade too (bot.upgrade_form), and a MIG change
    # where its GPUs can do MIG (these can: bot.mig_form).
    upgrade = [("request-upgrade", "Request a driver upgrade", target),
               ("request-mig", "Request a MIG change", target)] if text.startswith("status") else []
    for who in ("U0ALICE", "U0ERIN"):
        reply = dispatch(text, actor=CONFIG.actor(who), services=services, now=NOW)
        assert buttons(reply) == [("request-drain", "Request a drain", target), *upgrade]


def test_viewers_and_nodes_of_pools_without_a_drain_policy_get_no_drain_button(services):
    assert buttons(dispatch("status train-a", actor=CONFIG.actor("U0DAVE"), services=services, now=NOW)) == []
    assert buttons(dispatch("node gpu-a-01", actor=CONFIG.actor("U0DAVE"), services=services, now=NOW)) == []
    assert buttons(dispatch("node gpu-x-01", actor=CONFIG.actor("U0ALICE"), services=services, now=NOW)) == []


def test_clicking_request_a_drain_asks_for_the_form_only_for_someone_who_may_drain(services):
    def click(who: str, value: str | None) -> Any:
        return press(Click(action="request-drain", value=value, actor=CONFIG.actor(who), now=NOW), services)

    assert click("U0ALICE", "train-a").wants_form == WantedForm("drain", "train-a")
    assert click("U0ALICE", None).wants_form == WantedForm("drain", "")  # the Home tab's names nothing
    viewer = click("U0DAVE", "train-a")
    assert viewer.wants_form is None and not viewer.ok
    assert viewer.notice.summary == "`/gpu drain` needs the operator role; dave has viewer."
    junk = click("U0ALICE", '{"approved": true}')
    assert junk.wants_form is None and "does not belong to a gpuops message" in (junk.notice.summary or "")


def test_the_home_tab_has_the_drain_button_without_a_target_only_when_asked_for(services):
    fleet_reply = dispatch("status", actor=CONFIG.actor("U0ALICE"), services=services, now=NOW)

    with_button = home_view(fleet_reply, [], now=NOW, buttons=(form_of("drain").home_button,))
    without = home_view(fleet_reply, [], now=NOW)

    assert blockkit.view_errors(with_button, expected_type="home") == []
    (button,) = [e for b in with_button["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert button["text"]["text"] == "Request a drain" and button["action_id"].startswith("gpuops.request-drain.")
    assert "value" not in button
    assert not [b for b in without["blocks"] if b["type"] == "actions"]


def test_the_console_names_the_command_a_button_stands_for():
    assert drain_usage("train-a") == "drain train-a [at <time>|next-window] [for <duration>] [--include <node>,...] [reason]"
    assert drain_usage("") == "drain <node...|pool> [at <time>|next-window] [for <duration>] [--include <node>,...] [reason]"
