"""Shared test configuration."""

import torch  # noqa: F401  # imported once here, so in-process pytester runs do not re-import it

pytest_plugins = ["pytester"]  # for the plugin's integration tests; pytest allows it only in the top conftest
