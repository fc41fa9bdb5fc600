"""The benchmarks reuse the e2e fixtures (a bot over the fake Slack)."""

from testenv.fakeslack.fixtures import *  # noqa: F401,F403 - fixtures
from tests.e2e.conftest import *  # noqa: F401,F403 - fixtures
