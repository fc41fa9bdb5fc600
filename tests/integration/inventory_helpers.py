"""Shared by the inventory tests: the demo configuration, a fleet cache factory and a
wait on the fleet view."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

from testenv.install import wait_until
from workflows.config import load_config
from workflows.fleet.summary import Fleet
from workflows.fleet.watchcache import FleetCache

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_config(ROOT / "deploy" / "config.example.yaml")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def wait_fleet(cache: FleetCache, check: Callable[[Fleet], bool], what: str, timeout: float = 60) -> Fleet:
    wait_until(lambda: check(cache.fleet(_now())), timeout=timeout, what=what)
    return cache.fleet(_now())


def _codes(fleet: Fleet, subject: str) -> set[str]:
    return {f.code for f in fleet.findings_about(subject)}


