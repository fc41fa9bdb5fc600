"""The reliability suites use the e2e suite's bots and the integration suite's fixtures."""

from tests.e2e.conftest import *  # noqa: F401,F403 - fixtures
from tests.integration.conftest import *  # noqa: F401,F403 - fixtures
