"""The end-to-end tests' fixtures are in tests/fixtures/bots.py, their helpers in
tests/e2e/harness.py (re-exported here until the test modules import it)."""

from tests.e2e.harness import *  # noqa: F401,F403
