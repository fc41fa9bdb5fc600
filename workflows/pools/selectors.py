"""Kubernetes label selectors as text ("app=trainer,tier!=batch", "team in (a,b)",
"gpuops.io/wait"), parsed once and matched against a pod's labels.

The grammar is the one `kubectl -l` accepts: comma-separated requirements, each
`key=value`, `key==value`, `key!=value`, `key in (v1,v2)`, `key notin (v1,v2)`, `key`
(the label exists) or `!key` (it does not). All requirements must hold.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from workflows.pools import messages as say

Operator = Literal["=", "!=", "in", "notin", "exists", "!exists"]

_KEY = r"[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?"
_EQUALITY = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_VALUE})\s*$")
_SET = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s+\((?P<values>[^()]*)\)\s*$")
_EXISTS = re.compile(rf"^\s*(?P<not>!)?\s*(?P<key>{_KEY})\s*$")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op in ("=", "in"):
            return labels.get(self.key) in self.values
        # != and notin also hold when the label is absent, as in Kubernetes.
        return labels.get(self.key) not in self.values


@dataclass(frozen=True, slots=True)
class LabelSelector:
    text: str
    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Raises ValueError naming the requirement that cannot be read. An empty
        selector is refused: it would select every pod."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(say.empty_selector())
        requirements = tuple(_requirement(part) for part in _split(text))
        return cls(text=text.strip(), requirements=requirements)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return self.text


def _split(text: str) -> list[str]:
    """Split on the commas that are not inside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _requirement(part: str) -> Requirement:
    if match := _SET.match(part):
        values = frozenset(v.strip() for v in match.group("values").split(",") if v.strip())
        if not values:
            raise ValueError(say.bad_selector_part(part))
        set_op: Operator = "in" if match.group("op") == "in" else "notin"
        return Requirement(match.group("key"), set_op, values)
    if match := _EQUALITY.match(part):
        op: Operator = "!=" if match.group("op") == "!=" else "="
        return Requirement(match.group("key"), op, frozenset({match.group("value")}))
    if match := _EXISTS.match(part):
        return Requirement(match.group("key"), "!exists" if match.group("not") else "exists")
    raise ValueError(say.bad_selector_part(part))
