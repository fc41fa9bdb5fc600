"""The notifier: delivers the outbox to Slack, on the replica holding the engine lease.

What it does, as a runbook (one pass of `deliver_due`):

- Claim up to `batch` due messages (`storage.outbox.claim_pending`: oldest first, at
  most one per channel and thread at a time, so a thread reads in order).
- Render each by its payload `event` and send it:
  - a request's messages (`request_id` in the payload: request, run and step events)
    go to the request's thread. The first one creates the thread: it posts the request
    card (what `/gpu request <id>` shows, buttons included) to the channel and records
    the thread (`storage.requests.set_thread`) in the transaction that marks it sent.
    Later `post` messages reply in the thread with their text and then refresh the card
    at the thread's top; `update` messages (the engine's step transitions) only refresh
    the card with chat.update, so a run's progress reads in one place, not as a reply
    per step. A refresh that would not change the card is not sent.
  - `handover.posted`: render the stored checklist (`commands.handover.handover_message`),
    post it to the rotation's channel, and record its ts (`HandoverService.record_message`)
    in the transaction that marks it sent; `handover.acknowledged`: chat.update at the
    payload's `ts`; `handover.reminder` / `handover.escalation`: a reply in the
    handover's thread that starts with its mentions.
  - anything else with a `text` is posted as it is (escaped) to its channel and thread.
- Mark it sent with the message's ts, or failed: a rate limit (HTTP 429) is retried
  after Slack's Retry-After and pauses the rest of the pass; an error only a person can
  fix (channel_not_found, not_in_channel, an archived channel, a message Slack refuses)
  gives the message up at once and says so in the log at ERROR; any other error is
  retried with backoff and given up after `MAX_ATTEMPTS` claims.

Escaping: every text from the payload is escaped for mrkdwn (`bot.render_blocks.escape`:
&, <, >), so user text (a request's reason) can never form a mention, a broadcast or a
link. Mentions are the only markup that comes through: those the notifier writes itself
from the payload's `mentions` ids, and the `<@U…>` a request's sentence names someone by
(`workflows.access.public_name`) for the ids its payload lists as `people`; each id is
checked to be a plain Slack id first.

Delivery is at least once. The outbox dedupe key keeps a repeated transition from
queueing a message twice; a message marked sent is never claimed again, so a restarted
notifier repeats nothing that was marked. What can repeat: if the process dies (or the
database refuses the write) after Slack accepted a message and before it was marked
sent, the claim runs out (`CLAIM_LEASE`) and the message is posted once more. Slack's
chat.postMessage has no idempotency key a bot can use, so this window cannot be closed
from here; it is one message, once, after a crash.

It runs in its own thread: woken by `notify()` when something was queued, and every
`retry_every` seconds for retries and for messages queued by other processes. Nothing
it meets stops it: Slack errors are outcomes, and anything unexpected is logged and the
loop goes on.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler

from bot import messages as msg
from bot.clicks import current_card
from bot.journal import Journal
from bot.pictures import render_png
from bot.render_blocks import NOTIFICATION_TEXT, escape, render_blocks
from commands.handover import handover_message
from commands.pictures import run_timeline
from commands.services import Services
from storage import outbox
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import Database, PerThreadDatabase
from storage.ids import RequestId, RunId
from storage.outbox import OutboxMessage
from workflows.access import Actor, Role, UserId
from workflows.config import GpuopsConfig
from workflows.engine.halt_messages import HALT_CODES
from workflows.handover.service import HandoverService, HandoverView, UnknownHandover

log = logging.getLogger("gpuops.bot.notifier")

BATCH = 10
RETRY_EVERY = 2.0  # seconds between passes when nothing wakes the notifier
# How long a claim holds; a message whose claim ran out before it was sent is left for
# the next pass (the Slack client's timeout keeps one message well inside it).
CLAIM_LEASE = dt.timedelta(seconds=60)
SLACK_TIMEOUT = 10  # seconds per Web API call
MAX_ATTEMPTS = 24  # claims of one message before a non-rate-limit error gives it up
BACKOFF_FIRST = dt.timedelta(seconds=2)
BACKOFF_MOST = dt.timedelta(minutes=10)
RETRY_AFTER_DEFAULT = 1  # seconds, when a 429 comes without Retry-After

# Errors no retry fixes: the channel, the bot's membership or the message itself is wrong.
PERMANENT_ERRORS = frozenset({
    "channel_not_found", "not_in_channel", "is_archived", "channel_is_archived",
    "message_not_found", "cant_update_message", "edit_window_closed", "restricted_action",
    "msg_too_long", "no_text", "invalid_blocks", "invalid_blocks_format", "invalid_arguments",
    "too_many_attachments", "invalid_attachments", "not_allowed_token_type",
})
# Errors that need a person but affect every message (the token, the app's scopes):
# retried with backoff, logged at ERROR, so nothing is lost while someone fixes it.
CONFIGURATION_ERRORS = frozenset({
    "not_authed", "invalid_auth", "account_inactive", "token_revoked", "token_expired",
    "missing_scope", "no_permission", "team_access_not_granted",
})

# The events that end a run: its thread gets the run's timeline after the text.
RUN_ENDS = frozenset({"run.succeeded", "run.failed", "run.abort"})

_SLACK_ID = re.compile(r"^[A-Z0-9]{2,32}$")
_PARTIAL_ENTITY = re.compile(r"&[a-z]{0,3}$")

# Whom the notifier reads a request card as: the card is what any viewer sees.
NOTIFIER_ACTOR = Actor(user_id=UserId("gpuops"), name="gpuops", roles=frozenset({Role.VIEWER}),
                       via="notifier")


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# ------------------------------------------------------------------ talking to Slack


class SlackRefused(Exception):
    """One Web API call failed: Slack's `error` (or the client's), the HTTP status, and
    for a rate limit the seconds Slack asked to wait."""

    def __init__(self, error: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.status = status
        self.retry_after = retry_after

    @property
    def rate_limited(self) -> bool:
        return self.status == 429 or self.error == "ratelimited"

    @property
    def permanent(self) -> bool:
        return self.error in PERMANENT_ERRORS


def _retry_after(headers: Mapping[str, Any]) -> float:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            raw = value[0] if isinstance(value, (list, tuple)) and value else value
            try:
                return max(0.0, float(raw))
            except (TypeError, ValueError):
                break
    return float(RETRY_AFTER_DEFAULT)


def _refused(err: Exception) -> SlackRefused:
    if isinstance(err, SlackApiError):
        status = err.response.status_code
        error = str(err.response.get("error") or f"HTTP {status}")
        retry = _retry_after(err.response.headers or {}) if status == 429 or error == "ratelimited" else None
        return SlackRefused(error, status=status, retry_after=retry)
    return SlackRefused(type(err).__name__ + (f": {err}" if str(err) else ""))


class OutboxSlack:
    """The notifier's two Web API calls (chat.postMessage and chat.update, scope
    chat:write, declared in `bot.slack_api.WEB_API_SCOPES`).

    Unlike `bot.slack_api.SlackApi`, which swallows errors for callers that fall back
    to another way of answering, these raise `SlackRefused` with Slack's error, because
    the outbox decides what happens next (retry when, or give up). And the client has
    no rate-limit retry handler: a 429 must come back at once as a retry time stored in
    the outbox, not as a sleep inside the notifier's thread."""

    def __init__(self, client: WebClient) -> None:
        self.client = client

    @classmethod
    def like(cls, client: WebClient) -> OutboxSlack:
        """Talk to the same Slack with the same token as `client`."""
        return cls(WebClient(token=client.token, base_url=client.base_url, timeout=SLACK_TIMEOUT,
                             retry_handlers=[ConnectionErrorRetryHandler(max_retry_count=1)]))

    def post(self, channel: str, message: dict[str, Any], *, thread_ts: str | None = None) -> str:
        try:
            answer = self.client.chat_postMessage(channel=channel, thread_ts=thread_ts, **message)
        except (SlackApiError, SlackClientError, OSError) as err:
            raise _refused(err) from None
        return str(answer["ts"])

    def update(self, channel: str, ts: str, message: dict[str, Any]) -> None:
        try:
            self.client.chat_update(channel=channel, ts=ts, **message)
        except (SlackApiError, SlackClientError, OSError) as err:
            raise _refused(err) from None

    def upload(self, channel: str, *, thread_ts: str | None, filename: str, title: str, content: bytes) -> None:
        """Share a file in a thread (files.getUploadURLExternal, the bytes, then
        files.completeUploadExternal; scope files:write)."""
        try:
            self.client.files_upload_v2(channel=channel, thread_ts=thread_ts, filename=filename, title=title,
                                        content=content)
        except (SlackApiError, SlackClientError, OSError) as err:
            raise _refused(err) from None


# ------------------------------------------------------------------ what became of a message


@dataclass(frozen=True)
class OutboxDelivery:
    """What became of one outbox message in one pass: `sent` (with Slack's ts),
    `retry` (at `retry_at`), `failed` (given up) or `released` (not tried: the pass
    stopped, e.g. the lease was lost or Slack asked to wait)."""

    message_id: int
    event: str
    outcome: str
    ts: str | None = None
    error: str | None = None
    retry_at: dt.datetime | None = None


class OutboxDeliveries(Journal[OutboxDelivery]):
    """Every delivery of the outbox to Slack, in order."""


@dataclass(frozen=True)
class _Done:
    ts: str | None
    marked: bool = False  # the handler already marked it sent (with its own writes)


class OutboxHost(Protocol):
    """What the notifier needs from the runtime."""

    database: PerThreadDatabase

    def services(self) -> Services: ...


# ------------------------------------------------------------------ the notifier


class Notifier:
    """Delivers the outbox; see the module docstring. `deliver_due()` is one pass (tests
    call it directly); `start()` runs passes in a thread until `stop()`."""

    def __init__(self, host: OutboxHost, slack: OutboxSlack, *,
                 clock: Callable[[], dt.datetime] = _utc_now,
                 gate: Callable[[], bool] = lambda: True,
                 batch: int = BATCH, retry_every: float = RETRY_EVERY,
                 deliveries: OutboxDeliveries | None = None) -> None:
        self._host = host
        self._slack = slack
        self._clock = clock
        self._gate = gate
        self._batch = batch
        self._retry_every = retry_every
        self.deliveries = deliveries or OutboxDeliveries()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The card last sent to each (channel, ts), so a refresh that changes nothing is
        # not sent (a burst of step updates becomes one chat.update).
        self._cards: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._paused_until: dt.datetime | None = None
        # Passes the thread finished and whether it now waits for a wake-up (for tests).
        self._idle = threading.Condition()
        self._passes = 0
        self._waiting = False

    # -------------------------------------------------------------- the thread
    def notify(self) -> None:
        """Something was queued: deliver it now rather than at the next timer."""
        self._wake.set()

    def start(self) -> Notifier:
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the notifier is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="gpuops-notifier", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Stop after the message in hand (never in the middle of one)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and timeout > 0:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the notifier did not stop within %.0f s (a Slack call in flight); "
                            "it stops after that call", timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait_until_idle(self, *, after_passes: int = 0, timeout: float = 30.0) -> int:
        """Wait until the thread has nothing due and sleeps until woken (after at least
        `after_passes` idle waits); returns how many idle waits it began so far."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._waiting and self._passes > after_passes, timeout=timeout):
                raise TimeoutError(f"the notifier is not idle after {self._passes} idle waits")
            return self._passes

    def _set_idle(self, waiting: bool) -> None:
        with self._idle:
            self._waiting = waiting
            if waiting:
                self._passes += 1
            self._idle.notify_all()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.clear()  # before the pass: a notify() during it is kept
                try:
                    busy = self.deliver_due() > 0
                except Exception:  # noqa: BLE001 - e.g. the database locked; the next pass retries
                    log.exception("a notifier pass failed; trying again in %.0f s", self._retry_every)
                    busy = False
                if not busy:
                    self._set_idle(True)
                    self._wake.wait(self._retry_every)
                    self._set_idle(False)
        finally:
            self._host.database.close()

    # -------------------------------------------------------------- one pass
    def deliver_due(self) -> int:
        """Claim and deliver what is due now; how many messages were claimed."""
        if not self._gate():
            return 0
        now = self._clock()
        if self._paused_until is not None and now < self._paused_until:
            return 0
        self._paused_until = None
        db = self._host.database.get()
        claimed = outbox.claim_pending(db, limit=self._batch, now=now, lease=CLAIM_LEASE)
        for index, message in enumerate(claimed):
            if message.claimed_until is not None and self._clock() >= message.claimed_until:
                # Our claim on it (and on the rest, claimed together) ran out: another
                # notifier may hold them now, so they are neither sent nor touched.
                log.warning("the notifier's claim on %d outbox messages ran out before they were sent; "
                            "they go out in a later pass", len(claimed) - index)
                break
            stop_why = self._why_stop()
            if stop_why is not None:
                # Still ours: hand them back now rather than when the claim runs out.
                for rest in claimed[index:]:
                    self._release(db, rest, stop_why, retry_at=self._paused_until or self._clock())
                break
            self._deliver_one(db, message)
        return len(claimed)

    def _why_stop(self) -> str | None:
        if self._stop.is_set():
            return "the notifier is stopping"
        if not self._gate():
            return "this replica no longer holds the engine lease"
        if self._paused_until is not None and self._clock() < self._paused_until:
            return "Slack asked to wait (rate limited)"
        return None

    def _release(self, db: Database, message: OutboxMessage, why: str, *, retry_at: dt.datetime) -> None:
        outbox.mark_failed(db, id=message.id, error=f"not tried: {why}", retry_at=retry_at)
        self.deliveries.record(OutboxDelivery(message.id, _event(message), "released", error=why, retry_at=retry_at))

    def _deliver_one(self, db: Database, message: OutboxMessage) -> None:
        event = _event(message)
        now = self._clock()
        try:
            done = self._send(db, message, now=now)
        except SlackRefused as err:
            self._refused(db, message, err, now=now)
            return
        except Exception as err:  # noqa: BLE001 - a bug must cost one message, not the notifier
            log.exception("outbox message %s (%s) could not be rendered or recorded; giving it up",
                          message.id, event)
            outbox.mark_failed(db, id=message.id, error=f"{type(err).__name__}: {err}"[:500], retry_at=None)
            self.deliveries.record(OutboxDelivery(message.id, event, "failed", error=type(err).__name__))
            return
        if not done.marked:
            outbox.mark_sent(db, id=message.id, message_ts=done.ts, at=self._clock())
        self.deliveries.record(OutboxDelivery(message.id, event, "sent", ts=done.ts))

    def _refused(self, db: Database, message: OutboxMessage, err: SlackRefused, *, now: dt.datetime) -> None:
        event = _event(message)
        where = message.channel + (f" (thread {message.thread_ts})" if message.thread_ts else "")
        if err.rate_limited:
            wait = dt.timedelta(seconds=err.retry_after if err.retry_after is not None else RETRY_AFTER_DEFAULT)
            retry_at = now + wait
            self._paused_until = retry_at
            log.info("Slack rate-limited outbox message %s (%s) to %s; retrying in %.0f s as Slack asked",
                     message.id, event, where, wait.total_seconds())
            outbox.mark_failed(db, id=message.id, error=err.error, retry_at=retry_at)
            self.deliveries.record(OutboxDelivery(message.id, event, "retry", error=err.error, retry_at=retry_at))
            return
        if err.permanent or message.attempts >= MAX_ATTEMPTS:
            why = ("Slack refuses it" if err.permanent else f"it failed {message.attempts} times")
            log.error("outbox message %s (%s) to %s is given up: %s (%s).%s", message.id, event, where, why,
                      err.error, _hint(err.error))
            outbox.mark_failed(db, id=message.id, error=err.error, retry_at=None)
            self.deliveries.record(OutboxDelivery(message.id, event, "failed", error=err.error))
            return
        backoff = min(BACKOFF_FIRST * (2 ** max(0, message.attempts - 1)), BACKOFF_MOST)
        retry_at = now + backoff
        level = logging.ERROR if err.error in CONFIGURATION_ERRORS else logging.WARNING
        log.log(level, "outbox message %s (%s) to %s failed (%s, attempt %d); retrying in %.0f s.%s",
                message.id, event, where, err.error, message.attempts, backoff.total_seconds(), _hint(err.error))
        outbox.mark_failed(db, id=message.id, error=err.error, retry_at=retry_at)
        self.deliveries.record(OutboxDelivery(message.id, event, "retry", error=err.error, retry_at=retry_at))

    # -------------------------------------------------------------- rendering by event
    def _send(self, db: Database, message: OutboxMessage, *, now: dt.datetime) -> _Done:
        payload = message.payload if isinstance(message.payload, dict) else {}
        event = str(payload.get("event") or "")
        if event == "handover.posted":
            return self._handover_posted(db, message, payload, now=now)
        if event == "handover.acknowledged":
            return self._handover_acknowledged(db, message, payload)
        if event in ("handover.reminder", "handover.escalation"):
            return self._handover_chase(db, message, payload)
        if payload.get("request_id"):
            return self._request_message(db, message, payload, now=now)
        if message.kind == "post" and payload.get("text"):
            text = _text(str(payload["text"]))
            return _Done(self._slack.post(message.channel, {"text": text}, thread_ts=message.thread_ts))
        raise ValueError(f"no way to deliver a {message.kind!r} message with event {event!r}")

    # requests ---------------------------------------------------------------------------
    def _request_message(self, db: Database, message: OutboxMessage, payload: dict[str, Any], *,
                         now: dt.datetime) -> _Done:
        request_id = RequestId(str(payload["request_id"]))
        request = stored_requests.get(db, id=request_id)
        if request is None:
            raise ValueError(f"request {request_id} does not exist")
        channel = message.channel
        thread = message.thread_ts
        if thread is None and request.channel == channel:
            thread = request.thread_ts  # queued before the thread existed
        text = _with_people(payload.get("people"), _text(str(payload.get("text") or request_id)))
        if payload.get("event") == "run.failed":
            halted_on = payload.get("halted_on")
            text += _runbook(self._host.services().config, str(halted_on) if halted_on else None)
        if thread is None:
            # The first message of the request opens its thread with the card.
            card = self._card_message(request_id, now=now)
            ts = self._slack.post(channel, {**card, "text": text})
            self._remember_card(channel, ts, card)
            with db.transaction():
                stored_requests.set_thread(db, id=request_id, channel=channel, thread_ts=ts)
                outbox.mark_sent(db, id=message.id, message_ts=ts, at=self._clock())
            return _Done(ts, marked=True)
        if message.kind == "update":
            self._refresh_card(request_id, channel, thread, now=now, best_effort=False)
            return _Done(thread)
        ts = self._slack.post(channel, {"text": text}, thread_ts=thread)
        # The reply is in; the card refresh must not turn it into a retry (and a repost).
        self._refresh_card(request_id, channel, thread, now=now, best_effort=True)
        if payload.get("event") in RUN_ENDS and payload.get("run_id"):
            self._post_timeline(db, RunId(str(payload["run_id"])), channel, thread)
        return _Done(ts)

    def _post_timeline(self, db: Database, run_id: RunId, channel: str, thread: str) -> None:
        """The run's timeline as an image under its last word, best effort: the text is
        already in the thread, so a picture that cannot be drawn or uploaded is logged and
        the message still counts as sent (never reposted for its picture)."""
        run = stored_runs.get(db, id=run_id)
        request = stored_requests.get(db, id=run.request_id) if run is not None else None
        if run is None or request is None:
            return
        timeline = run_timeline(run, stored_steps.for_run(db, run_id=run_id), request)
        if not any(row.bars for row in timeline.rows):
            return  # no step ever began (aborted before it started): nothing to draw
        try:
            png = render_png(timeline)
            self._slack.upload(channel, thread_ts=thread, filename=timeline.file_name,
                               title=msg.timeline_title(run_id), content=png)
        except SlackRefused as err:
            log.warning("the timeline of %s was not uploaded to %s/%s (%s); the thread has its text",
                        run_id, channel, thread, err.error)
        except Exception:  # noqa: BLE001 - a picture must never cost the message
            log.exception("the timeline of %s could not be drawn; the thread has its text", run_id)

    def _card_message(self, request_id: str, *, now: dt.datetime) -> dict[str, Any]:
        card = current_card(request_id, self._host.services(), actor=NOTIFIER_ACTOR, now=now)
        return render_blocks(card).as_message()

    def _refresh_card(self, request_id: str, channel: str, ts: str, *, now: dt.datetime,
                      best_effort: bool) -> None:
        card = self._card_message(request_id, now=now)
        if self._cards.get((channel, ts)) == _fingerprint(card):
            return
        try:
            self._slack.update(channel, ts, card)
        except SlackRefused as err:
            if not best_effort:
                raise
            if err.rate_limited:
                self._paused_until = self._clock() + dt.timedelta(seconds=err.retry_after or RETRY_AFTER_DEFAULT)
            log.warning("the card of %s at %s/%s was not refreshed (%s); the next event refreshes it",
                        request_id, channel, ts, err.error)
            return
        self._remember_card(channel, ts, card)

    def _remember_card(self, channel: str, ts: str, card: dict[str, Any]) -> None:
        self._cards[(channel, ts)] = _fingerprint(card)
        self._cards.move_to_end((channel, ts))
        while len(self._cards) > 500:
            self._cards.popitem(last=False)

    # handovers --------------------------------------------------------------------------
    def _handovers(self, db: Database) -> HandoverService:
        return HandoverService(db, self._host.services().config)

    def _handover_view(self, db: Database, payload: dict[str, Any]) -> HandoverView:
        try:
            return self._handovers(db).get(int(payload["handover_id"]))
        except (KeyError, TypeError, ValueError, UnknownHandover) as err:
            raise ValueError(f"no stored handover for {payload.get('handover_id')!r}: {err}") from None

    def _handover_posted(self, db: Database, message: OutboxMessage, payload: dict[str, Any], *,
                         now: dt.datetime) -> _Done:
        view = self._handover_view(db, payload)
        rendered = render_blocks(handover_message(view, self._host.services().config)).as_message()
        ts = self._slack.post(message.channel, rendered, thread_ts=message.thread_ts)
        with db.transaction():
            # record_message may queue the ack update that came before the ts was known.
            self._handovers(db).record_message(view.id, ts=ts, now=self._clock())
            outbox.mark_sent(db, id=message.id, message_ts=ts, at=self._clock())
        self._wake.set()
        return _Done(ts, marked=True)

    def _handover_acknowledged(self, db: Database, message: OutboxMessage, payload: dict[str, Any]) -> _Done:
        view = self._handover_view(db, payload)
        ts = str(payload.get("ts") or view.ts or "")
        if not ts:
            raise ValueError(f"handover {view.id} has no Slack message to update")
        rendered = render_blocks(handover_message(view, self._host.services().config)).as_message()
        self._slack.update(message.channel, ts, rendered)
        return _Done(ts)

    def _handover_chase(self, db: Database, message: OutboxMessage, payload: dict[str, Any]) -> _Done:
        thread = message.thread_ts
        if thread is None:
            thread = self._handover_view(db, payload).ts  # queued before the post had its ts
        text = _with_mentions(payload.get("mentions"), _text(str(payload.get("text") or "")))
        return _Done(self._slack.post(message.channel, {"text": text}, thread_ts=thread))


# ------------------------------------------------------------------ text


def _event(message: OutboxMessage) -> str:
    payload = message.payload if isinstance(message.payload, dict) else {}
    return str(payload.get("event") or message.kind)


def _text(text: str) -> str:
    """Payload text, escaped for mrkdwn and short enough to notify with."""
    escaped = escape(text.strip()) or "…"
    if len(escaped) <= NOTIFICATION_TEXT:
        return escaped
    return _PARTIAL_ENTITY.sub("", escaped[:NOTIFICATION_TEXT - 1]) + "…"


def mention_markup(mentions: Any) -> str:
    """`<@U…>` for each user and `<!subteam^S…>` for each user group in a payload's
    `mentions` ({"users": [...], "groups": [...]}); ids that are not plain Slack ids are
    left out (and logged), so nothing but a mention can come out of here."""
    if not isinstance(mentions, dict):
        return ""
    parts: list[str] = []
    for key, prefixes, form in (("users", ("U", "W"), "<@{}>"), ("groups", ("S",), "<!subteam^{}>")):
        for raw in mentions.get(key) or ():
            value = str(raw)
            if _SLACK_ID.fullmatch(value) and value.startswith(prefixes):
                parts.append(form.format(value))
            else:
                log.warning("left out mention %r: not a Slack %s id", value, key[:-1])
    return " ".join(parts)


def _runbook(config: GpuopsConfig, halted_on: str | None) -> str:
    """The link to a halted run's runbook (by its `HaltCode`; a message queued by an older
    gpuops names a step kind, or nothing for a halt before a wave), or "" when the
    configuration names no `docs_url`."""
    page = halted_on if halted_on in HALT_CODES else "window-ended" if halted_on is None else "step-failed"
    url = config.halt_runbook_url(page)
    return msg.runbook_link(escape(url)) if url else ""


def _with_people(people: Any, escaped: str) -> str:
    """The escaped text with `<@U…>` restored for each Slack user id in `people`."""
    for raw in people if isinstance(people, list) else ():
        user = str(raw)
        if _SLACK_ID.fullmatch(user) and user.startswith(("U", "W")):
            escaped = escaped.replace(f"&lt;@{user}&gt;", f"<@{user}>")
    return escaped


def _with_mentions(mentions: Any, text: str) -> str:
    markup = mention_markup(mentions)
    return f"{markup} {text}" if markup else text


def _fingerprint(message: dict[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, separators=(",", ":"))


def _hint(error: str) -> str:
    hints = {
        "channel_not_found": " Check the channel id in the configuration (or the request's channel).",
        "not_in_channel": " Invite the gpuops app to the channel (/invite @gpuops).",
        "is_archived": " The channel is archived; configure another one.",
        "channel_is_archived": " The channel is archived; configure another one.",
        "missing_scope": " The app lacks a scope; reinstall it from deploy/slack-app-manifest.yaml.",
        "invalid_auth": " SLACK_BOT_TOKEN is no longer valid.",
        "token_revoked": " SLACK_BOT_TOKEN was revoked.",
    }
    return hints.get(error, "")
