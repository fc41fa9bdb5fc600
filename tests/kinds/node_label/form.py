"""The node label's request form (bot.request_forms `RequestForm`), named by its registry
line: the "Request a node label" button on a pool's status and the Home tab, a modal with
the nodes and the label, read into the same ask `/gpu label` makes."""

from __future__ import annotations

import datetime as dt
import shlex
from dataclasses import dataclass
from typing import Any

from bot.forms import FormContext, FormReading, cannot_request, form_metadata, submitted_values, text, usage_for
from bot.request_forms import RequestForm
from commands.registry import Call
from commands.reply import Reply
from tests.kinds.node_label import KIND
from tests.kinds.node_label.commands import request_label
from tests.kinds.node_label.plan import LabelAsk

ACTION = "request-label"
CALLBACK = "gpuops.label-form"
TARGETS, LABEL = "targets", "label"


@dataclass(frozen=True)
class LabelForm:
    targets: tuple[str, ...]
    key: str
    value: str | None
    channel: str | None = None

    def ask(self) -> LabelAsk:
        return LabelAsk(targets=self.targets, key=self.key, value=self.value, reason="asked with the form")

    def command(self) -> str:
        return shlex.join([KIND.name, *self.targets, f"{self.key}={self.value or ''}"])


def build(target: str, context: FormContext) -> dict[str, Any]:
    _, metadata = form_metadata(context)
    return {"type": "modal", "callback_id": CALLBACK, "private_metadata": metadata,
            "title": {"type": "plain_text", "text": "Node label"},
            "blocks": [{"type": "input", "block_id": TARGETS, "label": {"type": "plain_text", "text": "Nodes"},
                        "element": {"type": "plain_text_input", "action_id": TARGETS, "initial_value": target}},
                       {"type": "input", "block_id": LABEL, "label": {"type": "plain_text", "text": "Label"},
                        "element": {"type": "plain_text_input", "action_id": LABEL}}]}


def read(view: dict[str, Any], *, now: dt.datetime) -> FormReading[LabelForm]:
    values = submitted_values(view)
    targets = tuple(text(values, TARGETS).split())
    key, _, value = text(values, LABEL).partition("=")
    if not targets or not key:
        return FormReading(form=None, errors={TARGETS if not targets else LABEL: "name the nodes and key=value"})
    return FormReading(form=LabelForm(targets=targets, key=key, value=value or None))


def run(call: Call, ask: LabelAsk) -> Reply:
    return request_label(call, ask)


LABEL_REQUEST_FORM = RequestForm(
    kind=KIND.name, action=ACTION, callback=CALLBACK, title="Node label", purpose="to request a node label",
    build=build, read=read, run=run, footer=lambda command, channel: f"as `/gpu {command}`",
    cannot=lambda actor: cannot_request(KIND.name, actor),
    usage=lambda target: usage_for(KIND.name, "<pool|node...>", target),
    in_console=lambda target: f"type `/gpu label {target} <key>=<value>`")
