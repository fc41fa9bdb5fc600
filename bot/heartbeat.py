"""This replica's heartbeat, and the takeover of what a dead replica acknowledged.

Every replica (not only the Lease holder: every replica answers Slack) runs a
`ReplicaHeartbeat` thread. Every `beat` seconds it writes its row in
`replica_heartbeats` (storage.inbox), then looks for deliveries still claimed by a replica
silent for `dead_after` seconds, and for each:

- received longer ago than the response_url lives (Slack: 30 minutes, 5 uses), or already
  taken over `max_takeovers` times (a delivery that kills every replica that runs it must
  not walk through the installation): closed as abandoned, logged once, not run again;
- else taken over (one conditional UPDATE: of several survivors exactly one wins) and run
  again by `redo` (bot.slack_app's), on a small pool of its own so a slow run never delays
  a beat: a replica whose beats stop looks dead, and its own work would be run twice.

Why these numbers: a beat every 3 s and dead after 12 s (4 beats) ride out a slow commit or
a pause of the database of a few seconds without declaring a live replica dead; a dead one's
commands are answered some 12-15 s late, within Slack's response_url life by far.

The replica's name is its identity (the pod name) and a token of this process, so a pod
restarted under the same name does not hide the dead process's deliveries behind a fresh
heartbeat.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bot import messages as msg
from storage import inbox
from storage.database import PerThreadDatabase
from storage.inbox import Delivery

log = logging.getLogger("gpuops.bot.heartbeat")

# Redo: run a delivery taken over and answer it (bot.slack_app.SlackBot.redo).
Redo = Callable[[Delivery], None]


@dataclass(frozen=True)
class HeartbeatSettings:
    """How often a replica says it is alive, and when a silent one is taken for dead."""

    beat: float = 3.0  # seconds between two beats
    dead_after: float = 12.0  # seconds without a beat before a replica's deliveries are taken over
    # How long a delivery can still be answered: its response_url lives 30 minutes; a minute
    # is kept for the run itself.
    answerable: dt.timedelta = dt.timedelta(minutes=29)
    max_takeovers: int = 3
    redo_workers: int = 2


def replica_name(identity: str) -> str:
    """`identity` (the pod name) with a token of this process."""
    return f"{identity}/{secrets.token_hex(4)}"


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class ReplicaHeartbeat:
    """The heartbeat thread of replica `name` (see the module doc). `redo` None: beats
    only (a process that answers no Slack, as the console)."""

    def __init__(self, database: PerThreadDatabase, *, name: str, redo: Redo | None,
                 settings: HeartbeatSettings | None = None, clock: Callable[[], dt.datetime] = _utc_now) -> None:
        self.database = database
        self.name = name
        self.redo = redo
        self.settings = settings or HeartbeatSettings()
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=self.settings.redo_workers, thread_name_prefix="gpuops-redo")

    def start(self) -> ReplicaHeartbeat:
        """The first beat now (so nothing this replica acknowledges is ever without one),
        then one every `beat` seconds on a thread."""
        inbox.beat(self.database.get(), replica=self.name, at=self.clock())
        self._thread = threading.Thread(target=self._loop, name="gpuops-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.beat + 5)
            self._thread = None
        self._pool.shutdown(wait=True, cancel_futures=False)

    def _loop(self) -> None:
        failing = False  # said once when beats start failing, once when they work again
        try:
            while not self._stop.wait(self.settings.beat):
                try:
                    self.once(self.clock())
                except Exception as err:  # noqa: BLE001 - the next beat tries again
                    if not failing:
                        log.warning(msg.heartbeat_failed(self.name, f"{type(err).__name__}: {err}"))
                    failing = True
                else:
                    if failing:
                        log.info(msg.heartbeat_working_again(self.name))
                    failing = False
        finally:
            self.database.close()

    def once(self, now: dt.datetime) -> list[Delivery]:
        """One beat at `now`, then the takeover of what silent replicas left; returns the
        deliveries taken over (their runs are started on the pool)."""
        db = self.database.get()
        inbox.beat(db, replica=self.name, at=now)
        if self.redo is None:
            return []
        silent_since = now - dt.timedelta(seconds=self.settings.dead_after)
        taken: list[Delivery] = []
        for delivery in inbox.stranded(db, silent_since=silent_since):
            too_old = delivery.received_at < now - self.settings.answerable
            if too_old or delivery.takeovers >= self.settings.max_takeovers:
                if inbox.abandon(db, key=delivery.key, claimed_by=delivery.claimed_by, silent_since=silent_since,
                                 at=now):
                    log.warning(msg.delivery_abandoned(delivery.kind, delivery.key, delivery.claimed_by,
                                                       received_at=delivery.received_at,
                                                       takeovers=delivery.takeovers, too_old=too_old))
                continue
            if inbox.take_over(db, key=delivery.key, claimed_by=delivery.claimed_by, replica=self.name,
                               silent_since=silent_since, at=now):
                log.warning(msg.delivery_taken_over(delivery.kind, delivery.key, delivery.claimed_by, self.name))
                taken.append(delivery)
                self._pool.submit(self._redo, delivery)
        return taken

    def _redo(self, delivery: Delivery) -> None:
        assert self.redo is not None
        try:
            self.redo(delivery)
        except Exception:  # noqa: BLE001 - redo answers itself; this is a bug's last net
            log.exception("running %s %s again failed", delivery.kind, delivery.key)
