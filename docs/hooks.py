"""The documentation site's generated pages, written from the code as `mkdocs build` runs
(mkdocs.yml names this file as a hook): the command reference from the command registry,
the configuration reference from the pydantic models, the metrics from bot/metrics.py, the
findings from `FindingCode`, and one runbook page per finding code and per reason a run
halts (their words in docs/runbooks.yaml). tests/unit/test_docs_reference.py fails when a
command, key, metric or finding has no entry.

Each page is a function returning Markdown, so the tests read exactly what the site shows.
"""

from __future__ import annotations

import ast
import datetime as dt
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RUNBOOKS = DOCS / "runbooks.yaml"


# --- commands --------------------------------------------------------------------------

def command_anchor(name: str) -> str:
    return "gpu-" + name.replace(" ", "-")


def commands_page() -> str:
    from commands.catalog import REGISTRY

    specs = sorted(REGISTRY.commands.values(), key=lambda s: s.name)
    out = ["# Commands", "",
           "Every `/gpu` command, from the command registry. In Slack type `/gpu <command>`; in the",
           "console the same line; `/gpu help` lists what the asking user may run. A role is needed",
           "for the pool the command is about (a pool's `operators` and `approvers` count for it).",
           "Commands that change something read the user's Slack groups afresh; read-only ones use",
           "a list read in the last 5 minutes.", "",
           "| command | role | what it does |", "| --- | --- | --- |"]
    for spec in specs:
        out.append(f"| [`/gpu {spec.name}`](#{command_anchor(spec.name)}) | {spec.role.value} | {_cell(spec.summary)} |")
    for spec in specs:
        out += ["", f"## /gpu {spec.name} {{#{command_anchor(spec.name)}}}", "", spec.summary.rstrip(".") + ".", "",
                "```text", spec.usage, "```", "",
                f"- Role: **{spec.role.value}**",
                "- " + ("Changes something: the user's groups are read afresh." if spec.changes
                        else "Only reads."),
                *(["- Asks to confirm before it acts."] if spec.confirm else [])]
        if spec.examples:
            out += ["", "Examples:", "", "```text", *spec.examples, "```"]
    return "\n".join(out) + "\n"


# --- configuration ---------------------------------------------------------------------

def _comments_of(model: type[BaseModel]) -> dict[str, str]:
    """The `#` comment lines above each field of a model not given a description."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    lines = source.split("\n")
    found: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            i, comment = node.lineno - 2, []
            while i >= 0 and lines[i].strip().startswith("#"):
                comment.insert(0, lines[i].strip()[1:].strip())
                i -= 1
            if comment:
                found[node.target.id] = " ".join(comment)
    return found


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _type_text(annotation: Any) -> str:
    annotation = _unwrap(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is dt.timedelta:
        return "duration"
    if annotation is Path:
        return "path"
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_text(a) for a in args)
    if origin is tuple:
        return f"list of {_type_text(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type_text(args[0])} to {_type_text(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    if hasattr(annotation, "__members__"):  # an Enum
        return " \\| ".join(f'"{m.value}"' for m in annotation)  # type: ignore[union-attr]
    return getattr(annotation, "__name__", str(annotation))


def _duration_text(value: dt.timedelta) -> str:
    seconds = int(value.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def _default_text(info: Any) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default
    if isinstance(value, BaseModel):
        return "(its keys' defaults)"
    if isinstance(value, dt.timedelta):
        return f"`{_duration_text(value)}`"
    if value is None:
        return "unset"
    if hasattr(value, "value") and not isinstance(value, (int, float, str)):
        value = value.value
    if isinstance(value, tuple):
        value = [getattr(v, "value", v) for v in value]
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def _models_in(annotation: Any) -> Iterator[tuple[str, type[BaseModel]]]:
    """The models a field holds, with the key suffix that reaches them."""
    annotation = _unwrap(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield "", annotation
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _models_in(arg)
    elif origin is tuple and args:
        for suffix, model in _models_in(args[0]):
            yield "[]" + suffix, model
    elif origin is dict and args:
        for suffix, model in _models_in(args[1]):
            yield ".<name>" + suffix, model


def config_keys(model: type[BaseModel] | None = None, prefix: str = "",
                shown: dict[type[BaseModel], str] | None = None) -> list[tuple[str, str, str, str]]:
    """Every configuration key: (dotted key, type, default, meaning). A model met again
    (a cluster's `pools` under `clusters:`) points at where its keys are listed."""
    if model is None:
        from workflows.config import GpuopsConfig
        model = GpuopsConfig
    shown = {} if shown is None else shown
    comments = _comments_of(model)
    rows = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        meaning = info.description or comments.get(name, "")
        inner_models = list(_models_in(info.annotation))
        again = [shown[inner] for _, inner in inner_models if inner in shown]
        if again:
            meaning = (meaning + " " if meaning else "") + f"Its keys are those of `{again[0]}`."
        rows.append((key, _type_text(info.annotation), _default_text(info), meaning))
        for suffix, inner in inner_models:
            if inner not in shown:
                shown[inner] = f"{key}{suffix}"
                rows += config_keys(inner, f"{key}{suffix}.", shown)
    return rows


def configuration_page() -> str:
    out = ["# Configuration", "",
           "Every key of the configuration file, from its pydantic models: a key's type, its default",
           "and what it means. `gpuops config check <file>` reports every error with its file, line",
           "and column; `gpuops config schema` prints the same keys as a JSON Schema for an editor",
           "(the Helm chart's `values.schema.json` holds it under `config`). A `duration` is written",
           "`90s`, `30m`, `1h30m` or `2d`. `deploy/config.example.yaml` is the demo's configuration;",
           "`deploy/config.clusters.example.yaml` one with several clusters.", ""]
    sections: dict[str, list[tuple[str, str, str, str]]] = {}
    for row in config_keys():
        sections.setdefault(row[0].split(".")[0].split("[")[0], []).append(row)
    for section, rows in sections.items():
        out += [f"## {section}", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        out += [f"| `{key}` | {kind} | {default} | {_cell(meaning)} |" for key, kind, default, meaning in rows]
        out.append("")
    return "\n".join(out)


# --- metrics ---------------------------------------------------------------------------

def metrics() -> list[tuple[str, str, str, list[str]]]:
    """Every metric bot/metrics.py defines: (name as scraped, type, help, labels)."""
    source = (ROOT / "bot" / "metrics.py").read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and node.args[0].value.startswith("gpuops_")):
            continue
        func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        kind = re.sub(r"MetricFamily$", "", func).lower()
        help_text = node.args[1].value if isinstance(node.args[1], ast.Constant) else ""
        labels: list[str] = []
        for candidate in [*node.args[2:], *(k.value for k in node.keywords if k.arg == "labels")]:
            if isinstance(candidate, ast.List):
                labels = [e.value for e in candidate.elts if isinstance(e, ast.Constant)]
        name = node.args[0].value + ("_total" if kind == "counter" else "")
        found.append((name, kind, help_text, labels))
    return sorted(found)


def metrics_page() -> str:
    out = ["# Metrics", "",
           "`gpuops run` serves `/metrics` on its metrics port (`--metrics-port`, default 8081) in",
           "Prometheus's text format. Counters are scraped with `_total`; a histogram brings its",
           "`_bucket`, `_sum` and `_count`. With several clusters the fleet metrics carry a `cluster`",
           "label.", "", "| metric | type | labels | what it counts |", "| --- | --- | --- | --- |"]
    for name, kind, help_text, labels in metrics():
        out.append(f"| `{name}` | {kind} | {', '.join(f'`{label}`' for label in labels) or '-'} | {_cell(help_text)} |")
    return "\n".join(out) + "\n"


# --- findings and runbooks -------------------------------------------------------------

def finding_codes() -> list[str]:
    from workflows.fleet.findings import FindingCode
    return list(typing.get_args(FindingCode))


def halt_reasons() -> list[str]:
    """What a run can halt on: each step kind of a change kind (a step that fails), and the
    checks before a wave."""
    from workflows.kinds import KINDS
    return [*dict.fromkeys(step for kind in KINDS.kinds for step in kind.step_kinds), *BEFORE_A_WAVE]


# A run also halts before a wave starts (workflows/engine/loop.py): its window ended while
# it waited for the pool's capacity, a PodDisruptionBudget or a freeze.
BEFORE_A_WAVE = ("window-ended",)


def runbooks() -> dict[str, dict[str, dict[str, str]]]:
    loaded: dict[str, dict[str, dict[str, str]]] = yaml.safe_load(RUNBOOKS.read_text())
    return loaded


def runbook_page(section: str, key: str) -> str:
    entry = runbooks()[section][key]
    title = entry.get("title", f"Finding `{key}`" if section == "findings" else f"Halted: {key}")
    out = [f"# {title}", "", "## What it means", "", entry["means"].strip(), "",
           "## What to check first", "", entry["check"].strip(), "",
           "## Commands", "", entry["commands"].strip(), "",
           "## When to roll back", "", entry["roll_back"].strip(), ""]
    return "\n".join(out)


def runbooks_index() -> str:
    out = ["# Runbooks", "",
           "One page per finding and per reason a run halts: what it means, what to check first, the",
           "commands to use and when to roll back. When the configuration names where this site is",
           "served (`docs_url`), each finding and each halted run in Slack links to its page.", "",
           "## A run halted", "",
           "A halted run leaves its nodes as they are: the node that failed stays cordoned, and the",
           "run's thread and `/gpu request <id>` name the step, the node and the reason. Then either",
           "`/gpu continue <run>` once the cause is fixed (optionally `--skip <node>`), or `/gpu rollback",
           "<run>` for an upgrade, a MIG change or a move, or `/gpu uncordon` for what it left cordoned.",
           "", "| step or check | page |", "| --- | --- |"]
    book = runbooks()
    out += [f"| `{key}` | [{book['halts'][key].get('title', key)}](halts/{key}.md) |" for key in halt_reasons()]
    out += ["", "## Findings", "", "| finding | page |", "| --- | --- |"]
    out += [f"| `{code}` | [{book['findings'][code].get('title', code)}](findings/{code}.md) |"
            for code in finding_codes()]
    return "\n".join(out) + "\n"


def findings_page() -> str:
    from workflows.signals.findings import SIGNAL_CODES
    out = ["# Findings", "",
           "Every finding gpuops can raise, in `/gpu findings`, `/gpu status`, `/gpu node` and the",
           "handover checklist; each finding's severity is decided when it is found (critical,",
           "warning or info). Each links to its runbook.", "",
           "| code | from | runbook |", "| --- | --- | --- |"]
    book = runbooks()["findings"]
    for code in finding_codes():
        source = "GPU health (DCGM)" if code in SIGNAL_CODES else "the fleet's inventory"
        out.append(f"| `{code}` | {source} | [{_cell(book[code].get('title', code))}](../runbooks/findings/{code}.md) |")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- the pages, and the mkdocs hook ----------------------------------------------------

def generated_pages() -> dict[str, str]:
    pages = {"reference/commands.md": commands_page(),
             "reference/configuration.md": configuration_page(),
             "reference/metrics.md": metrics_page(),
             "reference/findings.md": findings_page(),
             "runbooks/index.md": runbooks_index()}
    pages.update({f"runbooks/findings/{code}.md": runbook_page("findings", code) for code in finding_codes()})
    pages.update({f"runbooks/halts/{key}.md": runbook_page("halts", key) for key in halt_reasons()})
    return pages


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, content in generated_pages().items():
        files.append(File.generated(config, path, content=content))
    return files
