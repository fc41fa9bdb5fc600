"""Who is acting, and what they may do. Every entry point (Slack, console, command
line) resolves its user to an `Actor` and every action checks a role here, so no entry
point can skip a check."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NewType

UserId = NewType("UserId", str)


class Role(enum.StrEnum):
    VIEWER = "viewer"      # read the fleet, requests and audit
    OPERATOR = "operator"  # request drains, upgrades, MIG changes; control runs
    APPROVER = "approver"  # approve or deny requests (never their own)
    ADMIN = "admin"        # everything, including cancelling others' requests


# What holding a role also grants. Approvers and operators can read; admins can do all.
_IMPLIES: dict[Role, frozenset[Role]] = {
    Role.VIEWER: frozenset({Role.VIEWER}),
    Role.OPERATOR: frozenset({Role.OPERATOR, Role.VIEWER}),
    Role.APPROVER: frozenset({Role.APPROVER, Role.VIEWER}),
    Role.ADMIN: frozenset(Role),
}


def effective_roles(roles: Iterable[Role]) -> frozenset[Role]:
    granted: set[Role] = set()
    for role in roles:
        granted |= _IMPLIES[role]
    return frozenset(granted)


@dataclass(frozen=True)
class Actor:
    """A person (or the CLI's local user) with the roles configuration gives them.

    `roles` are global; `pool_roles` are roles held for one pool only (for example
    approvers of the serving pools)."""

    user_id: UserId
    name: str
    roles: frozenset[Role] = frozenset()
    pool_roles: dict[str, frozenset[Role]] = field(default_factory=dict)
    # Where the identity came from, for the audit: "slack", "console", "cli".
    via: str = "slack"
    # The Slack user groups the user is in (as far as gpuops looked them up).
    groups: tuple[str, ...] = ()
    # Groups gpuops could not read just now (Slack failed, or its rate limit): the roles
    # they give are not granted, and a refusal says why.
    unread_groups: tuple[str, ...] = ()

    def has(self, role: Role, *, pool: str | None = None) -> bool:
        if role in effective_roles(self.roles):
            return True
        return pool is not None and role in effective_roles(self.pool_roles.get(pool, frozenset()))

    def has_anywhere(self, role: Role) -> bool:
        return self.has(role) or any(role in effective_roles(r) for r in self.pool_roles.values())


class AccessDenied(Exception):
    """The actor lacks the role an action needs; the message says which. `role` and
    `pool`, when known, are the role and the pool it was needed for: whoever shows the
    refusal can then say who may act there (the configuration knows, the actor does not)."""

    role: Role | None = None
    pool: str | None = None

    def __init__(self, reason: str, *, role: Role | None = None, pool: str | None = None) -> None:
        super().__init__(reason)
        self.role = role
        self.pool = pool


def require(actor: Actor, role: Role, *, action: str, pool: str | None = None) -> None:
    """Fail closed: raise AccessDenied unless `actor` holds `role` (for `pool`)."""
    if actor.has(role, pool=pool):
        return
    where = f" for pool {pool}" if pool else ""
    held = ", ".join(sorted(effective_roles(actor.roles))) or "no role"
    raise AccessDenied(f"{action} needs the {role} role{where}; {actor.name} has {held}{unread_note(actor)}",
                       role=role, pool=pool)


def unread_note(actor: Actor) -> str:
    """What a refusal adds when some of the actor's user groups could not be read."""
    if not actor.unread_groups:
        return ""
    return (f" (gpuops could not read the Slack user group{'s' if len(actor.unread_groups) > 1 else ''} "
            f"{', '.join(actor.unread_groups)} just now, so the roles they give are not counted; "
            "try again in a minute)")


_SLACK_USER_ID = re.compile(r"[UW][A-Z0-9]{2,31}", re.ASCII)
MENTION = re.compile(r"<@[UW][A-Z0-9]{2,31}>", re.ASCII)


class Mention(str):
    """`<@U…>`, a Slack user named by a mention gpuops wrote: Slack shows it as that very
    user. A renderer shows an untouched `Mention` (one matching `MENTION`) as a mention;
    text built from it is plain text again, escaped like any other."""


def public_name(user_id: str, *, names: Mapping[str, str], fallback: str | None = None) -> str:
    """How a person is named in a message others read in Slack (a request's thread): the
    name the configuration gives them, else a mention `<@U…>`, which Slack shows as that
    very user. Never their Slack display name: its owner can change it to anyone's (a
    group member who renames herself "carol" must not read as carol). Someone who is not
    a Slack user (the command line) is named by `fallback`, else their id."""
    if user_id in names:
        return names[user_id]
    if _SLACK_USER_ID.fullmatch(user_id):
        return Mention(f"<@{user_id}>")
    return fallback or user_id
