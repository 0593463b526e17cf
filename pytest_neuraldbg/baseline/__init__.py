"""Training-health baselines: a small reviewed JSON file per test, and the comparison that gates on it.

Opt in per test with ``@pytest.mark.neuraldbg(baseline=True)`` (every run the fixture watched is compared
after the test body) or call ``neuraldbg.assert_matches_baseline(ndbg)`` (the fixture's method: it needs the
test's identity and settings, so there is no stand-alone import). Create or refresh the files with
``pytest --neuraldbg-update-baselines``, review the diff and commit them.

Where: ``<test dir>/__neuraldbg__/<module stem>/<test name>.json``, one file per test (parametrize ids are part
of the name; a test that watches several runs keeps them by run name inside the file).

What: per run, at five fixed points of the run (the first and last observed step and the steps at 25%, 50% and
75% between them; each value is the nearest recorded point): per layer the gradient norm, update ratio
(``||dW|| / ||W||``), dead and saturated fractions; the loss and the loss-gradient norm; the verdicts (failure
kind and root layer of each hypothesis); the environment. Floats keep 4 significant digits.

How runs are compared (``compare_run``):

* verdicts exactly: a failure (kind, root layer) the baseline does not have is a regression; one that is
  gone is an improvement;
* gradient norms, update ratios and the loss-gradient norm in log space: a change by more than
  ``grad_tolerance`` (a factor, default 10) either way is a regression, because neither direction is better
  in general (100x smaller is on the way to vanishing, 100x larger to exploding). When the run fixed a failure
  of its baseline (verdicts gone, none new), such changes come with the fix and are reported as ``changed``;
* dead and saturated fractions: a rise by more than ``fraction_tolerance`` (absolute, default 0.1) is a
  regression, a fall by more is an improvement;
* the loss, when both runs observed it: a rise by more than ``loss_tolerance`` (relative to the baseline's,
  default 0.25) is a regression, a fall by more is an improvement;
* a layer, metric or run present on one side only is a regression (the model changed: refresh the baseline);
* norms and ratios below ``1e-12`` count as zero (so 0 -> 1e-3 is a change, 0 -> 1e-14 is not); a non-finite
  value equals the same non-finite value, a finite value turning non-finite is a regression and the reverse
  an improvement.

A regression fails the test; improvements pass and are listed in the terminal summary. A different torch
version, device, NeuralDBG version, seed or step count warns (:class:`NeuralDbgBaselineWarning`) and the runs
are compared anyway.

Determinism: a baseline is only as good as the run is repeatable. ``smoke_train(seed=0)`` seeds, for its
loop, torch's global generator (which also drives a ``DataLoader``'s shuffling, dropout and worker seeds),
``random``, numpy and a ``DataLoader``'s own ``generator`` when it was given one. Seed yourself what happens
before it or outside it: the model's initialisation (``torch.manual_seed(0)`` right before building the
model), data you generate (a seeded ``torch.Generator``), and your own training loop when you call the fixture
directly (``torch.manual_seed`` before it, a seeded DataLoader ``generator``). On a GPU also call
``torch.use_deterministic_algorithms(True)`` (and set ``CUBLAS_WORKSPACE_CONFIG=:4096:8``) or expect small
differences between runs, which the tolerances mostly absorb.

Modules: :mod:`.paths` (where a test's file lives), :mod:`.summary` (a run as baseline data), :mod:`.files`
(the JSON document: dump, write, load, validate), :mod:`.compare` (tolerances and the rules above),
:mod:`.texts` (failure texts and tables), :mod:`.check` (one test's baseline: compare or write) and
:mod:`.stale` (files no test uses, deleted with ``--neuraldbg-remove-stale-baselines``).
This package imports no torch at import time.
"""

from __future__ import annotations

from ..names import MAX_NAME
from .check import BaselineCheck, NeuralDbgBaselineWarning
from .compare import (
    CHANGED,
    IMPROVED,
    REGRESSED,
    Tolerances,
    compare_run,
    environment_differences,
    judge,
    severity,
)
from .files import FORMAT, BaselineError, document, dumps, load, validate, write
from .paths import directory_for, file_name, locate, path_for, shown
from .stale import remove, stale_files
from .summary import POINTS, Observed, device_of, environment, rounded, summarise, targets
from .texts import REMOVE_STALE_FLAG, UPDATE_FLAG, grouped, table, update_command

__all__ = [
    "CHANGED",
    "FORMAT",
    "IMPROVED",
    "MAX_NAME",
    "POINTS",
    "REGRESSED",
    "REMOVE_STALE_FLAG",
    "UPDATE_FLAG",
    "BaselineCheck",
    "BaselineError",
    "NeuralDbgBaselineWarning",
    "Observed",
    "Tolerances",
    "compare_run",
    "device_of",
    "directory_for",
    "document",
    "dumps",
    "environment",
    "environment_differences",
    "file_name",
    "grouped",
    "judge",
    "load",
    "locate",
    "path_for",
    "remove",
    "rounded",
    "severity",
    "shown",
    "stale_files",
    "summarise",
    "table",
    "targets",
    "update_command",
    "validate",
    "write",
]
