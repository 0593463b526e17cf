"""pytest entry point (``pytest11``): the ``neuraldbg`` fixture, its marker, options and reports.

Each hook hands off to a small module: :mod:`~pytest_neuraldbg.options` (flags, ini keys, environment,
precedence), :mod:`~pytest_neuraldbg.fixture` (what the fixture returns), :mod:`~pytest_neuraldbg.reporting`
(JUnit properties, report sections, terminal summary, files), :mod:`~pytest_neuraldbg.outcomes` (test outcomes
as pytest counts them, for reports that agree with it), :mod:`~pytest_neuraldbg.gate` (failing unhealthy tests)
and :mod:`~pytest_neuraldbg.baseline` (training-health baselines). pytest imports this module at the start of
every session in an environment where the package is installed, so it imports no torch and none of the engine but
its vocabulary (:mod:`neuraldbg.events`, :mod:`neuraldbg.text`): ``pytest --help``, xdist workers and test suites
that never use the fixture stay fast. The engine's kinds are imported when a verdict is first written, the rest of
the engine when a test first uses the fixture.
"""

from __future__ import annotations

import copy
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from . import baseline, gate, options, reporting, verdict
from .state import FIXTURE_KEY, SESSION_KEY, SessionState

if TYPE_CHECKING:
    from .fixture import NeuralDbgFixture


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--neuraldbg-*`` flags and ``neuraldbg_*`` ini keys (see :mod:`pytest_neuraldbg.options`)."""
    options.add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """Before pytest reads its arguments: a bare ``--neuraldbg-gate`` never takes the test path after it."""
    before = list(args)
    options.bare_flags_take_no_value(args, lambda path: (early_config.invocation_params.dir / path).exists())
    if args != before:  # pytest parsed them once already, to find the initial conftest files: parse again
        early_config.known_args_namespace = parser.parse_known_args(args, namespace=copy.copy(early_config.option))


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; resolve the settings (a bad value is a usage error naming its source)."""
    config.addinivalue_line("markers", options.MARKER_HELP)
    state = config.stash[SESSION_KEY] = SessionState(options.resolve(config))
    config.pluginmanager.register(reporting.Collector(state), reporting.Collector.NAME)


@pytest.fixture
def neuraldbg(request: pytest.FixtureRequest) -> Iterator[NeuralDbgFixture]:
    """Watch training in a test: ``with neuraldbg(model) as ndbg: ...`` or ``neuraldbg.smoke_train(...)``.

    Every run is reported: JUnit properties, terminal summary, ``--neuraldbg-report`` files and the gate.
    Configure with ``@pytest.mark.neuraldbg(**config)`` and the ``--neuraldbg-*`` options.
    """
    from .fixture import NeuralDbgFixture

    try:
        fixture, problem = NeuralDbgFixture.for_item(request.node, request.config.stash[SESSION_KEY].settings), ""
    except options.OptionError as exc:
        problem = str(exc)
    if problem:  # failed outside the except block, so the message is shown once, without a chained traceback
        pytest.fail(f"neuraldbg: {problem}", pytrace=False)
    request.node.stash[FIXTURE_KEY] = fixture
    yield fixture
    try:
        fixture.close()
    finally:
        # the call's report is made: the item, which pytest keeps to the session's end, lets go of the runs (their
        # models, gradients and device memory go as the test drops them)
        del request.node.stash[FIXTURE_KEY]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """After the test body: the baseline check (``baseline=True``, or writing it when updating), then the gate.

    Either fails the test here, in its call phase, so ``xfail`` sees the failure (see
    :mod:`~pytest_neuraldbg.gate`); a body that failed keeps its own failure and leaves the baseline alone.
    """
    try:
        result = yield
    except BaseException:
        reporting.finish_baseline(item, passed=False)
        raise
    gate.finish(item, item.config.stash[SESSION_KEY])
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """After the test body: attach its watched runs and baseline notes to the report, show the gate's text. The
    set-up and teardown reports carry none of them."""
    if call.when != "call":
        return (yield)
    state = item.config.stash[SESSION_KEY]
    recs = reporting.report_records(item, state)
    report = yield
    gate.show(report, call)
    raised = call.excinfo.value if call.excinfo is not None else None
    crashed = isinstance(raised, Exception) and not isinstance(raised, AssertionError)  # not pytest.fail/skip
    crash = type(raised).__name__ if crashed else ""
    reporting.annotate(report, recs, crash)
    if recs and reporting.junit_output_wanted(item.config):
        found = [reporting.attachments(rec, state, item.config.rootpath) for rec in recs]
        reporting.add_output(item, report, recs, found)
    reporting.annotate_baseline(report, item)
    return report


def pytest_deselected(items: list[pytest.Item]) -> None:
    """Remember deselected tests: their baselines are not stale."""
    if items:
        items[0].config.stash[SESSION_KEY].deselected.extend(baseline.locate(item) for item in items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """List the baseline files no collected test uses (reported in the terminal summary)."""
    reporting.find_stale(session, session.config.stash[SESSION_KEY])


def pytest_assertrepr_compare(config: pytest.Config, op: str, left: object, right: object) -> list[str] | None:
    """Explain ``assert ndbg.explain_failure() == []`` with every explanation in full."""
    return verdict.compare_lines(op, left, right)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove stale baselines when asked, write the report files: once, on the controller (not an xdist worker). A
    file that cannot be written is named in the terminal summary and turns a passing session's exit status into
    pytest's usage error (4): a report asked for and missing would otherwise go unseen in CI."""
    if not hasattr(session.config, "workerinput"):
        state = session.config.stash[SESSION_KEY]
        state.stopped = reporting.stopped_early(session)
        reporting.remove_stale(state, session.config.rootpath)
        reporting.write_files(state)
        if state.unwritten and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR  # a report asked for and not written fails the run


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The ``neuraldbg`` block: unhealthy runs and the files written."""
    reporting.terminal_summary(terminalreporter, config.stash[SESSION_KEY])
