"""The ``neuraldbg`` fixture: watching a hand-written loop, ``smoke_train``, recording runs, import cost."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_a_healthy_smoke_test_passes_and_its_run_is_reported_healthy(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_healthy="""
        import models

        def test_it(neuraldbg):
            ndbg = neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=30)
            assert ndbg.steps == 30
            assert not ndbg.attached
            assert neuraldbg.runs == [ndbg]
            assert ndbg.explain_failure() == []
            neuraldbg.assert_healthy(ndbg)
        """
    )
    result = project.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= neuraldbg =*", "1 watched run: 0 unhealthy (gate: off)"])


def test_a_smoke_test_s_model_is_freed_when_the_test_ends(project: pytest.Pytester) -> None:
    """pytest keeps every test's item to the session's end: the runs it watched (their models, gradients and device
    memory) must not stay with it. With the garbage collector off from the first test's body on, the second test
    sees the first one's model freed by reference counting alone, the report made (a JUnit file asks for it)."""
    project.makepyfile(
        test_free="""
        import gc
        import weakref

        import models

        WEIGHTS = []

        def test_train(neuraldbg):
            model = models.healthy()
            WEIGHTS.append(weakref.ref(next(model.parameters())))
            ndbg = neuraldbg.smoke_train(model, models.data(), models.loss, steps=30)
            assert ndbg.explain_failure() == []
            gc.disable()

        def test_freed():
            try:
                assert WEIGHTS[0]() is None
            finally:
                gc.enable()
        """
    )
    result = project.runpytest("-p", "no:randomly", "--junitxml=out.xml")
    result.assert_outcomes(passed=2)
    assert "neuraldbg.verdict" in (project.path / "out.xml").read_text()


def test_a_hand_written_loop_is_watched_and_its_dead_relu_reported(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_loop="""
        import models
        from neuraldbg import FailureKind, NeuralDbg

        def test_dead(neuraldbg):
            ndbg = models.loop(neuraldbg, models.dead())
            assert isinstance(ndbg, NeuralDbg)
            top = ndbg.hypotheses()[0]
            assert (top.kind, top.root.layer, top.root.step_start) == (FailureKind.DEAD_NEURONS, "3", 0)
        """
    )
    result = project.runpytest()
    result.assert_outcomes(passed=1)  # the gate is off by default: reported, not failed
    assert "UNHEALTHY test_loop.py::test_dead: dead_neurons at '3' from step 0" in result.stdout.str()


def test_smoke_train_takes_its_default_steps_from_the_option(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_steps="""
        import models

        def test_default(neuraldbg):
            assert neuraldbg.smoke_train(models.healthy(), models.data(), models.loss).steps == 7

        def test_explicit(neuraldbg):
            assert neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=3).steps == 3
        """
    )
    project.runpytest("--neuraldbg-steps=7").assert_outcomes(passed=2)


def test_several_runs_in_one_test_are_reported_by_name(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_two="""
        import models

        def test_compare(neuraldbg):
            good = neuraldbg.smoke_train(models.healthy(), models.data(), models.loss, steps=20, name="baseline")
            bad = neuraldbg.smoke_train(models.dead(), models.data(), models.loss, steps=20, name="broken")
            assert neuraldbg.named_runs == [("baseline", good), ("broken", bad)]
        """
    )
    result = project.runpytest()
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "2 watched runs: 1 unhealthy" in out
    assert "UNHEALTHY test_two.py::test_compare [run broken]: dead_neurons at '3'" in out
    assert "[run baseline]" not in out


def test_a_debugger_left_attached_is_closed_when_the_test_ends(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_open="""
        import models

        LEFT = []

        def test_leaves_it_open(neuraldbg):
            model = models.healthy()
            LEFT.append(neuraldbg(model).attach())
            x, y = models.data()[0]
            models.loss(model(x), y).backward()

        def test_it_was_closed():
            assert LEFT and not LEFT[0].attached
        """
    )
    project.runpytest().assert_outcomes(passed=2)


def test_the_fixture_offers_the_assertion_helpers_as_methods(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_methods="""
        import pytest_neuraldbg

        def test_methods(neuraldbg):
            names = [n for n in pytest_neuraldbg.__all__ if n.startswith("assert_")]
            assert len(names) == 8 and "assert_learns" in names
            for name in names:
                assert getattr(neuraldbg, name) is getattr(pytest_neuraldbg, name)
        """
    )
    project.runpytest().assert_outcomes(passed=1)


def test_loading_the_plugin_and_pytest_help_do_not_import_torch(pytester: pytest.Pytester) -> None:
    code = (
        "import sys, pytest\n"
        "pytest.main(['--help'])\n"
        "import pytest_neuraldbg, pytest_neuraldbg.plugin\n"
        "print('TORCH-IMPORTED', 'torch' in sys.modules, 'neuraldbg.debugger' in sys.modules)\n"
    )
    result = pytester.run(sys.executable, "-c", code)
    result.stdout.fnmatch_lines(["*--neuraldbg-gate=*fail|warn|off*", "*--neuraldbg-report=DIR*"])
    result.stdout.fnmatch_lines(["TORCH-IMPORTED False False"])  # the engine's vocabulary only (neuraldbg.events)


def test_a_session_that_watches_no_run_loads_none_of_the_engines_kinds(pytester: pytest.Pytester) -> None:
    """pytest imports the plugin at the start of every session in an environment where it is installed: a session
    of tests that never use it (one that passes, one marked by another plugin, one that fails) loads the engine's
    vocabulary and no more, and its report still works; asked for no report of the plugin's own, it imports none of
    its report writers and counts nothing for them."""
    pytester.makeconftest(
        """
        import sys

        from pytest_neuraldbg.state import SESSION_KEY

        def pytest_unconfigure(config):
            kinds = [m for m in sys.modules if m.startswith("neuraldbg.kinds")]
            print("ENGINE", len(kinds), "torch" in sys.modules, "neuraldbg.detectors" in sys.modules)
            writers = [m for m in ("pytest_neuraldbg.junit", "pytest_neuraldbg.markdown") if m in sys.modules]
            print("REPORTS", writers, config.stash[SESSION_KEY].outcomes.counts)
        """
    )
    pytester.makepyfile(
        test_plain="""
        def test_passes():
            assert 1 + 1 == 2

        def test_fails():
            assert 1 + 1 == 3
        """
    )
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["ENGINE 0 False False"])
    # no report of its own asked for: its writers are not imported, and pytest's outcomes are not counted for them
    result.stdout.fnmatch_lines(["REPORTS [[][]] {}"])


def test_the_packages_names_are_loaded_when_first_used() -> None:
    """``pytest_neuraldbg``'s public names come from their modules on first use: each is the defining module's own
    object, every name of ``__all__`` resolves and is listed by ``dir()``, an unknown name is an AttributeError
    that names it, and a module of the package is an attribute of it."""
    import pytest_neuraldbg
    from pytest_neuraldbg import assertions, fixture, verdict
    from pytest_neuraldbg.baseline import check

    assert pytest_neuraldbg.assert_healthy is assertions.assert_healthy
    assert pytest_neuraldbg.NeuralDbgFixture is fixture.NeuralDbgFixture
    assert pytest_neuraldbg.Hypotheses is verdict.Hypotheses
    assert pytest_neuraldbg.NeuralDbgBaselineWarning is check.NeuralDbgBaselineWarning
    assert all(getattr(pytest_neuraldbg, name) is not None for name in pytest_neuraldbg.__all__)
    assert set(pytest_neuraldbg.__all__) <= set(dir(pytest_neuraldbg))
    with pytest.raises(AttributeError, match="assert_fast"):
        pytest_neuraldbg.assert_fast  # noqa: B018
    # its modules are reached as attributes too, as when the package imported them all (a fresh process, where none
    # of them is imported yet)
    code = (
        "import sys, pytest_neuraldbg\n"
        "assert 'pytest_neuraldbg.assertions' not in sys.modules\n"
        "print(pytest_neuraldbg.assertions.assert_healthy is pytest_neuraldbg.assert_healthy)\n"
        "print(type(pytest_neuraldbg.baseline.NeuralDbgBaselineWarning).__name__)\n"
        "print(hasattr(pytest_neuraldbg, 'no_such_module'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "type", "False"]
