"""`make mutation`: mutation testing of the safety modules, module by module, each
module's results written to its own file stamped with the commit (tests/mutation/results.py).

    python -m tests.mutation.run [--modules freezes,capacity] [--tool mutmut|tables|both]
                                 [--children 1] [--keep] [--critical]
    python -m tests.mutation.run --index           # rewrite results/README.md only
    python -m tests.mutation.run --forget-stale    # delete results older than their module
    python -m tests.mutation.run --explain         # the results' reasons from explanations.toml
    python -m tests.mutation.run --recheck --modules runs   # its survivors again, after new tests

Two tools. mutmut (`[tool.mutmut]` in pyproject.toml: which files, which tests) mutates
operators, constants and calls inside functions; each module is run as `mutmut run
"<module>.*"`, its output in `mutants/<module>.log`. tests/mutation/tables.py reaches
what mutmut does not: the module-level tables that carry safety rules, and outcomes
turned around (a failure into a success, a refusal into nothing, False into True).

Each survivor (and mutant no test reaches) is compared with tests/mutation/explanations.toml:

- a survivor in a critical function (`[critical]`: the two-person rule, cordon restore,
  PDB handling, run start) fails the run, unless its own explanation shows it equivalent
  (starts with "Equivalent": no input tells it from the code);
- every other survivor must be explained there, by its own name (`[survivors]`; a reason
  given for a whole function is not taken, `[hints]` keeps those as hints): an
  unexplained one fails the run, and an explanation whose mutant no longer survives is
  reported as stale.

A module's results file is written only when all its mutants were checked, and only from
a tree whose product and tests are committed (the stamp). `--critical` runs only the
mutants of the critical functions, as a quick check: it writes no results file.

`--recheck` runs only the mutants a module's results file leaves open (and its timeouts:
on a busy machine mutmut's wall-clock limit counts a slow survivor as one), against the tests
as committed now, in the mutants/ directory of the run that made the file (its other
mutants' results are read from there), and stamps the file with the new commit. Tests
added since only kill more: a mutant killed then stays killed. It refuses a module whose
code changed since its results, and a mutants/ that holds another run.

mutmut's mutant names number the mutations of one function (`...x_require__mutmut_7`);
a change to that function renumbers them, so its explanations are reviewed with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.mutation import results as store
from tests.mutation.explaining import Rules, judge, why_of
from tests.mutation.results import MODULES, ROOT, UNEXPLAINED, ModuleResults, Unstampable

MUTANTS = ROOT / "mutants"
MUTMUT = Path(sys.executable).with_name("mutmut")

# mutmut's exit codes per mutant (mutmut.stats.status_by_exit_code, pinned version).
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", 37: "type check",
          -11: "segfault", -9: "segfault", None: "not checked"}
NOT_KILLED = ("survived", "no tests", "not checked", "suspicious", "skipped")


# --- mutmut ------------------------------------------------------------------------------


def mutant_prefix(module: str) -> str:
    return MODULES[module].removesuffix(".py").replace("/", ".")


def run_mutmut(name: str, patterns: list[str], *, children: int) -> int:
    log = MUTANTS / f"{name.replace('/', '.')}.log"
    MUTANTS.mkdir(exist_ok=True)
    # Tests read the reference captures in ../shared, beside the checkout; from mutmut's
    # copy (mutants/) that is the checkout itself.
    shared = ROOT / "shared"
    if not shared.exists() and (ROOT.parent / "shared").is_dir():
        shared.symlink_to(ROOT.parent / "shared")
    print(f"mutation: {name}, output in {log.relative_to(ROOT)}", flush=True)
    with log.open("w") as out:
        done = subprocess.run([str(MUTMUT), "run", "--max-children", str(children), *patterns],
                              cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        print(f"mutation: mutmut failed on {name} (exit {done.returncode}); see {log}", flush=True)
    return done.returncode


def critical_patterns(rules: Rules) -> list[str]:
    """The critical functions as mutmut run takes them (function names, then a star)."""
    return sorted({p.replace("__mutmut_*", "*") for patterns in rules.critical.values() for p in patterns})


def mutmut_statuses(module: str) -> dict[str, str]:
    meta = MUTANTS / (MODULES[module] + ".meta")
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: STATUS.get(code, "suspicious") for name, code in sorted(codes.items())}


def mutmut_diff(name: str, module: str) -> str:
    """The mutant's change, as `mutmut show` prints it (read in this process: one
    `mutmut show` per survivor would take a second each)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    os.chdir(ROOT)
    text = get_diff_for_mutant(name, path=MODULES[module])
    return "\n".join(line for line in text.splitlines() if not line.startswith(("---", "+++"))).strip()


def mutmut_results(module: str, commit: str, rules: Rules) -> tuple[ModuleResults | None, list[str]]:
    statuses = mutmut_statuses(module)
    if not statuses:
        return None, [f"{module}: mutmut left no results (see its log)"]
    counts = Counter(statuses.values())
    if counts["not checked"]:
        return None, [f"{module}: {counts['not checked']} mutants were not checked (a run cut short): no results "
                      "written for it"]
    open_ = [(n, s, mutmut_diff(n, module)) for n, s in statuses.items() if s in NOT_KILLED]
    judged, failures = judge(rules, module, "mutmut", open_)
    result = ModuleResults(tool="mutmut", module=module, source=MODULES[module], commit=commit,
                           counts={"mutants": len(statuses), "timeout": counts["timeout"],
                                   # killed: also a type error or a crash; survived: also suspicious, skipped
                                   "killed": sum(n for s, n in counts.items() if s not in NOT_KILLED and s != "timeout"),
                                   "survived": len(open_) - counts["no tests"], "no_tests": counts["no tests"]},
                           open=tuple(judged))
    return result, failures


# --- the commands ------------------------------------------------------------------------


def explain_again() -> int:
    """Rewrite each results file's reasons from explanations.toml (the mutants and the
    commit stay: what was run does not change when a survivor is explained)."""
    rules = Rules.load()
    left = 0
    for result in store.all_results():
        open_ = tuple(dataclasses.replace(o, why=why_of(rules, o.name)) for o in result.open)
        store.write(dataclasses.replace(result, open=open_))
        left += sum(1 for o in open_ if o.why == UNEXPLAINED or o.why.startswith("CRITICAL"))
    print(f"mutation: index in {store.write_index().relative_to(ROOT)}; {left} survivors not explained")
    return 1 if left else 0


def recheck(modules: list[str], *, children: int) -> int:
    """Run again only the mutants each module's results leave open (see the docstring)."""
    rules = Rules.load()
    commit = _stamp_or_say()
    if commit is None:
        return 2
    failures: list[str] = []
    for module in modules:
        path = store.results_path("mutmut", module)
        if not path.exists():
            failures.append(f"{module}: no mutmut results to check again (run it first)")
            continue
        before = store.read(path)
        reason = store.stale_reason(before)
        if reason is not None:
            failures.append(f"{module}: its results are from older code, run it whole: {reason}")
            continue
        there = len(mutmut_statuses(module))
        if there != before.counts["mutants"]:
            failures.append(f"{module}: mutants/ does not hold the run of {before.commit[:12]} "
                            f"({there} mutants there, {before.counts['mutants']} in its results)")
            continue
        # Timeouts too: mutmut's wall-clock limit turns a slow survivor on a busy machine
        # into a timeout, so a quiet machine checks them again.
        timeouts = [name for name, status in mutmut_statuses(module).items() if status == "timeout"]
        names = [o.name for o in before.open] + timeouts
        if not names:
            continue
        if run_mutmut(module, names, children=children) != 0:
            failures.append(f"{module}: mutmut failed")
            continue
        result, failed = mutmut_results(module, commit, rules)
        failures += failed
        if result is not None:
            print(f"mutation: {module}: {len(before.open)} open before, {len(result.open)} now", flush=True)
            failures += write_stamped(result, commit)
    return _ended(failures)


def forget_stale() -> int:
    for result in store.all_results():
        reason = store.stale_reason(result)
        if reason is not None:
            result.path.unlink()
            print(f"mutation: deleted {result.path.relative_to(ROOT)}: {reason}")
    print(f"mutation: index in {store.write_index().relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", default=",".join(MODULES), help=f"comma-separated, of: {', '.join(MODULES)}")
    parser.add_argument("--tool", choices=("mutmut", "tables", "both"), default="both")
    parser.add_argument("--children", type=int, default=int(os.environ.get("MUTATION_CHILDREN", "1")),
                        help="mutants tested at once (default 1: the machine is shared)")
    parser.add_argument("--keep", action="store_true", help="reuse mutants/ (mutmut's stats) from an earlier run")
    parser.add_argument("--critical", action="store_true",
                        help="run only the critical functions' mutmut mutants (all modules); writes no results")
    parser.add_argument("--index", action="store_true", help="only rewrite the index from the results files")
    parser.add_argument("--explain", action="store_true",
                        help="rewrite the results files' reasons from explanations.toml (no mutant is run)")
    parser.add_argument("--recheck", action="store_true",
                        help="run again only the mutants the modules' results leave open (in the run's mutants/)")
    parser.add_argument("--forget-stale", action="store_true",
                        help="delete the results files older than their module's last change, then the index")
    args = parser.parse_args(argv)
    if args.index:
        print(f"mutation: index in {store.write_index().relative_to(ROOT)}")
        return 0
    if args.forget_stale:
        return forget_stale()
    if args.explain:
        return explain_again()
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown modules {unknown}; known: {', '.join(MODULES)}")
    if args.recheck:
        return recheck(modules, children=args.children)
    rules = Rules.load()
    if args.critical:
        if MUTANTS.exists() and not args.keep:
            shutil.rmtree(MUTANTS)
        return 2 if run_mutmut("critical", critical_patterns(rules), children=args.children) != 0 else 0
    commit = _stamp_or_say()
    if commit is None:
        return 2
    failures: list[str] = []
    if args.tool in ("mutmut", "both"):
        if MUTANTS.exists() and not args.keep:
            shutil.rmtree(MUTANTS)
        for module in modules:
            if run_mutmut(module, [f"{mutant_prefix(module)}.*"], children=args.children) != 0:
                failures.append(f"{module}: mutmut failed")
                continue
            result, failed = mutmut_results(module, commit, rules)
            failures += failed
            if result is not None:
                failures += write_stamped(result, commit)
    if args.tool in ("tables", "both"):
        from tests.mutation import tables

        for module in [m for m in modules if m in store.modules_of("tables")]:
            result, failed = tables.run_module(module, commit=commit, rules=rules)
            failures += failed
            if result is not None:
                failures += write_stamped(result, commit)
    return _ended(failures)


def _stamp_or_say() -> str | None:
    """The commit to stamp results with, or None (said) when the tree cannot be stamped."""
    try:
        return store.stamp()
    except Unstampable as err:
        print(f"mutation: refused: {err}")
        return None


def _ended(failures: list[str]) -> int:
    """Rewrite the index, say what failed, and the exit code."""
    print(f"mutation: index in {store.write_index().relative_to(ROOT)}")
    for failure in failures:
        print(f"mutation: FAIL {failure}")
    return 1 if failures else 0


def write_stamped(result: ModuleResults, commit: str) -> list[str]:
    """Write a module's results if the tree is still the commit the run began on."""
    try:
        now = store.stamp()
    except Unstampable as err:
        return [f"{result.module}: results not written: {err}"]
    if now != commit:
        return [f"{result.module}: results not written: HEAD moved from {commit[:12]} to {now[:12]} during the run"]
    print(f"mutation: results in {store.write(result).relative_to(ROOT)}", flush=True)
    return []


if __name__ == "__main__":
    sys.exit(main())
