"""Command line: ``neuraldbg demo``, ``neuraldbg explain TRACE.json``, ``neuraldbg explain RANK_TRACES...`` (or a
report folder of separate runs' traces) and ``neuraldbg report TRACE... -o report.html``.

Exit codes: 0 healthy (or, for ``demo``, the demo was diagnosed as expected; for a job, every rank reported and
none shows a failure), 1 failures found (or a demo was misdiagnosed, or a rank of the job is missing), 2 usage,
input or output errors (one line on stderr naming the file and the problem; none when the reader of the output
went away), 3 an internal error: a bug in NeuralDBG, never a verdict on the training run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TextIO

EXIT_HEALTHY, EXIT_FAILURES, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def _parser() -> argparse.ArgumentParser:
    from .version import __version__

    parser = argparse.ArgumentParser(
        prog="neuraldbg", description="Explain why a PyTorch training run fails: root cause, chain and fix."
    )
    parser.add_argument("--version", action="version", version=f"neuraldbg {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    demo = sub.add_parser("demo", help="train a deliberately broken model and diagnose it")
    demo.add_argument("name", nargs="?", default=None, help="which demo (default: dead); see --list")
    demo.add_argument("--all", action="store_true", help="run every demo")
    demo.add_argument("--list", action="store_true", help="list the demos and exit")
    demo.add_argument("--no-graph", action="store_true", help="do not print the Mermaid graph")
    demo.add_argument("--save", metavar="PATH", help="also write the trace JSON to PATH")
    demo.add_argument(
        "--pictures",
        metavar="DIR",
        help="also draw the run's pictures (gradient flow, loss, update ratio; PNG and SVG) into DIR "
        '(needs matplotlib: pip install "pytest-neuraldbg[plots]")',
    )

    report = sub.add_parser("report", help="write a self-contained HTML report of one or more trace files")
    report.add_argument("traces", nargs="+", metavar="TRACE", help="trace files written by NeuralDbg.save()")
    report.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    report.add_argument("--no-pictures", action="store_true", help="leave the pictures out")
    report.add_argument(
        "--max-bytes", type=_positive_int, default=None, metavar="N", help="read trace files of up to N bytes"
    )

    explain = sub.add_parser(
        "explain",
        help="print the diagnosis stored in a trace file, or the merged diagnosis of a job's per-rank traces",
    )
    explain.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE",
        help="a trace written by NeuralDbg.save(); several traces, or a directory of them (every *.json in it): "
        "the per-rank traces of one distributed job, merged into one diagnosis",
    )
    explain.add_argument(
        "--max-bytes",
        type=_positive_int,
        default=None,
        metavar="N",
        help="read trace files of up to N bytes (default: 64 MiB)",
    )
    fmt = explain.add_mutually_exclusive_group()
    fmt.add_argument("--mermaid", action="store_true", help="print the Mermaid causal graph")
    fmt.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy, harmless
    args = _parser().parse_args(argv)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "demo": _demo,
        "report": _report,
        "explain": _explain_traces,
    }
    return _guarded(args.command, commands[args.command], args)


def _demo(args: argparse.Namespace) -> int:
    from .demo import DEFAULT, DEMOS
    from .errors import did_you_mean
    from .export.files import check_target

    if args.list:
        for name, demo in DEMOS.items():
            print(f"{name:14} {demo.story}")
        return EXIT_HEALTHY
    if args.all and args.name:
        print("neuraldbg demo: give a demo name or --all, not both", file=sys.stderr)
        return EXIT_USAGE
    names = list(DEMOS) if args.all else [args.name or DEFAULT]
    unknown = [n for n in names if n not in DEMOS]
    if unknown:
        print(
            f"neuraldbg demo: unknown demo {unknown[0]!r}{did_you_mean(unknown[0], DEMOS)}; "
            f"expected one of: {', '.join(DEMOS)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    # every file the demos will write is checked before the first one trains: a bad path costs no training
    saves = {name: _demo_save_path(args.save, name, several=len(names) > 1) for name in names} if args.save else {}
    for path in saves.values():
        check_target(path)
    status = EXIT_HEALTHY
    for name in names:
        demo = DEMOS[name]
        print(f"=== demo {name!r}: {demo.story}")
        dbg = demo.run()
        print(dbg.report())
        hypotheses = dbg.hypotheses()
        if hypotheses and not args.no_graph:
            print("\nCausal graph (Mermaid; paste into https://mermaid.live or a GitHub comment):\n")
            print(dbg.export_mermaid_causal_graph())
        if name in saves:
            print(f"\ntrace written to {dbg.save(saves[name])}")
        if args.pictures:
            status = max(status, _pictures(dbg, args.pictures, name))
        top = hypotheses[0] if hypotheses else None
        ok = (top is None) if demo.expected is None else (top is not None and top.kind is demo.expected)
        if ok and top is not None and demo.expected_layer is not None:
            ok = top.root.layer == demo.expected_layer
        verdict = "as expected" if ok else "NOT as expected"
        print(f"\n--- diagnosis {verdict} (expected {demo.expected.value if demo.expected else 'healthy'})\n")
        if not ok:
            status = EXIT_FAILURES
    return status


def _demo_save_path(given: str, name: str, *, several: bool) -> str:
    """Where ``demo --save`` writes demo ``name``'s trace: ``given`` itself for one demo; for several, the demo's
    name added to the file name's stem, before its suffix (``runs/t.json`` -> ``runs/t-dead.json``, ``runs/t`` ->
    ``runs/t-dead``), so each demo has its own file and no folder of the path is renamed."""
    from .export.files import OutputError
    from .text import printable

    folder, file_name = os.path.split(given)
    if not file_name:
        raise OutputError(
            f"{printable(given)}: ends with a path separator, so it names a folder; expected the path of a file "
            "to write the trace to (such as DIR/trace.json)"
        )
    if not several:
        return given
    stem, suffix = os.path.splitext(file_name)  # "t.json" -> ("t", ".json"); "t" and ".hidden" have no suffix
    return os.path.join(folder, f"{stem}-{name}{suffix}")


def _say(text: str, stream: TextIO | None = None) -> None:
    """Print text that may hold anything a trace held without failing and without acting on the terminal: control
    and bidirectional characters and lone surrogates become visible escapes (only the text's own line feeds stay)."""
    from .export.inert import inert

    stream = stream if stream is not None else sys.stdout
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(inert(text, lines=True).encode(encoding, "backslashreplace").decode(encoding, "replace") + "\n")


def _pictures(dbg: Any, folder: str, name: str) -> int:
    """Draw a demo's pictures into ``folder``; a usage error without matplotlib."""
    from .export import pictures
    from .export.files import OutputError

    if not pictures.available():
        print(f"neuraldbg demo: --pictures needs matplotlib: {pictures.INSTALL_HINT}", file=sys.stderr)
        return EXIT_USAGE
    try:
        written = pictures.draw(dbg, folder, f"demo-{name}")
    except OutputError as exc:
        _say(f"neuraldbg demo: {exc}", sys.stderr)
        return EXIT_USAGE
    for path in written:
        print(f"picture written to {path}")
    return EXIT_HEALTHY


def _report(args: argparse.Namespace) -> int:
    """``neuraldbg report TRACE... -o report.html``: exit 0 when every run is healthy, 1 when one is not."""
    from .export import html, pictures
    from .export.files import write_atomic
    from .trace import MAX_TRACE_BYTES, load

    paths = _trace_paths(args.traces)[0]
    _refuse_an_input_as_output(args.output, paths)
    traces = [load(path, max_bytes=args.max_bytes or MAX_TRACE_BYTES) for path in paths]
    runs = [html.run_page(trace, trace.source, pictures=not args.no_pictures) for trace in traces]
    note = "" if args.no_pictures or pictures.available() else f"Pictures need matplotlib: {pictures.INSTALL_HINT}"
    write_atomic(args.output, html.page(runs, note=note))
    _say(f"report written to {args.output} ({len(runs)} run{'' if len(runs) == 1 else 's'})")
    return EXIT_FAILURES if any(r.verdict != "healthy" for r in runs) else EXIT_HEALTHY


def _refuse_an_input_as_output(output: str, inputs: Sequence[str]) -> None:
    """Refuse, before anything is written, an output path that is one of the input traces (the same file, however
    named: through a link, a relative path, a hard link, or as one of an input folder's files): writing the report
    there would replace the trace it reads."""
    from .export.files import OutputError, same_file
    from .text import printable

    for path in inputs:
        if same_file(output, path):
            raise OutputError(
                f"{printable(output)}: is the input trace {printable(path)}; writing the report there would "
                "replace the trace: give another output file"
            )


class _OutputLost(Exception):
    """Standard output could not be written (a full disk, a closed pipe): the environment's failure, not a bug."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _Stdout:
    """``sys.stdout`` while a command runs: a write or flush that fails raises :class:`_OutputLost`, so that the
    command's failure is told apart from an ``OSError`` of NeuralDBG's own making."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise _OutputLost(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise _OutputLost(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _drop_unwritten_output(stream: TextIO) -> None:
    """Point the process's standard output at the null device: what is left in its buffer would otherwise fail
    again when Python flushes it on exit, with a second message ("Exception ignored ...")."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # a stream with no file (a test's capture)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)


def _guarded(command: str, run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a command: a bad input, output path or plugin is a usage error (2), and so is output that cannot be
    written (quietly when its reader went away, a closed pipe); anything else is a bug, an internal error (3)."""
    from .errors import NeuralDbgError

    stdout = sys.stdout
    try:
        with contextlib.redirect_stdout(_Stdout(stdout)):
            status = int(run(args))
            sys.stdout.flush()  # a buffered write fails here, where it can be reported, not at exit
        return status
    except _OutputLost as exc:
        _drop_unwritten_output(stdout)
        if not isinstance(exc.error, BrokenPipeError):  # the reader went away: nobody to tell
            _say(f"neuraldbg {command}: cannot write the output: {exc.error.strerror or exc.error}", sys.stderr)
        return EXIT_USAGE
    except NeuralDbgError as exc:  # TraceError, OutputError, ConfigError, a plugin that cannot be loaded
        _say(f"neuraldbg {command}: {exc}", sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug: never exit 1, which says the training run failed
        first = (str(exc).splitlines() or [""])[0]
        _say(
            f"neuraldbg {command}: internal error, a bug in NeuralDBG (please report it with the trace): "
            f"{type(exc).__name__}: {first}",
            sys.stderr,
        )
        traceback.print_exc(file=sys.stderr)
        return EXIT_INTERNAL


def _trace_paths(given: Sequence[str]) -> tuple[list[str], bool]:
    """The trace files named (directories expanded to their *.json files), and whether they form a job."""
    from .errors import TraceError
    from .text import printable as show_path

    paths: list[str] = []
    job = len(given) > 1
    for path in given:
        if not os.path.isdir(path):
            paths.append(path)
            continue
        job = True
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            raise TraceError(f"{show_path(path)}: cannot list the directory: {exc.strerror or exc}") from None
        found = [os.path.join(path, n) for n in names if n.endswith(".json") and not n.startswith(".")]
        if not found:
            raise TraceError(f"{show_path(path)}: no *.json trace in this directory")
        paths.extend(found)
    return paths, job


def _explain_traces(args: argparse.Namespace) -> int:
    from .distributed.merge import merge_traces, stated_rank
    from .trace import MAX_TRACE_BYTES, load

    paths, job = _trace_paths(args.traces)
    traces = [load(path, max_bytes=args.max_bytes or MAX_TRACE_BYTES) for path in paths]
    ranked = [t for t in traces if stated_rank(t) is not None]
    if job and not ranked:
        # no trace states a rank as a distributed run writes it (meta.rank, or a name like run.rank0.json): a
        # report folder, separate runs rather than the ranks of one job, even where a test's name holds "rank_2";
        # where some do, the job's rules apply (a trace without a rank is then an error)
        return _explain_each(args, traces)
    if job:
        merged = merge_traces(traces)
        if args.mermaid:
            _say(merged.export_mermaid())
        elif args.json:
            _say(json.dumps({"traces": [t.source for t in traces], **merged.to_dict()}, indent=2))
        else:
            _say(merged.report())
        return EXIT_HEALTHY if merged.healthy else EXIT_FAILURES
    trace = traces[0]
    hypotheses = trace.hypotheses()
    if args.mermaid:
        _say(trace.export_mermaid_causal_graph())
    elif args.json:
        _say(json.dumps(_trace_json(trace, hypotheses), indent=2))
    else:
        _say(trace.report())
    return EXIT_FAILURES if hypotheses else EXIT_HEALTHY


def _explain_each(args: argparse.Namespace, traces: Sequence[Any]) -> int:
    """Traces of separate runs (``--neuraldbg-report``'s folder): each explained in turn; exit 1 when one is
    unhealthy."""
    unhealthy = False
    if args.json:
        _say(json.dumps([_trace_json(t, t.hypotheses()) for t in traces], indent=2))
        return EXIT_FAILURES if any(t.hypotheses() for t in traces) else EXIT_HEALTHY
    for i, trace in enumerate(traces):
        hypotheses = trace.hypotheses()
        unhealthy = unhealthy or bool(hypotheses)
        _say(("\n" if i else "") + f"=== {trace.source}")
        _say(trace.export_mermaid_causal_graph() if args.mermaid else trace.report())
    return EXIT_FAILURES if unhealthy else EXIT_HEALTHY


def _trace_json(trace: Any, hypotheses: Sequence[Any]) -> dict[str, Any]:
    return {
        "trace": trace.source,
        "healthy": not hypotheses,
        "hypotheses": [
            {
                "kind": h.kind.value,
                "confidence": h.confidence,
                "layer": h.root.layer,
                "step": h.root.step_start,
                "explanation": h.explanation,
                "suggestion": h.suggestion,
                "chain": [
                    {
                        "layer": e.layer,
                        "param": e.param,
                        "state": e.to_state,
                        "steps": [e.step_start, e.step_end],
                    }
                    for e in h.chain
                ],
            }
            for h in hypotheses
        ],
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
