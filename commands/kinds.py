"""How each kind of change's command module answers its service's outcome (a planned
request, or a refusal), so commands that serve every kind (`/gpu rollback`) look the
kind up instead of branching on it. A kind's commands module registers its answer with
`@answers("<kind>")`; the kind itself is described in workflows/kinds.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from commands.reply import Reply
from commands.registry import Call

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
