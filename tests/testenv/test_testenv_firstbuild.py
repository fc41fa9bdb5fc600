"""The first build: what a newcomer is told before waiting, and pieces built side by side."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from testenv import firstbuild
from testenv.build import BuildError
from testenv.firstbuild import Piece


def _piece(name: str, minutes: float, *, ready: bool = False, build=None) -> Piece:
    return Piece(name, minutes, lambda: ready, build or (lambda: Path("/bin/true")))


def test_the_estimate_shares_the_measured_work_among_the_cores_and_never_beats_the_longest_piece():
    missing = [_piece("control plane", 10.5), _piece("helm", 4.0), _piece("operator", 2.5)]
    assert firstbuild.estimate_minutes(missing, cores=2) == pytest.approx(17.0)
    assert firstbuild.estimate_minutes(missing, cores=8) == pytest.approx(17.0 / 4)
    assert firstbuild.estimate_minutes([_piece("control plane", 10.5)], cores=1) == pytest.approx(21.0)
    assert firstbuild.estimate_minutes([], cores=2) == 0


def test_two_cores_build_two_pieces_at_once_and_more_cores_more():
    assert firstbuild.workers_for(1) == 2
    assert firstbuild.workers_for(2) == 2
    assert firstbuild.workers_for(8) == 5


def test_a_machine_with_everything_cached_builds_nothing_and_says_nothing(monkeypatch):
    built = []
    monkeypatch.setattr(firstbuild, "pieces", lambda: (_piece("a", 1, ready=True, build=lambda: built.append("a")),))
    out = io.StringIO()
    assert firstbuild.build_all(cores=2, out=out) == []
    assert built == [] and out.getvalue() == ""


def test_the_missing_pieces_are_named_with_an_estimate_and_built_side_by_side(monkeypatch):
    # Each of the two builds waits until the other has started: they finish only if they
    # run at the same time.
    both_started = threading.Barrier(2, timeout=30)

    def build() -> Path:
        both_started.wait()
        return Path("/bin/true")

    monkeypatch.setattr(firstbuild, "pieces", lambda: (
        _piece("the control plane", 10.5, build=build), _piece("helm", 4.0, build=build),
        _piece("Prometheus", 0.5, ready=True)))
    out = io.StringIO()
    built = firstbuild.build_all(cores=2, out=out)
    assert [piece.name for piece in built] == ["the control plane", "helm"]
    said = out.getvalue()
    assert "first build of 2 pieces: the control plane; helm" in said
    assert "about 14 minutes on this machine's 2 cores, 2 at a time" in said
    assert "Prometheus" not in said
    assert "first build done in" in said


def test_a_failed_piece_is_raised_after_the_others_finish_and_every_failure_is_named(monkeypatch):
    finished = []

    def fails(what: str):
        def build() -> Path:
            raise BuildError(f"building {what} failed; see its log")
        return build

    monkeypatch.setattr(firstbuild, "pieces", lambda: (
        _piece("etcd", 1, build=fails("etcd")), _piece("helm", 1, build=lambda: finished.append("helm")),
        _piece("operator", 1, build=fails("the operator"))))
    out = io.StringIO()
    with pytest.raises(BuildError, match="building etcd failed"):
        firstbuild.build_all(cores=2, out=out)
    assert finished == ["helm"]
    assert "operator failed too: building the operator failed" in out.getvalue()
    assert "first build done" not in out.getvalue()
