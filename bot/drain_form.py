"""The drain request form: the modal a "Request a drain" button opens (views.open with
the click's trigger_id), and what its submission means.

The form asks what `/gpu drain` asks (nodes or a pool, when, how long, why) and submits
it as the same structured request the command's grammar reads its words into (a
`DrainAsk`), run as that command (`commands.drain.request_drain` through
`commands.registry.invoke`): the same role checks, policy gates, plan and stored request,
with no words made and read back, so a reason may say anything. Only what can be checked
without the cluster is checked here, in the ack, as field errors (no target, a word that
is not a name, a duration that does not read, a time missing or past, no reason). The
form always asks for a reason, which `/gpu drain` needs only where the pool wants
approvals: whoever fills in a form can say why. The answer names the `/gpu drain` line
that asks the same, for next time.

Its private_metadata says only where to answer (the channel the button was in); like a
button's value it is a pointer, read defensively on submit. A form opened from the Home
tab has no channel, so it asks for one: a request without a channel would have no
thread, and its progress (PDB blocks, window ending, the end) would reach nobody.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
from dataclasses import dataclass
from typing import Any

from slack_sdk.models.blocks import (
    InputBlock,
    MarkdownTextObject,
    PlainTextInputElement,
    PlainTextObject,
    SectionBlock,
)
from slack_sdk.models.views import View

from bot import messages as msg
from bot.forms import (
    REASON,
    REASON_MAX,
    TARGETS,
    FormContext,
    FormReading,
    submitted_values,
    cannot_request,
    usage_for,
    channel_blocks,
    form_metadata,
    read_channel,
    read_when,
    text,
    when_blocks,
)
from bot.intents import TARGET_NAME
from bot.request_forms import RequestForm
from commands.drain import request_drain
from commands.reply import REQUEST_DRAIN
from commands.drain_grammar import KEYWORDS
from workflows.access import Actor
from workflows.drain.plan import DrainAsk, StartFrom
from workflows.durations import parse_duration
from workflows.pools.windows import UTC
from workflows.wording import at_words

DRAIN_CALLBACK = "gpuops.drain-request"
# Each input is the only element of its block, so a block and its action share a name
# (the start, its time and, from the Home tab, the channel are bot.forms's).
DURATION = "duration"
TARGETS_MAX = 2000
DURATION_MAX = 20

_DRAIN = ("drain",)
_TARGET_WORD = re.compile(f"^(?:pool=)?{TARGET_NAME}$")
_TARGET_PLACEHOLDER = "<node...|pool>"


def cannot_request_drain(actor: Actor) -> str | None:
    return cannot_request("drain", actor)


def drain_usage(target: str) -> str:
    """`/gpu drain`'s usage, with the target filled in when there is one."""
    return usage_for("drain", _TARGET_PLACEHOLDER, target)


# ------------------------------------------------------------------ the modal


def drain_form(target: str, context: FormContext) -> dict[str, Any]:
    """The modal, its targets prefilled with `target` ("" for none)."""
    channel, metadata = form_metadata(context)
    return View(
        type="modal",
        callback_id=DRAIN_CALLBACK,
        title=PlainTextObject(text=msg.DRAIN_FORM_TITLE),
        submit=PlainTextObject(text=msg.DRAIN_FORM_SUBMIT),
        close=PlainTextObject(text=msg.DRAIN_FORM_CLOSE),
        private_metadata=metadata,
        blocks=[
            SectionBlock(text=MarkdownTextObject(text=msg.drain_form_intro(channel))),
            InputBlock(block_id=TARGETS, label=PlainTextObject(text=msg.drain_targets_label()),
                       hint=PlainTextObject(text=msg.drain_targets_hint()),
                       element=PlainTextInputElement(action_id=TARGETS, initial_value=target or None,
                                                     max_length=TARGETS_MAX)),
            *when_blocks(),
            InputBlock(block_id=DURATION, label=PlainTextObject(text=msg.drain_duration_label()), optional=True,
                       hint=PlainTextObject(text=msg.drain_duration_hint()),
                       element=PlainTextInputElement(action_id=DURATION, max_length=DURATION_MAX)),
            InputBlock(block_id=REASON, label=PlainTextObject(text=msg.drain_reason_label()),
                       hint=PlainTextObject(text=msg.drain_reason_hint()),
                       element=PlainTextInputElement(action_id=REASON, max_length=REASON_MAX)),
            *channel_blocks(channel),
        ],
    ).to_dict()


# ------------------------------------------------------------------ the submission


@dataclass(frozen=True)
class DrainForm:
    """A drain as the form asked for it, every field readable."""

    targets: tuple[str, ...]
    when: StartFrom
    at: dt.datetime | None  # aware, for when == "at"
    duration: str | None  # as `/gpu drain` reads it after `for`, e.g. "1h30m"
    reason: str
    # The channel picked in a form from the Home tab (else the button's, in the metadata).
    channel: str | None = None

    def ask(self) -> DrainAsk:
        """The drain asked for, as `/gpu drain`'s grammar would read it (a picked time is UTC)."""
        at = self.at if self.when == "at" else None
        return DrainAsk(targets=self.targets, start_from=self.when, at=at, zone=UTC if at is not None else None,
                        duration=parse_duration(self.duration) if self.duration else None, reason=self.reason)

    def words(self) -> list[str]:
        """The `/gpu drain` words that ask for the same drain (shown to the submitter)."""
        words = list(self.targets)
        if self.when == "next-window":
            words.append("next-window")
        elif self.when == "at" and self.at is not None:
            words += at_words(self.at, UTC).split()
        if self.duration:
            words += ["for", self.duration]
        return words + self.reason.split()

    def command(self) -> str:
        """The `/gpu drain ...` line (without `/gpu`) this form stands for, quoted so
        the dispatcher reads back exactly these words."""
        return shlex.join([*_DRAIN, *self.words()])


def read_drain_form(view: dict[str, Any], *, now: dt.datetime) -> FormReading[DrainForm]:
    """The submitted form, or the field errors Slack should show (nothing is done then)."""
    values = submitted_values(view)
    errors: dict[str, str] = {}

    targets = tuple(text(values, TARGETS).replace(",", " ").split())
    if not targets:
        errors[TARGETS] = msg.drain_form_no_targets()
    for word in targets:
        if word.lower() in KEYWORDS:
            errors[TARGETS] = msg.drain_form_clause_in_targets(word)
            break
        if not _TARGET_WORD.fullmatch(word):
            errors[TARGETS] = msg.drain_form_bad_target(word)
            break

    when, at = read_when(values, now=now, errors=errors, no_time=msg.drain_form_no_time())

    written = text(values, DURATION)
    duration = "".join(written.split()) or None
    if duration is not None:
        try:
            ok = duration[:1].isascii() and duration[0].isdigit() and parse_duration(duration) > dt.timedelta(0)
        except ValueError:
            ok = False
        if not ok:
            errors[DURATION] = msg.drain_form_bad_duration(written)

    reason = " ".join(text(values, REASON).split())
    if not reason:
        errors[REASON] = msg.drain_form_no_reason()
    channel = read_channel(values, errors=errors)

    if errors:
        return FormReading(form=None, errors=errors)
    return FormReading(form=DrainForm(targets=targets, when=when, at=at, duration=duration, reason=reason,
                                           channel=channel))


# The form, as the kind's registry line names it (workflows/kinds.py `form`).
DRAIN_REQUEST_FORM = RequestForm(
    kind="drain", action=REQUEST_DRAIN, callback=DRAIN_CALLBACK, title=msg.DRAIN_FORM_TITLE, purpose=msg.DRAIN_FORM_FORM,
    build=drain_form, read=read_drain_form, run=request_drain, footer=msg.drain_form_footer, cannot=cannot_request_drain,
    usage=drain_usage, in_console=msg.drain_form_in_console)
