"""The mutation results in tests/mutation/results/ tell the truth: each file is the result
of its module as committed now (not older code), the index says what the files hold, and
every mutant a file lists as not killed is explained. Nothing here runs a mutant.

A results file claims to be current by being there: `python -m tests.mutation.run
--forget-stale` deletes the ones whose module changed since their commit (the index then
says "not run on the current code"), `make mutation MODULES=<module>` makes them again.
"""

from __future__ import annotations

import dataclasses
import subprocess
import tomllib

import pytest

from tests.mutation import results
from tests.mutation.explaining import Rules, why_of
from tests.mutation.results import MODULES, ROOT, UNEXPLAINED, HistoryUnknown, ModuleResults


def _reason(result: ModuleResults) -> str | None:
    try:
        return results.stale_reason(result)
    except HistoryUnknown as err:
        pytest.skip(f"cannot tell whether the mutation results are current: {err}")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_every_mutation_results_file_was_made_on_its_module_as_it_is_now():
    stale = {str(r.path.relative_to(ROOT)): reason for r in results.all_results() if (reason := _reason(r))}
    assert not stale, (
        "mutation results from older code (delete them with `python -m tests.mutation.run --forget-stale`, "
        f"or run their modules again with `make mutation MODULES=...`): {stale}")


def test_each_results_file_names_its_module_and_its_commit_in_full():
    for result in results.all_results():
        assert result.source == MODULES[result.module], result.path
        assert result.path == results.results_path(result.tool, result.module)
        assert len(result.commit) == 40 and int(result.commit, 16) >= 0, result.path
        assert result.counts["mutants"] == sum(result.counts[k] for k in ("killed", "timeout", "survived", "no_tests"))
        assert len(result.open) == result.counts["survived"] + result.counts["no_tests"], result.path


def test_the_mutation_index_says_what_the_results_files_hold():
    assert results.INDEX.read_text() == results.index_text(results.all_results()), (
        "tests/mutation/results/README.md is out of step: `python -m tests.mutation.run --index`")


def test_every_mutant_a_results_file_leaves_alive_is_explained_one_by_one():
    rules = Rules.load()
    unexplained = [f"{r.path.name}: {o.name}" for r in results.all_results() for o in r.open
                   if why_of(rules, o.name) == UNEXPLAINED or why_of(rules, o.name).startswith("CRITICAL")]
    assert not unexplained, "explain these in tests/mutation/explanations.toml, or kill them with a test"
    out_of_step = [o.name for r in results.all_results() for o in r.open if o.why != why_of(rules, o.name)]
    assert not out_of_step, "the results files say other reasons: `python -m tests.mutation.run --explain`"


def test_results_made_before_their_module_last_changed_are_refused_and_results_made_after_are_not():
    source = MODULES["steps/waiting"]
    last = _git("log", "-1", "--format=%H", "--", source)
    parents = _git("rev-list", "--parents", "-n", "1", last).split()[1:]
    if not parents:
        pytest.skip(f"{source}'s last change has no parent in this clone (shallow?)")
    made = ModuleResults(tool="mutmut", module="steps/waiting", source=source, commit=parents[0],
                         counts=dict.fromkeys(results.COUNTS, 0))

    reason = _reason(made)
    assert reason is not None and source in reason and last[:12] in reason
    assert _reason(dataclasses.replace(made, commit=last)) is None
    assert _reason(dataclasses.replace(made, commit=_git("rev-parse", "HEAD"))) is None
    unknown = _reason(dataclasses.replace(made, commit="0" * 40))
    assert unknown is not None and "not in this repository's history" in unknown



@pytest.mark.parametrize("text", ["one line", "@@ -1 +1 @@\n-    a\n+    b", "ends in a newline\n\n", "it's\n'quoted'"])
def test_a_string_in_a_results_file_reads_back_as_written(text):
    """`--explain` rewrites every results file from what it reads: a diff that grew a line
    on each rewrite churned the files of modules nobody ran again."""
    assert tomllib.loads(f"x = {results._toml_string(text)}")["x"] == text


def test_a_survivor_in_a_critical_function_is_taken_only_as_an_equivalent_named_one_by_one():
    rules = Rules("""
[critical]
"cordon restore" = ["pkg.x_restore__mutmut_*"]
[survivors]
"pkg.x_restore__mutmut_1" = "Equivalent: the key is read back only by the same check."
"pkg.x_restore__mutmut_2" = "A gap, named: no test makes a cordon fail twice."
"pkg.x_other__mutmut_1" = "A gap, named: records only."
""")
    assert why_of(rules, "pkg.x_restore__mutmut_1").startswith("Equivalent")
    assert why_of(rules, "pkg.x_restore__mutmut_2").startswith("CRITICAL (cordon restore)")
    assert why_of(rules, "pkg.x_restore__mutmut_3").startswith("CRITICAL (cordon restore)")
    assert why_of(rules, "pkg.x_other__mutmut_1") == "A gap, named: records only."
    assert why_of(rules, "pkg.x_other__mutmut_2") == UNEXPLAINED
