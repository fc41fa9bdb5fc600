"""`make demo` runs gpuops as the bot's own least-privilege identity, never as admin."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_demo_runs_gpuops_as_the_bots_service_account_not_as_admin():
    recipe = subprocess.run(["make", "-n", "demo", "VENV=.venv"], capture_output=True, text=True, cwd=ROOT,
                            timeout=60).stdout
    runs = [line for line in recipe.splitlines() if "/gpuops console" in line or "/gpuops run" in line]
    assert len(runs) == 2, recipe
    assert all("--context bot" in line for line in runs), runs
