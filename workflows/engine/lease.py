"""Leader election: only the replica holding a coordination.k8s.io/v1 Lease runs the engine.

The Lease (`gpuops-engine` in a configurable namespace) names its holder
(`holderIdentity`), how long a claim lasts (`leaseDurationSeconds`) and when it was last
renewed (`renewTime`). How holding works, as client-go's leader election does it:

- Every write is a compare-and-set on `resourceVersion` (create, or replace the version
  read). A Conflict means another replica wrote first: this one does not hold the lease.
- A candidate takes the lease over only when its holder released it, or when the record
  has not changed for a whole `leaseDurationSeconds` *measured on the candidate's own
  monotonic clock* from the moment it first saw that version. Wall clocks of different
  machines are never compared (`renewTime` is written for people, not trusted).
- The holder's own deadline is the moment it *sent* its last successful write plus the
  lease duration, on its monotonic clock. Any other replica saw that write later, so it
  can only take over after this deadline. `held()` turns false at the deadline even if
  the renewing thread never ran again: a stalled or suspended process does not act on an
  expired claim.
- Fail closed: a renewal that fails for any reason (conflict, another holder, API error)
  makes `held()` false at once. A later successful renewal restores it only if the record
  is still ours (the compare-and-set guarantees that).

What this cannot prevent: a process that checks `held()` and is then frozen for longer
than the remaining lease before its next API call. Keep the lease duration well above the
time one engine step's API call can take, and the renew period a third of it.

The identity must be unique per replica (a pod name); a restarted replica that keeps its
identity (a StatefulSet pod) takes its own lease back at once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from workflows.kube.errors import Conflict, KubeError, NotFound
from workflows.kube.gateway import KubeGateway
from workflows.kube.objects import LeaseRecord

log = logging.getLogger("gpuops.lease")


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass(frozen=True)
class LeaseSettings:
    """Where the lease lives and how long a claim lasts.

    namespace: where the Lease object is kept (the bot's own namespace).
    name: the Lease's name; every replica of one gpuops installation uses the same.
    duration: how long a claim holds without renewal (`leaseDurationSeconds`).
    renew_every: how often the holder renews (default: a third of `duration`).
    retry_every: how often a replica without the lease tries again (default: a quarter
    of `duration`).
    """

    namespace: str = "gpuops"
    name: str = "gpuops-engine"
    duration: dt.timedelta = dt.timedelta(seconds=15)
    renew_every: dt.timedelta | None = None
    retry_every: dt.timedelta | None = None

    def __post_init__(self) -> None:
        if self.duration < dt.timedelta(seconds=1):
            raise ValueError("a lease must last at least one second")

    @property
    def duration_seconds(self) -> int:
        return max(1, int(self.duration.total_seconds()))

    @property
    def renew_period(self) -> float:
        return (self.renew_every or self.duration / 3).total_seconds()

    @property
    def retry_period(self) -> float:
        return (self.retry_every or self.duration / 4).total_seconds()


class EngineLease:
    """One replica's claim on the engine lease. `start()` keeps trying (and renewing) in
    a background thread; `held()` is what the engine asks before every side effect."""

    def __init__(self, gateway: KubeGateway, *, identity: str, settings: LeaseSettings = LeaseSettings(),
                 monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = _utc_now,
                 on_change: Callable[[bool], None] | None = None) -> None:
        if not identity:
            raise ValueError("a lease holder needs an identity (e.g. the pod name)")
        self._gateway = gateway
        self.identity = identity
        self.settings = settings
        self._monotonic = monotonic
        self._wall = wall
        self._on_change = on_change
        self._lock = threading.Lock()
        self._held = False
        self._deadline = 0.0
        self._record: LeaseRecord | None = None
        # The version of the record last seen, and when (monotonic) it was first seen.
        self._observed_version: str | None = None
        self._observed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_problem: str | None = None
        # Monotonic times this replica gained the lease, oldest first, and how many
        # successful writes (acquisitions and renewals) it made: for tests and logs.
        self.acquired_at: list[float] = []
        self.writes = 0

    # --- what the engine asks ----------------------------------------------------------
    def held(self) -> bool:
        with self._lock:
            return self._held and self._monotonic() < self._deadline

    @property
    def deadline(self) -> float:
        """When (monotonic) the last claim runs (or ran) out unless renewed; 0 if none."""
        with self._lock:
            return self._deadline if self._held else 0.0

    @property
    def holder(self) -> str | None:
        """The holder named by the record last seen."""
        with self._lock:
            return self._record.holder if self._record else None

    # --- the background thread -----------------------------------------------------------
    def start(self) -> EngineLease:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"lease-{self.identity}", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, release: bool = True) -> None:
        """Stop renewing. `release` hands the lease back so another replica can take over
        at once. Without it the claim simply runs out, as after a crash: `held()` stays
        true until the deadline of the last renewal and is false from then on."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if release:
            self.release()

    def _loop(self) -> None:
        while not self._stop.is_set():
            ok = self.attempt()
            period = self.settings.renew_period if ok else self.settings.retry_period
            if self._stop.wait(period):
                return

    # --- one try ------------------------------------------------------------------------
    def attempt(self) -> bool:
        """Acquire or renew once; True if this replica holds the lease afterwards."""
        ns, name = self.settings.namespace, self.settings.name
        try:
            record = self._gateway.get_lease(ns, name)
        except NotFound:
            sent = self._monotonic()
            try:
                created = self._gateway.create_lease(ns, name, holder=self.identity,
                                                     duration_seconds=self.settings.duration_seconds,
                                                     at=self._wall())
            except Conflict:
                return self._lose("another replica created the lease first")
            except KubeError as err:
                return self._lose(f"could not create lease {ns}/{name}: {err}")
            return self._win(created, sent=sent)
        except KubeError as err:
            return self._lose(f"could not read lease {ns}/{name}: {err}")

        expired = self._observe(record)
        now = self._wall()
        if record.holder == self.identity:
            wanted = dataclasses.replace(record, renew_time=now,
                                         duration_seconds=self.settings.duration_seconds)
        elif record.holder is None or expired:
            wanted = dataclasses.replace(record, holder=self.identity, acquire_time=now, renew_time=now,
                                         duration_seconds=self.settings.duration_seconds,
                                         transitions=record.transitions + 1)
        else:
            return self._lose(f"held by {record.holder}")
        sent = self._monotonic()
        try:
            updated = self._gateway.update_lease(wanted)
        except Conflict:
            return self._lose("another replica wrote the lease first")
        except KubeError as err:
            return self._lose(f"could not renew lease {ns}/{name}: {err}")
        return self._win(updated, sent=sent)

    def release(self) -> None:
        """Give the lease up if this replica holds it (holder cleared, so others need not
        wait for it to run out)."""
        with self._lock:
            record = self._record if self._held else None
        self._set_held(False, deadline=0.0)
        if record is None or record.holder != self.identity:
            return
        try:
            self._gateway.update_lease(dataclasses.replace(record, holder=None, duration_seconds=1,
                                                           renew_time=self._wall()))
        except KubeError as err:  # it will run out by itself
            log.info("could not release lease %s/%s: %s", record.namespace, record.name, err)

    # --- privately ----------------------------------------------------------------------
    def _observe(self, record: LeaseRecord) -> bool:
        """Remember the record; True if it has not changed for a whole lease duration."""
        now = self._monotonic()
        with self._lock:
            self._record = record
            if record.resource_version != self._observed_version:
                self._observed_version = record.resource_version
                self._observed_at = now
                return False
            duration = record.duration_seconds or self.settings.duration_seconds
            return now - self._observed_at >= duration

    def _win(self, record: LeaseRecord, *, sent: float) -> bool:
        with self._lock:
            self._record = record
            self._observed_version = record.resource_version
            self._observed_at = self._monotonic()
            gained = not (self._held and self._monotonic() < self._deadline)
            if gained:
                self.acquired_at.append(sent)
            self.writes += 1
        self.last_problem = None
        self._set_held(True, deadline=sent + self.settings.duration.total_seconds())
        if gained:
            log.info("%s holds lease %s/%s", self.identity, record.namespace, record.name)
        return True

    def _lose(self, why: str) -> bool:
        if self.last_problem != why:
            log.info("%s does not hold the engine lease: %s", self.identity, why)
        self.last_problem = why
        self._set_held(False, deadline=0.0)
        return False

    def _set_held(self, held: bool, *, deadline: float) -> None:
        with self._lock:
            was = self._held and self._monotonic() < self._deadline
            self._held = held
            self._deadline = deadline
        if was != held and self._on_change is not None:
            self._on_change(held)


class AlwaysHeld:
    """A lease for a single replica that needs no election (a local console, unit tests)."""

    identity = "local"

    def held(self) -> bool:
        return True

    def start(self) -> AlwaysHeld:
        return self

    def stop(self, *, release: bool = True) -> None:
        return None
