"""A small mutator of our own for what mutmut does not reach (`python -m tests.mutation.run
--tool tables`).

mutmut mutates inside functions only, and never turns an outcome around. This mutates:

- module-level tables that carry safety rules (`TARGETS` with a table's name): each entry
  removed in turn, each value of a map swapped for the next different one, and each
  element of a value that is itself a set or tuple removed in turn;
- outcomes in named functions (a target named `function` or `Class.method`): `return
  True`/`return False` swapped; a `-> bool` function's computed answer made always True
  and always False; a `-> tuple[bool, ...]` check's verdict made True; a gate's `-> X |
  None` answer made None and its `-> list[...]` answer empty; a step's `Failed(...)` made `Done(...)` (a failure counted as
  a success); a `raise` made `pass` (a refusal that lets it through).

Each mutant is one change to one module, written into a copy of the committed tree
(`git archive HEAD`), and the target's tests are run on it (`-x`): the mutant is killed
when they fail. The tests named are those that should catch it, from tests/unit and
tests/e2e like mutmut's (not the control plane). Results go to
results/tables/<module>.toml like mutmut's; mutant names read
`<module>.<target>: <the change>`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.mutation.explaining import Rules, judge
from tests.mutation.results import MODULES, ROOT, ModuleResults

# The tests each group of targets is held to.
_WAITING = ("tests/unit/test_wait_conditions.py", "tests/unit/test_safety_rules.py", "tests/unit/test_engine_steps.py", "tests/unit/test_step_outcomes.py",
            "tests/unit/test_engine_safety.py")
_EVICTION = ("tests/unit/test_safety_rules.py", "tests/unit/test_engine_safety.py", "tests/unit/test_engine_steps.py",
             "tests/unit/test_eviction_throttled.py", "tests/unit/test_step_outcomes.py")
_ENGINE = ("tests/unit/test_step_failures.py", "tests/unit/test_safety_rules.py", "tests/unit/test_engine_safety.py", "tests/unit/test_engine_steps.py")
_RUNS = ("tests/unit/test_safety_rules.py", "tests/unit/test_runs.py", "tests/unit/test_host_driver_button.py",
         "tests/unit/test_window_start.py", "tests/unit/test_step_failures.py", "tests/unit/test_freezes.py",
         "tests/unit/test_run_controls.py")
_ACCESS = ("tests/unit/test_access.py", "tests/unit/test_pool_operators.py", "tests/unit/test_runs.py",
           "tests/unit/test_requests.py")
_POLICY = ("tests/unit/test_open_requests.py", "tests/unit/test_policy.py", "tests/unit/test_requests.py")
_FREEZES = ("tests/unit/test_freeze_audit.py", "tests/unit/test_freezes.py", "tests/unit/test_safety_rules.py",
            "tests/unit/test_freeze_records.py")
_WAVE_GATES = ("tests/unit/test_wave_gates.py",)
_CHECK = ("tests/unit/test_gpu_check.py", "tests/unit/test_dcgm_diag.py", "tests/unit/test_gpu_check_step.py")
_CAPACITY = ("tests/unit/test_capacity.py", "tests/unit/test_planning.py", "tests/unit/test_safety_rules.py",
             "tests/unit/test_upgrade_scope.py", "tests/unit/test_mig_plan.py", "tests/unit/test_upgrade_plan.py")


@dataclass(frozen=True)
class Target:
    module: str  # a short name of results.MODULES
    name: str  # a module-level table, or a function or `Class.method` whose outcomes are turned
    tests: tuple[str, ...]


TARGETS = (
    Target("access", "_IMPLIES", _ACCESS),
    Target("access", "Actor.has", _ACCESS),
    Target("policy", "CANCELLABLE_STATES", _POLICY),
    Target("policy", "OPEN_STATES", _POLICY),
    Target("runs", "RUNNABLE_STATES", _RUNS),
    Target("runs", "PERSON_STEPS", _RUNS),
    Target("runs", "RunService.start", _RUNS),
    Target("runs", "RunService._start_in_transaction", _RUNS),
    Target("runs", "RunService.confirm_host_driver", _RUNS),
    Target("runs", "RunService.release_hold", _RUNS),
    Target("steps/waiting", "CONDITIONS", _WAITING),
    Target("steps/waiting", "DEFAULT_VALIDATE", _WAITING),
    Target("steps/waiting", "DEFAULT_WAIT_FOR", _WAITING),
    Target("steps/waiting", "_ready", _WAITING),
    Target("steps/waiting", "_advertised", _WAITING),
    Target("steps/waiting", "_PodCheck.__call__", _WAITING),
    Target("steps/waiting", "_driver", _WAITING),
    Target("steps/eviction", "_ON_TIMEOUT", _EVICTION),
    Target("steps/eviction", "Evict._evict", _EVICTION),
    Target("steps/cordoning", "Cordon.advance", _ENGINE),
    Target("steps/gpu_check", "RunGpuCheck.advance", _CHECK),
    Target("steps/gpu_check", "_diag_read", _CHECK),
    Target("transitions", "StepTransitions.evaluate", _ENGINE),
    Target("engine_context", "EngineStepContext.run_unfinished", _ENGINE),
    Target("wave_gates", "WaveGates.wave_may_start", _ENGINE + _WAVE_GATES),
    Target("wave_gates", "WaveGates.frozen_now", _ENGINE + _FREEZES + _WAVE_GATES),
    Target("freezes", "FreezeService.check_target", _FREEZES),
    Target("freezes", "FreezeService.set", _FREEZES),
    Target("freezes", "holds_run", _FREEZES),
    Target("freezes", "covering", _FREEZES),
    Target("freezes", "holding_requests", _FREEZES),
    Target("freezes", "holding_run", _FREEZES),
    Target("capacity", "is_unavailable", _CAPACITY),
    Target("capacity", "CapacityCheck.ok", _CAPACITY),
    Target("capacity", "WaveGate.fits", _CAPACITY),
    Target("capacity", "check_drain", _CAPACITY),
    Target("capacity", "waves_within_budget", _CAPACITY),
)


@dataclass(frozen=True)
class Mutant:
    name: str
    source: str  # the whole module, changed
    diff: str
    tests: tuple[str, ...]


# --- making the mutants ------------------------------------------------------------------


def _replace(source: str, node: ast.AST, text: str) -> str:
    """`source` with `node`'s text replaced (ast offsets are UTF-8 byte columns)."""
    lines = source.encode().splitlines(keepends=True)
    start = sum(len(line) for line in lines[:node.lineno - 1]) + node.col_offset  # type: ignore[attr-defined]
    end = sum(len(line) for line in lines[:node.end_lineno - 1]) + node.end_col_offset  # type: ignore[attr-defined]
    data = source.encode()
    return (data[:start] + text.encode() + data[end:]).decode()


def _elements(value: ast.expr) -> list[ast.expr] | None:
    """The elements of a tuple, list or set literal, or of `frozenset({...})`."""
    if isinstance(value, ast.Tuple | ast.List | ast.Set):
        return value.elts
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("frozenset", "tuple")
            and len(value.args) == 1):
        return _elements(value.args[0])
    return None


def _without(value: ast.expr, index: int) -> ast.expr:
    copy = ast.parse(ast.unparse(value), mode="eval").body
    elements = _elements(copy)
    assert elements is not None
    del elements[index]
    return copy


def _table_mutants(name: str, value: ast.expr) -> Iterator[tuple[str, ast.expr]]:
    """(what changed, the table's new value) for each change to the table."""
    if isinstance(value, ast.Dict):
        keys = [ast.unparse(k) if k is not None else "**" for k in value.keys]
        for i, key in enumerate(keys):
            copy = ast.Dict(keys=value.keys[:i] + value.keys[i + 1:], values=value.values[:i] + value.values[i + 1:])
            yield f"without {key}", copy
        texts = [ast.unparse(v) for v in value.values]
        for i, key in enumerate(keys):
            other = next((texts[j % len(texts)] for j in range(i + 1, i + len(texts)) if texts[j % len(texts)] != texts[i]),
                         None)
            if other is not None:
                values = list(value.values)
                values[i] = ast.parse(other, mode="eval").body
                yield f"{key} -> {other}", ast.Dict(keys=value.keys, values=values)
            for j, element in enumerate(_elements(value.values[i]) or ()):
                values = list(value.values)
                values[i] = _without(value.values[i], j)
                yield f"{key} without {ast.unparse(element)}", ast.Dict(keys=value.keys, values=values)
        return
    for i, element in enumerate(_elements(value) or ()):
        yield f"without {ast.unparse(element)}", _without(value, i)


def _find(tree: ast.Module, dotted: str) -> ast.AST | None:
    body: list[ast.stmt] = tree.body
    found: ast.AST | None = None
    for part in dotted.split("."):
        found = next((n for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part
                      or isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == part for t in n.targets)
                      or isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == part),
                     None)
        if found is None:
            return None
        body = found.body if isinstance(found, ast.ClassDef) else []
    return found


_DONE = "__import__('workflows.engine.steps.contract', fromlist=['Done']).Done"


def _own_nodes(function: ast.FunctionDef) -> Iterator[ast.AST]:
    """The function's nodes, its nested functions' apart (they answer for themselves)."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.Lambda | ast.ClassDef):
            todo += list(ast.iter_child_nodes(node))
    # In the order of the source, so that "return #2" is the second one a reader sees.
    yield from sorted(found, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))


def _outcome_mutants(function: ast.FunctionDef, within: str = "") -> Iterator[tuple[str, ast.AST, str]]:
    """(what changed, the node replaced, its new text) for each outcome turned around."""
    returns = ast.unparse(function.returns) if function.returns is not None else ""
    counter = 0
    for node in _own_nodes(function):
        if isinstance(node, ast.FunctionDef):
            yield from _outcome_mutants(node, f"{within}{node.name}(): ")
        elif isinstance(node, ast.Return) and node.value is not None:
            counter += 1
            value = node.value
            where = f"{within}return #{counter} ({ast.unparse(value)[:60]})"
            if isinstance(value, ast.Constant) and isinstance(value.value, bool):
                yield f"{where} -> {not value.value}", node, f"return {not value.value}"
            elif returns == "bool" and not isinstance(value, ast.Constant):
                yield f"{where} -> True", node, "return True"
                yield f"{where} -> False", node, "return False"
            elif (returns.startswith("tuple[bool") and isinstance(value, ast.Tuple) and value.elts
                  and not (isinstance(value.elts[0], ast.Constant) and value.elts[0].value is True)):
                rest = ", ".join(ast.unparse(e) for e in value.elts[1:])
                yield f"{where} -> verdict True", node, f"return (True, {rest})"
            elif returns.endswith("| None") and not (isinstance(value, ast.Constant) and value.value is None):
                yield f"{where} -> None", node, "return None"
            elif returns.startswith("list[") and not (isinstance(value, ast.List) and not value.elts):
                yield f"{where} -> []", node, "return []"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Failed":
            reason = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "reason"), None)
            if reason is not None:
                yield f"{within}{ast.unparse(node)[:60]} -> Done", node, f"{_DONE}({ast.unparse(reason)})"
        elif isinstance(node, ast.Raise) and node.exc is not None:
            yield f"{within}{ast.unparse(node)[:60]} -> pass", node, "pass"


def _diff(before: str, after: str) -> str:
    import difflib

    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=2)
    return "\n".join(line for line in lines if not line.startswith(("---", "+++")))


def mutants(target: Target, source: str) -> list[Mutant]:
    tree = ast.parse(source)
    node = _find(tree, target.name)
    if node is None:
        raise LookupError(f"{MODULES[target.module]} has no {target.name} (tests/mutation/tables.py TARGETS)")
    prefix = f"{MODULES[target.module].removesuffix('.py').replace('/', '.')}.{target.name}"
    found: list[Mutant] = []
    if isinstance(node, ast.Assign | ast.AnnAssign):
        assert node.value is not None
        for what, value in _table_mutants(target.name, node.value):
            changed = _replace(source, node.value, ast.unparse(value))
            found.append(Mutant(f"{prefix}: {what}", changed, _diff(source, changed), target.tests))
    elif isinstance(node, ast.FunctionDef):
        for what, replaced, text in _outcome_mutants(node):
            changed = _replace(source, replaced, text)
            found.append(Mutant(f"{prefix}: {what}", changed, _diff(source, changed), target.tests))
    if not found:
        raise LookupError(f"{target.name} in {MODULES[target.module]}: nothing to mutate (tables.py TARGETS)")
    return found


# --- running them ------------------------------------------------------------------------


def _pytest(tree: Path, tests: tuple[str, ...], *, timeout: float | None) -> tuple[int, float]:
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider", "-n", "0"],
                              cwd=tree, env={**_env(), "PYTHONPATH": str(tree)}, capture_output=True, timeout=timeout,
                              check=False)
        code = done.returncode
    except subprocess.TimeoutExpired:
        code = -1
    return code, time.monotonic() - began


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run_module(module: str, *, commit: str, rules: Rules) -> tuple[ModuleResults | None, list[str]]:
    """Run every target of `module` on a copy of `commit`; its results and what fails."""
    path = MODULES[module]
    with tempfile.TemporaryDirectory(prefix="gpuops-tables-") as tmp:
        tree = Path(tmp)
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        original = (tree / path).read_text()
        found = [m for t in TARGETS if t.module == module for m in mutants(t, original)]
        baseline: dict[tuple[str, ...], float] = {}
        statuses: dict[str, str] = {}
        for mutant in found:
            if mutant.tests not in baseline:
                code, took = _pytest(tree, mutant.tests, timeout=None)
                if code != 0:
                    return None, [f"{module}: its tests fail without a mutant (exit {code}): {' '.join(mutant.tests)}"]
                baseline[mutant.tests] = took
            (tree / path).write_text(mutant.source)
            try:
                code, _ = _pytest(tree, mutant.tests, timeout=3 * baseline[mutant.tests] + 30)
            finally:
                (tree / path).write_text(original)
            statuses[mutant.name] = ("killed" if code in (1, 2, 3) else "timeout" if code == -1
                                     else "survived" if code == 0 else "no tests")
            print(f"mutation: tables {statuses[mutant.name]}: {mutant.name}", flush=True)
    diffs = {m.name: m.diff for m in found}
    open_ = [(name, status, diffs[name]) for name, status in statuses.items() if status in ("survived", "no tests")]
    judged, failures = judge(rules, module, "tables", open_)
    counts = {"mutants": len(statuses), "killed": sum(s == "killed" for s in statuses.values()),
              "timeout": sum(s == "timeout" for s in statuses.values()),
              "survived": sum(s == "survived" for s in statuses.values()),
              "no_tests": sum(s == "no tests" for s in statuses.values())}
    return ModuleResults(tool="tables", module=module, source=path, commit=commit, counts=counts,
                         open=tuple(judged)), failures


def main() -> None:
    """List the mutants without running them: `python -m tests.mutation.tables`."""
    for target in TARGETS:
        for mutant in mutants(target, (ROOT / MODULES[target.module]).read_text()):
            print(mutant.name)


if __name__ == "__main__":
    main()
