"""The package layers written in ARCHITECTURE.md hold: bot -> commands -> workflows ->
storage, only bot/ talks to Slack, only the Kubernetes gateway imports the client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_in_pyproject_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken" in result.stdout


def test_every_package_says_what_belongs_in_it():
    for package in ("bot", "commands", "workflows", "storage", "testenv"):
        init = ROOT / package / "__init__.py"
        text = init.read_text()
        assert text.lstrip().startswith('"""'), f"{init} has no docstring"
