"""The mutation results as files: one per module and tool, each stamped with the commit
its run was made on, and the index beside them.

    tests/mutation/results/<tool>/<module>.toml   (tool: mutmut, or tables: tables.py)
    tests/mutation/results/README.md              (the index, generated from those files)

A results file says what one run found on one module's code at one commit: how many
mutants, how many the tests killed, and each one they did not, with its diff and why it
may live (explanations.toml). Its presence is its claim: "these are the results of the
module as it is". So a results file whose module changed after its commit is refused
(tests/unit/test_mutation_results.py): delete it (`python -m tests.mutation.run
--forget-stale`) or run the module again. The index lists every module of every tool;
one with no results file is "not run on the current code". Nothing here runs mutmut.

A run is stamped only from a clean tree: with a change not committed to the product or
its tests, the commit would not say what was tested (`stamp` refuses).
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
INDEX = RESULTS / "README.md"

# Short name -> the source file mutated (as in pyproject's [tool.mutmut] only_mutate).
MODULES = {
    "access": "workflows/access.py",
    "policy": "workflows/requests/policy.py",
    "requests": "workflows/requests/records.py",
    "request_errors": "workflows/requests/errors.py",
    "request_views": "workflows/requests/views.py",
    "submitting": "workflows/requests/submitting.py",
    "approving": "workflows/requests/approving.py",
    "drain_extensions": "workflows/requests/drain_extensions.py",
    "rollbacks": "workflows/requests/rollbacks.py",
    "runs": "workflows/engine/runs.py",
    "steps/contract": "workflows/engine/steps/contract.py",
    "steps/cordoning": "workflows/engine/steps/cordoning.py",
    "steps/eviction": "workflows/engine/steps/eviction.py",
    "steps/waiting": "workflows/engine/steps/waiting.py",
    "steps/driver": "workflows/engine/steps/driver.py",
    "steps/operator_upgrade": "workflows/engine/steps/operator_upgrade.py",
    "steps/mig": "workflows/engine/steps/mig.py",
    "steps/gpu_check": "workflows/engine/steps/gpu_check.py",
    "steps/host_driver": "workflows/engine/steps/host_driver.py",
    "steps/table": "workflows/engine/steps/table.py",
    "check_pod": "workflows/engine/check_pod.py",
    "engine": "workflows/engine/loop.py",
    "waves": "workflows/engine/waves.py",
    "wave_gates": "workflows/engine/wave_gates.py",
    "engine_context": "workflows/engine/context.py",
    "transitions": "workflows/engine/transitions.py",
    "window_start": "workflows/engine/window_start.py",
    "capacity": "workflows/pools/capacity.py",
    "freezes": "workflows/pools/freezes.py",
    "plans": "workflows/plans.py",
    "drain_plan": "workflows/drain/plan.py",
    "upgrade_plan": "workflows/upgrade/plan.py",
    "mig_plan": "workflows/mig/plan.py",
    "migrate_plan": "workflows/migrate/plan.py",
    "audit": "storage/audit.py",
}
TOOLS = ("mutmut", "tables")
# What a run reads besides tests/mutation itself: a change not committed here means the
# commit would not say what was tested.
TESTED_PATHS = ("workflows", "storage", "bot", "commands", "testenv", "deploy", "tests", "pyproject.toml")
NOT_CURRENT = "not run on the current code"


@dataclass(frozen=True)
class Open:
    """A mutant the tests did not kill."""

    name: str
    status: str  # survived, no tests, ...
    why: str  # its explanation, or UNEXPLAINED
    diff: str


@dataclass(frozen=True)
class ModuleResults:
    tool: str
    module: str
    source: str
    commit: str
    counts: Mapping[str, int]  # mutants, killed, timeout, survived, no_tests
    open: Sequence[Open] = field(default_factory=tuple)

    @property
    def path(self) -> Path:
        return results_path(self.tool, self.module)

    @property
    def explained(self) -> int:
        return sum(1 for o in self.open if o.why != UNEXPLAINED)


UNEXPLAINED = "UNEXPLAINED"
COUNTS = ("mutants", "killed", "timeout", "survived", "no_tests")


def results_path(tool: str, module: str) -> Path:
    return RESULTS / tool / (module.replace("/", ".") + ".toml")


# --- git ---------------------------------------------------------------------------------


class Unstampable(Exception):
    """The tree is not one commit: results made on it could not say what they tested."""


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def stamp() -> str:
    """The commit a run is made on: HEAD, refused when what the run reads is not committed."""
    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        raise Unstampable(f"not a git checkout ({head.stderr.strip()})")
    dirty = git("status", "--porcelain", "--", *TESTED_PATHS, ":(exclude)tests/mutation")
    if dirty.stdout.strip():
        files = ", ".join(line[3:] for line in dirty.stdout.splitlines()[:5])
        raise Unstampable(f"changes not committed ({files}{', ...' if len(dirty.stdout.splitlines()) > 5 else ''}): "
                          "commit them (or stash them) and run again, so the results name the code they tested")
    return head.stdout.strip()


class HistoryUnknown(Exception):
    """This checkout cannot tell (no git, or a shallow clone cut above the commits needed)."""


def _shallow_boundary() -> set[str]:
    path = git("rev-parse", "--git-path", "shallow").stdout.strip()
    shallow = Path(path) if Path(path).is_absolute() else ROOT / path
    return set(shallow.read_text().split()) if shallow.exists() else set()


def stale_reason(result: ModuleResults) -> str | None:
    """Why `result` is not the result of its module as committed now (None: it is).
    The module's last change must be its commit or an ancestor of it."""
    if git("rev-parse", "--is-inside-work-tree").returncode != 0:
        raise HistoryUnknown("not a git checkout")
    boundary = _shallow_boundary()
    if git("cat-file", "-e", f"{result.commit}^{{commit}}").returncode != 0:
        if boundary:
            raise HistoryUnknown(f"this clone is shallow and does not hold {result.commit[:12]}, the commit "
                                 f"{result.path.relative_to(ROOT)} was made on: `git fetch --unshallow` and run again")
        return f"its commit {result.commit[:12]} is not in this repository's history"
    last = git("log", "-1", "--format=%H", "--", result.source).stdout.strip()
    if not last:
        return f"{result.source} is not in the history (moved or deleted?)"
    if last in boundary:
        raise HistoryUnknown(f"this clone is shallow: the last change of {result.source} it can see "
                             f"({last[:12]}) is where its history is cut: `git fetch --unshallow` and run again")
    if git("merge-base", "--is-ancestor", last, result.commit).returncode != 0:
        return f"{result.source} changed in {last[:12]}, after (or beside) the commit the run was made on, " \
               f"{result.commit[:12]}"
    return None


# --- the files ---------------------------------------------------------------------------


def _toml_string(text: str) -> str:
    """`text` as TOML that reads back as exactly `text` (a multi-line literal drops only the
    newline right after its opening quotes), so writing a results file again changes nothing."""
    if "\n" in text and "'''" not in text:
        return "'''\n" + text + "'''"
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a TOML basic string


def write(result: ModuleResults) -> Path:
    lines = [f"# Mutation results of {result.source} ({result.tool}), written by tests/mutation/run.py.",
             "# Current only while the module has not changed since `commit` (tests/unit/test_mutation_results.py).",
             f"tool = {_toml_string(result.tool)}",
             f"module = {_toml_string(result.module)}",
             f"source = {_toml_string(result.source)}",
             f"commit = {_toml_string(result.commit)}"]
    lines += [f"{key} = {int(result.counts.get(key, 0))}" for key in COUNTS]
    for mutant in result.open:
        lines += ["", "[[open]]", f"name = {_toml_string(mutant.name)}", f"status = {_toml_string(mutant.status)}",
                  f"why = {_toml_string(mutant.why)}", f"diff = {_toml_string(mutant.diff)}"]
    result.path.parent.mkdir(parents=True, exist_ok=True)
    result.path.write_text("\n".join(lines) + "\n")
    return result.path


def read(path: Path) -> ModuleResults:
    data = tomllib.loads(path.read_text())
    return ModuleResults(tool=data["tool"], module=data["module"], source=data["source"], commit=data["commit"],
                         counts={key: int(data[key]) for key in COUNTS},
                         open=tuple(Open(o["name"], o["status"], o["why"], o["diff"]) for o in data.get("open", ())))


def all_results() -> list[ModuleResults]:
    return [read(path) for path in sorted(RESULTS.glob("*/*.toml"))]


def modules_of(tool: str) -> list[str]:
    """The modules a tool covers (the tables mutator: those with a target in tables.py)."""
    if tool == "tables":
        from tests.mutation.tables import TARGETS

        return [m for m in MODULES if any(t.module == m for t in TARGETS)]
    return list(MODULES)


def index_text(results: Iterable[ModuleResults]) -> str:
    by_key = {(r.tool, r.module): r for r in results}
    lines = ["# Mutation results", "",
             "Generated by `python -m tests.mutation.run` (`make mutation`) from the files beside it: one per",
             "module and tool, stamped with the commit its run was made on. A results file is current while its",
             "module has not changed since that commit (tests/unit/test_mutation_results.py refuses one that is",
             f"not); a module without one is \"{NOT_CURRENT}\". The survivors, their diffs and why each may",
             "live are in the module's file.", ""]
    for tool in TOOLS:
        lines += [f"## {tool}", "",
                  "| module | source | commit | mutants | killed | timeout | survived | no tests | explained |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for module in modules_of(tool):
            r = by_key.get((tool, module))
            if r is None:
                lines.append(f"| {module} | {MODULES[module]} | {NOT_CURRENT} | | | | | | |")
                continue
            c = r.counts
            lines.append(f"| {module} | {r.source} | {r.commit[:12]} | {c['mutants']} | {c['killed']} | "
                         f"{c['timeout']} | {c['survived']} | {c['no_tests']} | {r.explained} of {len(r.open)} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_index() -> Path:
    INDEX.parent.mkdir(parents=True, exist_ok=True)
    INDEX.write_text(index_text(all_results()))
    return INDEX
