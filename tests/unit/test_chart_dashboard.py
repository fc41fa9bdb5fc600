"""The chart's Grafana dashboard (deploy/helm/gpuops/files/dashboard.json) reads only
metrics gpuops serves, and every fleet metric per the `cluster` variable. That each
query returns series from a running bot is tested against a real Prometheus in
tests/integration/test_health_and_metrics_control_plane.py."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((ROOT / "deploy" / "helm" / "gpuops" / "files" / "dashboard.json").read_text())
# The metrics that carry a `cluster` label with several clusters (bot/metrics.py).
PER_CLUSTER = ("gpuops_findings", "gpuops_pool_gpus", "gpuops_pool_gpus_out", "gpuops_watch_cache_")


def _served() -> set[str]:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    names = {name for name, *_ in hooks.metrics()}
    return names | {f"{n}_{part}" for n in names for part in ("bucket", "sum", "count")}


def test_each_panel_reads_metrics_gpuops_serves_and_fleet_metrics_per_cluster():
    served = _served()
    (cluster,) = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "cluster"]
    assert cluster["includeAll"] and cluster["allValue"] == ".*"
    titles = [panel["title"] for panel in DASHBOARD["panels"]]
    assert len(set(titles)) == len(titles)
    for panel in DASHBOARD["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"\b(gpuops_[a-z_]+)", target["expr"]):
                assert name in served, (panel["title"], name)
                if name.startswith(PER_CLUSTER):
                    assert re.search(rf'{name}\{{cluster=~"\$cluster"\}}', target["expr"]), (panel["title"], name)
