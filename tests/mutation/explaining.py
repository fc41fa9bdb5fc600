"""What explanations.toml says: the critical functions, why each named survivor may live,
and the hints earlier runs left per function (tests/mutation/run.py's docstring)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from tests.mutation import results as store
from tests.mutation.results import UNEXPLAINED, Open

EXPLANATIONS = Path(__file__).resolve().parent / "explanations.toml"


class Rules:
    """explanations.toml: the critical functions, and why each named survivor may live."""

    def __init__(self, text: str) -> None:
        rules = tomllib.loads(text)
        self.critical: dict[str, list[str]] = rules.get("critical", {})
        self.survivors: dict[str, str] = rules.get("survivors", {})
        self.hints: dict[str, str] = rules.get("hints", {})

    @classmethod
    def load(cls) -> Rules:
        return cls(EXPLANATIONS.read_text())

    def critical_area(self, name: str) -> str | None:
        return next((area for area, patterns in self.critical.items()
                     if any(fnmatch.fnmatchcase(name, p) for p in patterns)), None)

    def why(self, name: str) -> str | None:
        return self.survivors.get(name)

    def hint(self, name: str) -> str | None:
        return next((text for pattern, text in self.hints.items() if fnmatch.fnmatchcase(name, pattern)), None)


# A survivor in a critical function may live only when no test could kill it: its
# explanation then starts with this word and says why no input tells the two apart. A gap,
# however well named, is not taken there.
EQUIVALENT = "Equivalent"


def why_of(rules: Rules, name: str) -> str:
    """What a results file says of an open mutant: its explanation, CRITICAL or UNEXPLAINED."""
    why = rules.why(name)
    area = rules.critical_area(name)
    if area is not None and not (why or "").startswith(EQUIVALENT):
        return f"CRITICAL ({area}): must be killed, or shown equivalent"
    return why or UNEXPLAINED


def judge(rules: Rules, module: str, tool: str, open_: list[tuple[str, str, str]]) -> tuple[list[Open], list[str]]:
    """The open mutants with their explanations, and what fails the run."""
    failures: list[str] = []
    judged: list[Open] = []
    for name, status, diff in open_:
        why = why_of(rules, name)
        if why.startswith("CRITICAL"):
            failures.append(f"{name} ({status}) is in the critical area '{rules.critical_area(name)}' and not "
                            "shown equivalent")
        elif why == UNEXPLAINED:
            hint = rules.hint(name)
            failures.append(f"{name} ({status}) is not explained in {EXPLANATIONS.name}"
                            + (f" (an earlier run said of its function: {hint})" if hint else ""))
        judged.append(Open(name, status, why, diff))
    names = {o.name for o in judged}
    prefix = store.MODULES[module].removesuffix(".py").replace("/", ".")
    for name in rules.survivors:
        if name.startswith(prefix) and name not in names and (tool == "tables") == (":" in name):
            print(f"mutation: stale explanation (that mutant no longer survives): {name}")
    return judged, failures
