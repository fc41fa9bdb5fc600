"""The Bolt app: one set of listeners for Socket Mode and HTTP mode.

Every delivery is acknowledged at once and the work runs afterwards on the app's worker
pool (bolt lazy listeners). Before the ack of a command, a click or a form, the delivery
is kept in the database's inbox (storage.inbox): one insert of its key, what running it
again needs, and this replica's name; nothing else, so Slack still gets its answer within
milliseconds however slow the cluster or Slack itself is. Slack never sends an
acknowledged delivery again, so this row is what lets a survivor answer it when this
replica dies before it does (bot.heartbeat takes it over and calls `redo`). The work then:

1. drops a repeated delivery: the inbox's insert is also the duplicate check, so a Slack
   retry (X-Slack-Retry-Num in HTTP mode, retry_attempt in Socket Mode) or a redelivery to
   another replica runs nothing twice (the Home tab's event, which only redraws, is
   remembered in the idempotency table instead, scope `slack-retry`). A form submission
   the ack refused with field errors is not kept: the form stays open under the same view
   id, and its corrected submission must still run;
2. resolves the Slack user to an `Actor` (`bot.identity`): for anything that changes
   something (every click and form, and a command the registry marks `changes`) with
   their user groups read afresh, so someone just taken out of a group cannot act on
   the cached list; the Home tab and commands that only read use the cache;
3. runs the same dispatcher (`commands.dispatch`) or click handler (`bot.clicks`) the
   console uses, so role checks and the two-person rule are the domain's, not Slack's
   (the drain form's structured request runs as `/gpu drain` through the same door);
4. answers: the response_url first, then chat.postMessage, then a DM; a reply too long
   for one message is cut and its full text uploaded as a file;
5. closes the delivery in the inbox: answered (a small write of its own, after the answer).

Running a delivery again repeats no side effect: the services carry the delivery's key, a
request it filed carries it too and the run again answers with that request; every other
change is a compare-and-set on a state the first run already moved (see `redo`).

Nothing that happens in a listener crashes the process: failures are logged, and the
user is told when possible.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from slack_bolt import App
from slack_bolt.error import BoltError
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot import messages as msg
from bot.clicks import Click, ClickOutcome, press
from bot.forms import FormContext, form_context
from bot.request_forms import RequestForm, form_of, forms_in_force, home_buttons
from bot.home import home_view
from bot.identity import SlackDirectory
from bot.inbox_keeper import InboxKeeper
from bot.intents import action_of
from bot.journal import Journal
from bot.modals import DENY_CALLBACK, REASON_BLOCK, DenyContext, deny_context, deny_modal, submitted_reason
from bot.pictures import render_png
from bot.render_blocks import FileLink, render_blocks
from bot.render_text import render_text
from bot.slack_api import BOT_EVENTS, SLASH_COMMAND, SlackApi
from bot.wiring import Runtime
from storage import inbox
from storage.inbox import Delivery
from commands.catalog import dispatch, run_command
from commands.fleet import fleet_status
from commands.pictures import CapacityChart, Picture
from commands.registry import REGISTRY, Call, CommandSpec, invoke
from commands.requests import open_waits
from commands.reply import Reply, error_reply
from workflows.access import Actor
from workflows.durations import utc_now

log = logging.getLogger("gpuops.bot.slack")

EVENT_SCOPE = "slack-retry"
DELIVERY_WORKERS = 8
# How long a kept delivery's key waits for its work: a response_url's half hour, after
# which nothing could be answered anyway.
KEPT_FOR = dt.timedelta(minutes=30)
_ACTION_IDS = re.compile(r"^gpuops\.[a-z]+(?:-[a-z]+)*\.\d+\Z", re.ASCII)  # \Z: no trailing newline




@dataclass(frozen=True)
class _FormRun:
    """A submitted request form, as the command it stands for."""

    command: str  # the `/gpu ...` words (without `/gpu`) that ask the same
    channel: str | None  # picked in the form (from the Home tab), else None
    spec: CommandSpec
    run: Callable[[Call], Reply]
    footer: Callable[[str, str | None], str]


def _wanted_form(outcome: ClickOutcome, context: FormContext) -> tuple[dict[str, Any], str, str] | None:
    """The modal a click asked for (a kind's request form), with how to name it when it
    cannot be opened."""
    if outcome.wants_form is None:
        return None
    form = form_of(outcome.wants_form.kind)
    return form.build(outcome.wants_form.target, context), form.purpose, form.title


class SlackRejectedToken(Exception):
    """auth.test refused the bot token; the message says so without the token."""


@dataclass(frozen=True)
class IncomingDelivery:
    kind: str  # command, click, deny, drain-form, home
    key: str | None
    outcome: str  # answered, refused, invalid (field errors shown), duplicate, failed


class IncomingDeliveries(Journal[IncomingDelivery]):
    """What became of each delivery from Slack, in order."""


@dataclass(frozen=True)
class Place:
    """Where a clicked button was: a message (maybe ephemeral) or the Home tab."""

    channel: str | None
    message_ts: str | None
    ephemeral: bool
    from_home: bool
    response_url: str | None


def _filename(title: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60] or "reply"
    return f"gpuops-{slug}.txt"


class SlackBot:
    """The listeners' work, independent of how Slack delivered it."""

    def __init__(self, runtime: Runtime, api: SlackApi, *, directory: SlackDirectory | None = None,
                 deliveries: IncomingDeliveries | None = None, clock: Callable[[], dt.datetime] = utc_now) -> None:
        self.runtime = runtime
        self.api = api
        # NB: the whole configuration: with several clusters, each cluster's pools name
        # approver groups; a command's cluster then gives the person its pools' rights.
        self.directory = directory or SlackDirectory(
            api, runtime.clusters.config if runtime.clusters is not None else runtime.config)
        self.deliveries = deliveries or IncomingDeliveries()
        self.clock = clock
        # Deliveries this replica's acks kept in the inbox, whose work has not started, and
        # when: a key whose work never ran is forgotten after KEPT_FOR.
        self._kept: dict[str, dt.datetime] = {}
        self._kept_lock = threading.Lock()
        self.keeper = InboxKeeper(runtime.database, replica=lambda: self.runtime.replica, clock=lambda: self.clock())

    # -------------------------------------------------------------- registration
    def register(self, app: App) -> None:
        app.command(SLASH_COMMAND)(ack=self.ack_command, lazy=[self.run_command])
        app.action(_ACTION_IDS)(ack=self.ack_click, lazy=[self.run_click])
        app.view(DENY_CALLBACK)(ack=self.ack_deny, lazy=[self.run_deny])
        for form in forms_in_force():
            app.view(form.callback)(ack=self.form_ack(form), lazy=[self.form_run(form)])
        for event in BOT_EVENTS:
            app.event(event)(ack=self.ack, lazy=[self.run_home])
        app.error(self.on_error)

    # -------------------------------------------------------------- acks (one insert at most)
    @staticmethod
    def ack(ack: Any) -> None:
        ack()

    def ack_command(self, ack: Any, command: dict[str, Any]) -> None:
        self._keep("command", _command_key(command), command)
        ack()

    def ack_click(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        self._keep("click", _click_key(body, action), {"body": body, "action": action})
        ack()

    def ack_deny(self, ack: Any, body: dict[str, Any], view: dict[str, Any]) -> None:
        if submitted_reason(view):
            self._keep("deny", _view_key(DENY_CALLBACK, body, view), {"body": body, "view": view})
            ack()
        else:
            ack(response_action="errors", errors={REASON_BLOCK: msg.deny_reason_missing()})

    def form_ack(self, form: RequestForm) -> Callable[[Any, dict[str, Any], dict[str, Any]], None]:
        """The ack of `form`'s submission: its field errors, else kept and done."""
        def ack_form(ack: Any, body: dict[str, Any], view: dict[str, Any]) -> None:
            # Only checks that read the form and the clock: the cluster is not asked here.
            errors = form.read(view, now=self.clock()).errors
            if not errors:
                self._keep("form", _view_key(form.callback, body, view), {"body": body, "view": view})
            self._ack_form(ack, errors)
        return ack_form

    @staticmethod
    def _ack_form(ack: Any, errors: dict[str, str]) -> None:
        if errors:
            ack(response_action="errors", errors=errors)
        else:
            ack()

    def _keep(self, kind: str, key: str | None, payload: dict[str, Any]) -> None:
        """Keep the delivery in the inbox before its ack; its work runs only if this was
        its first delivery (`_first`). The database not answering in time must not
        silence the bot nor hold the ack: the delivery is then handled here, without the
        net (bot.inbox_keeper)."""
        if key is None:
            return
        if self.keeper.keep(key=key, kind=kind, payload=_kept_payload(payload)):
            now = self.clock()
            with self._kept_lock:
                self._kept = {k: at for k, at in self._kept.items() if now - at < KEPT_FOR}
                self._kept[key] = now

    def on_error(self, error: Exception, body: dict[str, Any]) -> None:
        log.error("listener failed on a %s delivery: %s", body.get("type") or body.get("command"), error,
                  exc_info=error)

    # -------------------------------------------------------------- the work
    def _first(self, kind: str, key: str | None) -> bool:
        """Whether to run the delivery `key`: its ack kept it as new (and no other listener
        took it since). A delivery kept before (a retry, a redelivery) runs nothing."""
        if key is None:
            return True
        with self._kept_lock:
            if self._kept.pop(key, None) is not None:
                return True
        log.info(msg.duplicate_delivery_log(kind, key))
        self.deliveries.record(IncomingDelivery(kind, key, "duplicate"))
        return False

    def _first_event(self, key: str | None) -> bool:
        """The Home tab's event, remembered in the idempotency table (it only redraws)."""
        if key is None:
            return True
        try:
            first = self.runtime.first_delivery(key, scope=EVENT_SCOPE, now=self.clock())
        except Exception:  # noqa: BLE001 - the store being down must not silence the bot
            log.exception("cannot check home %s against earlier deliveries; handling it", key)
            return True
        if not first:
            log.info(msg.duplicate_delivery_log("home", key))
            self.deliveries.record(IncomingDelivery("home", key, "duplicate"))
        return first

    def _answered(self, key: str | None) -> None:
        """Close the delivery in the inbox: it was answered (or told it failed)."""
        if key is None:
            return
        self.keeper.settle(key)
        try:
            inbox.answered(self.runtime.database.get(), key=key, at=self.clock())
        except Exception:  # noqa: BLE001 - answered already; a survivor may answer it again
            log.exception("cannot mark %s answered in the inbox", key)

    def redo(self, delivery: Delivery) -> None:
        """Run again a delivery a replica acknowledged and died before answering (taken
        over by bot.heartbeat), and answer it as the first run would have.

        No side effect is repeated. What creates a row stores the delivery's key with it
        and the run again answers with that row: a request filed (drain, upgrade, mig,
        migrate, rollback, continue; forms too), a freeze set, a note written. What moves
        a window by a duration (`drain extend`) names the delivery in its audit row and is
        not moved again. The rest is a compare-and-set on a state the first run already
        moved, refused the second time with nothing written: an approval (once per
        approver and plan), a deny, cancel, pause, resume, abort, unfreeze, `drain done`
        (a hold already released), `migrate confirm` (a step already confirmed), a
        handover acknowledgement (a repeat records nothing), an uncordon of a node
        already schedulable. The answer of such a refusal says it was done already, not
        the first run's words."""
        payload: dict[str, Any] = delivery.payload if isinstance(delivery.payload, dict) else {}
        if delivery.kind == "command":
            self._command(payload, delivery.key)
            return
        body, second = payload.get("body") or {}, payload.get("action") or payload.get("view") or {}
        if delivery.kind == "click":
            self._click(body, second, delivery.key)
        elif delivery.kind == "deny":
            self._deny(body, second, delivery.key)
        elif delivery.kind == "form":
            form = next((f for f in forms_in_force() if f.callback == second.get("callback_id")), None)
            if form is None:  # a form this version no longer has: nothing can run it
                log.warning("%s is a form this gpuops does not know; it is not run again", delivery.key)
                self._answered(delivery.key)
                return
            self._form(form, body, second, delivery.key)
        else:
            log.warning("%s is a %s, which this gpuops does not run again", delivery.key, delivery.kind)
            self._answered(delivery.key)

    def run_command(self, command: dict[str, Any]) -> None:
        key = _command_key(command)
        if self._first("command", key):
            self._command(command, key)

    def _command(self, command: dict[str, Any], key: str | None) -> None:
        user = str(command.get("user_id") or "")
        outcome = "answered"
        try:
            actor = self.directory.actor(user, fallback_name=command.get("user_name"),
                                         fresh=REGISTRY.changes(str(command.get("text") or "")))
            reply = dispatch(str(command.get("text") or ""), actor=actor, services=self.runtime.services(delivery=key),
                             now=self.clock(), channel=command.get("channel_id"))
        except Exception:  # noqa: BLE001 - answer something rather than nothing
            log.exception("/gpu %s for %s failed", command.get("text"), user)
            reply, outcome = error_reply(msg.not_done_title(), msg.something_failed()), "failed"
        self.answer(reply, user=user, channel=command.get("channel_id"), response_url=command.get("response_url"))
        self._answered(key)
        self.deliveries.record(IncomingDelivery("command", key, outcome))

    def run_click(self, body: dict[str, Any], action: dict[str, Any]) -> None:
        key = _click_key(body, action)
        if self._first("click", key):
            self._click(body, action, key)

    def _click(self, body: dict[str, Any], action: dict[str, Any], key: str) -> None:
        outcome = "failed"
        try:
            outcome = self._press(body, action, key)
        finally:
            self._answered(key)
            self.deliveries.record(IncomingDelivery("click", key, outcome))

    def _press(self, body: dict[str, Any], action: dict[str, Any], key: str) -> str:
        """A click's work and its answer; what became of it."""
        user = str((body.get("user") or {}).get("id") or "")
        container = body.get("container") or {}
        place = Place(
            channel=container.get("channel_id") or (body.get("channel") or {}).get("id"),
            message_ts=container.get("message_ts"),
            ephemeral=bool(container.get("is_ephemeral")),
            from_home=container.get("type") == "view",
            response_url=body.get("response_url"),
        )
        try:
            clicked = action_of(str(action.get("action_id") or "")) or ""
            # NB: every button changes something or opens a form that does (and says
            # at once whether the clicker may), so every click reads the groups afresh.
            actor = self.directory.actor(user, fallback_name=(body.get("user") or {}).get("username"), fresh=True)
            click = Click(action=clicked, value=action.get("value"), actor=actor, now=self.clock())
            outcome = press(click, self.runtime.services(delivery=key))
            wanted = _wanted_form(outcome, FormContext(channel=None if place.from_home else place.channel))
            if wanted is not None:
                modal, form_name, button = wanted
                error = self.api.open_modal(str(body.get("trigger_id")), modal)
                if error is not None:
                    self.tell(user, error_reply(msg.not_done_title(), msg.modal_failed(
                        error, form=form_name, button=button)), place)
                return "answered" if error is None else "failed"
            if outcome.wants_reason is not None:
                context = DenyContext(value=str(action.get("value")), channel=place.channel,
                                      message_ts=place.message_ts, ephemeral=place.ephemeral,
                                      from_home=place.from_home, response_url=place.response_url)
                error = self.api.open_modal(str(body.get("trigger_id")), deny_modal(outcome.wants_reason, context))
                if error is not None:
                    self.tell(user, error_reply(msg.not_done_title(), msg.modal_failed(error)), place)
                return "answered"
            self.show(outcome, actor=actor, place=place)
            return "answered" if outcome.ok else "refused"
        except Exception:  # noqa: BLE001
            log.exception("click %s by %s failed", action.get("action_id"), user)
            self.tell(user, error_reply(msg.not_done_title(), msg.something_failed()), place)
            return "failed"

    def run_deny(self, body: dict[str, Any], view: dict[str, Any]) -> None:
        key = _view_key(DENY_CALLBACK, body, view)
        if not submitted_reason(view):
            # The ack showed the field error; the same view comes back with the reason.
            self.deliveries.record(IncomingDelivery("deny", key, "invalid"))
            return
        if self._first("deny", key):
            self._deny(body, view, key)

    def _deny(self, body: dict[str, Any], view: dict[str, Any], key: str) -> None:
        user = str((body.get("user") or {}).get("id") or "")
        context = deny_context(str(view.get("private_metadata") or ""))
        place = Place(channel=context.channel if context else None, message_ts=context.message_ts if context else None,
                      ephemeral=bool(context and context.ephemeral), from_home=bool(context and context.from_home),
                      response_url=context.response_url if context else None)
        try:
            actor = self.directory.actor(user, fallback_name=(body.get("user") or {}).get("username"), fresh=True)
            click = Click(action="deny", value=context.value if context else None, actor=actor, now=self.clock(),
                          reason=submitted_reason(view))
            outcome = press(click, self.runtime.services(delivery=key))
            self.show(outcome, actor=actor, place=place)
            self.deliveries.record(IncomingDelivery("deny", key, "answered" if outcome.ok else "refused"))
        except Exception:  # noqa: BLE001
            log.exception("deny by %s failed", user)
            self.tell(user, error_reply(msg.not_done_title(), msg.something_failed()), place)
            self.deliveries.record(IncomingDelivery("deny", key, "failed"))
        finally:
            self._answered(key)

    def form_run(self, form: RequestForm) -> Callable[[dict[str, Any], dict[str, Any]], None]:
        """The work of `form`'s submission: the change it asks for, run as its command
        (`/gpu drain`, `/gpu upgrade`, `/gpu mig`)."""
        def run_form(body: dict[str, Any], view: dict[str, Any]) -> None:
            key = _view_key(form.callback, body, view)
            if form.read(view, now=self.clock()).form is None:
                # The ack showed the field errors; the same view comes back corrected.
                self.deliveries.record(IncomingDelivery(form.delivery, key, "invalid"))
                return
            if self._first(form.delivery, key):
                self._form(form, body, view, key)
        return run_form

    def _form(self, form: RequestForm, body: dict[str, Any], view: dict[str, Any], key: str) -> None:
        try:
            submitted = form.read(view, now=self.clock()).form
            if submitted is None:  # the ack showed its field errors (as `run_form` finds)
                self.deliveries.record(IncomingDelivery(form.delivery, key, "invalid"))
                return
            ask = submitted.ask()

            def run(call: Call) -> Reply:
                return form.run(call, ask)

            self._run_form(body, view, form.delivery, key, _FormRun(
                command=submitted.command(), channel=submitted.channel, spec=form.command, run=run,
                footer=form.footer))
        finally:
            self._answered(key)

    def _run_form(self, body: dict[str, Any], view: dict[str, Any], kind: str, key: str, form: _FormRun) -> None:
        """A request form, submitted: run as its command, answered to the submitter in
        the channel the button was in or the form named (an ephemeral message there,
        else a DM)."""
        user = str((body.get("user") or {}).get("id") or "")
        channel = form.channel or form_context(str(view.get("private_metadata") or "")).channel
        outcome = "answered"
        try:
            actor = self.directory.actor(user, fallback_name=(body.get("user") or {}).get("username"),
                                         fresh=form.spec.changes)
            reply = invoke(form.spec, form.run, actor=actor, services=self.runtime.services(delivery=key),
                           now=self.clock(), text=form.command, channel=channel)
            reply = replace(reply, footer=form.footer(form.command, reply.footer))
            if not reply.ok:
                outcome = "refused"
        except Exception:  # noqa: BLE001 - answer something rather than nothing
            log.exception("the %s of %s (%s) failed", kind, user, form.command)
            reply, outcome = error_reply(msg.not_done_title(), msg.something_failed()), "failed"
        self.answer(reply, user=user, channel=channel, response_url=None, ephemeral_in_channel=True)
        self.deliveries.record(IncomingDelivery(kind, key, outcome))

    def run_home(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        user = str(event.get("user") or "")
        key = body.get("event_id")
        if event.get("tab", "home") != "home" or not self._first_event(key):
            return
        try:
            published = self.publish_home(user)
            self.deliveries.record(IncomingDelivery("home", key, "answered" if published else "failed"))
        except Exception:  # noqa: BLE001
            log.exception("the Home tab of %s failed", user)
            self.deliveries.record(IncomingDelivery("home", key, "failed"))

    # -------------------------------------------------------------- answering
    def publish_home(self, user: str, *, actor: Actor | None = None, notice: Reply | None = None) -> bool:
        actor = actor or self.directory.actor(user)
        services = self.runtime.services()
        now = self.clock()
        fleet_reply = run_command("status", fleet_status, actor=actor, services=services, now=now)
        waiting = services.requests.waiting_for(actor, now=now) if services.requests is not None else []
        return self.api.publish_home(user, home_view(fleet_reply, waiting, now=now, notice=notice,
                                                     waits=open_waits(services, now=now),
                                                     buttons=home_buttons(actor),
                                                     zone=services.config.display_zone))

    def answer(self, reply: Reply, *, user: str, channel: str | None, response_url: str | None,
               ephemeral_in_channel: bool = False) -> None:
        """The reply to a command: where the user looks first, then anywhere that works.
        `ephemeral_in_channel` (for a form, which has no response_url): a reply only the
        user sees goes to them in `channel` before a DM."""
        rendered = render_blocks(reply)
        if rendered.truncated:
            link = self._upload_full_text(reply, user=user, channel=channel)
            if link is not None:
                rendered = render_blocks(reply, full_text=FileLink(link, _filename(reply.title)))
        message = rendered.as_message()
        self._send_answer(reply, message, user=user, channel=channel, response_url=response_url,
                          ephemeral_in_channel=ephemeral_in_channel)
        if reply.picture is not None:
            self._share_picture(reply.picture, visibility=reply.visibility, user=user, channel=channel)

    def _send_answer(self, reply: Reply, message: dict[str, Any], *, user: str, channel: str | None,
                     response_url: str | None, ephemeral_in_channel: bool) -> None:
        if response_url and self.api.respond(response_url, {**message, "response_type": reply.visibility}):
            return
        if reply.visibility == "in_channel" and channel and self.api.post(channel, message):
            return
        if (ephemeral_in_channel and reply.visibility == "ephemeral" and channel
                and self.api.ephemeral(channel, user, message)):
            return
        if not self.api.direct_message(user, message):
            log.error("could not answer %s by response_url, channel or DM", user)

    def _share_picture(self, picture: Picture, *, visibility: str, user: str, channel: str | None) -> None:
        """The reply's picture as a file where the reply is seen, as a long reply's full
        text is: the channel for a channel reply, else the user's DM. Best effort: the
        text is already answered whatever becomes of the picture."""
        try:
            png = render_png(picture)
        except Exception:  # noqa: BLE001 - a picture must never cost the answer
            log.exception("a reply's picture could not be drawn; the text was answered")
            return
        title = (msg.capacity_title(picture.pool) if isinstance(picture, CapacityChart)
                 else msg.timeline_title(picture.run_id))
        if visibility == "in_channel" and channel and self.api.upload_file(
                channel, filename=picture.file_name, title=title, content=png) is not None:
            return
        target = self.api.open_dm(user)
        if target is not None:
            self.api.upload_file(target, filename=picture.file_name, title=title, content=png)

    def _upload_full_text(self, reply: Reply, *, user: str, channel: str | None) -> str | None:
        """Where the reply is seen: the channel for a channel reply, else the user's DM
        (a file shared in a channel would show an ephemeral answer to everyone)."""
        def upload(target: str | None) -> str | None:
            if target is None:
                return None
            return self.api.upload_text(target, filename=_filename(reply.title),
                                        title=msg.full_text_title(reply.title), content=render_text(reply))

        if reply.visibility == "in_channel" and channel:
            link = upload(channel)
            if link is not None:
                return link
        return upload(self.api.open_dm(user))

    def show(self, outcome: ClickOutcome, *, actor: Actor, place: Place) -> None:
        """After a click: the request message as it reads now, and a word to the clicker."""
        if place.from_home:
            self.publish_home(actor.user_id, actor=actor, notice=outcome.notice)
            return
        if outcome.card is not None:
            message = render_blocks(outcome.card).as_message()
            updated = False
            if place.channel and place.message_ts and not place.ephemeral:
                updated = self.api.update(place.channel, place.message_ts, message)
            if not updated and place.response_url:
                self.api.respond(place.response_url, {**message, "replace_original": True})
        if outcome.notice.summary:
            self.tell(actor.user_id, outcome.notice, place)

    def tell(self, user: str, reply: Reply, place: Place) -> None:
        """A few words only `user` sees: ephemeral where they clicked, else a DM."""
        message = render_blocks(reply).as_message()
        if place.from_home:
            self.publish_home(user, notice=reply)
            return
        if place.response_url and self.api.respond(
                place.response_url, {**message, "response_type": "ephemeral", "replace_original": False}):
            return
        if place.channel and self.api.ephemeral(place.channel, user, message):
            return
        self.api.direct_message(user, message)


def _command_key(command: dict[str, Any]) -> str | None:
    trigger = command.get("trigger_id")
    return f"{command.get('command')}:{command.get('user_id') or ''}:{trigger}" if trigger else None


def _click_key(body: dict[str, Any], action: dict[str, Any]) -> str:
    user = str((body.get("user") or {}).get("id") or "")
    return f"{action.get('action_id')}:{user}:{body.get('trigger_id') or action.get('action_ts')}"


def _view_key(callback: str, body: dict[str, Any], view: dict[str, Any]) -> str:
    return f"{callback}:{(body.get('user') or {}).get('id') or ''}:{view.get('id')}"


def _kept_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """What the inbox keeps of a delivery: all it carries but Slack's verification token
    (a credential of the app, which running it again does not need)."""
    def without_token(value: Any) -> Any:
        return {k: v for k, v in value.items() if k != "token"} if isinstance(value, dict) else value
    return {k: without_token(v) for k, v in without_token(payload).items()}


def build_app(runtime: Runtime, *, client: WebClient, signing_secret: str | None = None,
              bot: SlackBot | None = None) -> tuple[App, SlackBot]:
    """The Bolt app for `runtime`. With `signing_secret` (HTTP mode) every request's
    signature and timestamp are checked; without it (Socket Mode, whose connection the
    app-level token authenticates) nothing arrives but over the socket. Raises
    SlackRejectedToken when auth.test refuses the bot token."""
    try:
        # process_before_response: the ack function runs on the thread that received the
        # request and the lazy work goes to the worker pool; so acks never queue behind
        # busy workers (with False, bolt runs acks on that same pool).
        app = App(client=client, name="gpuops", signing_secret=signing_secret or "",
                  request_verification_enabled=signing_secret is not None, process_before_response=True,
                  listener_executor=ThreadPoolExecutor(max_workers=DELIVERY_WORKERS,
                                                       thread_name_prefix="gpuops-worker"),
                  logger=logging.getLogger("gpuops.bolt"))
    except BoltError as err:
        cause = err.__context__
        error = cause.response.get("error") if isinstance(cause, SlackApiError) else "auth.test failed"
        raise SlackRejectedToken(msg.slack_rejected_token(str(error))) from None
    bot = bot or SlackBot(runtime, SlackApi(client))
    # Approvals are re-checked against user groups too whenever they are counted, on
    # every thread of this process (the notifier's cards as well as the clicks).
    runtime.roles = bot.directory.roles_of
    bot.register(app)
    return app, bot
