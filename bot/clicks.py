"""What clicking a gpuops button does, the same for Slack and the console.

A click names an action and carries an opaque value (a request id and the plan hash the
clicker saw). Nothing in it is trusted: the request is looked up again and
`RequestService` checks the clicker's role, the two-person rule, the plan hash and the
deadline, exactly as for a typed command. The outcome says what the clicker should be
told and how the request's message should read now, or that a form comes first (Deny's
reason; "Request a drain" opens the drain form, whose submission is `/gpu drain`; each
kind's form is in bot.request_forms).

A button that stands for a command (a card shown as `/gpu request` shows it, Roll back,
Continue, Host driver removed) runs that command with the button's values
(`commands.registry.run_command`): the typed command's cluster, role check at the door
and audit, with no `/gpu` line written for the dispatcher to split again, so an id or a
node name is only ever that id or name.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass

from bot import messages as msg
from bot.intents import KNOWN_ACTIONS, decode_run_at_node, decode_target, decode_value
from bot.request_card import request_card
from bot.request_forms import RequestForm, WantedForm, form_opened_by
from commands.catalog import access_refusal, run_command
from commands.handover import handover_message
from commands.migrate import confirm_host_driver
from commands.reply import HOST_DRIVER_REMOVED, Reply, error_reply
from commands.clusters import actor_in, services_for_subject
from commands.requests import continue_halted, request_reply
from commands.services import Services
from commands.upgrade import rollback_run
from workflows.access import AccessDenied, Actor
from workflows.engine.runs import RunRefused
from workflows.handover.service import HandoverError, HandoverService
from workflows.requests.errors import RequestRefused, UnknownRequest

log = logging.getLogger("gpuops.bot.clicks")


@dataclass(frozen=True)
class Click:
    action: str
    value: str | None
    actor: Actor
    now: dt.datetime
    reason: str | None = None  # for deny: what the modal (or console prompt) collected


@dataclass(frozen=True)
class ClickOutcome:
    # What to tell the clicker (only them).
    notice: Reply
    # How the request's message should read now; None to leave it alone.
    card: Reply | None = None
    # Deny needs a reason first: the request id to ask it for.
    wants_reason: str | None = None
    # "Request a drain" (a driver upgrade, a MIG change) opens that kind's request form
    # (bot.request_forms), the node or pool filled in.
    wants_form: WantedForm | None = None

    @property
    def ok(self) -> bool:
        return self.notice.ok


def _refused(text: str) -> Reply:
    return error_reply(msg.not_done_title(), text)


def _done(text: str) -> Reply:
    return Reply(title=msg.done_title(), summary=text)


def current_card(request_id: str, services: Services, *, actor: Actor, now: dt.datetime) -> Reply:
    """The request as its message should read now: what `/gpu request <id>` shows (so a
    message keeps its layout when a click updates it), else `request_card`. The id is
    handed to the command as it is, never written into a line to be split again."""
    try:
        reply = run_command("request", lambda call: request_reply(call, request_id, for_channel=True), actor=actor,
                            services=services, now=now, about=request_id)
        if reply.ok:
            return reply
    except Exception:  # noqa: BLE001 - the decision is made; showing it must not fail
        log.exception("/gpu request %s failed; showing the plain card", request_id)
    return request_card(services.requests.get(request_id), now=now, zone=services.config.display_zone)  # type: ignore[union-attr]  # cards are drawn only where requests are served


def _abort(click: Click, run_id: str, services: Services) -> ClickOutcome:
    runs = services.runs
    if runs is None:
        return ClickOutcome(notice=_refused(msg.abort_unavailable()))
    try:
        view = runs.abort(click.actor, run_id, now=click.now)
    except AccessDenied as err:  # a viewer's click is refused like any other
        return ClickOutcome(notice=_refused(access_refusal(err, services)))
    except RunRefused as err:
        return ClickOutcome(notice=_refused(str(err)))
    return ClickOutcome(notice=_done(msg.aborted_by_you(view.id)))


def _rollback(click: Click, run_id: str, services: Services, *, command: str = "rollback") -> ClickOutcome:
    """Ask for the rollback of a halted upgrade or MIG run, as `/gpu rollback <run>` typed in the
    halted request's channel would (the same role check at the door): the new request gets its
    own card and thread there. With `command` "continue", its continuation (`/gpu continue
    <run>`), the same way. The run id is that command's run, whatever characters it holds."""
    channel = None
    if services.runs is not None and services.requests is not None:
        try:
            channel = services.requests.get(services.runs.get(run_id).run.request_id).channel
        except (RunRefused, UnknownRequest):
            pass  # the command says what is wrong with the run
    ask = continue_halted if command == "continue" else rollback_run
    reply = run_command(command, lambda call: ask(call, run_id), actor=click.actor, services=services,
                        now=click.now, about=run_id, channel=channel)
    return ClickOutcome(notice=reply)


def _acknowledge(click: Click, handover_id: str, services: Services) -> ClickOutcome:
    # NB: an id SQLite can hold (found by the fuzzer: a 30-digit id raised OverflowError).
    if services.database is None or not (handover_id.isascii() and handover_id.isdigit() and len(handover_id) <= 18):
        return ClickOutcome(notice=_refused(msg.not_a_gpuops_button()))
    handovers = HandoverService(services.database, services.config)
    try:
        outcome = handovers.acknowledge(click.actor, int(handover_id), now=click.now,
                                        actor_groups=click.actor.groups)
    except HandoverError as err:
        return ClickOutcome(notice=_refused(str(err)))
    card = handover_message(outcome.handover, services.config) if outcome.first else None
    return ClickOutcome(notice=_done(outcome.text), card=card)


def _request_form(click: Click, form: RequestForm) -> ClickOutcome:
    """Nothing is requested yet: the clicker gets the kind's request form (or, in the
    console, the command to type). Someone who cannot ask for any is told so now rather
    than after filling it in; the submission runs the kind's command (`/gpu drain`, `/gpu
    upgrade`, `/gpu mig`), which checks again."""
    target = decode_target(click.value)
    if target is None:
        return ClickOutcome(notice=_refused(msg.not_a_gpuops_button()))
    refusal = form.cannot(click.actor)
    if refusal is not None:
        return ClickOutcome(notice=_refused(refusal))
    return ClickOutcome(notice=_done(""), wants_form=WantedForm(form.kind, target))


def press(click: Click, services: Services) -> ClickOutcome:
    """Carry out one click; refusals come back as the notice, never as an exception."""
    form = form_opened_by(click.action)
    if form is not None:
        return _request_form(click, form)
    if click.action == HOST_DRIVER_REMOVED:
        run_at_node = decode_run_at_node(click.value)
        if run_at_node is None:
            return ClickOutcome(notice=_refused(msg.not_a_gpuops_button()))
        run_id, node = run_at_node
        return ClickOutcome(notice=run_command("migrate confirm",
                                               lambda call: confirm_host_driver(call, run_id, node=node),
                                               actor=click.actor, services=services, now=click.now, about=run_id))
    value = decode_value(click.value)
    if click.action not in KNOWN_ACTIONS or value is None:
        return ClickOutcome(notice=_refused(msg.not_a_gpuops_button()))
    # With several clusters: the request's or run's own cluster (its pools' rules decide).
    services = services_for_subject(services, value.subject)
    click = dataclasses.replace(click, actor=actor_in(services, click.actor))
    if click.action == "abort":
        return _abort(click, value.subject, services)
    if click.action == "handover-ack":
        return _acknowledge(click, value.subject, services)
    if click.action == "rollback":
        return _rollback(click, value.subject, services)
    if click.action == "continue":
        return _rollback(click, value.subject, services, command="continue")
    requests = services.requests
    if requests is None:
        return ClickOutcome(notice=_refused(msg.requests_unavailable()))
    request_id = value.subject
    try:
        if click.action == "approve":
            view = requests.approve(click.actor, request_id, plan_hash=value.plan_hash or "", now=click.now)
            # A running drain's extension still waiting counts its own approvals.
            counted = len(view.extension.approvers) if view.extension is not None else view.approvals_counted
            notice = _done(msg.approved_by_you(view.id, counted, view.approvals_required))
        elif click.action == "deny":
            if not (click.reason or "").strip():
                requests.check_may_deny(click.actor, request_id, now=click.now)  # refused before the form
                return ClickOutcome(notice=_done(""), wants_reason=request_id)
            view = requests.deny(click.actor, request_id, reason=click.reason or "", now=click.now)
            notice = _done(msg.denied_by_you(view.id))
        else:
            view = requests.cancel(click.actor, request_id, now=click.now)
            notice = _done(msg.cancelled_by_you(view.id))
    except UnknownRequest as err:
        return ClickOutcome(notice=_refused(err.reason))
    except RequestRefused as err:
        # The card may be stale (approved, denied or expired meanwhile): show it as it is.
        return ClickOutcome(notice=_refused(err.reason),
                       card=current_card(request_id, services, actor=click.actor, now=click.now))
    return ClickOutcome(notice=notice, card=current_card(view.id, services, actor=click.actor, now=click.now))
