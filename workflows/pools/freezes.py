"""Change freezes: while a freeze is in force on a pool (or on the whole cluster), no new
request is filed for the pool (drain, upgrade, MIG change, move to the operator), no
approved run starts, and a run in flight stops at its next node boundary: the nodes it is
working on finish every step (uncordon included), no further node or wave starts. A
freeze that says `let_running_finish` lets runs that had started go on to their end; it
still holds runs that had not.

A run stopped by a freeze is not halted: it waits, and it goes on by itself, from the
node where it stopped, when the freeze ends (its `until` passes) or an admin lifts it.
Nothing was left half-done at the boundary, so going on is what the approvers approved;
the wave gate (workflows.pools.capacity.check_wave) still checks the window and the
pool's capacity before each wave, and a run whose window ended while it was frozen halts
with that reason (workflows.engine.wave_gates).

A freeze expires by itself (in force while `now < until` and not lifted): nothing has to
run at `until`. Setting and lifting are for admins and audited (`freeze.set`,
`freeze.lifted`). Time is an argument; nothing here reads the clock.
"""

from __future__ import annotations

import datetime as dt
import difflib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from storage import audit
from storage import freezes as stored_freezes
from storage.codec import JsonValue
from storage.database import Database
from storage.freezes import CLUSTER, StoredFreeze
from workflows.access import Actor, Role, public_name, require
from workflows.pools import messages as say

__all__ = ["CLUSTER", "Freeze", "FreezeRefused", "FreezeService", "FreezeSet", "covering", "freeze_sentence",
           "holding_requests", "holding_run", "holds_run", "all_in_force"]

Freeze = StoredFreeze


class FreezeRefused(Exception):
    """The freeze or unfreeze was refused; the message is one sentence for the person."""


@dataclass(frozen=True, slots=True)
class FreezeSet:
    freeze: Freeze
    # The freeze in force on the same target that this one replaced, if any.
    replaced: Freeze | None


def covering(freezes: Iterable[Freeze], pool: str, *, cluster: str | None = None) -> list[Freeze]:
    """The freezes among `freezes` that cover `pool` of `cluster`: its own and its
    cluster's (None: one cluster)."""
    return [f for f in freezes if f.cluster == cluster and f.target in (CLUSTER, pool)]


def holds_run(freeze: Freeze, *, started: bool) -> bool:
    """Whether `freeze` keeps a run from starting its next node: always, unless it lets
    running runs finish and this one had started."""
    return not (freeze.let_running_finish and started)


def all_in_force(db: Database, *, now: dt.datetime) -> list[Freeze]:
    """Every freeze in force at `now`, the cluster's first (what views and the handover show)."""
    return stored_freezes.in_force(db, now=now)


def holding_requests(db: Database, *, pool: str, now: dt.datetime, cluster: str | None = None) -> Freeze | None:
    """The freeze that refuses new requests for `pool` (of `cluster`) at `now`, if any
    (the one that ends last, so the sentence says when the pool is open again)."""
    found = covering(stored_freezes.in_force(db, now=now), pool, cluster=cluster)
    return max(found, key=lambda f: f.until) if found else None


def holding_run(db: Database, *, pool: str, started: bool, now: dt.datetime,
                cluster: str | None = None) -> Freeze | None:
    """The freeze that keeps a run of `pool` (of `cluster`) from starting its next node
    at `now`, if any; `started`: the run had started (it has steps under way or done)."""
    found = [f for f in covering(stored_freezes.in_force(db, now=now), pool, cluster=cluster)
             if holds_run(f, started=started)]
    return max(found, key=lambda f: f.until) if found else None


def freeze_sentence(freeze: Freeze, *, zone: dt.tzinfo) -> str:
    """"Pool serving-a is frozen by erin until 2026-12-05 10:00 CET: incident 4711; …", its
    end in `zone` (the display zone; the handover's, the rotation's)."""
    return say.freeze_line(target=freeze.target, by=freeze.set_by_name, until=freeze.until, reason=freeze.reason,
                           let_running_finish=freeze.let_running_finish, cluster=freeze.cluster, zone=zone)


class FreezeService:
    """Freezes on one database connection (one per thread, see `storage.database`).
    `pools` are the configured pool names a freeze may name (besides "cluster"); `wake`
    tells an engine in this process to look at once (a lifted freeze lets runs go on);
    `zone` is the one its refusals write times in (the display zone, `display.timezone`)."""

    def __init__(self, db: Database, *, pools: Collection[str], names: Mapping[str, str] | None = None,
                 wake: Callable[[], None] | None = None, cluster: str | None = None,
                 zone: dt.tzinfo = dt.timezone.utc, delivery: str | None = None) -> None:
        self._db = db
        # The Slack delivery these services answer (storage.inbox's key), if any: a freeze
        # it sets carries it, so the delivery run again answers with that freeze (`set`).
        self._delivery = delivery
        self._zone = zone
        # The cluster whose pools (or all of it) these freezes name (None: one cluster).
        self._cluster = cluster
        self._pools = frozenset(pools)
        self._names: Mapping[str, str] = names or {}
        self._wake = wake or (lambda: None)

    def check_target(self, target: str) -> str:
        """`target` as a freeze names it ("cluster" or a configured pool), or FreezeRefused
        naming the closest."""
        if target.lower() == CLUSTER:
            return CLUSTER
        if target in self._pools:
            return target
        closest = difflib.get_close_matches(target, sorted(self._pools | {CLUSTER}), n=3, cutoff=0.5)
        raise FreezeRefused(say.freeze_unknown_target(target, closest=closest, pools=sorted(self._pools)))

    def set(self, actor: Actor, *, target: str, until: dt.datetime, reason: str, let_running_finish: bool,
            now: dt.datetime) -> FreezeSet:
        """Freeze `target` until `until`; a freeze in force there already is replaced.
        Asked again by the Slack delivery that set a freeze (its replica died before
        answering), it sets nothing and answers with that freeze."""
        require(actor, Role.ADMIN, action="Freezing changes")
        if self._delivery is not None:
            earlier = stored_freezes.set_by_delivery(self._db, delivery=self._delivery)
            if earlier is not None:
                return FreezeSet(freeze=earlier[0], replaced=earlier[1])
        target = self.check_target(target)
        if until <= now:
            raise FreezeRefused(say.freeze_until_past(until, now=now, zone=self._zone))
        who = public_name(actor.user_id, names=self._names, fallback=actor.name)
        with self._db.transaction():
            freeze, replaced = stored_freezes.create(self._db, target=target, until=until, reason=reason.strip(),
                                                     let_running_finish=let_running_finish, set_by=actor.user_id,
                                                     set_by_name=who, at=now, cluster=self._cluster,
                                                     delivery=self._delivery)
            if replaced is not None:
                audit.append(self._db, actor=actor.user_id, k8s_identity=None, action="freeze.lifted",
                             target=target, at=now, before=_freeze_json(replaced), after=None,
                             detail={"freeze": replaced.id, "replaced_by": freeze.id,
                                     "reason": "replaced by a new freeze"})
            audit.append(self._db, actor=actor.user_id, k8s_identity=None, action="freeze.set", target=target,
                         at=now, before=_freeze_json(replaced) if replaced is not None else None,
                         after=_freeze_json(freeze), detail={"freeze": freeze.id})
        self._wake()
        return FreezeSet(freeze=freeze, replaced=replaced)

    def lift(self, actor: Actor, *, target: str, reason: str, now: dt.datetime) -> Freeze:
        """End the freeze in force on `target` now; FreezeRefused when there is none (saying
        which freeze does cover it, if one does)."""
        require(actor, Role.ADMIN, action="Lifting a freeze")
        target = self.check_target(target)
        who = public_name(actor.user_id, names=self._names, fallback=actor.name)
        with self._db.transaction():
            freeze = stored_freezes.in_force_on(self._db, target=target, now=now, cluster=self._cluster)
            if freeze is None:
                others = self.in_force(now)
                cluster = next((f for f in others if f.target == CLUSTER), None)
                raise FreezeRefused(say.freeze_nothing_to_lift(
                    target, cluster_freeze=freeze_sentence(cluster, zone=self._zone) if cluster is not None else None,
                    frozen_pools=[f.target for f in others if f.target != CLUSTER]))
            if not stored_freezes.lift(self._db, id=freeze.id, by=actor.user_id, by_name=who, reason=reason.strip(),
                                       at=now):
                raise FreezeRefused(say.freeze_nothing_to_lift(target, cluster_freeze=None, frozen_pools=[]))
            audit.append(self._db, actor=actor.user_id, k8s_identity=None, action="freeze.lifted", target=target,
                         at=now, before=_freeze_json(freeze), after=None,
                         detail={"freeze": freeze.id, "reason": reason.strip()})
            lifted = stored_freezes.get(self._db, id=freeze.id)
        self._wake()
        assert lifted is not None
        return lifted

    def in_force(self, now: dt.datetime) -> list[Freeze]:
        """Every freeze of this cluster in force at `now`, the cluster's first."""
        return [f for f in stored_freezes.in_force(self._db, now=now) if f.cluster == self._cluster]


def _freeze_json(freeze: Freeze) -> dict[str, JsonValue]:
    return {"id": freeze.id, "target": freeze.target, "until": freeze.until.isoformat(), "reason": freeze.reason,
            "let_running_finish": freeze.let_running_finish, "set_by": freeze.set_by}
