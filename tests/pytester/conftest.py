"""Shared set-up of the plugin's integration tests.

``pytester`` itself is enabled in ``tests/conftest.py`` (pytest refuses
``pytest_plugins`` in a nested conftest once a plain ``pytest`` run collects it).
Everything an inner run imports is imported before the first test of this folder runs (pytester removes modules
an in-process run imported when it ends): torch, the engine, the plugin's modules that it imports on first use
(its public names, its report writers), and what torch imports lazily on a first optimizer
step (torch._dynamo, which breaks when imported twice in one process). The training step that loads those lazy
imports runs in the ``lazy_imports_loaded`` session fixture, not when the suite is collected.
"""

from __future__ import annotations

import contextlib
import os

import integration_support
import pytest
import torch
import torch.nn.functional

import neuraldbg
import pytest_neuraldbg
import pytest_neuraldbg.junit
import pytest_neuraldbg.markdown
import pytest_neuraldbg.smoke
import pytest_neuraldbg.watched

# the plugin loads its public names (the fixture's class, the assertion helpers, the verdicts) on first use, not
# when pytest starts: loaded here, an inner run finds them loaded and the package's names stay the modules' own
for _name in pytest_neuraldbg.__all__:
    getattr(pytest_neuraldbg, _name)

# optional; imported here once: unloaded by pytester's module cleanup, its native extension reports leaks at exit
with contextlib.suppress(ImportError):
    import mermaidx  # noqa: F401


@pytest.fixture(scope="session", autouse=True)
def lazy_imports_loaded() -> None:
    """One watched training step of every kind the inner runs use, so their lazy imports happen now."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    for optimizer in (torch.optim.Adam(model.parameters()), torch.optim.SGD(model.parameters(), lr=0.1)):
        with neuraldbg.NeuralDbg(model) as dbg:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(torch.ones(4, 2)), torch.zeros(4, 1)).backward()
            optimizer.step()
        dbg.export_mermaid_causal_graph()
        dbg.to_dict()
        dbg.report()


@pytest.fixture(autouse=True)
def _no_neuraldbg_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner runs must not see NEURALDBG_* variables of the shell that runs this suite, nor CI markers: with CI
    or BUILD_NUMBER set, pytest prints whole failure messages in its short summary, which changes the output
    the tests read."""
    for name in list(os.environ):
        if name.startswith("NEURALDBG_") or name in ("CI", "BUILD_NUMBER"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _inner_runs_without_hypothesis(request: pytest.FixtureRequest) -> None:
    """Inner runs do without Hypothesis' pytest plugin, which every pytest process of this environment loads (it
    is installed for tests/fuzz): no inner project uses it, and importing it took 1.2 s of CPU in each subprocess
    run and each of its xdist workers, over half of a bare pytest start. Set once ``pytester`` is set up (it
    clears PYTEST_ADDOPTS, so the shell's never reaches an inner run), and only for tests that use it."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")
        request.getfixturevalue("monkeypatch").setenv("PYTEST_ADDOPTS", "-p no:hypothesispytest")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester directory holding ``models.py``."""
    pytester.makepyfile(models=integration_support.MODELS)
    return pytester
