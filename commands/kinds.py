"""How each kind of change's command module answers its service's outcome (a planned
request, or a refusal), so commands that serve every kind (`/gpu rollback`) look the
kind up instead of branching on it. A kind's commands module registers its answer with
`@answers("<kind>")`; the kind itself is described in workflows/kinds.py.

A kind with a request form also registers the button that opens it (`request_button`):
`/gpu status` offers each kind's button in one loop, the Home tab its form's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from commands.reply import Reply
from commands.registry import Call, kind_commands_loaded
from workflows.fleet.pool import PoolInventory
from workflows.fleet.summary import Fleet
from workflows.kinds import kinds_in_force

# What a kind's command makes of its service's call: the reply, or the refusal's.
Answer = Callable[[Call, Callable[[], Any]], Reply]

ANSWERS: dict[str, Answer] = {}


def answers(kind: str) -> Callable[[Answer], Answer]:
    """Register the decorated function as how `kind`'s service outcomes are answered."""
    def register(answer: Answer) -> Answer:
        if kind in ANSWERS:
            raise ValueError(f"kind {kind!r} already has an answer: {ANSWERS[kind].__module__}")
        ANSWERS[kind] = answer
        return answer
    return register


@dataclass(frozen=True, slots=True)
class RequestButton:
    """The button that opens a kind's request form ("Request a drain"), as a reply offers it."""

    # The kind of change (workflows/kinds.py), also its command's word.
    kind: str
    # The button's action (commands.reply REQUEST_*) and words.
    action: str
    label: str
    # Offered on a node's own status too (to ask for that node), not only on its pool's.
    on_nodes: bool = False
    # Whether a pool is one the form makes sense for (None: every configured pool).
    offered: Callable[[PoolInventory, Fleet], bool] | None = None


BUTTONS: dict[str, RequestButton] = {}


def answer_of(kind: str) -> Answer | None:
    """How the commands of `kind` answer its service's outcomes; None for a kind not in
    force or without an answer."""
    kind_commands_loaded()
    return ANSWERS.get(kind) if kind in kinds_in_force() else None


def buttons_in_force() -> tuple[RequestButton, ...]:
    """The request buttons of the kinds in force, in the kinds' order."""
    kind_commands_loaded()
    return tuple(BUTTONS[kind.name] for kind in kinds_in_force() if kind.name in BUTTONS)


def request_button(button: RequestButton) -> RequestButton:
    """Register `button` as how its kind's request form is offered."""
    if button.kind in BUTTONS:
        raise ValueError(f"kind {button.kind!r} already has a request button")
    BUTTONS[button.kind] = button
    return button
