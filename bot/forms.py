"""What the request forms (the drain form, the upgrade form) share: where the answer goes
(the channel the button was in, kept in the view's private_metadata, or a channel picked
in a form opened from the Home tab), the start choice (now, the pool's next window, a
picked time), and reading a submitted view's values defensively.

Private metadata is a pointer, like a button's value: read back only when it is what a
form wrote (a checked channel id), else ignored.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from slack_sdk.models.blocks import (
    ConversationFilter,
    ConversationSelectElement,
    DateTimePickerElement,
    InputBlock,
    Option,
    PlainTextObject,
    StaticSelectElement,
)

from bot import messages as msg
from commands import messages as command_msg
from commands.catalog import REGISTRY
from workflows.access import Actor
from workflows.drain.plan import StartFrom
from workflows.pools.windows import UTC

# Each input is the only element of its block, so a block and its action share a name.
WHEN, TIME, CHANNEL = "when", "time", "channel"
# The inputs more than one form asks for: what to change (nodes, pools) and why.
TARGETS, REASON = "targets", "reason"
WHENS: tuple[StartFrom, ...] = ("now", "next-window", "at")
# The longest reason a person may type: a request's in its form, a denial's in its modal.
REASON_MAX = 500
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{2,30}$")


Form = TypeVar("Form")


@dataclass(frozen=True)
class FormReading(Generic[Form]):
    """A submitted form read: the request it asks for, or (form None) the field errors
    Slack should show, block_id -> what is wrong there (nothing is done then)."""

    form: Form | None
    errors: dict[str, str] = field(default_factory=dict)


def submitted_values(view: dict[str, Any]) -> dict[str, Any]:
    """`view.state.values` of a submission: block_id -> action_id -> the element's value."""
    values = (view.get("state") or {}).get("values")
    return values if isinstance(values, dict) else {}


def cannot_request(command: str, actor: Actor) -> str | None:
    """Why `actor` cannot ask for any `/gpu <command>` (the dispatcher's words), or None
    when they hold the role it needs for some pool (the command checks the pool)."""
    spec = REGISTRY.commands.get((command,))
    if spec is None:
        return msg.not_a_gpuops_button()
    return None if actor.has_anywhere(spec.role) else command_msg.needs_role(spec.name, spec.role, actor)


def usage_for(command: str, placeholder: str, value: str) -> str:
    """`/gpu <command>`'s usage with `placeholder` filled in by `value` when there is one."""
    spec = REGISTRY.commands.get((command,))
    usage = spec.usage if spec is not None else f"{command} {placeholder}"
    return usage.replace(placeholder, value, 1) if value else usage


@dataclass(frozen=True)
class FormContext:
    # The channel the button was clicked in: where the plan is shown and the request's
    # thread posted. None from the Home tab (the form then asks for a channel).
    channel: str | None = None


def checked_channel(channel: object) -> str | None:
    return channel if isinstance(channel, str) and _CHANNEL_ID.fullmatch(channel) else None


def form_metadata(context: FormContext) -> tuple[str | None, str]:
    """The checked channel of `context`, and the private_metadata that keeps it."""
    channel = checked_channel(context.channel)
    return channel, json.dumps({"channel": channel} if channel else {})


def form_context(private_metadata: str) -> FormContext:
    """Where to answer; no channel when the metadata is not what a form wrote."""
    try:
        raw = json.loads(private_metadata or "{}")
    except ValueError:
        return FormContext()
    return FormContext(channel=checked_channel(raw.get("channel") if isinstance(raw, dict) else None))


def channel_blocks(channel: str | None) -> list[InputBlock]:
    """The channel picker, for a form with no channel (opened from the Home tab)."""
    if channel:
        return []
    return [InputBlock(block_id=CHANNEL, label=PlainTextObject(text=msg.drain_channel_label()),
                       hint=PlainTextObject(text=msg.drain_channel_hint()),
                       element=ConversationSelectElement(
                           action_id=CHANNEL,
                           filter=ConversationFilter(include=["public", "private"], exclude_bot_users=True)))]


def when_blocks() -> list[InputBlock]:
    """Start (now, the pool's next window, the time below) and the time picker."""
    options = [Option(value=when, label=msg.WHEN_CHOICES[when]) for when in WHENS]
    return [
        InputBlock(block_id=WHEN, label=PlainTextObject(text=msg.drain_when_label()),
                   element=StaticSelectElement(action_id=WHEN, options=options, initial_option=options[0])),
        InputBlock(block_id=TIME, label=PlainTextObject(text=msg.drain_time_label()), optional=True,
                   hint=PlainTextObject(text=msg.drain_time_hint()),
                   element=DateTimePickerElement(action_id=TIME)),
    ]


def value(values: dict[str, Any], block: str) -> dict[str, Any]:
    found = (values.get(block) or {}).get(block)
    return found if isinstance(found, dict) else {}


def text(values: dict[str, Any], block: str) -> str:
    written = value(values, block).get("value")
    return written.strip() if isinstance(written, str) else ""


def read_when(values: dict[str, Any], *, now: dt.datetime, errors: dict[str, str],
              no_time: str) -> tuple[StartFrom, dt.datetime | None]:
    """The start asked for and its time (UTC, for `at` only); a missing or past time
    goes into `errors` (`no_time` says what to pick)."""
    picked = value(values, TIME).get("selected_date_time")
    at = dt.datetime.fromtimestamp(picked, tz=UTC) if isinstance(picked, int) and not isinstance(picked, bool) \
        else None
    chosen = (value(values, WHEN).get("selected_option") or {}).get("value")
    when: StartFrom = chosen if chosen in WHENS else ("at" if at is not None else "now")
    if when == "at":
        if at is None:
            errors[TIME] = no_time
        elif at < now:
            errors[TIME] = msg.drain_form_time_passed()
    return when, at if when == "at" else None


def read_channel(values: dict[str, Any], *, errors: dict[str, str]) -> str | None:
    """The channel picked in a form from the Home tab (None in a form that did not ask)."""
    if CHANNEL not in values:
        return None
    picked = checked_channel(value(values, CHANNEL).get("selected_conversation"))
    if picked is None:
        errors[CHANNEL] = msg.drain_form_no_channel()
    return picked
