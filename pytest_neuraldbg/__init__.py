"""pytest-neuraldbg: the ``neuraldbg`` fixture, assertion helpers and CI reports for training health."""
