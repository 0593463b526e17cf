"""Command line: ``neuraldbg demo`` and ``neuraldbg explain TRACE.json``.

Exit codes: 0 healthy (or, for ``demo``, the demo was diagnosed as expected), 1 failures found (or a demo was
misdiagnosed), 2 usage or input errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence

EXIT_HEALTHY, EXIT_FAILURES, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    from . import __version__

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

    explain = sub.add_parser("explain", help="print the diagnosis stored in a trace file")
    explain.add_argument("trace", help="a trace written by NeuralDbg.save()")
    fmt = explain.add_mutually_exclusive_group()
    fmt.add_argument("--mermaid", action="store_true", help="print the Mermaid causal graph")
    fmt.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy, harmless
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    return _explain(args)


def _demo(args: argparse.Namespace) -> int:
    from .demo import DEFAULT, DEMOS

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
            f"neuraldbg demo: unknown demo {unknown[0]!r}; expected one of: {', '.join(DEMOS)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
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
        if args.save:
            path = args.save if len(names) == 1 else args.save.replace(".json", f"-{name}.json")
            print(f"\ntrace written to {dbg.save(path)}")
        top = hypotheses[0] if hypotheses else None
        ok = (top is None) if demo.expected is None else (top is not None and top.kind is demo.expected)
        if ok and top is not None and demo.expected_layer is not None:
            ok = top.root.layer == demo.expected_layer
        verdict = "as expected" if ok else "NOT as expected"
        print(f"\n--- diagnosis {verdict} (expected {demo.expected.value if demo.expected else 'healthy'})\n")
        if not ok:
            status = EXIT_FAILURES
    return status


def _explain(args: argparse.Namespace) -> int:
    from .errors import TraceError
    from .tracefile import load

    try:
        trace = load(args.trace)
    except TraceError as exc:
        print(f"neuraldbg explain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    hypotheses = trace.hypotheses()
    if args.mermaid:
        print(trace.export_mermaid_causal_graph())
    elif args.json:
        payload = {
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
        print(json.dumps(payload, indent=2))
    else:
        print(trace.report())
    return EXIT_FAILURES if hypotheses else EXIT_HEALTHY


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
