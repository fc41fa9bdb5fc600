"""The chart's values.schema.json (the configuration's JSON Schema under `config`) is
enforced by a real helm (built by testenv): the demo configuration installs, a wrong value
is refused at `helm template` with the key and the reason, before anything reaches a
cluster."""

from __future__ import annotations

from pathlib import Path

import yaml

from testenv.helm import run_helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuops"
TOKENS = ["--set", "slack.botToken=xoxb-1", "--set", "slack.appToken=xapp-1"]


def template(home: Path, *values: str):
    return run_helm("template", "gpuops", str(CHART), "--namespace", "gpuops", *TOKENS, *values, home=home)


def test_the_demo_configuration_passes_the_charts_schema(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": yaml.safe_load((ROOT / "deploy" / "config.example.yaml").read_text())}))
    done = template(tmp_path, "--values", str(values))
    assert done.returncode == 0, done.stderr


def test_a_wrong_configuration_value_is_refused_with_its_key(tmp_path):
    done = template(tmp_path, "--set", "config.pools.a.kind=batch")
    assert done.returncode != 0
    assert "/config/pools/a/kind" in done.stderr and "'serving', 'training'" in done.stderr
    done = template(tmp_path, "--set", "config.pools.a.kind=training", "--set", "config.pools.a.upgrade_soak=soon")
    assert done.returncode != 0 and "/config/pools/a/upgrade_soak" in done.stderr
