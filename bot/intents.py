"""Buttons as every renderer shows them: their action ids, the confirmation a destructive
one asks for, and the opaque value they carry.

A button's value names a thing (a request id, and the plan hash the clicker was shown;
or the node or pool "Request a drain" fills into the drain form); it never carries a
decision. The server looks the thing up and checks everything again when the button is
clicked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot import messages as msg
from commands.reply import HOST_DRIVER_REMOVED, REQUEST_DRAIN, REQUEST_MIG, REQUEST_UPGRADE, Confirm, Intent

ACTION_PREFIX = "gpuops."
# Clicking these cannot be undone (a rollback asks for changes to nodes that just changed),
# so Slack (and the console) ask first.
DESTRUCTIVE = frozenset({"deny", "abort", "cancel", "rollback"})
KNOWN_ACTIONS = frozenset({"approve", "deny", "cancel", "abort", "handover-ack", "rollback", "continue", REQUEST_DRAIN,
                           REQUEST_UPGRADE, REQUEST_MIG, HOST_DRIVER_REMOVED})

_ACTION_ID = re.compile(r"^gpuops\.([a-z]+(?:-[a-z]+)*)\.\d+$", re.ASCII)
_VALUE = re.compile(r"^(?P<subject>[A-Za-z0-9][A-Za-z0-9._-]{0,63})(?:/(?P<hash>[0-9a-f]{6,64}))?$")
# A node (a Kubernetes name, up to 253 characters) or a pool (a label value, up to 63).
TARGET_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?"
_TARGET = re.compile(f"^{TARGET_NAME}$")


def confirm_for(intent: Intent) -> Confirm | None:
    if intent.confirm is not None:
        return intent.confirm
    if intent.action in DESTRUCTIVE:
        return msg.default_confirm(intent.action, intent.label)
    return None


def action_id(intent: Intent, index: int) -> str:
    """Unique within a message even when two buttons do the same thing."""
    return f"{ACTION_PREFIX}{intent.action}.{index}"


def action_of(action_id_text: str) -> str | None:
    match = _ACTION_ID.fullmatch(action_id_text)
    return match.group(1) if match else None


@dataclass(frozen=True)
class ButtonValue:
    subject: str  # a request id (a run id for abort, later)
    plan_hash: str | None = None


def encode_value(subject: str, plan_hash: str | None = None) -> str:
    value = f"{subject}/{plan_hash}" if plan_hash else subject
    if not _VALUE.fullmatch(value):
        raise ValueError(f"not a button value: {value!r}")
    return value


def decode_value(value: str | None) -> ButtonValue | None:
    """None for anything that is not what gpuops puts in a button (never trust it)."""
    match = _VALUE.fullmatch(value or "")
    if match is None:
        return None
    return ButtonValue(subject=match.group("subject"), plan_hash=match.group("hash"))


_RUN_AT_NODE = re.compile(rf"^(?P<run>[A-Za-z0-9][A-Za-z0-9._-]{{0,63}})(?:@(?P<node>{TARGET_NAME}))?$")


def decode_run_at_node(value: str | None) -> tuple[str, str | None] | None:
    """The run and node a "Host driver removed" button names ("run-4b1d9e@gpu-07"; a
    card from before buttons named the node carries the run alone); None for anything else."""
    match = _RUN_AT_NODE.fullmatch(value or "")
    return (match.group("run"), match.group("node")) if match else None


def decode_target(value: str | None) -> str | None:
    """The node or pool a "Request a drain" (or "Request a driver upgrade") button names:
    "" when it names none (the Home tab's), None for anything that is not a name."""
    if not value:
        return ""
    return value if _TARGET.fullmatch(value) else None
