"""Shared test configuration: one torch thread per test process, and the full benchmark validation behind an option.

* torch is imported here, once, so in-process pytester runs (which unload what they imported) do not import it
  again; ``pytester`` is enabled here because pytest allows ``pytest_plugins`` only in the top conftest.
* Every model in the suite is tiny: one intra-op thread is faster than a pool of two fighting for two busy cores
  (a benchmark scenario took 19.3 s with torch's default threads, 0.9 s with one). The ``one_thread`` fixture sets
  it for every test of this process; processes the suite starts (pytester subprocess runs, their xdist workers,
  ``python -c`` checks) inherit ``OMP_NUM_THREADS=1`` unless the shell set a value.
* Where the environment forbids writing bytecode (``PYTHONDONTWRITEBYTECODE``, as on this project's CI machine),
  every process the suite starts (xdist workers, pytester subprocess runs and their workers, distributed ranks, CLI
  checks: about a hundred) compiled the engine and the plugin from source on import, 1.6 s of CPU each. The
  suite compiles its own two packages once instead, at the start (``compileall`` writes explicitly; the variable
  only stops imports from writing), and those processes read the compiled files. Installed packages are
  compiled by pip.
* ``--benchmark`` selects the tests marked ``benchmark``: the full validation of both scenario sets of the
  diagnosis benchmark (ground truth and diagnosis of every scenario, each set's targets), which CI runs once per
  push in a job of its own. Without it they are deselected, and the fast subset (every failure kind and the hard
  healthy runs) still runs.
"""

from __future__ import annotations

import compileall
import os
import sys
from collections.abc import Iterator
from pathlib import Path

if not os.environ.get("OMP_NUM_THREADS"):  # before torch is imported: the processes started by tests inherit it
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest
import torch  # imported once here, so in-process pytester runs do not re-import it


def _compile_own_packages() -> None:
    """Compile ``neuraldbg`` and ``pytest_neuraldbg`` where imports may not write bytecode (see above); files
    already compiled are skipped, so each worker's call costs a directory walk."""
    if not sys.flags.dont_write_bytecode:
        return
    import neuraldbg
    import pytest_neuraldbg

    for package in (neuraldbg, pytest_neuraldbg):
        folder = Path(package.__file__ or "").parent
        if os.access(folder, os.W_OK):  # an installed, read-only copy was compiled by pip
            compileall.compile_dir(folder, quiet=2)


_compile_own_packages()

pytest_plugins = ["pytester"]  # for the plugin's in-process runs; pytest allows it only in the top conftest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--benchmark",
        action="store_true",
        default=False,
        help="also run the tests marked 'benchmark': the full validation of every scenario of the diagnosis "
        "benchmark (CI runs it once per push, in its own job)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("benchmark") or "benchmark" in (config.getoption("markexpr") or ""):
        return  # asked for (`-m benchmark`), or left to the marker expression
    kept, deselected = [], []
    for item in items:
        (deselected if item.get_closest_marker("benchmark") else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread for every test (tiny models; results do not depend on the split), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
