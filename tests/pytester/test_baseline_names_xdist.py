"""Ten tests, ten baseline files, under two xdist workers too: ids that read alike (``TestA::test_b`` and
``TestA.test_b``) never share one. (The collision was first seen under ``-n 4``; file names are a pure function of
the id, so two workers writing one folder show it as well.)"""

from __future__ import annotations

import pytest

pytest.importorskip("xdist")

#: ``TestA.test_b`` is a test a collector named with a dot (as plugins that collect YAML or notebooks do), beside
#: the method ``test_b`` of class ``TestA`` (``TestA::test_b``), and ``test[a::b]`` beside ``test[a.b]``.
CONFTEST = """
import pytest

def pytest_pycollect_makeitem(collector, name, obj):
    if name == "dotted_b":
        return [pytest.Function.from_parent(collector, name="TestA.test_b", callobj=obj)]
"""

TESTS = """
import models
import pytest
import torch

MARK = pytest.mark.neuraldbg(baseline=True)

def train(neuraldbg, width=16):
    torch.manual_seed(width)
    neuraldbg.smoke_train(models.mlp(width), models.data(), models.loss, steps=5)

class TestA:
    @MARK
    def test_b(self, neuraldbg):
        train(neuraldbg)

@MARK
def dotted_b(neuraldbg):
    train(neuraldbg)

@MARK
@pytest.mark.parametrize("case", ["a::b", "a.b", "a/b", "a_b"], ids=lambda c: c)
def test_param(neuraldbg, case):
    train(neuraldbg)

@MARK
@pytest.mark.parametrize("width", [4, 8, 12, 16])
def test_width(neuraldbg, width):
    train(neuraldbg, width)
"""


def test_ten_tests_write_ten_distinct_baselines_under_four_workers(project: pytest.Pytester) -> None:
    project.makeconftest(CONFTEST)
    project.makepyfile(test_names=TESTS)
    result = project.runpytest_subprocess("-n", "2", "--neuraldbg-update-baselines", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=10)
    result.stdout.fnmatch_lines(["baselines: 10 created"])
    files = sorted(p.name for p in (project.path / "__neuraldbg__" / "test_names").iterdir())
    assert len(files) == 10, files
    again = project.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    again.assert_outcomes(passed=10)
    assert "stale baseline" not in again.stdout.str()
