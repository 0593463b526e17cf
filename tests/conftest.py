"""Shared test configuration."""

import torch  # noqa: F401  # imported once here, so in-process pytester runs do not re-import it
