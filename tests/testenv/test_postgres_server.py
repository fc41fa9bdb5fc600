"""The test PostgreSQL server's own pure part: without Debian's package it fails, naming
the package, instead of skipping the storage tests that need it."""

from __future__ import annotations

import pytest

from testenv import postgres


def test_missing_server_binaries_fail_naming_the_debian_package(monkeypatch, tmp_path):
    monkeypatch.setattr(postgres, "BINARIES", f"{tmp_path}/*/bin")

    with pytest.raises(postgres.PostgresMissing, match=r"install Debian's `postgresql` package"):
        postgres.server_binaries()


def test_the_newest_installed_major_version_is_used(monkeypatch, tmp_path):
    for version in ("9", "15", "13"):
        (tmp_path / version / "bin").mkdir(parents=True)
        (tmp_path / version / "bin" / "initdb").touch()
    monkeypatch.setattr(postgres, "BINARIES", f"{tmp_path}/*/bin")

    assert postgres.server_binaries() == tmp_path / "15" / "bin"
