"""Keeping a delivery in the inbox before its ack, within a deadline (`InboxKeeper`).

Slack wants the ack within 3 seconds and never sends an acknowledged delivery again, so
the inbox's insert (storage.inbox.accept) sits on the ack's path. The database must not
take that ack hostage: a SQLite writer holding the lock makes the insert wait out the busy
timeout (5 s), and a PostgreSQL that went away makes it wait out a connect timeout (10 s)
or, on a connection whose server fell silent, the TCP keepalives. So the insert runs on a
thread of its own, and the ack waits for it at most `deadline`:

- done in time: its answer says whether the delivery is new (run it) or a repeat;
- not done in time, or failed: the delivery is handled here without the net (run it, as
  if new), and the insert goes on in the background. The log says so once when keeping
  starts to fail and once when it works again, not once per delivery.

An insert still running when the delivery is answered is waited for (`settle`, up to
`settle_wait`) before the delivery is marked answered, so a row that lands late is closed
too and no survivor runs it again. A row that lands after even that is left claimed by
this live replica; should it die within the half hour a response_url lives, a survivor
answers it a second time (its side effects stay single: see SlackBot.redo).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from bot import messages as msg
from storage import inbox
from storage.codec import JsonValue
from storage.database import PerThreadDatabase

log = logging.getLogger("gpuops.bot.slack")

# Slack's 3 s, less the HTTP round trip and Bolt's own work around the ack.
KEEP_DEADLINE = dt.timedelta(seconds=1.5)
# How long an answered delivery waits for its insert still under way, on the worker thread.
SETTLE_WAIT = dt.timedelta(seconds=30)
# Inserts at once; more wait for a thread (and, past the deadline, are handled without the net).
KEEPERS = 2


class InboxKeeper:
    """`keep(...)` before an ack: True to run the delivery here, False for a repeat."""

    def __init__(self, database: PerThreadDatabase, *, replica: Callable[[], str], clock: Callable[[], dt.datetime],
                 deadline: dt.timedelta = KEEP_DEADLINE, settle_wait: dt.timedelta = SETTLE_WAIT) -> None:
        self.database = database
        self.replica = replica
        self.clock = clock
        self.deadline = deadline
        self.settle_wait = settle_wait
        self._pool = ThreadPoolExecutor(max_workers=KEEPERS, thread_name_prefix="gpuops-inbox")
        self._lock = threading.Lock()
        self._late: dict[str, Future[bool]] = {}  # inserts the ack stopped waiting for
        self._failing: str | None = None  # why keeping fails, while it does (said once)

    def keep(self, *, key: str, kind: str, payload: JsonValue) -> bool:
        insert = self._pool.submit(self._accept, key, kind, payload)
        try:
            new = insert.result(timeout=self.deadline.total_seconds())
        except FutureTimeout:
            with self._lock:
                # A finished insert needs no waiting: drop those, so a delivery whose work
                # never ran (and never settles) does not keep its future for good.
                self._late = {k: f for k, f in self._late.items() if not f.done()}
                self._late[key] = insert
            self._failed(kind, key, f"the database did not answer within {self.deadline.total_seconds():g} s")
            return True
        except Exception as err:  # noqa: BLE001 - the store being down must not silence the bot
            self._failed(kind, key, f"{type(err).__name__}: {err}")
            return True
        self._working()
        return new

    def settle(self, key: str) -> None:
        """Before `key` is marked answered: wait for its insert if the ack did not."""
        with self._lock:
            insert = self._late.pop(key, None)
        if insert is None:
            return
        try:
            insert.result(timeout=self.settle_wait.total_seconds())
        except Exception:  # noqa: BLE001 - said when keeping failed; marking finds no row
            return

    def _accept(self, key: str, kind: str, payload: JsonValue) -> bool:
        return inbox.accept(self.database.get(), key=key, kind=kind, payload=payload, replica=self.replica(),
                            at=self.clock())

    def _failed(self, kind: str, key: str, why: str) -> None:
        with self._lock:
            first, self._failing = self._failing is None, why
        if first:
            log.warning(msg.delivery_not_kept_log(kind, key, why))

    def _working(self) -> None:
        with self._lock:
            was, self._failing = self._failing, None
        if was is not None:
            log.info(msg.deliveries_kept_again_log())
