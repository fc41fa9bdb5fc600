"""The documentation site's generated pages, written from the code as `mkdocs build` runs
(mkdocs.yml names this file as a hook): the command reference from the command registry,
the configuration reference from the pydantic models, the metrics from bot/metrics.py, the
findings from `FindingCode`, and one runbook page per finding code and per reason a run
halts (their words in docs/runbooks.yaml), and the `<!-- generated: name -->` parts of the
results pages from the results files (a missing or malformed file stops the build).
tests/unit/test_docs_reference.py fails when a command, key, metric or finding has no entry.

Each page is a function returning Markdown, so the tests read exactly what the site shows.
"""

from __future__ import annotations

import ast
import datetime as dt
import inspect
import json
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
ALERTS = ROOT / "deploy" / "helm" / "gpuops" / "files" / "alerts.yaml"


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


def _examples() -> list[Any]:
    return [yaml.safe_load((ROOT / "deploy" / name).read_text())
            for name in ("config.example.yaml", "config.clusters.example.yaml")]


def _example_of(key: str, documents: list[Any]) -> str:
    """The key's value in the shipped example configurations (the first place it is set),
    for a key that holds a plain value; "" where no example sets it."""
    def walk(node: Any, parts: list[str]) -> Iterator[Any]:
        if not parts:
            yield node
            return
        head, rest = parts[0], parts[1:]
        if head == "<name>" and isinstance(node, dict):
            for value in node.values():
                yield from walk(value, rest)
        elif head.endswith("[]"):
            inner = node.get(head[:-2]) if isinstance(node, dict) else None
            for item in inner if isinstance(inner, list) else ():
                yield from walk(item, rest)
        elif isinstance(node, dict) and head in node:
            yield from walk(node[head], rest)

    parts = re.split(r"\.(?![^<]*>)", key.replace("[].", "[]|").replace("[]", "[]").replace("|", "."))
    for document in documents:
        for value in walk(document, parts):
            if value is not None and not isinstance(value, dict) and not (isinstance(value, list) and value
                                                                           and isinstance(value[0], dict)):
                shown = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
                return f"`{shown}`" if len(shown) <= 60 else ""
    return ""


def configuration_page() -> str:
    out = ["# Configuration", "",
           "Every key of the configuration file, from its pydantic models: a key's type, its default",
           "and what it means. `gpuops config check <file>` reports every error with its file, line",
           "and column; `gpuops config schema` prints the same keys as a JSON Schema for an editor",
           "(the Helm chart's `values.schema.json` holds it under `config`). A `duration` is written",
           "`90s`, `30m`, `1h30m` or `2d`. The example column is the key's value in",
           "`deploy/config.example.yaml` (the demo's configuration) or `deploy/config.clusters.example.yaml`",
           "(several clusters), where they set it.", ""]
    sections: dict[str, list[tuple[str, str, str, str]]] = {}
    for row in config_keys():
        sections.setdefault(row[0].split(".")[0].split("[")[0], []).append(row)
    documents = _examples()
    for section, rows in sections.items():
        out += [f"## {section}", "", "| key | type | default | meaning | example |", "| --- | --- | --- | --- | --- |"]
        out += [f"| `{key}` | {kind} | {default} | {_cell(meaning)} | {_example_of(key, documents)} |"
                for key, kind, default, meaning in rows]
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
    """Every reason a run halts: the codes of `HaltCode` (a step that fails, the engine's
    own, the checks before a wave), each given where the halt is decided."""
    from workflows.engine.halt_messages import HALT_CODES
    return list(HALT_CODES)


def runbooks() -> dict[str, dict[str, dict[str, str]]]:
    loaded: dict[str, dict[str, dict[str, str]]] = yaml.safe_load(RUNBOOKS.read_text())
    return loaded


def alert_names() -> list[str]:
    """Every alert of the chart's rules file (deploy/helm/gpuops/files/alerts.yaml)."""
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["alert"] for group in rules["groups"] for rule in group["rules"]]


def runbook_page(section: str, key: str) -> str:
    entry = runbooks()[section][key]
    title = entry.get("title", f"Finding `{key}`" if section == "findings" else f"Halted: {key}")
    if section == "alerts":
        return "\n".join([f"# {title}", "", f"The alert `{key}` (the Helm chart's `metrics.prometheusRule`).", "",
                          "## What it means", "", entry["means"].strip(), "",
                          "## What to check first", "", entry["check"].strip(), "",
                          "## Commands", "", entry["commands"].strip(), ""])
    out = [f"# {title}", ""]
    if section == "halts":
        out += ["```mermaid", "flowchart LR",
                f'    halted["The run halted: {key}"] --> check["What to check first"]',
                '    check --> fixed{"Cause fixed?"}',
                '    fixed -- yes --> go["/gpu continue RUN"]',
                '    fixed -- "no, or the change is unwanted" --> back["/gpu rollback RUN<br/>or /gpu uncordon NODE"]',
                "```", ""]
    out += ["## What it means", "", entry["means"].strip(), "",
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
           "", "| reason | page |", "| --- | --- |"]
    book = runbooks()
    out += [f"| `{key}` | [{book['halts'][key].get('title', key)}](halts/{key}.md) |" for key in halt_reasons()]
    out += ["", "## Findings", "", "| finding | page |", "| --- | --- |"]
    out += [f"| `{code}` | [{book['findings'][code].get('title', code)}](findings/{code}.md) |"
            for code in finding_codes()]
    out += ["", "## Alerts", "", "The Helm chart's alert rules (`metrics.prometheusRule`) link each alert here.", "",
            "| alert | page |", "| --- | --- |"]
    out += [f"| `{name}` | [{book['alerts'][name].get('title', name)}](alerts/{name}.md) |" for name in alert_names()]
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


# --- results pages: tables and charts from the results files --------------------------

BENCH = ROOT / "tests" / "bench" / "results"


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _machine(result: dict[str, Any]) -> str:
    m = result["machine"]
    when = f" on {result['when'][:10]}" if "when" in result else ""
    return f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB{when}"


def inventory_results() -> str:
    r = _load(BENCH / "inventory-5000-nodes-75000-pods.json")
    x = r["results"]
    low, high = x["cold_over_baseline_range"]
    rows = [
        ("raw list of every node and pod, parsed (the baseline)", f"{x['baseline_list_s']:.1f} s", ""),
        ("cache cold start", f"{x['cold_start_s']:.1f} s = {x['cold_over_baseline']:.2f}x the baseline "
         f"({low:.2f}x-{high:.2f}x)", "<= 1.5x"),
        ("`/gpu status` while pods churn (median / p99)",
         f"{x['status_median_ms']:.1f} / {x['status_p99_ms']:.1f} ms", "<= 50 ms median"),
        ("`/gpu status`, nothing changing (median)", f"{x['status_quiet_median_ms']:.2f} ms", ""),
        ("`/gpu status` after one change (median / p99)",
         f"{x['status_after_one_change_median_ms']:.2f} / {x['status_after_one_change_p99_ms']:.1f} ms", "<= 5 ms"),
        ("resident memory of a fresh bot process", f"{x['rss_mib']:.0f} MiB", "<= 500 MB"),
    ]
    out = [f"From `tests/bench/results/inventory-5000-nodes-75000-pods.json` ({_machine(r)}):", "",
           "| measure | result | target |", "| --- | --- | --- |"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    pairs = x["pairs_s"]
    out += ["", "Each cold start right after its own baseline (seconds):", "", "```mermaid", "xychart-beta",
            '    title "Raw list against cold start, pair by pair"',
            f'    x-axis [{", ".join(str(i + 1) for i in range(len(pairs)))}]',
            '    y-axis "seconds" 0 --> ' + str(int(max(p[0] for p in pairs)) + 2),
            f"    bar [{', '.join(f'{p[0]:.1f}' for p in pairs)}]",
            f"    bar [{', '.join(f'{p[1]:.1f}' for p in pairs)}]", "```", "",
            "The taller bars are the raw list, the shorter the cache's cold start."]
    return "\n".join(out)


def scaling_results() -> str:
    r = _load(BENCH / "scaling-curve.json")
    points = r["points"]
    sizes = [str(p["nodes"]) for p in points]

    def series(key: str, digits: int = 2) -> str:
        return ", ".join(f"{p[key]:.{digits}f}" for p in points)

    out = [f"From `tests/bench/results/scaling-curve.json` ({_machine(r)}):", "",
           "```mermaid", "xychart-beta", '    title "Cold start against the raw list, by nodes"',
           f"    x-axis [{', '.join(sizes)}]",
           f'    y-axis "seconds" 0 --> {int(max(p["baseline_list_s"] for p in points)) + 2}',
           f"    bar [{series('baseline_list_s')}]", f"    line [{series('cold_start_s')}]",
           f"    line [{series('cold_start_cpu_s')}]", "```", "",
           "Bars: the API server's raw list; the upper line: gpuops' cold start; the lower: gpuops' "
           "own CPU in it.", "",
           "```mermaid", "xychart-beta", '    title "/gpu status, by nodes (median, ms)"',
           f"    x-axis [{', '.join(sizes)}]", '    y-axis "ms" 0 --> 1',
           f"    line [{series('status_quiet_median_ms')}]",
           f"    line [{series('status_after_one_change_median_ms')}]", "```", "",
           "The lower line: nothing changing; the upper: right after one change.", "",
           "| cost | " + " | ".join(f"{s} nodes" for s in sizes) + " | b | verdict | 3 x 5,000 against 3 x one |",
           "| --- | " + " | ".join("---" for _ in sizes) + " | --- | --- | --- |"]
    names = {"baseline_list_s": "raw list (the reference)", "cold_start_s": "cold start",
             "cold_start_cpu_s": "cold start, gpuops' own CPU",
             "status_quiet_median_ms": "`/gpu status`, nothing changing",
             "status_after_one_change_median_ms": "`/gpu status` after one change", "rss_mib": "resident memory"}
    for key, name in names.items():
        curve = r["curve"].get(key, {})
        apart = r["clusters_against_apart"].get(key, {})
        values = " | ".join(f"{p[key]:.2f} {curve.get('unit', '')}".strip() for p in points)
        ratio = f"{apart['ratio']:.2f}x" if "ratio" in apart else ""
        out.append(f"| {name} | {values} | {curve.get('exponent', '')} | {_cell(curve.get('verdict', ''))} | {ratio} |")
    return "\n".join(out)


def upgrade_results() -> str:
    r = _load(BENCH / "upgrade-side-by-side.json")
    rounds, operator = r["gpuops_rounds"], r["operator"]
    first = rounds[0]
    measured = (f"; the operator's figures are from its whole run of {operator['when'][:10]}"
                if operator.get("when") and operator["when"][:10] != r["when"][:10] else "")
    loads = [x for run in (*rounds, operator) for x in run.get("load_average", [])]
    load = (f" The machine's one-minute load average ran {min(loads):.1f}-{max(loads):.1f} on its 2 cores "
            "while it measured." if loads else "")
    out = [f"From `tests/bench/results/upgrade-side-by-side.json` ({_machine(r)}): "
           f"{len(rounds)} rounds of gpuops, one of the operator{measured}.{load} The timeline draws each run's "
           "waves at its average wave length (the file keeps each run's total and its waves).", "",
           "```mermaid", "gantt", '    title "200 nodes, 20 at a time: gpuops driving against the operator\'s own"',
           "    dateFormat X", "    axisFormat %M:%S"]
    for title, run in ((f"gpuops ({first['waves']} waves)", first), (f"GPU Operator ({operator['waves']} waves)", operator)):
        wave = run["wall_s"] / run["waves"]
        out.append(f"    section {title}")
        for i in range(run["waves"]):
            start, end = round(i * wave), round((i + 1) * wave)
            out.append(f"    wave {i + 1} : {start}, {end}")
    out += ["```", "", "| measure | gpuops | GPU Operator | goal |", "| --- | --- | --- | --- |"]
    ranges = r["gpuops_ranges"]

    def span(key: str, unit: str = "", digits: int = 2) -> str:
        low, high = ranges[key]
        return f"{low:.{digits}f}-{high:.{digits}f}{unit}"

    out += [f"| wall time, version change to every node back | {span('wall_s', ' s', 0)} | {operator['wall_s']:.0f} s | |",
            f"| over the simulated minimum (waves x 12 s) | {span('over_physical_min', 'x')} | "
            f"{operator['over_physical_min']:.1f}x | <= {r['goals']['gpuops_over_physical_min']}x |",
            f"| reaction, new driver pod Ready to the next move, p95 | {span('reaction_p95_s', ' s')} | "
            f"{operator['reaction_p95_s']:.0f} s | <= {r['goals']['gpuops_reaction_p95_s']:.0f} s |",
            f"| engine CPU per node upgraded | {span('cpu_s_per_node', ' s')} | | |"]
    met = r["gpuops_goals_met_in_every_round"]
    out += ["", "Goals met in every round: " + ", ".join(f"`{k}` {'yes' if v else 'no'}" for k, v in met.items()) + "."]
    return "\n".join(out)


def ack_results() -> str:
    r = _load(BENCH / "ack-latency.json")
    names = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
    load = r.get("load_average")
    load_text = (f" The machine's one-minute load average was {min(load):.1f}-{max(load):.1f} on its "
                 f"{r['machine']['cores']} cores." if load else "")
    out = [f"From `tests/bench/results/ack-latency.json` ({_machine(r)}; {r['server']}; {r['rounds']} rounds on each "
           f"database, one after the other): Slack's limit for the acknowledgement is 3 s.{load_text}", "",
           "| measure (median / p99) | " + " | ".join(names[n] for n in r["databases"]) + " | PostgreSQL / SQLite |",
           "| --- | " + " | ".join("---" for _ in r["databases"]) + " | --- |"]
    rows = (("`/healthz` round trip (no database)", "healthz", False), ("ack, the HTTP answer (no database)", "ack", True),
            ("`/gpu help` answered at its response_url", "help_answer", True),
            ("`/gpu status` answered at its response_url", "status_answer", True))
    for title, key, p99 in rows:
        cells = [f"{x[key + '_median_ms']:.1f}" + (f" / {x[key + '_p99_ms']:.1f}" if p99 else "") + " ms"
                 for x in r["databases"].values()]
        ratio = r["postgresql_over_sqlite"].get(f"{key}_median_ms")
        out.append(f"| {title} | " + " | ".join(cells) + f" | {f'{ratio:.2f}x' if ratio else ''} |")
    targets = "; ".join(f"{names[n]}: {x['target']}" for n, x in r["databases"].items())
    out += ["", f"Target: {targets}."]
    return "\n".join(out)


def engine_results() -> str:
    """The engine's CPU per node on SQLite and on PostgreSQL (tests/bench/results/engine-per-node.json)."""
    r = _load(BENCH / "engine-per-node.json")
    fleet = r["fleet"]
    loads = [x for run in r["rounds"] for name in ("sqlite", "postgresql") for x in run[name]["load_average"]]
    out = [f"From `tests/bench/results/engine-per-node.json` ({_machine(r)}): a {fleet['gpu_nodes']}-node pool "
           f"upgraded {fleet['parallel_nodes']} nodes at a time, {len(r['rounds'])} rounds, each once on each "
           f"database. PostgreSQL: {r['postgresql']['settings']}. The machine's one-minute load average ran "
           f"{min(loads):.1f}-{max(loads):.1f} on its {r['machine']['cores']} cores while it measured.", "",
           "| round | engine CPU per node, SQLite | engine CPU per node, PostgreSQL | PostgreSQL / SQLite | "
           "with the server's CPU | wall time, SQLite / PostgreSQL |", "| --- | --- | --- | --- | --- | --- |"]
    for index, run in enumerate(r["rounds"], 1):
        sqlite, pg = run["sqlite"], run["postgresql"]
        out.append(f"| {index} | {sqlite['engine_cpu_s_per_node']:.3f} s | {pg['engine_cpu_s_per_node']:.3f} s | "
                   f"{run['engine_cpu_pg_over_sqlite']:.2f}x | {run['engine_and_server_cpu_pg_over_sqlite']:.2f}x | "
                   f"{sqlite['wall_s']:.0f} s / {pg['wall_s']:.0f} s |")
    out += ["", f"Target: {r['target']}: {'met' if r['target_met_in_every_round'] else 'MISSED'}."]
    return "\n".join(out)


def inventory_database_results() -> str:
    """`/gpu status` on each database, from the newest inventory results file that measured it."""
    measured = sorted((r for r in (_load(path) for path in BENCH.glob("inventory-*.json"))
                       if "status_by_database" in r.get("results", {})), key=lambda r: str(r.get("when", "")))
    if not measured:
        raise ResultsFileError("tests/bench/results/: no inventory results file has status_by_database")
    r = measured[-1]
    x, fleet = r["results"], r["fleet"]
    names = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
    out = [f"From the inventory run at {fleet['gpu_nodes']:,} GPU nodes and {fleet['pods']:,} pods "
           f"({_machine(r)}): `/gpu status` from the warm cache, without a database and on each.", "",
           "| `/gpu status`, nothing changing | median | p99 |", "| --- | --- | --- |",
           f"| without a database | {x['status_quiet_median_ms']:.2f} ms | {x['status_quiet_p99_ms']:.2f} ms |"]
    out += [f"| on {names.get(name, name)} | {one['status_median_ms']:.2f} ms | {one['status_p99_ms']:.2f} ms |"
            for name, one in x["status_by_database"].items()]
    return "\n".join(out)


def suite_times() -> str:
    """tests/results/suite-times.md as it is, with its per-suite worker times as a chart."""
    text = (ROOT / "tests" / "results" / "suite-times.md").read_text()
    body = text.split("\n", 1)[1].strip()
    found = re.search(r"Per suite folder[^:]*:(.*?)\.", body, re.S)
    out = ["From `tests/results/suite-times.md`:", "", body]
    if found:
        parts = re.findall(r"([a-z/]+) ([\d,]+) s", found.group(1))
        out += ["", "```mermaid", 'pie title "Worker time per suite folder (s)"',
                *(f'    "{name}" : {seconds.replace(",", "")}' for name, seconds in parts), "```"]
    return "\n".join(out)


def mutation_results() -> str:
    """The index of tests/mutation/results/ (one results file per module and tool, each
    stamped with its commit), and a chart of the modules that have results."""
    text = (ROOT / "tests" / "mutation" / "results" / "README.md").read_text()
    body = text.split("\n", 1)[1].strip().replace("## ", "### ")
    mutmut = text.split("## tables")[0]
    rows = re.findall(r"^\| ([a-z_/]+) \| \S+ \| [0-9a-f]{12} \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", mutmut, re.M)
    out = ["From `tests/mutation/results/README.md`:", "", body]
    if rows:
        out += ["", "```mermaid", "xychart-beta", '    title "mutmut: mutants killed and survived, by module run on the current code"',
                f"    x-axis [{', '.join(chr(34) + row[0] + chr(34) for row in rows)}]",
                f'    y-axis "mutants" 0 --> {max(int(row[1]) for row in rows)}',
                f"    bar [{', '.join(row[2] for row in rows)}]", f"    line [{', '.join(row[4] for row in rows)}]", "```"]
    return "\n".join(out)


def kill_points() -> str:
    """Where the engine was killed in the drain runs (tests/reliability/results/kills-drains.json)."""
    latest = reliability_runs("kills-drains.json")[-1]
    if not isinstance(latest.get("kill_points"), dict) or not latest["kill_points"]:
        raise ResultsFileError("tests/reliability/results/kills-drains.json: its last run has no kill_points")
    points = sorted(latest["kill_points"].items(), key=lambda kv: -kv[1])
    return "\n".join([
        f"Where the {latest['kills']} kills of {latest['runs']} drain runs landed (seed {latest['seed']}, "
        f"{latest['machine']}): {latest['lost_runs']} runs lost, {latest['side_effects_twice']} writes taken twice.",
        "", "```mermaid", "xychart-beta", '    title "SIGKILLs of the engine, by the moment they landed"',
        f"    x-axis [{', '.join(chr(34) + name + chr(34) for name, _ in points)}]",
        f'    y-axis "kills" 0 --> {points[0][1] + 2}', f"    bar [{', '.join(str(n) for _, n in points)}]", "```"])


# --- the reliability page: every run of every suite, from tests/reliability/results/ ----

RELIABILITY = ROOT / "tests" / "reliability" / "results"


class ResultsFileError(Exception):
    """A results file the site is built from is missing or not in the shape its page reads."""


def reliability_runs(name: str) -> Any:
    """The runs of one results file; a missing or malformed file stops the build, naming it."""
    path = RELIABILITY / name
    try:
        loaded = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsFileError(f"{path.relative_to(ROOT)} is missing: the reliability page is built from it") from None
    except (OSError, ValueError) as error:
        raise ResultsFileError(f"{path.relative_to(ROOT)} is not readable JSON: {error}") from None
    lists = loaded.values() if isinstance(loaded, dict) and name == "fuzz.json" else [loaded]
    if not all(isinstance(runs, list) and runs and all(isinstance(r, dict) for r in runs) for runs in lists):
        raise ResultsFileError(f"{path.relative_to(ROOT)} must hold a non-empty list of runs"
                               + (" per fuzz target" if name == "fuzz.json" else ""))
    return loaded


def _n(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _of(part: int, whole: int) -> str:
    return f"{_n(part)} of {_n(whole)}"


def _fuzz_rows(results: dict[str, list[dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any], str, str]]:
    for target, runs in results.items():
        for r in runs:
            outcomes = ", ".join(f"{_n(n)} {outcome}" for outcome, n in r["outcomes"].items())
            yield (f"fuzz: {target}", r, f"{_n(r['cases'])} cases ({outcomes})",
                   f"{r['tracebacks']} tracebacks, {r['refusals_without_a_sentence']} refusals without a sentence, "
                   f"{r['stored_on_refusal']} stored on refusal")


def _kill_rows(suite: str) -> Any:
    def rows(runs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], str, str]]:
        for r in runs:
            cordons = (f", {r['human_cordons_undone']} human cordons undone" if "human_cordons_undone" in r else "")
            yield (suite, r, f"{_n(r['runs'])} runs, {_n(r['kills'])} kills, {_n(r['engine_processes'])} processes",
                   f"{r['lost_runs']} lost runs, {r['side_effects_twice']} writes twice{cordons}; "
                   f"audit chain {r['audit_chain']}")
    return rows


def _api_fault_rows(runs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], str, str]]:
    for r in runs:
        yield ("API faults", r,
               f"{_n(r['runs'])} runs ({r['drain_runs']} drains, {r['upgrade_runs']} upgrades); "
               f"{sum(r['webhook_refusals'].values())} refusals, {r['connection_cuts']} cuts, "
               f"{r['etcd_compactions']} compactions, {r['relists_after_410']} relists after 410",
               f"{_of(r['succeeded'], r['runs'])} succeeded, {r['duplicates']} writes twice, "
               f"{r['human_cordons_undone']} human cordons undone, {r['watch_cache_mismatches']} watch cache "
               f"mismatches, {r['thread_messages_claiming_a_budget']} budget notices for a throttled eviction; "
               f"audit chain {r['audit_chain']}")


def _security_rows(runs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], str, str]]:
    for r in runs:
        rows = r["rows"]
        for part, name in (("forged", "forged requests"), ("stale", "stale requests")):
            x = rows[part]
            yield (f"security: {name}", r, f"{_n(x['cases'])} cases",
                   f"{_of(x['refused'], x['cases'])} refused ({', '.join(x['statuses'])}), "
                   f"{x['stored_on_refusal']} stored, {x['posted_to_slack']} posted, {x['dispatched']} dispatched")
        x = rows["replayed"]
        yield ("security: replays", r, f"{_n(x['cases'])} cases, {_n(x['replays_sent'])} replays",
               f"{_of(x['acknowledged_200'], x['replays_sent'])} answered 200, {x['acted_on_twice']} acted on twice, "
               f"{x['stored_on_replay']} stored, {x['posted_on_replay']} posted again")
        x = rows["approver_access"]
        yield ("security: approver presses that must fail", r, f"{_n(x['cases'])} cases",
               f"{_of(x['refused'], x['cases'])} refused, {_of(x['refused_with_reason'], x['refused'])} with a "
               f"sentence, {x['stored_on_refusal']} stored")
        x = rows["approver_removed_by_config"]
        yield ("security: approver dropped from the configuration", r, f"{_n(x['cases'])} presses",
               f"{_of(x['refused'], x['cases'])} refused, {x['stored_on_refusal']} stored; "
               f"{_of(x['earlier_approvals_no_longer_counted'], x['earlier_approvals'])} earlier approvals "
               "no longer count")
        for kind, x in rows["audit_tampering"]["by_kind"].items():
            yield (f"security: audit tampering, {kind}", r, f"{_n(x['cases'])} cases",
                   f"{_of(x['detected'], x['cases'])} found from the file, "
                   f"{_of(x['detected_with_published_head'], x['cases'])} with a published head")
        x = rows["secrets_in_logs"]
        yield ("security: secrets in logs", r,
               f"{_n(x['cases'])} operations of {x['operations']} kinds, {_n(x['lines_written'])} lines",
               f"{x['leaks']} leaks")


def _load_rows(runs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], str, str]]:
    for r in runs:
        ack = r["ack_ms"]
        yield ("load", r, f"{_n(r['actions'])} actions by {r['people']} people; ack p50 {ack['p50']} ms, "
                          f"p99 {ack['p99']} ms, max {ack['max']} ms",
               f"{r['ack_over_3s']} acks over 3 s, {r['lost']} lost, {r['duplicated']} duplicated, "
               f"{r['non_200']} not 200; the drain {r['drain']['state']} ({r['drain']['nodes']} nodes, "
               f"{r['drain']['evictions']} evictions)")


def _failover_rows(runs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], str, str]]:
    for r in runs:
        took, commit = r["takeover_s"], r["first_commit_s"] or {}
        yield ("failover", r,
               f"{_n(r['drains'])} drains and {_n(r['upgrades'])} upgrades, {_n(r['kills'])} kills of the Lease holder, "
               f"{_n(r['requests'])} requests by {r['people']} people; the Lease taken over in p50 {took['p50']} s, "
               f"p95 {took['p95']} s (limit {r['takeover_limit_s']} s), the run's next step p50 {commit.get('p50')} s, "
               f"p95 {commit.get('p95')} s",
               f"{r['lost']} lost{_taken_over(r)}, "
               f"{r['answered_twice']} answered twice, {r['side_effects_repeated']} writes twice, "
               f"{r['approvals_counted_twice']} approvals twice; audit chain {r['audit_chain']}")


def _taken_over(r: dict[str, Any]) -> str:
    """What the survivors answered for the killed replicas (acknowledged, not answered);
    figures from before the inbox counted those as lost instead."""
    if "answered_by_the_survivor" in r:
        return f" ({r['answered_by_the_survivor']} acknowledged by a killed replica, answered by the survivor)"
    if "lost_acked_by_the_killed_replica" in r:
        return f" ({r['lost_acked_by_the_killed_replica']} acknowledged by the killed replica)"
    return ""


def _slow_client_rows(runs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], str, str]]:
    for r in runs:
        h, a, closed = r["healthz"], r["slack_acks"], r["closed"]
        yield ("slow clients", r,
               f"{_n(r['attackers']['connections_opened'])} attacking connections; `/healthz` p99 {h['p99_ms']} ms, "
               f"Slack acks p99 {a['p99_ms']} ms; closed late {_n(closed['slack_port']['late'])} and "
               f"{_n(closed['health_port']['late'])}, for room {_n(closed['slack_port']['for_room'])} and "
               f"{_n(closed['health_port']['for_room'])} (Slack and health ports)",
               f"`/healthz` {_of(h['ok'], h['count'])} answered, {h['over_1s']} over 1 s; Slack "
               f"{_of(a['ok'], a['count'])} acknowledged, {a['over_3s']} over 3 s")


def _hostile_rows(runs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], str, str]]:
    for r in runs:
        yield ("hostile sources", r,
               f"{_n(r['cases'])} cases, {_n(r['commands'])} commands; slowest {r['slowest_command_seconds']} s, "
               f"most memory {r['max_memory_mb']} MB",
               f"{r['hung']} hung, {r['crashes']} crashes, {r['left_reading']} readers left reading")


RELIABILITY_SUITES: dict[str, Any] = {
    "fuzz.json": _fuzz_rows,
    "kills-drains.json": _kill_rows("SIGKILLs across drains"),
    "kills-upgrades.json": _kill_rows("SIGKILLs across upgrades"),
    "api-faults.json": _api_fault_rows,
    "security.json": _security_rows,
    "load.json": _load_rows,
    "failover.json": _failover_rows,
    "slow-clients.json": _slow_client_rows,
    "hostile-sources.json": _hostile_rows,
}


def reliability_rows() -> list[tuple[str, dict[str, Any], str, str]]:
    """(suite, run, what ran, the figures that must be zero or whole), suite by suite."""
    rows = []
    for name, to_rows in RELIABILITY_SUITES.items():
        try:
            rows += list(to_rows(reliability_runs(name)))
        except (KeyError, TypeError, AttributeError) as error:
            raise ResultsFileError(f"{(RELIABILITY / name).relative_to(ROOT)}: a run lacks {error} "
                                   "(or holds it in another shape)") from None
    return rows


def reliability_results() -> str:
    out = ["From `tests/reliability/results/`, every run kept, suite by suite:", "",
           "| suite | when (UTC) | seed | machine | what ran | must be zero or whole |",
           "| --- | --- | --- | --- | --- | --- |"]
    for suite, run, ran, figures in reliability_rows():
        when = str(run["at"])[:16].replace("T", " ")
        out.append(f"| {suite} | {when} | {run['seed']} | {_cell(str(run['machine']))} | {_cell(ran)} | "
                   f"{_cell(figures)} |")
    return "\n".join(out)


GENERATED_PARTS = {"suite-times": suite_times, "mutation": mutation_results, "kills": kill_points, "reliability": reliability_results, "inventory": inventory_results, "scaling": scaling_results, "upgrade": upgrade_results,
                   "ack": ack_results, "engine": engine_results, "inventory-databases": inventory_database_results}
PART = re.compile(r"<!-- generated: ([a-z-]+) -->")


def fill_parts(markdown: str) -> str:
    """Replace each `<!-- generated: name -->` with its part (an unknown name fails)."""
    return PART.sub(lambda m: GENERATED_PARTS[m.group(1)](), markdown)


# --- the Helm chart's values schema ----------------------------------------------------

CHART_SCHEMA = ROOT / "deploy" / "helm" / "gpuops" / "values.schema.json"


# The chart's alert rules and dashboard (values.yaml says what each key does).
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
MONITORING_VALUES: dict[str, Any] = {
    "prometheusRule": {"type": "object", "additionalProperties": False, "properties": {
        "enabled": {"type": "boolean"}, "labels": _LABELS, "job": {"type": "string"},
        "approvalsWaitingSeconds": {"type": "integer", "minimum": 1}, "docsUrl": {"type": "string"}}},
    "dashboard": {"type": "object", "additionalProperties": False, "properties": {
        "enabled": {"type": "boolean"}, "namespace": {"type": "string"}, "labels": _LABELS}},
}


def chart_values_schema() -> dict[str, Any]:
    """The chart's values.schema.json: `config` is the configuration's JSON Schema (helm
    install, upgrade, lint and template check it); other values are the chart's own."""
    from workflows.config import config_json_schema

    config = config_json_schema()
    defs = config.pop("$defs")
    config.pop("$schema")
    config["description"] = ("The gpuops configuration (`gpuops config schema`); ignored when "
                             "existingConfigMap names a ConfigMap.")
    # A ConfigMap from elsewhere is the bot's to check (`gpuops config check`), not the
    # chart's: `config` is checked only when existingConfigMap names none.
    return {"$schema": "http://json-schema.org/draft-07/schema#",
            "title": "gpuops Helm chart values",
            "type": "object",
            "properties": {"metrics": {"type": "object", "properties": MONITORING_VALUES}},
            "if": {"properties": {"existingConfigMap": {"minLength": 1}}, "required": ["existingConfigMap"]},
            "else": {"properties": {"config": config}},
            "$defs": defs}


def chart_values_schema_text() -> str:
    return json.dumps(chart_values_schema(), indent=2, sort_keys=False) + "\n"


# --- the pages, and the mkdocs hook ----------------------------------------------------

def generated_pages() -> dict[str, str]:
    pages = {"reference/commands.md": commands_page(),
             "reference/configuration.md": configuration_page(),
             "reference/metrics.md": metrics_page(),
             "reference/findings.md": findings_page(),
             "runbooks/index.md": runbooks_index()}
    pages.update({f"runbooks/findings/{code}.md": runbook_page("findings", code) for code in finding_codes()})
    pages.update({f"runbooks/halts/{key}.md": runbook_page("halts", key) for key in halt_reasons()})
    pages.update({f"runbooks/alerts/{name}.md": runbook_page("alerts", name) for name in alert_names()})
    return pages


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    from mkdocs.exceptions import PluginError

    try:
        return fill_parts(markdown)
    except ResultsFileError as error:
        raise PluginError(f"{page.file.src_path}: {error}") from None


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, content in generated_pages().items():
        files.append(File.generated(config, path, content=content))
    return files


if __name__ == "__main__":
    # `python docs/hooks.py`: write the chart's values.schema.json from the configuration's
    # models (tests/unit/test_docs_reference.py fails while it is out of step).
    CHART_SCHEMA.write_text(chart_values_schema_text())
    print(f"wrote {CHART_SCHEMA.relative_to(ROOT)}")
