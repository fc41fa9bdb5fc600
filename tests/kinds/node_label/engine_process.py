"""`python -m tests.kinds.node_label.engine_process`: `python -m bot.engine_process` in a
process that knows the node label kind (its registry put in force first, as a composition
root does), for the tests that kill and restart an engine."""

from __future__ import annotations

import sys

from bot import engine_process
from tests.kinds.node_label import registry
from workflows.kinds import put_in_force

if __name__ == "__main__":
    put_in_force(registry())
    sys.exit(engine_process.main())
