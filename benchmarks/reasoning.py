"""How the reasoning scales with the number of events: ``hypotheses()`` on synthetic traces of 1k to 540k events.

    python -m benchmarks.reasoning                  # 1k .. 64k events, both shapes, and 540k
    python -m benchmarks.reasoning --sizes 1000 8000 --shapes wide --repeat 3

Events are generated, not trained: a model of L layers (Linear and ReLU alternating, a Tanh every fifth) over a
long run, each event a random failure or evidence state of a random layer over a random span of steps, in the
proportions a long, troubled run produces (vanishing and evidence most, run-level findings rare). Two shapes:

* ``wide``: the number of layers grows with the events (20 events per layer): a huge model;
* ``long``: 200 layers, the events grow with the run's length (many episodes per layer);
* ``separate``: every event its own fault (units dying in one layer after another, each recovering before the
  layer before it dies), so that choosing roots, not collecting chains, is the work.

Each size is diagnosed by ``neuraldbg.reasoning.diagnose`` with the built-in rules (what ``hypotheses()`` runs,
minus the explanations' history lookups); the time is the best of ``--repeat`` runs (wall clock,
``time.perf_counter``), with the number of rule checks (``explains`` calls) beside it.
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from neuraldbg.events import EventType, FailureKind, SemanticEvent
from neuraldbg.reasoning import Topology, builtin_rules, diagnose

K = FailureKind
T = EventType


def topology(layers: int) -> Topology:
    order = [f"blocks.{i}" for i in range(layers)]
    types, roles = {}, {}
    for i, name in enumerate(order):
        kind = "Linear" if i % 2 == 0 else ("Tanh" if i % 10 == 5 else "ReLU")
        types[name] = kind
        roles[name] = {"Linear": "parametric", "Tanh": "bounded", "ReLU": "gated"}[kind]
    return Topology(order=order, types=types, roles=roles, first_step=0, last_step=100_000)


#: (weight, maker) of each kind of synthetic event; a maker returns (event type, kind, state, metrics).
def _makers() -> list[tuple[float, Callable[[random.Random], tuple[EventType, K | None, str, dict[str, float]]]]]:
    return [
        (0.22, lambda r: (T.GRADIENT, K.VANISHING_GRADIENTS, "vanishing", _vanishing(r))),
        (0.08, lambda r: (T.ACTIVATION, K.DEAD_NEURONS, "dead", {"dead_fraction": 0.9, "units": 64.0})),
        (0.05, lambda r: (T.ACTIVATION, K.SATURATED_ACTIVATIONS, "saturated", {"saturated_fraction": 0.8})),
        (0.08, lambda r: (T.GRADIENT, K.EXPLODING_GRADIENTS, "exploding", {"grad_norm": 10 ** r.uniform(3, 9)})),
        (0.03, lambda r: (T.ACTIVATION, K.NON_FINITE, "non_finite", {"output_norm": float("inf")})),
        (0.02, lambda r: (T.GRADIENT, K.NON_FINITE, "non_finite", {"grad_norm": float("nan")})),
        (0.08, lambda r: (T.UPDATE, K.FROZEN_PARAMETERS, "frozen", _frozen(r))),
        (0.12, lambda r: (T.ACTIVATION, None, "anomalous", {"output_rms": 10 ** r.uniform(3, 8)})),
        (0.07, lambda r: (T.ACTIVATION, None, "amplifying", {"gain": 10 ** r.uniform(1, 4), "output_rms": 1e4})),
    ]


def _frozen(r: random.Random) -> dict[str, float]:
    return {"grad_norm": 0.3, "in_optimizer": float(r.random() < 0.5)}


def _vanishing(r: random.Random) -> dict[str, float]:
    if r.random() < 0.5:
        return {"grad_norm": 0.0, "exact_zero": 1.0, "max_layer_grad_norm": 1.0}
    return {"grad_norm": 10 ** r.uniform(-12, -5), "max_layer_grad_norm": 1.0}


def events(n: int, layers: int, seed: int = 0, steps: int = 100_000) -> list[SemanticEvent]:
    """``n`` synthetic events over ``layers`` layers and ``steps`` steps."""
    r = random.Random(seed)
    topo = topology(layers)
    makers = _makers()
    weights = [w for w, _ in makers]
    out: list[SemanticEvent] = []
    model_level = max(1, n // 50)  # model-wide events: stalled updates, update surges, bad batches, NaN losses
    for _ in range(n - model_level):
        ((_, make),) = r.choices(makers, weights)
        etype, kind, state, metrics = make(r)
        layer = topo.order[r.randrange(layers)]
        param = f"{layer}.weight" if etype is T.UPDATE else None
        out.append(_event(r, etype, kind, layer, param, state, metrics, steps))
    for _ in range(model_level):
        pick = r.random()
        if pick < 0.4:
            e = (T.UPDATE, K.STALLED_UPDATES, "stalled", {"median_update_ratio": 1e-7, "lr": 1e-7})
        elif pick < 0.8:
            lr = r.choice([0.5, 5.0, 50.0])
            e = (T.UPDATE, None, "exploding", {"median_update_ratio": 1.0, "lr": lr})
        elif pick < 0.9:
            e = (T.INPUT, K.NON_FINITE, "non_finite", {})
        else:
            e = (T.LOSS, K.NON_FINITE, "non_finite", {})
        out.append(_event(r, *e[:2], "", None, e[2], e[3], steps))  # type: ignore[arg-type]
    for kind in (K.EVAL_MODE_TRAINING, K.INCOMPLETE_OBSERVATION):
        out.append(SemanticEvent(T.RUN, kind, "", None, 0, steps - 1, None, kind.value, {"steps": float(steps)}))
    return out


def separate(n: int) -> tuple[list[SemanticEvent], Topology]:
    """``n`` dead layers that explain nothing of each other: later layers die earlier and recover first."""
    topo = topology(2 * n)
    metrics = {"dead_fraction": 1.0, "units": 8.0}
    evs = [
        SemanticEvent(
            T.ACTIVATION,
            K.DEAD_NEURONS,
            topo.order[2 * i + 1],
            None,
            10 * (n - i),
            10 * (n - i) + 5,
            None,
            "dead",
            dict(metrics),
            0.9,
        )
        for i in range(n)
    ]
    return evs, topo


def _event(
    r: random.Random,
    etype: EventType,
    kind: K | None,
    layer: str,
    param: str | None,
    state: str,
    metrics: dict[str, float],
    steps: int,
) -> SemanticEvent:
    start = r.randrange(steps)
    end = min(steps - 1, start + int(r.expovariate(1 / 40)))
    metrics = {k: float(v) for k, v in metrics.items()}
    return SemanticEvent(etype, kind, layer, param, start, end, None, state, metrics, round(r.uniform(0.5, 1.0), 3))


@contextmanager
def counting_checks() -> Iterator[list[int]]:
    """Count calls of every built-in rule's ``explains`` (the engine's unit of work) while inside."""
    calls = [0]
    classes = {type(rule) for rule in builtin_rules()}
    saved = {cls: cls.__dict__["explains"] for cls in classes}

    def wrap(original: Callable[..., bool]) -> Callable[..., bool]:
        def explains(self: Any, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
            calls[0] += 1
            return original(self, cause, effect, topo)

        return explains

    try:
        for cls, original in saved.items():
            cls.explains = wrap(original)
        yield calls
    finally:
        for cls, original in saved.items():
            cls.explains = original


def measure(n: int, shape: str, repeat: int) -> tuple[float, int, int]:
    """(best seconds, rule checks, hypotheses) for one synthetic trace."""
    if shape == "separate":
        evs, topo = separate(n)
    else:
        layers = max(4, n // 20) if shape == "wide" else 200
        evs, topo = events(n, layers, seed=n), topology(layers)
    rules = builtin_rules()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        found = diagnose(evs, topo, rules)
        best = min(best, time.perf_counter() - start)
    with counting_checks() as calls:
        diagnose(evs, topo, rules)
    return best, calls[0], len(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 2000, 4000, 8000, 16000, 32000, 64000])
    parser.add_argument(
        "--shapes", nargs="*", default=["wide", "long", "separate"], choices=["wide", "long", "separate"]
    )
    parser.add_argument("--large", type=int, default=540_000, help="one more size, wide shape (0: none)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"NeuralDBG reasoning scaling, Python {platform.python_version()}, {platform.machine()}")
    print()
    print("| shape | events | layers | hypotheses | rule checks | checks/event | seconds | us/event |")
    print("|---|---|---|---|---|---|---|---|")
    runs = [(shape, n) for shape in args.shapes for n in args.sizes]
    if args.large:
        runs.append(("wide", args.large))
    for shape, n in runs:
        seconds, checks, found = measure(n, shape, 1 if n > 100_000 else args.repeat)
        layers = {"wide": max(4, n // 20), "long": 200, "separate": 2 * n}[shape]
        print(
            f"| {shape} | {n} | {layers} | {found} | {checks} | {checks / n:.2f} | {seconds:.3f} | "
            f"{1e6 * seconds / n:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
