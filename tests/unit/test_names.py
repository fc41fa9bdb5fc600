"""One name, one meaning: a public top-level name of the product (bot, commands, workflows,
storage) is defined in one module, so `Delivery` or `rolling_order` means one thing wherever
it is read. Where two modules mean the same thing it is defined once and imported; where
they mean different things they are named apart (an outbox delivery to Slack is not a
delivery from Slack). The few names one per module by protocol are listed below, each
with the modules it may be defined in. And rooms by task, none a warehouse: no product
module runs over 800 lines."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("bot", "commands", "workflows", "storage")
# Names each module of a kind defines by protocol: the module is the name's meaning.
_KIND_PROTOCOL = ("workflows/mig/", "workflows/migrate/", "workflows/upgrade/")
# Storage modules are one table each; a table's functions are read as `runs.get`,
# `steps.transition`, `freezes.in_force`, and its finished states differ by table.
_TABLES = ("storage/",)
PROTOCOL: dict[str, tuple[str, ...]] = {
    # each process's entry point is its module's `main`
    "main": ("bot/cli.py", "bot/engine_process.py"),
    # each kind's step logic, found by the kinds registry in the kind's step_logic module
    "STEP_LOGIC": _KIND_PROTOCOL,
    # each kind's sentences the engine asks every kind's messages module for
    "ONLY_CONFIGURED": _KIND_PROTOCOL,
    "ROLLED_BACK": _KIND_PROTOCOL,
    **{name: _TABLES for name in ("get", "put", "create", "transition", "for_run", "for_request", "recent",
                                  "in_force", "FINISHED_STATES")},
}


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


def product_files() -> list[Path]:
    return [path for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))]


def test_no_public_name_is_defined_in_two_modules_of_the_product_unless_by_protocol():
    where: dict[str, list[str]] = defaultdict(list)
    for path in product_files():
        for name in defined_names(path.read_text()):
            where[name].append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in where.items()
             if len(paths) > 1 and not all(p.startswith(PROTOCOL.get(name, ())) for p in paths)}
    assert twice == {}


def test_every_protocol_name_is_still_defined_in_more_than_one_module():
    where: dict[str, int] = defaultdict(int)
    for path in product_files():
        for name in defined_names(path.read_text()):
            where[name] += 1
    assert {name for name in PROTOCOL if where[name] < 2} == set()


def test_the_name_finder_sees_functions_classes_and_assignments_but_not_private_or_imported_names():
    source = ("from x import imported\nA, B = 1, 2\nC: int = 3\n_hidden = 4\nlog = None\n"
              "def utc_now(): ...\nclass Delivery: ...\n")
    assert defined_names(source) == {"A", "B", "C", "utc_now", "Delivery"}


# Rooms by task, none a warehouse: a product module past this many lines holds more than
# one topic, and is split by topic into modules of its package.
MAX_LINES = 800


def test_no_product_module_is_over_800_lines():
    long = {str(path.relative_to(ROOT)): lines for path in product_files()
            if (lines := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
