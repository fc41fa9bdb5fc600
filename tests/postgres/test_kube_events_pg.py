"""tests/unit/test_kube_events.py's tests again, on PostgreSQL (`db` from tests/postgres/conftest.py)."""

from __future__ import annotations

from tests.unit.test_kube_events import *  # noqa: F403

# Left out here: they drive the engine on tests/unit's fake cluster (a tests/unit fixture).
UNIT_ONLY = (
    "test_a_drain_queues_an_event_on_the_node_for_each_thing_done_to_it_naming_the_run",
    "test_a_dry_run_changes_nothing_and_so_queues_no_event",
)
for _name in UNIT_ONLY:
    del globals()[_name]
