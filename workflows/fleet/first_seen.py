"""Ages of node states that the cluster does not timestamp, from gpuops' own records.

The GPU Operator labels a node's driver upgrade state and MIG change state, but says
nothing of when it entered them. A finding such as "stuck in upgrade-required for 3h"
needs that age, so gpuops notes the time it first saw each node in each state (in its
database, so a restart does not make an old state young again) and the inventory ages
states from that. A time gpuops itself wrote on the node wins (the simulator writes
`gpuops.io/upgrade-state-since`), as do the controller's own start times.

A person's cordon and taints have no age either: `stamp_restrictions` notes when gpuops
first saw a node cordoned by a person (aspect `cordon`) and its person-set taints as a
set (aspect `taints`, `workflows.fleet.restrictions`), for the `restriction-forgotten`
finding. Labels and annotations a person's tool set (aspect `hand-set`) are known only where
the node is read with its managed fields (`/gpu node`), so `hand_set_age` records them there.

`FirstSeen.stamp(inventory, now)` is called by the watch cache whenever it assesses a node
again (a node or its pods changed): in memory it is a dict lookup; the database is
written only when a state changes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Iterable
from typing import Any

from storage import first_seen as stored
from storage.database import Database
from workflows.fleet.assessment import NodeInventory
from workflows.fleet.restrictions import cordon_state, taint_state
from workflows.kube.objects import NodeName, NodeObject
from workflows.kube.labels import PAUSED_FOR_MIG_CHANGE

UPGRADE = "upgrade"
MIG = "mig"
CORDON = "cordon"
TAINTS = "taints"
HAND_SET = "hand-set"
ASPECTS = (UPGRADE, MIG, CORDON, TAINTS, HAND_SET)
# A node whose operands are paused for a MIG change but whose mig.config.state says
# nothing (the wedge of gpu-operator#2833) is tracked in state PAUSED_FOR_MIG_CHANGE.

class FirstSeen:
    """Thread-safe; `database` gives the calling thread's connection."""

    def __init__(self, database: Callable[[], Database], *, cluster: str | None = None) -> None:
        self._database = database
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], tuple[str, dt.datetime]] | None = None
        # With several clusters on one database, a cluster other than the home one keeps
        # its records as `<cluster>/<node>` (a node name is its cluster's own, and has no
        # `/`); the home cluster's stay under the plain name, as before `clusters:`.
        self._prefix = f"{cluster}/" if cluster else ""

    def _memory(self) -> dict[tuple[str, str], tuple[str, dt.datetime]]:
        if self._known is None:
            prefix = self._prefix
            self._known = {(aspect, node.removeprefix(prefix)): seen
                           for (aspect, node), seen in stored.load_all(self._database()).items()
                           if (node.startswith(prefix) if prefix else "/" not in node)}
        return self._known

    def since(self, aspect: str, node: str, state: str | None, now: dt.datetime) -> dt.datetime | None:
        """When `node` was first seen in `state` for `aspect` (now, if just now); None
        and forgotten when it is in no state."""
        key = (aspect, node)
        with self._lock:
            known = self._memory()
            seen = known.get(key)
            if state is None:
                if seen is not None:
                    del known[key]
                    stored.forget(self._database(), aspect=aspect, node=self._prefix + node)
                return None
            if seen is not None and seen[0] == state:
                return seen[1]
            known[key] = (state, now)
            stored.put(self._database(), aspect=aspect, node=self._prefix + node, state=state, since=now)
            return now

    def forget(self, node: str, now: dt.datetime) -> None:
        """The node is gone (noticed at `now`)."""
        for aspect in ASPECTS:
            self.since(aspect, node, None, now)
        # Written by commands, not through this memory: forgotten in the database itself.
        stored.forget(self._database(), aspect=HAND_SET, node=self._prefix + node)

    def stamp(self, inv: NodeInventory, now: dt.datetime) -> NodeInventory:
        """`inv` with its upgrade and MIG states aged from when gpuops first saw them,
        where the node itself gives no time."""
        upgrade_seen = self.since(UPGRADE, inv.name, inv.upgrade.state, now)
        mig_state = inv.mig.config_state or (PAUSED_FOR_MIG_CHANGE if inv.paused_for_mig_change else None)
        mig_seen = self.since(MIG, inv.name, mig_state, now)
        changes: dict[str, Any] = {}
        if inv.upgrade.since is None and upgrade_seen is not None:
            changes["upgrade"] = dataclasses.replace(inv.upgrade, since=upgrade_seen)
        if inv.mig.since is None and mig_seen is not None:
            changes["mig"] = dataclasses.replace(inv.mig, since=mig_seen)
        return dataclasses.replace(inv, **changes) if changes else inv

    def stamp_restrictions(self, inv: NodeInventory, node: NodeObject | None,
                           now: dt.datetime) -> dict[tuple[str, NodeName], dt.datetime]:
        """Note a person's cordon of `inv` and (with its node object) its person-set taints;
        (aspect, node) -> since for those it has. Without the node object its taints are
        left as recorded (unknown is not "none")."""
        found: dict[tuple[str, NodeName], dt.datetime] = {}
        cordoned = self.since(CORDON, inv.name, cordon_state(inv), now)
        if cordoned is not None:
            found[(CORDON, inv.name)] = cordoned
        if node is not None:
            tainted = self.since(TAINTS, inv.name, taint_state(node), now)
        else:
            with self._lock:
                seen = self._memory().get((TAINTS, inv.name))
            tainted = seen[1] if seen is not None else None
        if tainted is not None:
            found[(TAINTS, inv.name)] = tainted
        return found


def restriction_ages(database: Database, nodes: Iterable[tuple[NodeInventory, NodeObject | None]], *,
                     now: dt.datetime, cluster: str | None = None) -> dict[tuple[str, NodeName], dt.datetime]:
    """When gpuops first saw each of `nodes` (nodes with a person's restriction, and the
    node object where known) cordoned by a person and with its taints: read one record
    each, not every record (a command at 5,000 nodes reads only the few restricted). One
    not recorded yet (no watch cache noting them, or a record lost) is recorded now, so
    it ages from the first look. Records of restrictions that ended are the watch cache's
    to forget (`FirstSeen.forget` and `stamp_restrictions`)."""
    prefix = f"{cluster}/" if cluster else ""
    found: dict[tuple[str, NodeName], dt.datetime] = {}
    for inv, node in nodes:
        states = [(CORDON, cordon_state(inv))]
        if node is not None:
            states.append((TAINTS, taint_state(node)))
        for aspect, state in states:
            if state is None:
                continue
            seen = stored.get(database, aspect=aspect, node=prefix + inv.name)
            if seen is not None and seen[0] == state:
                found[(aspect, inv.name)] = seen[1]
            else:
                stored.put(database, aspect=aspect, node=prefix + inv.name, state=state, since=now)
                found[(aspect, inv.name)] = now
    return found


def hand_set_age(database: Database, node: NodeName, state: str | None, *, now: dt.datetime,
                 cluster: str | None = None) -> dt.datetime | None:
    """When gpuops first saw `node` with the labels and annotations a person's tool set
    (`state`, `workflows.fleet.restrictions.marks_state`): recorded now on the first look,
    kept while they stay the same, forgotten when there are none (None then)."""
    key = (f"{cluster}/" if cluster else "") + node
    seen = stored.get(database, aspect=HAND_SET, node=key)
    if state is None:
        if seen is not None:
            stored.forget(database, aspect=HAND_SET, node=key)
        return None
    if seen is not None and seen[0] == state:
        return seen[1]
    stored.put(database, aspect=HAND_SET, node=key, state=state, since=now)
    return now
