"""`make mutation`: mutation testing of the safety modules with mutmut, one module at a
time, then a report of every mutant the tests did not kill.

    python -m tests.mutation.run [--modules policy,runs] [--children 1] [--keep] [--critical] [--report-only]

Each module of MODULES is run as `mutmut run "<module>*"` (mutmut's configuration is
`[tool.mutmut]` in pyproject.toml: which files, which tests), its output going to
`mutants/<module>.log`. Then the survivors (and mutants no test reaches) of every module
are written to `tests/mutation/results/survivors.md`, with their diffs, and compared with
`tests/mutation/explanations.toml`:

- a survivor in a critical function (the two-person rule, cordon restore, PDB handling,
  run start: `[critical]` there) fails the run;
- every other survivor must be explained there (`[survivors]`, by mutant name): an
  unexplained one fails the run too, and an explanation whose mutant no longer survives
  is reported as stale.

`--critical` runs only the mutants of the critical functions (a quick check of the rules
that must hold; `--keep` reuses the other results of an earlier run for the report).

Mutant names number the mutations of one function (`...x_require__mutmut_7`); a change
to that function renumbers them, so its explanations are reviewed with it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "survivors.md"
EXPLANATIONS = HERE / "explanations.toml"
MUTANTS = ROOT / "mutants"
MUTMUT = Path(sys.executable).with_name("mutmut")

# Short name -> the source file mutmut mutates (as in pyproject's only_mutate).
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
    "engine": "workflows/engine/loop.py",
    "waves": "workflows/engine/waves.py",
    "wave_gates": "workflows/engine/wave_gates.py",
    "engine_context": "workflows/engine/context.py",
    "transitions": "workflows/engine/transitions.py",
    "window_start": "workflows/engine/window_start.py",
    "audit": "storage/audit.py",
}
# mutmut's exit codes per mutant (mutmut.stats.status_by_exit_code, pinned version).
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", 37: "type check",
          -11: "segfault", -9: "segfault", None: "not checked"}
NOT_KILLED = ("survived", "no tests", "not checked", "suspicious", "skipped")


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str
    status: str


def mutant_prefix(module: str) -> str:
    return MODULES[module].removesuffix(".py").replace("/", ".")


def run_mutmut(name: str, patterns: list[str], *, children: int) -> int:
    log = MUTANTS / f"{name}.log"
    MUTANTS.mkdir(exist_ok=True)
    print(f"mutation: {name}, output in {log.relative_to(ROOT)}", flush=True)
    with log.open("w") as out:
        done = subprocess.run([str(MUTMUT), "run", "--max-children", str(children), *patterns],
                              cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        print(f"mutation: mutmut failed on {name} (exit {done.returncode}); see {log}", flush=True)
    return done.returncode


def critical_patterns() -> list[str]:
    """The critical functions as mutmut run takes them (function names, then a star)."""
    critical = tomllib.loads(EXPLANATIONS.read_text()).get("critical", {})
    return sorted({p.replace("__mutmut_*", "*") for patterns in critical.values() for p in patterns})


def results(module: str) -> list[Mutant]:
    meta = MUTANTS / (MODULES[module] + ".meta")
    if not meta.exists():
        return []
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return [Mutant(name, module, STATUS.get(code, "suspicious")) for name, code in sorted(codes.items())]


def diff(name: str, module: str) -> str:
    """The mutant's change, as `mutmut show` prints it (read in this process: one
    `mutmut show` per survivor would take a second each)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    os.chdir(ROOT)
    text = get_diff_for_mutant(name, path=MODULES[module])
    return "\n".join(line for line in text.splitlines() if not line.startswith(("---", "+++"))).strip()


def report(modules: list[str]) -> int:
    rules = tomllib.loads(EXPLANATIONS.read_text())
    critical: dict[str, list[str]] = rules.get("critical", {})
    explained: dict[str, str] = rules.get("survivors", {})
    everything = {m: results(m) for m in modules}
    lines = ["# Mutation testing: what survived", "",
             "Written by `make mutation` (tests/mutation/run.py) from mutmut's results; explanations in",
             "`tests/mutation/explanations.toml`. Survivors in the critical functions fail the run.", "",
             "| module | mutants | killed | timeout | survived | no tests | not checked | explained |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    failures: list[str] = []
    detail: list[str] = []
    unchecked: Counter[str] = Counter()
    for module, mutants in everything.items():
        counts = Counter(m.status for m in mutants)
        for mutant in mutants:
            if mutant.status == "not checked":
                unchecked[mutant.name.rsplit("__mutmut_", 1)[0]] += 1
        open_ = [m for m in mutants if m.status in NOT_KILLED and m.status != "not checked"]
        lines.append(f"| {MODULES[module]} | {len(mutants)} | {counts['killed']} | {counts['timeout']} | "
                     f"{counts['survived']} | {counts['no tests']} | {counts['not checked']} | "
                     f"{sum(any(fnmatch.fnmatchcase(m.name, p) for p in explained) for m in open_)} |")
        for mutant in open_:
            area = next((a for a, patterns in critical.items()
                         if any(fnmatch.fnmatchcase(mutant.name, p) for p in patterns)), None)
            why = next((reason for pattern, reason in explained.items() if fnmatch.fnmatchcase(mutant.name, pattern)),
                       None)
            if area is not None:
                failures.append(f"{mutant.name} ({mutant.status}) is in the critical area '{area}'")
            elif why is None:
                failures.append(f"{mutant.name} ({mutant.status}) is not explained in {EXPLANATIONS.name}")
            detail += [f"### `{mutant.name}` ({mutant.status})", "", "```diff", diff(mutant.name, module), "```", "",
                       f"Critical ({area}): must be killed." if area else f"Why it may live: {why or 'UNEXPLAINED'}",
                       ""]
    surviving = {m.name for ms in everything.values() for m in ms if m.status in NOT_KILLED}
    checked = {m.name for ms in everything.values() for m in ms}
    # An explanation is stale when it names mutants of the modules run and none of them survives.
    stale = sorted(p for p in explained if any(fnmatch.fnmatchcase(n, p) for n in checked)
                   and not any(fnmatch.fnmatchcase(n, p) for n in surviving))
    lines += ["", f"Critical areas (no survivor allowed): {', '.join(critical)}.", ""]
    if stale:
        lines += ["Explanations whose mutant no longer survives (remove them): "
                  + ", ".join(f"`{n}`" for n in stale), ""]
    if unchecked:
        failures.append(f"{sum(unchecked.values())} mutants were not checked (a run cut short): run make mutation")
        lines += ["## Not checked in this run", "",
                  "mutmut generated these but the run ended before testing them; they are neither killed nor",
                  "survivors yet. Per function:", ""]
        lines += [f"- `{name}`: {count}" for name, count in sorted(unchecked.items())] + [""]
    lines += ["## Survivors", ""] + (detail or ["None.", ""])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines).rstrip() + "\n")
    print(f"mutation: results in {RESULTS.relative_to(ROOT)}")
    for failure in failures:
        print(f"mutation: FAIL {failure}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", default=",".join(MODULES), help=f"comma-separated, of: {', '.join(MODULES)}")
    parser.add_argument("--children", type=int, default=int(os.environ.get("MUTATION_CHILDREN", "1")),
                        help="mutants tested at once (default 1: the machine is shared)")
    parser.add_argument("--keep", action="store_true", help="reuse mutants/ from an earlier run")
    parser.add_argument("--report-only", action="store_true", help="only write the report from mutants/")
    parser.add_argument("--critical", action="store_true",
                        help="run only the critical functions' mutants (all modules), then report")
    args = parser.parse_args(argv)
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown modules {unknown}; known: {', '.join(MODULES)}")
    if not args.report_only:
        if not args.keep and MUTANTS.exists():
            shutil.rmtree(MUTANTS)
        runs = ([("critical", critical_patterns())] if args.critical else
                [(module, [f"{mutant_prefix(module)}.*"]) for module in modules])
        for name, patterns in runs:
            if run_mutmut(name, patterns, children=args.children) != 0:
                return 2
    return report(modules)


if __name__ == "__main__":
    sys.exit(main())
