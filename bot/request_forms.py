"""The request forms, one spec per kind of change that has one (drain, driver upgrade, MIG
change): the button that opens it, the modal, how a submission is read, and the command it
runs as. The click handler, the Slack app and the console look a form up here by the
button's action or by the kind, and the Slack app registers every form in one loop; a
kind with a form adds one entry to `FORMS`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from bot import messages as msg
from bot.drain_form import DRAIN_CALLBACK, cannot_request_drain, drain_form, drain_usage, read_drain_form
from bot.forms import FormContext, FormReading
from bot.mig_form import MIG_CALLBACK, cannot_request_mig, mig_form, mig_usage, read_mig_form
from bot.upgrade_form import UPGRADE_CALLBACK, cannot_request_upgrade, read_upgrade_form, upgrade_form, upgrade_usage
from commands.catalog import REGISTRY
from commands.kinds import BUTTONS
from commands.drain import request_drain
from commands.mig import request_mig
from commands.registry import Call, CommandSpec
from commands.reply import REQUEST_DRAIN, REQUEST_MIG, REQUEST_UPGRADE, Intent, Reply
from commands.upgrade import request_upgrade
from workflows.access import Actor


class SubmittedForm(Protocol):
    """A submission read without field errors (DrainForm, UpgradeForm, MigForm)."""

    @property
    def channel(self) -> str | None: ...

    def command(self) -> str: ...

    def ask(self) -> Any: ...


class ReadForm(Protocol):
    def __call__(self, view: dict[str, Any], *, now: dt.datetime) -> FormReading[Any]: ...


@dataclass(frozen=True)
class RequestForm:
    """One kind's request form."""

    # The kind of change (workflows/kinds.py), also its `/gpu` command's word.
    kind: str
    # The button that opens it (commands.reply) and the modal's callback_id.
    action: str
    callback: str
    # How to name it when it cannot be opened: the button's words, and "to request a ...".
    title: str
    purpose: str
    # The modal, its target prefilled ("" for none).
    build: Callable[[str, FormContext], dict[str, Any]]
    # A submission: the form it asks for, or the field errors Slack should show.
    read: ReadForm
    # The command's own function on the form's ask (what `/gpu <kind>` runs after reading words).
    run: Callable[[Call, Any], Reply]
    # The line under the reply saying which command the form stood for.
    footer: Callable[[str, str | None], str]
    # Why an actor cannot ask for any change of this kind (None: they may, for some pool).
    cannot: Callable[[Actor], str | None]
    # The command's usage with the target filled in, and how the console says to type it.
    usage: Callable[[str], str]
    in_console: Callable[[str], str]

    @property
    def delivery(self) -> str:
        """How the Slack app's journal names a submission ("drain-form")."""
        return f"{self.kind}-form"

    @property
    def command(self) -> CommandSpec:
        return REGISTRY.commands[(self.kind,)]

    @property
    def home_button(self) -> Intent:
        """The button that opens it with nothing filled in (the kind's `RequestButton`'s words)."""
        return Intent(action=self.action, label=BUTTONS[self.kind].label, value="")


FORMS: tuple[RequestForm, ...] = (
    RequestForm(kind="drain", action=REQUEST_DRAIN, callback=DRAIN_CALLBACK, title=msg.DRAIN_FORM_TITLE,
                purpose=msg.DRAIN_FORM_FORM, build=drain_form, read=read_drain_form, run=request_drain,
                footer=msg.drain_form_footer, cannot=cannot_request_drain, usage=drain_usage,
                in_console=msg.drain_form_in_console),
    RequestForm(kind="upgrade", action=REQUEST_UPGRADE, callback=UPGRADE_CALLBACK, title=msg.UPGRADE_FORM_TITLE,
                purpose=msg.UPGRADE_FORM_FORM, build=upgrade_form, read=read_upgrade_form, run=request_upgrade,
                footer=msg.upgrade_form_footer, cannot=cannot_request_upgrade, usage=upgrade_usage,
                in_console=msg.upgrade_form_in_console),
    RequestForm(kind="mig", action=REQUEST_MIG, callback=MIG_CALLBACK, title=msg.MIG_FORM_TITLE,
                purpose=msg.MIG_FORM_FORM, build=mig_form, read=read_mig_form, run=request_mig,
                footer=msg.mig_form_footer, cannot=cannot_request_mig, usage=mig_usage,
                in_console=msg.mig_form_in_console),
)


@dataclass(frozen=True)
class WantedForm:
    """A click that opens a request form: which kind's, with what to fill in ("" for none)."""

    kind: str
    target: str


def form_opened_by(action: str) -> RequestForm | None:
    """The form a button's action opens, if it opens one."""
    return next((form for form in FORMS if form.action == action), None)


def form_of(kind: str) -> RequestForm:
    """The request form of a kind of change that has one."""
    return next(form for form in FORMS if form.kind == kind)


def home_buttons(actor: Actor) -> tuple[Intent, ...]:
    """The Home tab's buttons for `actor`: each form they may open, in the forms' order."""
    return tuple(form.home_button for form in FORMS if form.cannot(actor) is None)
