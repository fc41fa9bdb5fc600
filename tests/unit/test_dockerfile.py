"""The image, checked as far as a machine without a registry can: the Dockerfile runs the
`gpuops` entry point as a numeric non-root user, copies only files that exist, keeps
compilers out of the final stage; and the wheel it installs carries the product only."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _stages() -> list[list[str]]:
    stages: list[list[str]] = []
    for line in DOCKERFILE.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            stages.append([])
        if stages and line and not line.startswith("#"):
            stages[-1].append(line)
    return stages


def test_the_image_runs_the_gpuops_entry_point_as_a_numeric_non_root_user():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    final = _stages()[-1]
    assert scripts["gpuops"] == "bot.cli:main"
    assert 'ENTRYPOINT ["gpuops"]' in final and 'CMD ["run"]' in final
    (user,) = [line.split()[1] for line in final if line.startswith("USER ")]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can check it
    assert final[0].startswith("FROM python:3.11-slim")


def test_every_file_it_copies_exists_and_the_final_stage_has_no_compiler():
    for stage in _stages():
        for line in stage:
            if line.startswith("COPY ") and "--from=" not in line:
                *sources, _ = line.split()[1:]
                assert all((ROOT / s).exists() for s in sources), line
    final = " ".join(_stages()[-1])
    assert not re.search(r"\b(gcc|g\+\+|build-essential|apt-get install)\b", final)
    assert "COPY --from=build /wheels" in final and "COPY bot" not in final


def test_the_wheel_carries_the_product_only(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("gpuops-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {"bot", "commands", "workflows", "storage"} <= tops
    assert not tops & {"testenv", "tests", "deploy"}, tops
    assert "bot/templates/" in " ".join(zipfile.ZipFile(wheel).namelist())  # the handover templates travel
