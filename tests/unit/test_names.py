"""One name, one meaning: a public name bot/ defines is defined in no other module of the
product, so `Delivery` or `utc_now` means one thing wherever it is read. Where two modules
mean the same thing it is defined once and imported; where they mean different things
they are named apart (an outbox delivery to Slack is not a delivery from Slack)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("bot", "commands", "workflows", "storage")
# Each process's entry point is its module's `main`, by convention.
CONVENTIONAL = {"main"}


def defined_names(source: str) -> set[str]:
    """The public names a module's top level defines: functions, classes, assignments."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(e.id for e in (target.elts if isinstance(target, ast.Tuple) else [target])
                             if isinstance(e, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_") and name != "log"}


def test_no_public_name_of_bot_is_defined_in_two_modules_of_the_product():
    where: dict[str, list[str]] = defaultdict(list)
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in defined_names(path.read_text()):
                where[name].append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in where.items()
             if len(paths) > 1 and name not in CONVENTIONAL and any(p.startswith("bot/") for p in paths)}
    assert twice == {}


def test_the_name_finder_sees_functions_classes_and_assignments_but_not_private_or_imported_names():
    source = ("from x import imported\nA, B = 1, 2\nC: int = 3\n_hidden = 4\nlog = None\n"
              "def utc_now(): ...\nclass Delivery: ...\n")
    assert defined_names(source) == {"A", "B", "C", "utc_now", "Delivery"}
