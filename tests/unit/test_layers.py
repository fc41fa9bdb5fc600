"""The package layers written in ARCHITECTURE.md hold: bot -> commands -> workflows ->
storage, only bot/ talks to Slack, only the Kubernetes gateway imports the client, in
bot/ only the composition root imports the gateway, and inside workflows/ each package
imports only the packages below it. No module of the
product takes part in an import circle, and none dodges one with a `TYPE_CHECKING` or
function-level import. The design page's map of workflows/ (docs/design/index.md) matches the tree."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("bot", "commands", "workflows", "storage", "testenv")


def test_the_import_contracts_in_pyproject_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 6 kept, 0 broken" in result.stdout
    assert "Inside workflows, each package imports only the ones below it KEPT" in result.stdout
    assert f"{GATEWAY_CONTRACT} KEPT" in result.stdout


GATEWAY_CONTRACT = "In bot/, only the composition root imports the Kubernetes gateway"


def test_a_bot_module_that_imports_the_kubernetes_gateway_breaks_a_contract(tmp_path):
    # A copy of the product whose command line reaches for the gateway itself.
    for package in PRODUCT:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    cli = tmp_path / "bot" / "cli.py"
    cli.write_text(cli.read_text() + "\nfrom workflows.kube.gateway import KubeGateway  # noqa: F401,E402\n")
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache", str(tmp_path / "pyproject.toml")], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True)
    assert result.returncode != 0
    assert f"{GATEWAY_CONTRACT} BROKEN" in result.stdout
    assert "bot.cli -> workflows.kube.gateway" in result.stdout


def import_circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
    return circles


def test_no_module_of_the_product_is_part_of_an_import_circle():
    graph = grimp.build_graph(*PRODUCT)
    assert import_circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c", "d"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    graph.add_import(importer="c", imported="d")
    assert import_circles(graph) == [["a", "b", "c"]]


def product_files() -> list[Path]:
    return sorted(path for package in PRODUCT for path in (ROOT / package).rglob("*.py"))


def test_no_import_of_the_product_hides_behind_type_checking():
    hiding = [str(path.relative_to(ROOT)) for path in product_files() if "TYPE_CHECKING" in path.read_text()]
    assert hiding == []


def test_gpuops_modules_are_imported_at_the_top_of_the_domain_modules():
    # A function-level import is how a circle is dodged; workflows/, commands/ and storage/
    # import their own modules at the top (bot/ may defer Slack-only modules it may not need).
    late = []
    for path in product_files():
        if path.parts[len(ROOT.parts)] not in ("workflows", "commands", "storage"):
            continue
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if (isinstance(node, ast.ImportFrom) and id(node) not in top and node.module
                    and node.module.split(".")[0] in PRODUCT):
                late.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert late == []


def packages() -> list[Path]:
    return sorted(init.parent for package in PRODUCT for init in (ROOT / package).rglob("__init__.py"))


def test_every_package_says_what_belongs_in_it():
    for package in packages():
        init = package / "__init__.py"
        assert init.read_text().lstrip().startswith('"""'), f"{init} has no docstring"


def test_the_design_pages_map_names_every_package_of_workflows_and_nothing_else():
    # The architecture map lives on the documentation site's design page (the README links it).
    design = (ROOT / "docs" / "design" / "index.md").read_text()
    section = re.split(r"\n#{2,3} ", design.split("## Where things are", 1)[1], maxsplit=1)[0]
    mapped = set(re.findall(r"`workflows/([a-z_]+)/`", section))
    on_disk = {p.name for p in (ROOT / "workflows").iterdir() if (p / "__init__.py").exists()}
    assert mapped == on_disk
    modules = set(re.findall(r"`workflows/([a-z_]+)\.py`", section))
    assert modules == {p.stem for p in (ROOT / "workflows").glob("*.py") if p.stem != "__init__"}
