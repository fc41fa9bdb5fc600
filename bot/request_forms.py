"""The request forms, one spec per kind of change that has one (drain, driver upgrade, MIG
change): the button that opens it, the modal, how a submission is read, and the command it
runs as. The click handler, the Slack app and the console look a form up here by the
button's action or by the kind, and the Slack app registers every form in one loop. A
kind's form is its own module's `RequestForm`, named by the kind's registry line
(workflows/kinds.py `form`): `forms_in_force()` reads the kinds in force, so a kind with
a form edits nothing here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from bot.forms import FormContext, FormReading
from commands.catalog import REGISTRY
from commands.kinds import BUTTONS
from commands.registry import Call, CommandSpec, kind_commands_loaded
from commands.reply import Intent, Reply
from workflows.access import Actor
from workflows.kinds import kinds_in_force, named


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
        kind_commands_loaded()  # the kind's commands module registers its button
        return Intent(action=self.action, label=BUTTONS[self.kind].label, value="")


def forms_in_force() -> tuple[RequestForm, ...]:
    """The request forms of the kinds in force that have one, in the kinds' order."""
    forms: list[RequestForm] = []
    for kind in kinds_in_force():
        if kind.form is not None:
            form = named(kind.form)
            if not isinstance(form, RequestForm) or form.kind != kind.name:
                raise TypeError(f"kind {kind.name!r}: {kind.form} is not its RequestForm")
            forms.append(form)
    return tuple(forms)


@dataclass(frozen=True)
class WantedForm:
    """A click that opens a request form: which kind's, with what to fill in ("" for none)."""

    kind: str
    target: str


def form_opened_by(action: str) -> RequestForm | None:
    """The form a button's action opens, if it opens one."""
    return next((form for form in forms_in_force() if form.action == action), None)


def form_of(kind: str) -> RequestForm:
    """The request form of a kind of change that has one."""
    return next(form for form in forms_in_force() if form.kind == kind)


def home_buttons(actor: Actor) -> tuple[Intent, ...]:
    """The Home tab's buttons for `actor`: each form they may open, in the forms' order."""
    return tuple(form.home_button for form in forms_in_force() if form.cannot(actor) is None)
