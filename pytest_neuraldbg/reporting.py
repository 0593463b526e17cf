"""Where the verdicts go: JUnit properties, report sections, baselines, the terminal summary, files.

Per test (on the worker that ran it): each watched run becomes a plain-data record; the records ride on the
call report as ``report.neuraldbg_runs`` and as ``item.user_properties``, both of which pytest-xdist carries
to the controller. The controller collects them in ``pytest_runtest_logreport`` and writes every file once,
in ``pytest_sessionfinish``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from neuraldbg.export.inert import inert
from neuraldbg.text import num, one_line, printable

from . import baseline, options, outcomes, records, verdict
from .ci import annotation, on_github
from .names import MAX_NAME, digest, portable_name
from .records import RunRecord
from .state import FIXTURE_KEY, RECORDS_KEY, SESSION_KEY, SessionState

SECTION = "NeuralDBG training health"
ATTRIBUTE = "neuraldbg_runs"
BASELINE_ATTRIBUTE = "neuraldbg_baseline"
STALE_OUTPUT = "neuraldbg_stale"  # key of config.workeroutput: stale baselines seen by an xdist worker


# --- per test ---------------------------------------------------------------------------------------------


def record_item(item: pytest.Item, state: SessionState) -> list[RunRecord]:
    """The records of the runs the test watched; their verdicts are added to ``item.user_properties``.

    Computed once after the test body (for the gate, or else for the call report) and kept on the item.
    """
    done = item.stash.get(RECORDS_KEY, None)
    if done is not None:
        return done
    fixture = item.stash.get(FIXTURE_KEY, None)
    runs = fixture.named_runs if fixture is not None else []
    keep_trace = state.settings.report is not None
    # the gate, when the test's own marker set it (gate="off": the test does not want its training judged)
    marked = fixture is not None and fixture.settings.source("gate").startswith("marker")
    gate = fixture.settings.gate if fixture is not None and marked else ""
    recs = [
        records.summarise(dbg, nodeid=item.nodeid, run=name, include_trace=keep_trace, gate=gate) for name, dbg in runs
    ]
    for (_, dbg), rec in zip(runs, recs):
        draw_pictures(dbg, rec, state)
    for rec in recs:
        item.user_properties.extend(user_properties(rec, several=len(recs) > 1))
    item.stash[RECORDS_KEY] = recs
    return recs


def picture_stem(record: RunRecord) -> str:
    """The file-name stem of a run's pictures: the test's portable name, its run, and a hash of both, so that every
    worker names a run alike and no two runs share a name."""
    key = f"{record['nodeid']}::{record['run']}"
    return f"{safe_name(str(record['nodeid']), 80)}-{digest(key)}"


def draw_pictures(dbg: Any, record: RunRecord, state: SessionState) -> None:
    """With a report folder, draw the run's pictures there (on the worker that ran it): for an unhealthy run, or
    every run with ``--neuraldbg-pictures=all``. Never fails the test: a problem is said in the record's error."""
    settings = state.settings
    wanted = settings.pictures == "all" or (settings.pictures == "unhealthy" and record["verdict"] == records.UNHEALTHY)
    if settings.report is None or not wanted:
        return
    from neuraldbg.export import pictures

    if not pictures.available():
        return
    try:
        written = pictures.draw(dbg, settings.report, picture_stem(record))
    except Exception as exc:  # a report must never break the test it describes: said as a warning
        import warnings

        from neuraldbg.errors import NeuralDbgWarning

        record["pictures"] = []
        warnings.warn(
            NeuralDbgWarning(f"NeuralDBG could not draw the pictures of this run: {inert(repr(exc))}"), stacklevel=2
        )
        return
    record["pictures"] = [path.name for path in written]


def attachments(record: RunRecord, state: SessionState, root: Path) -> list[str]:
    """A run's PNG pictures as a JUnit reader finds them: relative to the project's root when below it."""
    if state.settings.report is None:
        return []
    return [
        baseline.shown(state.settings.report / name, root)
        for name in record.get("pictures", [])
        if name.endswith(".png")
    ]


def report_records(item: pytest.Item, state: SessionState) -> list[RunRecord]:
    """The records for the test's call report; the item forgets them, so that a rerun records afresh. A test
    without the fixture (most of a suite's) has none, found without computing them."""
    if FIXTURE_KEY not in item.stash:
        return []
    recs = record_item(item, state)
    del item.stash[RECORDS_KEY]
    return recs


def user_properties(record: RunRecord, several: bool = False) -> list[tuple[str, str]]:
    """Short lines for pytest's ``--junitxml``, which viewers show as a table: ``neuraldbg.verdict`` and, for an
    unhealthy run, ``neuraldbg.root`` (kind and layer of the first hypothesis), ``neuraldbg.onset`` (its step) and a
    one-line ``neuraldbg.explanation``; for a run that could not be analysed, the error. The graph and the chain,
    which are many lines, go to the failing test's output (:func:`system_out`).

    A test that watched several runs gets one group per run, each led by ``neuraldbg.run``.
    """
    props = [("neuraldbg.verdict", str(record["verdict"]))]
    hypotheses = record["hypotheses"]
    if record["verdict"] == records.ERROR:
        props.append(("neuraldbg.explanation", one_line(str(record.get("error", "")), PROPERTY_LIMIT)))
    elif hypotheses:
        first = hypotheses[0]
        more = f" (+{len(hypotheses) - 1} more)" if len(hypotheses) > 1 else ""
        where = f"'{first['layer']}'" if first["layer"] else "the model"
        props += [
            ("neuraldbg.root", f"{first['kind']} at {where}{more}"),
            ("neuraldbg.onset", f"step {first['step']}"),
            ("neuraldbg.explanation", one_line(str(first["explanation"]), PROPERTY_LIMIT)),
        ]
    return [("neuraldbg.run", str(record["run"])), *props] if several else props


#: Longest property value, in characters (viewers show properties in a table cell).
PROPERTY_LIMIT = 300
#: The key of the report section that pytest's JUnit writes into the case's ``<system-out>`` (with ``junit_logging``
#: ``system-out``, ``out-err`` or ``all``): pytest counts every section named "Captured stdout ..." as output, and
#: writes it from the teardown report, which carries the sections an item added during its call.
OUTPUT_KEY = "stdout neuraldbg"


def system_out(recs: Sequence[RunRecord], attachments: Sequence[Sequence[str]] = ()) -> str:
    """The multi-line part of a failing test's JUnit case, for each unhealthy run: GitLab's ``[[ATTACHMENT|path]]``
    lines for its pictures, its causal chain, and its causal graph (Mermaid)."""
    parts = []
    for i, rec in enumerate(recs):
        if rec["verdict"] != records.UNHEALTHY:
            continue
        lines = [f"[[ATTACHMENT|{path}]]" for path in (attachments[i] if i < len(attachments) else ())]
        lines.append(f"NeuralDBG run {rec['run']}: {verdict.headline(rec['hypotheses'])}")
        for h in rec["hypotheses"]:
            lines += verdict.chain_lines(h)
        lines += ["Causal graph (Mermaid):", str(rec["mermaid"])]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def junit_output_wanted(config: pytest.Config) -> bool:
    """Whether pytest's ``--junitxml`` writes test output into ``<system-out>`` (``junit_logging``)."""
    if not getattr(config.option, "xmlpath", None):
        return False
    return str(config.getini("junit_logging")) in ("system-out", "out-err", "all")


def section_text(recs: Sequence[RunRecord], crash: str = "") -> str:
    """The explanation of every unhealthy run of a test, for its report section. ``crash``: the exception the test
    raised (not an assertion): a run that observed nothing then says so, rather than blame the training loop."""
    parts = []
    for rec in recs:
        label = f"run {rec['run']}: " if len(recs) > 1 else ""
        if crash and rec["verdict"] == records.UNHEALTHY and _observed_nothing(rec):
            parts.append(
                f"{label}NeuralDBG has no verdict on this run: the test raised {crash} after {rec['steps']} "
                "observed training steps, before the run could be judged."
            )
        elif rec["verdict"] == records.UNHEALTHY:
            parts.append(verdict.failure_text(label + verdict.headline(rec["hypotheses"]), rec["hypotheses"]))
        elif rec["verdict"] == records.ERROR:
            parts.append(label + str(rec.get("error")))
    return "\n\n".join(parts)


def add_output(
    item: pytest.Item, report: pytest.TestReport, recs: list[RunRecord], attachments: Sequence[Sequence[str]] = ()
) -> None:
    """A failed test's unhealthy runs: their chain, graph and picture attachments as output of its JUnit case (not
    shown again in the terminal, whose failure text already explains them)."""
    text = system_out(recs, attachments) if report.failed else ""
    if text:
        item.add_report_section("call", OUTPUT_KEY, text)


def _observed_nothing(record: RunRecord) -> bool:
    """Whether every finding of a run is about the run as a whole (nothing observed, no gradient, ...)."""
    return all(verdict.run_level(h["kind"]) for h in record["hypotheses"])


def annotate(report: pytest.TestReport, recs: list[RunRecord], crash: str = "") -> None:
    """Attach the records to the call report and explain its unhealthy runs, unless its failure already does.

    A failed test gets the explanation in its failure itself (a section of the traceback), so the terminal and
    the failure text of pytest's JUnit carry it: ``assert not ndbg.explain_failure()`` fails with the verdict
    as its message and every explanation and chain in its text. A passing test gets a report section.
    """
    if not recs:
        return
    setattr(report, ATTRIBUTE, recs)
    if not any(r["verdict"] != records.HEALTHY for r in recs):
        return
    unhealthy = [r for r in recs if r["verdict"] == records.UNHEALTHY]
    if report.failed and _carries_explanations(report, unhealthy):
        return
    text = section_text(recs, crash)
    longrepr: Any = report.longrepr
    if report.failed and hasattr(longrepr, "addsection"):  # a traceback: the explanation becomes its last section
        longrepr.addsection(SECTION, text)
    elif report.failed and isinstance(report.longrepr, str):
        report.longrepr = f"{report.longrepr}\n\n{SECTION}:\n{text}"
    else:
        report.sections.append((SECTION, text))


def _carries_explanations(report: pytest.TestReport, unhealthy: list[RunRecord]) -> bool:
    """Whether the failure text already explains every unhealthy run (an assertion helper's message)."""
    text = str(report.longrepr)
    return bool(unhealthy) and all(h["explanation"] in text for r in unhealthy for h in r["hypotheses"])


# --- baselines --------------------------------------------------------------------------------------------


def finish_baseline(item: pytest.Item, passed: bool) -> None:
    """After the test body: let the fixture compare or write the baseline; its outcome becomes a JUnit property.

    A regression found here raises the test's failure (from the fixture).
    """
    __tracebackhide__ = True
    fixture = item.stash.get(FIXTURE_KEY, None)
    if fixture is None and passed:
        fixture = _baseline_without_fixture(item)
    if fixture is None or fixture.baseline is None:
        return
    try:
        fixture.finish_baseline(passed)
    finally:
        notes = fixture.baseline.notes
        if notes:
            item.user_properties.append(
                ("neuraldbg.baseline", f"{outcomes.baseline_status(notes)}: {notes[0]['path']}")
            )


def _baseline_without_fixture(item: pytest.Item) -> Any:
    """A test marked ``baseline=True`` that did not even request the fixture: it gets one (with no runs), whose
    baseline check then fails it for watching no run. A marked test's marker is checked as the fixture would
    (a bad value fails it, named). None for every other test."""
    __tracebackhide__ = True
    if item.get_closest_marker(options.MARKER) is None:  # most tests: no marker, so no baseline
        return None
    try:
        # the whole marker is checked, not only its baseline key: a misspelt key (``baselin=True``) on a test that
        # never requests the fixture would otherwise switch its baseline off unseen
        fixture, problem = _fixture_for(item), ""
    except options.OptionError as exc:
        fixture, problem = None, str(exc)
    if problem:
        pytest.fail(f"neuraldbg: {problem}", pytrace=False)
    if fixture is None or not fixture.settings.baseline:
        return None
    item.stash[FIXTURE_KEY] = fixture
    return fixture


def _fixture_for(item: pytest.Item) -> Any:
    """A fixture for ``item`` made by the plugin: the fixture's module (and with it the engine's kinds) is imported
    here, for a test marked for a baseline, not for every test that passed."""
    from .fixture import NeuralDbgFixture

    return NeuralDbgFixture.for_item(item, item.config.stash[SESSION_KEY].settings)


def annotate_baseline(report: pytest.TestReport, item: pytest.Item) -> None:
    """Carry the test's baseline notes on its call report (to the xdist controller and the summary)."""
    fixture = item.stash.get(FIXTURE_KEY, None)
    if fixture is not None and fixture.baseline is not None and fixture.baseline.notes:
        setattr(report, BASELINE_ATTRIBUTE, list(fixture.baseline.notes))


def find_stale(session: pytest.Session, state: SessionState) -> None:
    """After collection (in the process that collected): the stale baseline files of the collected modules.

    Deselected tests (``-k``, ``-m``, ``--deselect``, ``--lf``) still count as existing; modules selected only
    in part (``test_x.py::test_y``) are skipped. On an xdist worker the result goes to the controller.
    """
    config = session.config
    tests = [baseline.locate(item) for item in session.items] + state.deselected
    try:
        found = baseline.stale_files(tests, _partly_selected(config))
    except OSError:  # an unreadable directory: the listing is a courtesy, never a reason to stop the session
        return
    stale = {baseline.shown(path, config.rootpath): f"{test} in {path.parent.name}.py" for path, test in found}
    state.stale.update(stale)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[STALE_OUTPUT] = stale


def _partly_selected(config: pytest.Config) -> Callable[[Path], bool]:
    parts = [str(arg).split("::", 1)[0] for arg in config.args if "::" in str(arg)]
    base = config.invocation_params.dir
    paths = {(base / part).resolve() for part in parts}
    names = {Path(part).name for part in parts}  # also when a worker resolves paths elsewhere: err on caution
    return lambda module: module.resolve() in paths or module.name in names


class Collector:
    """Keeps the records of every finished test: in this process, or on the controller from xdist workers."""

    NAME = "neuraldbg-collector"

    def __init__(self, state: SessionState) -> None:
        self.state = state
        # pytest's outcomes: every test's for the report files (their summaries quote the session's counts), else
        # only those of the tests that watched a run (the terminal summary tells which of them passed)
        self._every_test = state.settings.writes_files
        self._watched: set[str] = set()  # node ids of the tests whose call report carried records

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        recs = (getattr(report, ATTRIBUTE, None) or []) if report.when == "call" else []
        if recs:
            self._watched.add(report.nodeid)  # before its teardown's report, which may turn it into an error
        if self._every_test or recs or report.nodeid in self._watched:
            self.state.outcomes.add(report)
        if report.when == "call":
            self.state.records.extend(recs)
            if report.failed and on_github():
                path, line = report.location[0], (report.location[1] or 0) + 1
                found = annotation(path, line, recs)
                if found is not None:
                    self.state.annotations.append(found)
            self.state.baseline_notes.extend(getattr(report, BASELINE_ATTRIBUTE, None) or [])

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """pytest-xdist, on the controller: the stale baselines a worker found."""
        self.state.stale.update(getattr(node, "workeroutput", {}).get(STALE_OUTPUT, {}))


# --- end of session ----------------------------------------------------------------------------------------


def safe_name(nodeid: str, max_len: int = MAX_NAME) -> str:
    """A portable file name for a test node id: ``tests/test_x.py::test_y[a/b]`` -> ``tests_test_x.py_test_y_a_b``
    (see :func:`~pytest_neuraldbg.names.portable_name`; names that read alike are told apart by :func:`file_names`)."""
    return portable_name(nodeid, max_len=max_len)


def file_names(recs: Sequence[RunRecord]) -> list[str]:
    """A distinct file stem per record: the test's safe name, plus the run name when a test has several."""
    per_test: dict[str, int] = {}
    for r in recs:
        per_test[r["nodeid"]] = per_test.get(r["nodeid"], 0) + 1
    taken: set[str] = set()
    out: list[str] = []
    for r in recs:
        stem = safe_name(r["nodeid"])
        if per_test[r["nodeid"]] > 1:
            stem = f"{stem}-run-{safe_name(str(r['run']), 40)}"
        if stem.lower() in taken:  # two ids that sanitise alike (case-insensitive file systems too)
            stem = f"{stem}-{digest(r['nodeid'] + '::' + str(r['run']))}"
        taken.add(stem.lower())
        out.append(stem)
    return out


def sorted_records(state: SessionState) -> list[RunRecord]:
    """Records in a stable order (xdist delivers them in completion order)."""
    return sorted(state.records, key=lambda r: (str(r["nodeid"]), str(r["run"])))


def stopped_early(session: pytest.Session) -> str:
    """Why the session stopped before running every collected test (``-x``, ``--maxfail``, a plugin, an interrupt
    or an internal error of pytest's), or ``""``.

    Under pytest-xdist too: the controller's session counts the failures the workers report and sets its own
    ``shouldfail``."""
    why = session.shouldfail or session.shouldstop
    if why:
        return str(why)
    status = getattr(session, "exitstatus", pytest.ExitCode.OK)
    if status == pytest.ExitCode.INTERRUPTED:  # Ctrl-C, or a test that raised KeyboardInterrupt
        return "interrupted"
    if status == pytest.ExitCode.INTERNAL_ERROR:
        return "an internal error"
    return ""


def remove_stale(state: SessionState, root: Path) -> None:
    """With ``--neuraldbg-remove-stale-baselines``: delete the stale baseline files (controller only)."""
    if not state.settings.remove_stale_baselines:
        return
    for shown_path in sorted(state.stale):
        path = Path(shown_path)
        if baseline.remove(path if path.is_absolute() else root / path):
            state.removed.append(shown_path)


def write_files(state: SessionState) -> None:
    """Write ``--neuraldbg-report`` and ``--neuraldbg-junit`` outputs (controller only), each file atomically, the
    report folder's files under its lock (see :mod:`neuraldbg.export.files`). Neither asked for: nothing is imported."""
    settings = state.settings
    if not settings.writes_files:
        return
    from neuraldbg.export.files import folder_lock

    from . import junit, markdown

    recs = sorted_records(state)
    results = outcomes.baseline_results(state.baseline_notes)
    if settings.report is not None:
        directory = settings.report
        try:
            with folder_lock(directory):
                for rec, stem in zip(recs, file_names(recs)):
                    if rec.get("trace") is not None:
                        trace = json.dumps(rec["trace"], indent=1, allow_nan=False) + "\n"
                        _keep(state, directory / f"{stem}.json", trace, listed=False)
                    if rec.get("mermaid"):
                        _keep(state, directory / f"{stem}.mmd", rec["mermaid"] + "\n", listed=False)
                drawn = {id(rec): rec.get("pictures", []) for rec in recs if rec.get("pictures")}
                summary = markdown.summary(
                    recs,
                    gate=settings.gate,
                    outcomes=state.outcomes,
                    baselines=results,
                    stopped=state.stopped,
                    pictures=drawn,
                    note=pictures_note(state, recs),
                )
                _keep(state, directory / "summary.md", summary)
                _keep(state, directory / "report.html", html_report(state, recs))
        except OSError as exc:  # the folder itself: it could not be made, or locked
            state.unwritten.append(_why(directory, exc))
    if settings.junit is not None:
        root = settings.junit.parent
        found = {id(rec): attachments(rec, state, root) for rec in recs}
        text = junit.report(recs, outcomes=state.outcomes, baselines=results, attachments=found)
        _keep(state, settings.junit, text)


def _keep(state: SessionState, path: Path, text: str, listed: bool = True) -> None:
    """Write one output file (listed in the terminal summary when ``listed``). One that cannot be written (a
    folder made where the file goes since the session began, a link, a full disk) is named in the terminal summary
    with why, fails the session, and leaves the other files to be written."""
    try:
        written = _write(path, text)
    except OSError as exc:
        state.unwritten.append(_why(path, exc))
        return
    if listed:
        state.written.append(written)


def _why(path: Path, exc: OSError) -> str:
    """What a failed write says: the message of an :class:`~neuraldbg.export.files.OutputError` (it names the path
    and what is there), else the path and the system's reason."""
    from neuraldbg.export.files import OutputError

    if isinstance(exc, OutputError):
        return str(exc)
    return f"{printable(str(path))}: cannot be written: {exc.strerror or exc}"


def pictures_note(state: SessionState, recs: Sequence[RunRecord]) -> str:
    """What the reports say when pictures were due and matplotlib is missing; else ``""``."""
    from neuraldbg.export import pictures

    due = state.settings.pictures == "all" or any(r["verdict"] == records.UNHEALTHY for r in recs)
    if state.settings.pictures == "off" or not due or pictures.available():
        return ""
    return f"Pictures of the runs (gradient flow, loss, update ratio) need matplotlib: {pictures.INSTALL_HINT}"


def html_report(state: SessionState, recs: Sequence[RunRecord]) -> str:
    """``report.html``: every run of the session with its explanations, pictures and causal graph, in one file."""
    from neuraldbg.export import html

    from . import markdown

    assert state.settings.report is not None
    pages = []
    for rec, label in zip(recs, markdown.labels(recs)):
        found = [html.Hypothesis(h["summary"], h["explanation"], verdict.chain_lines(h)[1:]) for h in rec["hypotheses"]]
        page = html.RunPage(label, str(rec["verdict"]), found, str(rec.get("mermaid", "")))
        page.note = str(rec.get("error", ""))
        numbers = rec.get("numbers") or {}
        page.numbers = f"{rec['steps']} steps" + (
            f", final loss {num(float(numbers['final_loss']))}" if "final_loss" in numbers else ""
        )
        for name in rec.get("pictures", []):
            if name.endswith(".svg"):
                try:
                    page.pictures.append((name, (state.settings.report / name).read_bytes()))
                except OSError:
                    continue
        pages.append(page)
    return html.page(pages, intro=f"pytest, whole session: {state.outcomes.text() or 'no test ran'}.",
                     note=pictures_note(state, recs))  # fmt: skip


def _write(path: Path, text: str) -> Path:
    from neuraldbg.export.files import write_atomic

    return write_atomic(path, text)


def _line(reporter: Any, text: str, **markup: bool) -> None:
    """One line of the terminal summary: names and ids in it are inert (no control or bidirectional character
    reaches the terminal, see :mod:`neuraldbg.export.inert`)."""
    reporter.write_line(inert(text), **markup)


def terminal_summary(reporter: Any, state: SessionState) -> None:
    """The ``neuraldbg`` block: counts, then one line per unhealthy run, baselines, then the files written. Under
    GitHub Actions, the workflow annotations of the failed unhealthy tests come first (see :mod:`.ci`)."""
    for line in state.annotations:
        reporter.write_line(line)
    recs = sorted_records(state)
    if not recs and not state.written and not state.unwritten and not state.baseline_notes and not state.stale:
        return
    reporter.write_sep("=", "neuraldbg")
    if state.stopped:
        _line(reporter, f"the session stopped early ({state.stopped}): tests after it did not run", yellow=True)
    if recs:
        _runs_summary(reporter, state, recs)
    baseline_summary(reporter, state)
    for path in state.written:
        _line(reporter, f"neuraldbg: wrote {path}")
    for problem in state.unwritten:
        _line(reporter, f"neuraldbg: could not write {problem}", red=True, bold=True)


def baseline_summary(reporter: Any, state: SessionState) -> None:
    """Counts per outcome, then improved tests, files written, tests not written and stale files."""
    per_test: dict[str, list[dict[str, Any]]] = {}
    for note in state.baseline_notes:
        per_test.setdefault(str(note["nodeid"]), []).append(note)
    status = {nodeid: outcomes.baseline_status(notes) for nodeid, notes in sorted(per_test.items())}
    if status:
        counts: dict[str, int] = {}
        for value in status.values():
            counts[value] = counts.get(value, 0) + 1
        order = [*outcomes.BASELINE_ORDER, "unchanged", "matched"]
        listed = ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=order.index))
        _line(reporter, f"baselines: {listed}")
    for nodeid, value in status.items():
        notes = per_test[nodeid]
        if value == "improved":
            lines = [line for n in notes for line in n["lines"]]
            more = f"; +{len(lines) - 3} more" if len(lines) > 3 else ""
            _line(reporter, f"baseline improved {nodeid}: {'; '.join(lines[:3])}{more}", green=True)
            _line(reporter, f"  keep the improvement: {baseline.update_command(nodeid)}")
        elif value in ("created", "updated"):
            _line(reporter, f"baseline {value}: {notes[0]['path']} ({nodeid})")
        elif value == "not written":
            _line(reporter, f"baseline not written for {nodeid}: the test did not pass", yellow=True)
    for path, test in sorted(state.stale.items()):
        if path in state.removed:
            _line(reporter, f"removed stale baseline: {path} (no test {test})")
        else:
            _line(reporter, f"stale baseline: {path} (no test {test})", yellow=True)
    if len(state.removed) < len(state.stale):
        _line(
            reporter,
            f"  remove them with {baseline.REMOVE_STALE_FLAG}, or rename them after a renamed test and run "
            f"{baseline.UPDATE_FLAG}",
        )


def _runs_summary(reporter: Any, state: SessionState, recs: list[RunRecord]) -> None:
    unhealthy = [r for r in recs if r["verdict"] == records.UNHEALTHY]
    errors = [r for r in recs if r["verdict"] == records.ERROR]
    counts = f"{len(recs)} watched run{'' if len(recs) == 1 else 's'}: {len(unhealthy)} unhealthy"
    counts += f", {len(errors)} not analysed" if errors else ""
    _line(reporter, f"{counts} (gate: {state.settings.gate})")
    per_test: dict[str, int] = {}
    for r in recs:
        per_test[r["nodeid"]] = per_test.get(r["nodeid"], 0) + 1
    for r in unhealthy:
        expected = state.outcomes.of(r["nodeid"]) == "passed"  # a helper's failure the passing test caught
        found = "; ".join(
            h["summary"] + (" (asserted by the test)" if expected and h.get("asserted") else "")
            for h in r["hypotheses"]
        )
        _line(reporter, f"UNHEALTHY {records.run_label(r, per_test[r['nodeid']])}: {found}", red=True)
    for r in errors:
        _line(reporter, f"ERROR {records.run_label(r, per_test[r['nodeid']])}: {r.get('error')}", yellow=True)
