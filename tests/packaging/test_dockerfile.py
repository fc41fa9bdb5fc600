"""The image, checked as far as a machine without a container registry can: the Dockerfile
runs the `gpuops` entry point as the numeric non-root user the Helm chart expects, copies
only files that exist and that .dockerignore lets through, copies every product package
pyproject.toml ships, installs only the wheels its first stage built (no compiler, no
index), and the wheel it installs carries the product only."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CHART_VALUES = yaml.safe_load((ROOT / "deploy" / "helm" / "gpuops" / "values.yaml").read_text())


def _stages() -> list[list[str]]:
    """Each stage's instructions, a line each (continuation lines joined, comments out)."""
    stages: list[list[str]] = []
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def _copies(stage: list[str]) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context (not from a stage)."""
    found = []
    for line in stage:
        words = line.split()
        if words[0] == "COPY" and not any(w.startswith("--from=") for w in words):
            *sources, destination = [w for w in words[1:] if not w.startswith("--")]
            found.append((sources, destination))
    return found


def _product_packages() -> set[str]:
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*") for pattern in include}


def test_the_image_runs_the_gpuops_entry_point_as_the_chart_s_non_root_user():
    final = _stages()[-1]
    assert PYPROJECT["project"]["scripts"]["gpuops"] == "bot.cli:main"
    assert final[0] == "FROM python:3.11-slim"
    assert final[-2:] == ['ENTRYPOINT ["gpuops"]', 'CMD ["run"]']
    (user,) = [line.split()[1] for line in final if line.startswith("USER ")]
    uid, gid = user.split(":")
    # Numeric, or Kubernetes cannot tell that runAsNonRoot holds without running the image.
    assert uid.isdigit() and gid.isdigit() and int(uid) != 0
    pod = CHART_VALUES["podSecurityContext"]
    assert (int(uid), int(gid)) == (pod["runAsUser"], pod["runAsGroup"])
    assert f"useradd --uid {uid} --gid {gid}" in " ".join(final)


def test_every_file_it_copies_exists_and_is_not_left_out_of_the_build_context():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    copied = [source for stage in _stages() for sources, _ in _copies(stage) for source in sources]
    assert copied
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not [p for p in ignored if fnmatch.fnmatch(source, p.removeprefix("**/"))], \
            f"COPY {source}: .dockerignore leaves it out of the build context"


def test_the_build_stage_copies_every_package_the_wheel_ships_and_nothing_else():
    build = _stages()[0]
    copied = {source.rstrip("/") for sources, _ in _copies(build) for source in sources}
    assert copied - {"pyproject.toml", "README.md"} == _product_packages()
    assert PYPROJECT["project"]["readme"] == "README.md"  # the build reads it


def test_the_final_stage_installs_the_built_wheels_only_with_no_compiler():
    final = _stages()[-1]
    text = " ".join(final)
    assert not _copies(final), "the final stage copies from the build context"
    assert [line for line in final if line.startswith("COPY ")] == ["COPY --from=build /wheels /wheels"]
    assert not re.search(r"\b(gcc|g\+\+|cc|make|build-essential|apt-get|python3?-dev)\b", text)
    (install,) = [line for line in final if "pip install" in line]
    assert "--no-index" in install and "--find-links=/wheels" in install


def test_the_wheel_carries_the_product_only(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("gpuops-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == _product_packages(), tops  # no testenv (nor its fake Slack), tests or deploy
    assert not [n for n in names if "fakeslack" in n or "/tests/" in n]
    # The templates the bot renders travel with it.
    assert [n for n in names if n.startswith("bot/templates/") and n.endswith(".j2")]
    assert [n for n in names if n.startswith("workflows/handover/templates/") and n.endswith(".j2")]
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "gpuops = bot.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
