"""A real Prometheus for the tests that scrape the bot, and its `promtool` for the tests of
the chart's alert rules: Debian's package (bookworm ships 2.42, static Go binaries), unpacked into the test environment's cache rather than
installed, so nothing on the machine changes and a second run reuses it. The package
lists are refreshed once if the machine has none (a fresh CI machine)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from testenv.build import BuildError, cache_root

PACKAGE = "prometheus"


def prometheus_path() -> Path:
    """Where the cached `prometheus` binary is (or will be, once fetched)."""
    return cache_root() / "prometheus" / "prometheus"


def promtool_path() -> Path:
    """Where the cached `promtool` binary is (or will be, once fetched)."""
    return cache_root() / "prometheus" / "promtool"


def promtool_binary() -> Path:
    """The cached `promtool` (`promtool test rules`), from the same package."""
    _unpack()
    return promtool_path()


def prometheus_binary() -> Path:
    """The cached `prometheus` binary, fetched and unpacked on first use."""
    _unpack()
    return prometheus_path()


def ready() -> bool:
    return prometheus_path().is_file() and promtool_path().is_file()


def _unpack() -> None:
    """Both binaries in the cache, the package fetched once if either is missing (a cache
    from before promtool was kept has only `prometheus`)."""
    if ready():
        return
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise BuildError("a Prometheus for the tests comes from Debian's package: apt-get and dpkg-deb are needed")
    with tempfile.TemporaryDirectory(prefix="gpuops-prometheus-") as work:
        folder = Path(work)
        if _download(folder).returncode != 0:
            update = subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, timeout=600)
            if update.returncode != 0:
                raise BuildError(f"apt-get update failed: {update.stderr.strip()[-500:]}")
            again = _download(folder)
            if again.returncode != 0:
                raise BuildError(f"apt-get download {PACKAGE} failed: {again.stderr.strip()[-500:]}")
        (deb,) = folder.glob(f"{PACKAGE}_*.deb")
        unpacked = folder / "root"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True, capture_output=True, timeout=300)
        for target in (promtool_path(), prometheus_path()):  # prometheus last: an older check looks for it alone
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".partial")
            shutil.copy2(unpacked / "usr" / "bin" / target.name, partial)
            partial.replace(target)  # whole or not at all: a cut run leaves no half binary


def _download(folder: Path) -> subprocess.CompletedProcess[str]:
    # NB: run as root, apt warns that its _apt user cannot write here and downloads anyway.
    return subprocess.run(["apt-get", "download", "-q", PACKAGE], cwd=folder, capture_output=True, text=True,
                          timeout=600)
