"""The MIG change request form: the modal a "Request a MIG change" button opens (on a
MIG-capable pool's `/gpu status <pool>` and on the Home tab), and what its submission
means.

The form asks what `/gpu mig` asks (the pool or nodes, the layout, when, why) and submits
it as the same structured request the command reads its words into (a `MigAsk`), run as
that command (`commands.mig.request_mig` through `commands.registry.invoke`): the same
role checks, layout checks against the MIG manager's config, plan and stored request.
Only what needs no cluster is checked here, in the ack, as field errors (targets or a
layout that are not names, a time missing or past, no reason). The answer names the
`/gpu mig` line that asks the same, for next time.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
from dataclasses import dataclass
from typing import Any

from slack_sdk.models.blocks import InputBlock, MarkdownTextObject, PlainTextInputElement, PlainTextObject, SectionBlock
from slack_sdk.models.views import View

from bot import messages as msg
from bot.forms import (
    REASON,
    REASON_MAX,
    TARGETS,
    FormContext,
    FormReading,
    cannot_request,
    channel_blocks,
    form_metadata,
    read_channel,
    read_when,
    submitted_values,
    text,
    usage_for,
    when_blocks,
)
from bot.intents import TARGET_NAME
from bot.request_forms import RequestForm
from commands.mig import request_mig
from commands.reply import REQUEST_MIG
from workflows.access import Actor
from workflows.drain.plan import StartFrom
from workflows.mig.plan import MigAsk
from workflows.pools.windows import UTC
from workflows.wording import at_words

MIG_CALLBACK = "gpuops.mig-request"
LAYOUT = "layout"
MIG_TARGETS_MAX, LAYOUT_MAX = 500, 63

_MIG = ("mig",)
_NAME = re.compile(f"^{TARGET_NAME}$")
_LAYOUT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def cannot_request_mig(actor: Actor) -> str | None:
    return cannot_request("mig", actor)


def mig_usage(pool: str) -> str:
    """`/gpu mig`'s usage, with the pool filled in when there is one."""
    return usage_for("mig", "<pool|node...>", pool)


def mig_form(pool: str, context: FormContext) -> dict[str, Any]:
    """The modal, its pool prefilled with `pool` ("" for none)."""
    channel, metadata = form_metadata(context)
    return View(
        type="modal",
        callback_id=MIG_CALLBACK,
        title=PlainTextObject(text=msg.MIG_FORM_TITLE),
        submit=PlainTextObject(text=msg.MIG_FORM_SUBMIT),
        close=PlainTextObject(text=msg.DRAIN_FORM_CLOSE),
        private_metadata=metadata,
        blocks=[
            SectionBlock(text=MarkdownTextObject(text=msg.mig_form_intro(channel))),
            InputBlock(block_id=TARGETS, label=PlainTextObject(text=msg.mig_targets_label()),
                       hint=PlainTextObject(text=msg.mig_targets_hint()),
                       element=PlainTextInputElement(action_id=TARGETS, initial_value=pool or None,
                                                     max_length=MIG_TARGETS_MAX)),
            InputBlock(block_id=LAYOUT, label=PlainTextObject(text=msg.mig_layout_label()),
                       hint=PlainTextObject(text=msg.mig_layout_hint()),
                       element=PlainTextInputElement(action_id=LAYOUT, max_length=LAYOUT_MAX)),
            *when_blocks(),
            InputBlock(block_id=REASON, label=PlainTextObject(text=msg.drain_reason_label()),
                       hint=PlainTextObject(text=msg.drain_reason_hint()),
                       element=PlainTextInputElement(action_id=REASON, max_length=REASON_MAX)),
            *channel_blocks(channel),
        ],
    ).to_dict()


@dataclass(frozen=True)
class MigForm:
    """A MIG change as the form asked for it, every field readable."""

    targets: tuple[str, ...]
    layout: str
    when: StartFrom
    at: dt.datetime | None  # aware, for when == "at"
    reason: str
    channel: str | None = None

    def ask(self) -> MigAsk:
        return MigAsk(targets=self.targets, layout=self.layout, reason=self.reason,
                      start=self.at if self.when == "at" else None, next_window=self.when == "next-window")

    def command(self) -> str:
        """The `/gpu mig ...` line (without `/gpu`) that asks for the same change."""
        words = [*_MIG, *self.targets, self.layout]
        if self.when == "next-window":
            words.append("next-window")
        elif self.when == "at" and self.at is not None:
            words += at_words(self.at, UTC).split()
        return shlex.join(words + self.reason.split())


def read_mig_form(view: dict[str, Any], *, now: dt.datetime) -> FormReading[MigForm]:
    """The submitted form, or the field errors Slack should show (nothing is done then)."""
    values = submitted_values(view)
    errors: dict[str, str] = {}

    targets = tuple(dict.fromkeys(text(values, TARGETS).replace(",", " ").split()))
    if not targets or not all(_NAME.fullmatch(t) for t in targets):
        errors[TARGETS] = msg.mig_form_bad_targets(" ".join(targets))
    layout = text(values, LAYOUT)
    if not _LAYOUT.fullmatch(layout):
        errors[LAYOUT] = msg.mig_form_bad_layout(layout)
    when, at = read_when(values, now=now, errors=errors, no_time=msg.mig_form_no_time())
    reason = " ".join(text(values, REASON).split())
    if not reason:
        errors[REASON] = msg.mig_form_no_reason()
    channel = read_channel(values, errors=errors)

    if errors:
        return FormReading(form=None, errors=errors)
    return FormReading(form=MigForm(targets=targets, layout=layout, when=when, at=at, reason=reason,
                                    channel=channel))


# The form, as the kind's registry line names it (workflows/kinds.py `form`).
MIG_REQUEST_FORM = RequestForm(
    kind="mig", action=REQUEST_MIG, callback=MIG_CALLBACK, title=msg.MIG_FORM_TITLE, purpose=msg.MIG_FORM_FORM,
    build=mig_form, read=read_mig_form, run=request_mig, footer=msg.mig_form_footer, cannot=cannot_request_mig,
    usage=mig_usage, in_console=msg.mig_form_in_console)
