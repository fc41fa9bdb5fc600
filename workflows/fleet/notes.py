"""Notes on nodes: `/gpu note <node> <text> [for <duration>]`, an operator's word on why a
node is cordoned or tainted. A note in force is shown in `/gpu node` and the handover,
and silences the finding of a restriction nobody remembers (`restriction-forgotten`,
`workflows.fleet.findings.forgotten_restrictions`) until it ends.

Writing one is for the node's pool's operators and audited (`node.note`). A note expires
by itself (in force while `now < until`); time is an argument, nothing here reads the clock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from storage import audit
from storage import notes as stored
from storage.database import Database
from storage.notes import StoredNote
from workflows.fleet import drift_messages as _say
from workflows.access import Actor, Role, public_name, require
from workflows.kube.objects import NodeName

__all__ = ["DEFAULT_NOTE_FOR", "MAX_NOTE_FOR", "Note", "NoteRefused", "NoteService", "notes_by_node"]

Note = StoredNote

# How long a note holds when no `for <duration>` is given, and the longest it may hold: a
# note is a reason for now, not a standing exception (that belongs in the configuration).
DEFAULT_NOTE_FOR = dt.timedelta(days=7)
MAX_NOTE_FOR = dt.timedelta(days=90)


class NoteRefused(Exception):
    """The note cannot be written; the message says why. Nothing was stored."""


def notes_by_node(notes: list[Note]) -> dict[NodeName, tuple[Note, ...]]:
    found: dict[NodeName, list[Note]] = {}
    for note in notes:
        found.setdefault(NodeName(note.node), []).append(note)
    return {node: tuple(each) for node, each in found.items()}


class NoteService:
    """Notes on one database connection (one per thread, see `storage.database`)."""

    def __init__(self, db: Database, *, names: Mapping[str, str] | None = None, cluster: str | None = None,
                 delivery: str | None = None) -> None:
        self._db = db
        # The Slack delivery these services answer (storage.inbox's key), if any: a note it
        # writes carries it, so the delivery run again answers with that note (`add`).
        self._delivery = delivery
        self._names: Mapping[str, str] = names or {}
        self._cluster = cluster

    def add(self, actor: Actor, *, node: NodeName, pool: str, text: str, lasts: dt.timedelta,
            now: dt.datetime) -> Note:
        """Write the note on `node` (of `pool`), in force for `lasts` from `now`. Asked again
        by the Slack delivery that wrote a note (its replica died before answering), it
        writes nothing and answers with that note."""
        require(actor, Role.OPERATOR, action="Writing a note on a node", pool=pool)
        if self._delivery is not None:
            earlier = stored.written_by_delivery(self._db, delivery=self._delivery)
            if earlier is not None:
                return earlier
        text = " ".join(text.split())
        if not text:
            raise NoteRefused(_say.note_empty())
        if lasts <= dt.timedelta(0) or lasts > MAX_NOTE_FOR:
            raise NoteRefused(_say.note_bad_length(lasts, longest=MAX_NOTE_FOR))
        who = public_name(actor.user_id, names=self._names, fallback=actor.name)
        with self._db.transaction():
            note = stored.create(self._db, node=node, text=text, until=now + lasts, set_by=actor.user_id,
                                 set_by_name=who, at=now, cluster=self._cluster, delivery=self._delivery)
            audit.append(self._db, actor=actor.user_id, k8s_identity=None, action="node.note", target=node,
                         at=now, after={"note": note.id, "text": note.text,
                                        "until": note.until.isoformat(), "pool": pool},
                         detail={"cluster": self._cluster} if self._cluster else None)
        return note

    def in_force(self, now: dt.datetime) -> dict[NodeName, tuple[Note, ...]]:
        """The notes in force at `now`, by node, newest first."""
        return notes_by_node(stored.in_force(self._db, now=now, cluster=self._cluster))

