"""`gpuops config check`: a configuration read as the bot reads it at start, every
problem named with its file, line and column and key, exit 1; a good one summarized, exit
0. The bot stops at start on the same messages (`load_config`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.cli import main
from workflows.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]

BAD = """\
cluster:
  pool_label: gpuops.io/pool
pools:
  serving-a:
    kind: serving
    windows:
      - {days: [sat], start: "02:00", end: "06:00", timezone: Mars/Olympus}
    max_unavailable: two
  training-a:
    kind: training
    colour: blue
upgrades:
  gpu_check: {resource: cpu}
"""


def test_every_problem_is_named_with_its_line_column_and_key(tmp_path):
    path = tmp_path / "gpuops.yaml"
    path.write_text(BAD)
    with pytest.raises(ConfigError) as stopped:
        load_config(path)
    lines = str(stopped.value).splitlines()
    assert [line.split(": ", 2)[:2] for line in lines] == [
        [f"{path}:7:63", "pools.serving-a.windows.0.timezone"],
        [f"{path}:8:22", "pools.serving-a.max_unavailable"],
        [f"{path}:11:13", "pools.training-a.colour"],
        [f"{path}:13:25", "upgrades.gpu_check.resource"],
    ]
    assert "gpu_check.resource must be a GPU resource" in lines[3] and "Value error" not in lines[3]


def test_config_check_exits_1_with_the_errors_and_0_with_a_summary(tmp_path, capsys):
    path = tmp_path / "gpuops.yaml"
    path.write_text(BAD)
    assert main(["config", "check", str(path)]) == 1
    assert f"{path}:8:22: pools.serving-a.max_unavailable:" in capsys.readouterr().err

    example = ROOT / "deploy" / "config.example.yaml"
    assert main(["config", "check", str(example)]) == 0
    assert capsys.readouterr().out.startswith(f"{example}: ok: 3 pools (inference-mig, serving-a, training-a)")


def test_the_several_clusters_example_is_valid_and_names_each_pool_with_its_cluster(capsys):
    example = ROOT / "deploy" / "config.clusters.example.yaml"
    assert main(["config", "check", str(example)]) == 0
    assert capsys.readouterr().out.startswith(f"{example}: ok: 2 pools (east/serving-a, west/training-a)")


def test_yaml_that_does_not_parse_is_named_where_it_breaks(tmp_path, capsys):
    path = tmp_path / "gpuops.yaml"
    path.write_text("pools:\n  serving-a: {kind: serving\n")
    assert main(["config", "check", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"{path}:3:1: not valid YAML:")
