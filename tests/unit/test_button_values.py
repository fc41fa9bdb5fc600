"""A button's value (and a form's metadata) is read only when the whole of it is what
gpuops writes: a value with a trailing newline, which a `$` anchor lets through, is not
a gpuops button, and a press with it is refused before anything is looked up."""

from __future__ import annotations

import datetime as dt

import pytest

from bot.clicks import Click, press
from bot.forms import checked_channel
from bot.intents import action_of, decode_run_at_node, decode_target, decode_value, encode_value
from commands.services import Services
from workflows.config import GpuopsConfig

NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
CONFIG = GpuopsConfig.model_validate({"access": {"users": {"U0ADMIN": ["admin"]}}})
NOT_OURS = "That button does not belong to a gpuops message this version understands."


@pytest.mark.parametrize(("decode", "value"), [
    (decode_value, "req-4b1d9e/0123abcd"),
    (decode_value, "req-4b1d9e"),
    (decode_run_at_node, "run-4b1d9e@gpu-07"),
    (decode_run_at_node, "run-4b1d9e"),
    (decode_target, "gpu-07"),
    (action_of, "gpuops.approve.0"),
    (checked_channel, "C0OPS"),
], ids=lambda v: getattr(v, "__name__", v))
def test_a_value_gpuops_wrote_is_read_and_the_same_value_with_a_trailing_newline_is_not(decode, value):
    assert decode(value) is not None
    assert decode(value + "\n") is None
    assert decode(value + "\r\n") is None


def test_a_value_with_a_trailing_newline_is_never_written_into_a_button():
    with pytest.raises(ValueError):
        encode_value("req-4b1d9e\n")


@pytest.mark.parametrize("action, value", [
    ("abort", "run-4b1d9e\n"), ("rollback", "run-4b1d9e\n"), ("cancel", "req-4b1d9e\n"),
    ("approve", "req-4b1d9e/0123abcd\n"), ("host-driver-removed", "run-4b1d9e@gpu-07\n"),
])
def test_a_press_with_a_trailing_newline_is_refused_as_not_a_gpuops_button(action, value):
    services = Services(config=CONFIG, fleet=None)  # type: ignore[arg-type]

    outcome = press(Click(action=action, value=value, actor=CONFIG.actor("U0ADMIN"), now=NOW), services)

    assert not outcome.notice.ok and outcome.notice.summary == NOT_OURS, outcome.notice
