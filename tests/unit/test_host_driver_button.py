"""The Host driver removed/installed button names its run and node; a value gpuops did
not write is refused before anything is looked up, and a press becomes the same `/gpu
migrate confirm <run> <node>` a person could type."""

from __future__ import annotations

import datetime as dt

import pytest

from bot.clicks import Click, press
from bot.intents import decode_run_at_node
from commands.reply import HOST_DRIVER_REMOVED
from commands.services import Services
from workflows.config import GpuopsConfig

NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
CONFIG = GpuopsConfig.model_validate({"access": {"users": {"U0ADMIN": ["admin"]}}})


@pytest.mark.parametrize(("value", "read"), [
    ("run-4b1d9e@gpu-07", ("run-4b1d9e", "gpu-07")),
    ("run-4b1d9e@ip-10-0-3-7.ec2.internal", ("run-4b1d9e", "ip-10-0-3-7.ec2.internal")),
    ("run-4b1d9e", ("run-4b1d9e", None)),  # a card from before buttons named the node
    ("run-4b1d9e@", None), ("run-4b1d9e@gpu 07", None), ("@gpu-07", None), ("run-1@gpu-07@gpu-08", None),
    ("run-1@gpu-07; drop table", None), ("", None), (None, None),
])
def test_only_a_run_and_a_kubernetes_node_name_are_read_from_the_button(value, read):
    assert decode_run_at_node(value) == read


def test_a_forged_value_is_refused_as_not_a_gpuops_button_and_nothing_is_confirmed():
    services = Services(config=CONFIG, fleet=None)  # type: ignore[arg-type]
    outcome = press(Click(action=HOST_DRIVER_REMOVED, value="run-1@gpu 07 && rm", actor=CONFIG.actor("U0ADMIN"),
                          now=NOW), services)
    assert not outcome.notice.ok
    assert outcome.notice.summary == "That button does not belong to a gpuops message this version understands."


def test_a_press_is_the_confirm_command_for_that_node():
    services = Services(config=CONFIG, fleet=None)  # type: ignore[arg-type]  # no runs here: the command says so
    outcome = press(Click(action=HOST_DRIVER_REMOVED, value="run-1@gpu-07", actor=CONFIG.actor("U0ADMIN"),
                          now=NOW), services)
    assert not outcome.notice.ok and "Runs" in (outcome.notice.summary or outcome.notice.title), outcome.notice
