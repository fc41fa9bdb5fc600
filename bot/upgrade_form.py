"""The driver upgrade request form: the modal a "Request a driver upgrade" button opens
(on a pool's `/gpu status <pool>` and on the Home tab), and what its submission means.

The form asks what `/gpu upgrade` asks (the pool, the driver version, when, whether a
downgrade is meant, why) and submits it as the same structured request the command reads
its words into (an `UpgradeAsk`), run as that command (`commands.upgrade.request_upgrade`
through `commands.registry.invoke`): the same role checks, scope, plan and stored request,
with no words made and read back, so a reason may say anything (even `--dry-run`). Only
what needs no cluster is checked here, in the ack, as field errors (a pool or version
that is not one, a time missing or past, no reason). The answer names the `/gpu upgrade`
line that asks the same, for next time.

Where the answer goes is bot.forms's: the button's channel, or a channel picked in a form
opened from the Home tab.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
from dataclasses import dataclass
from typing import Any

from slack_sdk.models.blocks import (
    CheckboxesElement,
    InputBlock,
    MarkdownTextObject,
    Option,
    PlainTextInputElement,
    PlainTextObject,
    SectionBlock,
)
from slack_sdk.models.views import View

from bot import messages as msg
from bot.forms import (
    REASON,
    REASON_MAX,
    FormContext,
    FormReading,
    submitted_values,
    cannot_request,
    channel_blocks,
    form_metadata,
    read_channel,
    read_when,
    text,
    usage_for,
    value,
    when_blocks,
)
from bot.intents import TARGET_NAME
from bot.request_forms import RequestForm
from commands.upgrade import request_upgrade
from commands.reply import REQUEST_UPGRADE
from workflows.access import Actor
from workflows.drain.plan import StartFrom
from workflows.pools.windows import UTC
from workflows.upgrade.plan import UpgradeAsk
from workflows.upgrade.scope import DriverVersion, UpgradeRefused
from workflows.wording import at_words

UPGRADE_CALLBACK = "gpuops.upgrade-request"
# Each input is the only element of its block, so a block and its action share a name
# (the start, its time and, from the Home tab, the channel are bot.forms's).
POOL, VERSION, DOWNGRADE = "pool", "version", "downgrade"
POOL_MAX, VERSION_MAX = 63, 20

_UPGRADE = ("upgrade",)
_POOL_WORD = re.compile(f"^{TARGET_NAME}$")


def cannot_request_upgrade(actor: Actor) -> str | None:
    return cannot_request("upgrade", actor)


def upgrade_usage(pool: str) -> str:
    """`/gpu upgrade`'s usage, with the pool filled in when there is one."""
    return usage_for("upgrade", "<pool>", pool)


def upgrade_form(pool: str, context: FormContext) -> dict[str, Any]:
    """The modal, its pool prefilled with `pool` ("" for none)."""
    channel, metadata = form_metadata(context)
    downgrade = Option(value=DOWNGRADE, label=msg.upgrade_downgrade_choice())
    return View(
        type="modal",
        callback_id=UPGRADE_CALLBACK,
        title=PlainTextObject(text=msg.UPGRADE_FORM_TITLE),
        submit=PlainTextObject(text=msg.UPGRADE_FORM_SUBMIT),
        close=PlainTextObject(text=msg.DRAIN_FORM_CLOSE),
        private_metadata=metadata,
        blocks=[
            SectionBlock(text=MarkdownTextObject(text=msg.upgrade_form_intro(channel))),
            InputBlock(block_id=POOL, label=PlainTextObject(text=msg.upgrade_pool_label()),
                       element=PlainTextInputElement(action_id=POOL, initial_value=pool or None,
                                                     max_length=POOL_MAX)),
            InputBlock(block_id=VERSION, label=PlainTextObject(text=msg.upgrade_version_label()),
                       hint=PlainTextObject(text=msg.upgrade_version_hint()),
                       element=PlainTextInputElement(action_id=VERSION, max_length=VERSION_MAX)),
            *when_blocks(),
            InputBlock(block_id=DOWNGRADE, label=PlainTextObject(text=msg.upgrade_downgrade_label()), optional=True,
                       element=CheckboxesElement(action_id=DOWNGRADE, options=[downgrade])),
            InputBlock(block_id=REASON, label=PlainTextObject(text=msg.drain_reason_label()),
                       hint=PlainTextObject(text=msg.drain_reason_hint()),
                       element=PlainTextInputElement(action_id=REASON, max_length=REASON_MAX)),
            *channel_blocks(channel),
        ],
    ).to_dict()


@dataclass(frozen=True)
class UpgradeForm:
    """An upgrade as the form asked for it, every field readable."""

    pool: str
    version: str
    when: StartFrom
    at: dt.datetime | None  # aware, for when == "at"
    downgrade: bool
    reason: str
    # The channel picked in a form from the Home tab (else the button's, in the metadata).
    channel: str | None = None

    def ask(self) -> UpgradeAsk:
        return UpgradeAsk(pool=self.pool, version=self.version, downgrade=self.downgrade, reason=self.reason,
                          start=self.at if self.when == "at" else None, next_window=self.when == "next-window")

    def command(self) -> str:
        """The `/gpu upgrade ...` line (without `/gpu`) that asks for the same upgrade."""
        words = [*_UPGRADE, self.pool, "to", self.version]
        if self.when == "next-window":
            words.append("next-window")
        elif self.when == "at" and self.at is not None:
            words += at_words(self.at, UTC).split()
        if self.downgrade:
            words.append("--downgrade")
        return shlex.join(words + self.reason.split())


def read_upgrade_form(view: dict[str, Any], *, now: dt.datetime) -> FormReading[UpgradeForm]:
    """The submitted form, or the field errors Slack should show (nothing is done then)."""
    values = submitted_values(view)
    errors: dict[str, str] = {}

    pool = text(values, POOL)
    if not _POOL_WORD.fullmatch(pool):
        errors[POOL] = msg.upgrade_form_bad_pool(pool)
    version = text(values, VERSION)
    try:
        version = DriverVersion.parse(version).text
    except UpgradeRefused as err:
        errors[VERSION] = err.reason
    when, at = read_when(values, now=now, errors=errors, no_time=msg.upgrade_form_no_time())
    picked = value(values, DOWNGRADE).get("selected_options")
    downgrade = isinstance(picked, list) and any(
        isinstance(option, dict) and option.get("value") == DOWNGRADE for option in picked)
    reason = " ".join(text(values, REASON).split())
    if not reason:
        errors[REASON] = msg.upgrade_form_no_reason()
    channel = read_channel(values, errors=errors)

    if errors:
        return FormReading(form=None, errors=errors)
    return FormReading(form=UpgradeForm(pool=pool, version=version, when=when, at=at, downgrade=downgrade,
                                               reason=reason, channel=channel))


# The form, as the kind's registry line names it (workflows/kinds.py `form`).
UPGRADE_REQUEST_FORM = RequestForm(
    kind="upgrade", action=REQUEST_UPGRADE, callback=UPGRADE_CALLBACK, title=msg.UPGRADE_FORM_TITLE, purpose=msg.UPGRADE_FORM_FORM,
    build=upgrade_form, read=read_upgrade_form, run=request_upgrade, footer=msg.upgrade_form_footer, cannot=cannot_request_upgrade,
    usage=upgrade_usage, in_console=msg.upgrade_form_in_console)
