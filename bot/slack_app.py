"""The Bolt app: one set of listeners for Socket Mode and HTTP mode.

Every delivery is acknowledged at once and the work runs afterwards on the app's worker
pool (bolt lazy listeners): the ack function does no I/O at all, so Slack gets its
answer within milliseconds however slow the cluster or Slack itself is. The work then:

1. drops a repeated delivery: the first thing it does is remember the delivery's key in
   the SQLite idempotency table (scope `slack-retry` for commands and events, `button`
   for clicks and the forms), so a Slack retry (X-Slack-Retry-Num in HTTP mode,
   retry_attempt in Socket Mode) or a redelivery after a restart runs nothing twice. A
   form submission the ack refused with field errors is not remembered: the form stays
   open under the same view id, and its corrected submission must still run;
2. resolves the Slack user to an `Actor` (`bot.identity`): for anything that changes
   something (every click and form, and a command the registry marks `changes`) with
   their user groups read afresh, so someone just taken out of a group cannot act on
   the cached list; the Home tab and commands that only read use the cache;
3. runs the same dispatcher (`commands.dispatch`) or click handler (`bot.clicks`) the
   console uses, so role checks and the two-person rule are the domain's, not Slack's
   (the drain form's structured request runs as `/gpu drain` through the same door);
4. answers: the response_url first, then chat.postMessage, then a DM; a reply too long
   for one message is cut and its full text uploaded as a file.

Nothing that happens in a listener crashes the process: failures are logged, and the
user is told when possible.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
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
from bot.intents import action_of
from bot.journal import Journal
from bot.modals import DENY_CALLBACK, REASON_BLOCK, DenyContext, deny_context, deny_modal, submitted_reason
from bot.pictures import render_png
from bot.render_blocks import FileLink, render_blocks
from bot.render_text import render_text
from bot.slack_api import BOT_EVENTS, SLASH_COMMAND, SlackApi
from bot.wiring import Runtime
from commands.catalog import dispatch, run_command
from commands.fleet import fleet_status
from commands.pictures import CapacityChart, Picture
from commands.registry import REGISTRY, Call, CommandSpec, invoke
from commands.requests import open_waits
from commands.reply import Reply, error_reply
from workflows.access import Actor
from workflows.durations import utc_now

log = logging.getLogger("gpuops.bot.slack")

COMMAND_SCOPE = "slack-retry"
EVENT_SCOPE = "slack-retry"
BUTTON_SCOPE = "button"
DELIVERY_WORKERS = 8
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

    # -------------------------------------------------------------- registration
    def register(self, app: App) -> None:
        app.command(SLASH_COMMAND)(ack=self.ack, lazy=[self.run_command])
        app.action(_ACTION_IDS)(ack=self.ack, lazy=[self.run_click])
        app.view(DENY_CALLBACK)(ack=self.ack_deny, lazy=[self.run_deny])
        for form in forms_in_force():
            app.view(form.callback)(ack=self.form_ack(form), lazy=[self.form_run(form)])
        for event in BOT_EVENTS:
            app.event(event)(ack=self.ack, lazy=[self.run_home])
        app.error(self.on_error)

    # -------------------------------------------------------------- acks (no I/O here)
    @staticmethod
    def ack(ack: Any) -> None:
        ack()

    @staticmethod
    def ack_deny(ack: Any, view: dict[str, Any]) -> None:
        if submitted_reason(view):
            ack()
        else:
            ack(response_action="errors", errors={REASON_BLOCK: msg.deny_reason_missing()})

    def form_ack(self, form: RequestForm) -> Callable[[Any, dict[str, Any]], None]:
        """The ack of `form`'s submission: its field errors, else done."""
        def ack_form(ack: Any, view: dict[str, Any]) -> None:
            # Only checks that read the form and the clock: the cluster is not asked here.
            self._ack_form(ack, form.read(view, now=self.clock()).errors)
        return ack_form

    @staticmethod
    def _ack_form(ack: Any, errors: dict[str, str]) -> None:
        if errors:
            ack(response_action="errors", errors=errors)
        else:
            ack()

    def on_error(self, error: Exception, body: dict[str, Any]) -> None:
        log.error("listener failed on a %s delivery: %s", body.get("type") or body.get("command"), error,
                  exc_info=error)

    # -------------------------------------------------------------- the work
    def _first(self, kind: str, key: str | None, scope: str) -> bool:
        if key is None:
            return True
        try:
            first = self.runtime.first_delivery(key, scope=scope, now=self.clock())
        except Exception:  # noqa: BLE001 - the store being down must not silence the bot
            log.exception("cannot check %s %s against earlier deliveries; handling it", kind, key)
            return True
        if not first:
            log.info(msg.duplicate_delivery_log(kind, key))
            self.deliveries.record(IncomingDelivery(kind, key, "duplicate"))
        return first

    def run_command(self, command: dict[str, Any]) -> None:
        user = str(command.get("user_id") or "")
        trigger = command.get("trigger_id")
        key = f"{command.get('command')}:{user}:{trigger}" if trigger else None
        if not self._first("command", key, COMMAND_SCOPE):
            return
        outcome = "answered"
        try:
            actor = self.directory.actor(user, fallback_name=command.get("user_name"),
                                         fresh=REGISTRY.changes(str(command.get("text") or "")))
            reply = dispatch(str(command.get("text") or ""), actor=actor, services=self.runtime.services(),
                             now=self.clock(), channel=command.get("channel_id"))
        except Exception:  # noqa: BLE001 - answer something rather than nothing
            log.exception("/gpu %s for %s failed", command.get("text"), user)
            reply, outcome = error_reply(msg.not_done_title(), msg.something_failed()), "failed"
        self.answer(reply, user=user, channel=command.get("channel_id"), response_url=command.get("response_url"))
        self.deliveries.record(IncomingDelivery("command", key, outcome))

    def run_click(self, body: dict[str, Any], action: dict[str, Any]) -> None:
        user = str((body.get("user") or {}).get("id") or "")
        key = f"{action.get('action_id')}:{user}:{body.get('trigger_id') or action.get('action_ts')}"
        if not self._first("click", key, BUTTON_SCOPE):
            return
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
            outcome = press(click, self.runtime.services())
            wanted = _wanted_form(outcome, FormContext(channel=None if place.from_home else place.channel))
            if wanted is not None:
                modal, form_name, button = wanted
                error = self.api.open_modal(str(body.get("trigger_id")), modal)
                if error is not None:
                    self.tell(user, error_reply(msg.not_done_title(), msg.modal_failed(
                        error, form=form_name, button=button)), place)
                self.deliveries.record(IncomingDelivery("click", key, "answered" if error is None else "failed"))
                return
            if outcome.wants_reason is not None:
                context = DenyContext(value=str(action.get("value")), channel=place.channel,
                                      message_ts=place.message_ts, ephemeral=place.ephemeral,
                                      from_home=place.from_home, response_url=place.response_url)
                error = self.api.open_modal(str(body.get("trigger_id")), deny_modal(outcome.wants_reason, context))
                if error is not None:
                    self.tell(user, error_reply(msg.not_done_title(), msg.modal_failed(error)), place)
                self.deliveries.record(IncomingDelivery("click", key, "answered"))
                return
            self.show(outcome, actor=actor, place=place)
            self.deliveries.record(IncomingDelivery("click", key, "answered" if outcome.ok else "refused"))
        except Exception:  # noqa: BLE001
            log.exception("click %s by %s failed", action.get("action_id"), user)
            self.tell(user, error_reply(msg.not_done_title(), msg.something_failed()), place)
            self.deliveries.record(IncomingDelivery("click", key, "failed"))

    def run_deny(self, body: dict[str, Any], view: dict[str, Any]) -> None:
        user = str((body.get("user") or {}).get("id") or "")
        key = f"{DENY_CALLBACK}:{user}:{view.get('id')}"
        if not submitted_reason(view):
            # The ack showed the field error; the same view comes back with the reason.
            self.deliveries.record(IncomingDelivery("deny", key, "invalid"))
            return
        if not self._first("deny", key, BUTTON_SCOPE):
            return
        context = deny_context(str(view.get("private_metadata") or ""))
        place = Place(channel=context.channel if context else None, message_ts=context.message_ts if context else None,
                      ephemeral=bool(context and context.ephemeral), from_home=bool(context and context.from_home),
                      response_url=context.response_url if context else None)
        try:
            actor = self.directory.actor(user, fallback_name=(body.get("user") or {}).get("username"), fresh=True)
            click = Click(action="deny", value=context.value if context else None, actor=actor, now=self.clock(),
                          reason=submitted_reason(view))
            outcome = press(click, self.runtime.services())
            self.show(outcome, actor=actor, place=place)
            self.deliveries.record(IncomingDelivery("deny", key, "answered" if outcome.ok else "refused"))
        except Exception:  # noqa: BLE001
            log.exception("deny by %s failed", user)
            self.tell(user, error_reply(msg.not_done_title(), msg.something_failed()), place)
            self.deliveries.record(IncomingDelivery("deny", key, "failed"))

    def form_run(self, form: RequestForm) -> Callable[[dict[str, Any], dict[str, Any]], None]:
        """The work of `form`'s submission: the change it asks for, run as its command
        (`/gpu drain`, `/gpu upgrade`, `/gpu mig`)."""
        def run_form(body: dict[str, Any], view: dict[str, Any]) -> None:
            submitted = form.read(view, now=self.clock()).form
            if submitted is None:
                self._run_form(body, view, form.delivery, form.callback, None)
                return
            ask = submitted.ask()

            def run(call: Call) -> Reply:
                return form.run(call, ask)

            self._run_form(body, view, form.delivery, form.callback, _FormRun(
                command=submitted.command(), channel=submitted.channel, spec=form.command, run=run,
                footer=form.footer))
        return run_form

    def _run_form(self, body: dict[str, Any], view: dict[str, Any], kind: str, callback: str,
                  form: _FormRun | None) -> None:
        """A request form, submitted: run as its command, answered to the submitter in
        the channel the button was in or the form named (an ephemeral message there,
        else a DM)."""
        user = str((body.get("user") or {}).get("id") or "")
        key = f"{callback}:{user}:{view.get('id')}"
        if form is None:
            # The ack showed the field errors; the same view comes back corrected.
            self.deliveries.record(IncomingDelivery(kind, key, "invalid"))
            return
        if not self._first(kind, key, BUTTON_SCOPE):
            return
        channel = form.channel or form_context(str(view.get("private_metadata") or "")).channel
        outcome = "answered"
        try:
            actor = self.directory.actor(user, fallback_name=(body.get("user") or {}).get("username"),
                                         fresh=form.spec.changes)
            reply = invoke(form.spec, form.run, actor=actor, services=self.runtime.services(), now=self.clock(),
                           text=form.command, channel=channel)
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
        if event.get("tab", "home") != "home" or not self._first("home", key, EVENT_SCOPE):
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
