"""The Slack-agnostic answer of a command: a small view model that bot/ renders as Block
Kit, as console text or as command-line output. Commands put all their rows in; the
renderers decide how much fits and say "and N more"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from commands.pictures import Picture
from workflows.fleet.findings import Severity

# The button that offers to request a drain of the pool or node a reply is about: its
# value is only that name ("" for none). Slack opens the drain form; the console says
# which `/gpu drain` to type.
REQUEST_DRAIN = "request-drain"
# Opens the upgrade form for the pool in its value ("" for none).
REQUEST_UPGRADE = "request-upgrade"
REQUEST_MIG = "request-mig"
# A person says the host driver is gone from the node a move to the operator waits on.
HOST_DRIVER_REMOVED = "host-driver-removed"


@dataclass(frozen=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    title: str | None = None


@dataclass(frozen=True)
class Notice:
    """A finding or warning: one line an on-call engineer can act on."""

    severity: Severity
    text: str
    subject: str | None = None
    command: str | None = None  # a /gpu command that shows more
    runbook: str | None = None  # its runbook on the documentation site (`docs_url`)


@dataclass(frozen=True)
class Confirm:
    title: str
    text: str
    confirm: str = "Yes"
    deny: str = "Cancel"


@dataclass(frozen=True)
class Intent:
    """A button. `value` is an opaque id the server looks up and checks again when
    clicked; it never carries a decision the server trusts."""

    action: str  # e.g. "approve", "deny", "abort", "ack"
    label: str
    value: str
    style: Literal["primary", "danger"] | None = None
    confirm: Confirm | None = None


@dataclass(frozen=True)
class Section:
    title: str | None = None
    text: str | None = None
    facts: tuple[Fact, ...] = ()
    table: Table | None = None
    notices: tuple[Notice, ...] = ()
    bullets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reply:
    title: str
    summary: str | None = None
    sections: tuple[Section, ...] = ()
    intents: tuple[Intent, ...] = ()
    # False when the command could not do what was asked (bad input, unknown name,
    # missing role): the command line exits non-zero, Slack shows it only to the user.
    ok: bool = True
    # Who sees it in Slack: only the user, or the channel.
    visibility: Literal["ephemeral", "in_channel"] = "ephemeral"
    footer: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # A picture that goes with the text (commands.pictures: e.g. `status <pool> --chart`);
    # Slack gets it as a file beside the reply, the console as a file whose path it prints.
    picture: Picture | None = None

    def all_notices(self) -> tuple[Notice, ...]:
        return tuple(n for s in self.sections for n in s.notices)


def error_reply(title: str, text: str, *, hint: str | None = None) -> Reply:
    return Reply(title=title, summary=text, ok=False, footer=hint)
