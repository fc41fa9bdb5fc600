"""What commands may call: the fleet view, configuration and the request service.
Entry points (Slack app, console, command line) build one and pass it in."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Protocol

from workflows.config import GpuopsConfig
from workflows.inventory import Fleet


class FleetSource(Protocol):
    def fleet(self, now: dt.datetime) -> Fleet: ...


@dataclass
class Services:
    config: GpuopsConfig
    fleet: FleetSource
    # The request service and engine arrive with the requests issue.
    requests: Any | None = None
