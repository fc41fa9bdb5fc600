"""The modal that asks an approver why they deny a request (views.open with the click's
trigger_id). Its private_metadata says which request and which message to update
afterwards; like a button's value it is only a pointer, checked again on submit."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from slack_sdk.models.blocks import InputBlock, PlainTextInputElement, PlainTextObject, SectionBlock
from slack_sdk.models.views import View

from bot import messages as msg
from bot.forms import REASON_MAX
from bot.render_blocks import escape

DENY_CALLBACK = "gpuops.deny"
REASON_BLOCK = "reason"
REASON_ACTION = "reason"


@dataclass(frozen=True)
class DenyContext:
    value: str  # the Deny button's value
    channel: str | None = None  # the request message to update, when it is a message
    message_ts: str | None = None
    ephemeral: bool = False
    from_home: bool = False
    # The click's response_url: how an ephemeral message is replaced (chat.update cannot).
    response_url: str | None = None


def deny_modal(request_id: str, context: DenyContext) -> dict[str, Any]:
    return View(
        type="modal",
        callback_id=DENY_CALLBACK,
        title=PlainTextObject(text=msg.DENY_MODAL_TITLE),
        submit=PlainTextObject(text=msg.DENY_MODAL_SUBMIT),
        close=PlainTextObject(text=msg.DENY_MODAL_CLOSE),
        private_metadata=json.dumps(asdict(context)),
        blocks=[
            SectionBlock(text=msg.deny_modal_intro(escape(request_id))),
            InputBlock(block_id=REASON_BLOCK, label=PlainTextObject(text=msg.deny_reason_label()),
                       element=PlainTextInputElement(action_id=REASON_ACTION, multiline=True,
                                                     max_length=REASON_MAX)),
        ],
    ).to_dict()


def deny_context(private_metadata: str) -> DenyContext | None:
    try:
        raw = json.loads(private_metadata or "")
        return DenyContext(**{k: raw.get(k) for k in DenyContext.__dataclass_fields__ if k in raw})
    except (ValueError, TypeError, AttributeError):
        return None


def submitted_reason(view: dict[str, Any]) -> str:
    values = (view.get("state") or {}).get("values") or {}
    field = (values.get(REASON_BLOCK) or {}).get(REASON_ACTION) or {}
    return (field.get("value") or "").strip()
