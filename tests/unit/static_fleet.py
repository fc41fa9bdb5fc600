"""A fleet source (`services.fleet`) that always answers with one fleet built from plain values."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from workflows.fleet.summary import Fleet


@dataclass
class StaticFleet:
    value: Fleet

    def fleet(self, now: dt.datetime) -> Fleet:
        return self.value
