"""With `docs_url` in the configuration, what Slack shows links to the documentation
site's runbooks: each finding in `/gpu findings`, `/gpu status` and the handover, and a
halted run's message in its thread (the runbook of why it halted); the console shows the
same links as text; without it, no link."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from bot.notifier import Notifier, OutboxSlack
from bot.render_blocks import render_blocks
from bot.render_text import render_text
from bot.slack_api import web_client
from bot.wiring import Runtime
from commands.catalog import dispatch
from storage import outbox
from testenv.fakeslack import FakeSlackWebApi
from tests.e2e.harness import CHANNEL, demo_config, submit_upgrade, text_of
from workflows.config import GpuopsConfig

UTC = dt.timezone.utc
DOCS = "https://gpuops.example.com/docs/"


@pytest.fixture
def docs_url() -> str | None:
    return DOCS


@pytest.fixture
def config(docs_url: str | None) -> GpuopsConfig:
    return demo_config(docs_url=docs_url)


@pytest.fixture
def notifier(slack: FakeSlackWebApi, runtime: Runtime) -> Iterator[Notifier]:
    notifier = Notifier(runtime, OutboxSlack.like(web_client(slack.bot_token, base_url=slack.base_url)))
    yield notifier
    notifier.stop()


def findings_text(runtime: Runtime, command: str) -> str:
    reply = dispatch(command, actor=runtime.config.actor("U0DAVE"), services=runtime.services(),
                     now=dt.datetime.now(UTC), channel=CHANNEL)
    return text_of(render_blocks(reply).as_message()["blocks"])


@pytest.mark.parametrize("command", ["/gpu findings", "/gpu status"])
def test_each_finding_links_its_runbook(runtime, command):
    text = findings_text(runtime, command)
    assert "serving-a-000: 4 of 8 nvidia.com/gpu allocatable" in text
    assert f"<{DOCS}runbooks/findings/unhealthy-gpus/|runbook>" in text


def test_each_finding_in_the_handover_links_its_runbook(runtime):
    text = findings_text(runtime, "/gpu handover")
    assert "serving-a-000: 4 of 8 nvidia.com/gpu allocatable" in text
    assert f"<{DOCS}runbooks/findings/unhealthy-gpus/|runbook>" in text


def test_the_console_shows_each_findings_runbook_under_it(runtime):
    reply = dispatch("/gpu findings", actor=runtime.config.actor("U0DAVE"), services=runtime.services(),
                     now=dt.datetime.now(UTC), channel=CHANNEL)
    lines = render_text(reply).splitlines()
    at = next(i for i, line in enumerate(lines) if "serving-a-000: 4 of 8 nvidia.com/gpu allocatable" in line)
    assert lines[at + 1] == f"    runbook: {DOCS}runbooks/findings/unhealthy-gpus/"


@pytest.mark.parametrize("docs_url", [None])
def test_without_docs_url_a_finding_has_no_link(runtime):
    assert "|runbook>" not in findings_text(runtime, "/gpu findings")
    assert "|runbook>" not in findings_text(runtime, "/gpu handover")


def halted(runtime: Runtime, notifier: Notifier, slack: FakeSlackWebApi, halted_on: str | None) -> str:
    """The thread message the notifier posts for a run halted on `halted_on` (its halt code;
    a step kind or None in a message an older gpuops queued), as the engine queues it."""
    view = submit_upgrade(runtime)
    while notifier.deliver_due():
        pass
    payload = {"event": "run.failed", "request_id": view.id, "run_id": "run-1", "state": "failed",
               "text": "gpu-a-01: evict failed: a PodDisruptionBudget allows no disruption"}
    if halted_on is not None:
        payload["halted_on"] = halted_on
    outbox.enqueue(runtime.database.get(), channel=CHANNEL, thread_ts=None, kind="post", at=dt.datetime.now(UTC),
                   dedupe_key=f"{view.id}/failed", payload=payload)
    while notifier.deliver_due():
        pass
    return str(slack.calls("chat.postMessage")[-1].args["text"])


def test_a_halted_runs_thread_message_links_the_runbook_of_why_it_halted(slack, runtime, notifier):
    text = halted(runtime, notifier, slack, "eviction-blocked")
    assert text.startswith("gpu-a-01: evict failed")
    assert text.endswith(f"What to check and do: <{DOCS}runbooks/halts/eviction-blocked/|the runbook>")


def test_a_run_halted_before_a_wave_links_the_window_runbook(slack, runtime, notifier):
    assert f"<{DOCS}runbooks/halts/window-ended/|the runbook>" in halted(runtime, notifier, slack, "window-ended")


def test_a_halt_queued_by_an_older_gpuops_still_links_a_runbook_that_exists(slack, runtime, notifier):
    assert f"<{DOCS}runbooks/halts/step-failed/|the runbook>" in halted(runtime, notifier, slack, "evict")
    assert f"<{DOCS}runbooks/halts/window-ended/|the runbook>" in halted(runtime, notifier, slack, None)


@pytest.mark.parametrize("docs_url", [None])
def test_without_docs_url_a_halted_run_has_no_link(slack, runtime, notifier):
    assert "runbook" not in halted(runtime, notifier, slack, "eviction-blocked")
