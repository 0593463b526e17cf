"""Assertion helpers for training health: each fails with a one-line verdict, the explanation and the chain.

Use them on a debugger after training (a live :class:`~neuraldbg.NeuralDbg` or a trace from
:func:`neuraldbg.load`)::

    from pytest_neuraldbg import assert_healthy, assert_no_dead_neurons

    def test_training_is_healthy(neuraldbg):
        ndbg = neuraldbg.smoke_train(model, loader, loss_fn)
        assert_healthy(ndbg)

A check looks at the root cause of each failure hypothesis *and* at the events it explains: a dead ReLU
that zeroes the gradients upstream fails :func:`assert_no_dead_neurons` and also
:func:`assert_no_vanishing_gradients`, whose message then names the dead layer as the cause.
This module imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from neuraldbg.errors import did_you_mean
from neuraldbg.export.inert import inert, inert_data
from neuraldbg.kinds import registry
from neuraldbg.kinds.base import Check
from neuraldbg.text import pct

from . import learning, records, verdict
from .errors import ArgumentError, ArgumentTypeError
from .records import EventRecord, HypothesisRecord

#: A loss that fell at least this much without reaching the factor, with no fault found, is learning slowly.
SLOW_BUT_FALLING = 1.05


def _hypotheses(ndbg: Any, helper: str) -> list[HypothesisRecord]:
    __tracebackhide__ = True
    if not callable(getattr(ndbg, "hypotheses", None)):
        raise ArgumentTypeError(
            f"{helper}(): expected a NeuralDbg debugger or a trace from neuraldbg.load(), got {type(ndbg).__name__}"
        )
    return [records.hypothesis_dict(h) for h in ndbg.hypotheses()]


def kind_names(kinds: Iterable[Any], helper: str, also: Iterable[str] = ()) -> set[str]:
    """Failure kind names from :class:`~neuraldbg.FailureKind` members or their names as strings, each a kind this
    process knows or one in ``also`` (the kinds the run reported)."""
    __tracebackhide__ = True
    known = verdict.kinds(also)
    out: set[str] = set()
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        value = getattr(kind, "value", kind)
        text = str(value).strip().lower().replace("-", "_").replace(" ", "_")
        if text not in known:
            raise ArgumentError(
                f"{helper}(ignore=...): unknown failure kind {kind!r}{did_you_mean(text, known)}; "
                f"expected one of {', '.join(known)}"
            )
        out.add(text)
    return out


def _note_asserted(ndbg: Any, hypotheses: Sequence[HypothesisRecord]) -> None:
    """Tell a debugger of the fixture which failures a helper is raising on (see :mod:`~pytest_neuraldbg.gate`)."""
    note = getattr(ndbg, "note_asserted", None)
    if callable(note):
        note([records.key(h) for h in hypotheses])


def _fail(ndbg: Any, first_line: str, hypotheses: Sequence[HypothesisRecord]) -> NoReturn:
    __tracebackhide__ = True
    _note_asserted(ndbg, hypotheses)
    shown: list[HypothesisRecord] = [inert_data(h) for h in hypotheses]  # names as visible escapes, one line each
    raise AssertionError(verdict.failure_text(inert(first_line), shown))


def assert_healthy(ndbg: Any, *, ignore: Iterable[Any] = ()) -> None:
    """Fail when the run has any failure hypothesis whose root cause is not in ``ignore``.

    That includes the run-level kinds: a run that took no training step, got no gradient, trained in eval mode,
    had a loss that cannot teach, or was not fully observed is not healthy, whatever its layers did.
    ``ignore`` takes :class:`~neuraldbg.FailureKind` members or strings (``"frozen_parameters"``), e.g. to
    accept frozen layers of a fine-tuned model; on a run of the fixture, the gate and the reports then ignore those
    kinds too.
    """
    __tracebackhide__ = True
    hypotheses = _hypotheses(ndbg, "assert_healthy")
    skip = kind_names(ignore, "assert_healthy", (h["kind"] for h in hypotheses))
    note = getattr(ndbg, "note_ignored", None)
    if skip and callable(note):
        note(skip)  # what the test ignored, the gate and the reports ignore too
    found = [h for h in hypotheses if h["kind"] not in skip]
    if found:
        _fail(ndbg, verdict.headline(found), found)


def _checked_by(helper: str) -> tuple[tuple[str, ...], str, Check]:
    """The kinds whose rooms name ``helper`` as their check, the words of its verdict line, and the check that says
    which history series its ``max_fraction`` applies to."""
    rooms = [room for room in registry.rooms() if room.check.helper == helper]
    what = next((room.check.what for room in rooms if room.check.what), helper)
    fraction = next((room.check for room in rooms if room.check.fraction), Check())
    return tuple(room.name for room in rooms), what, fraction


def _assert_none_of(ndbg: Any, helper: str) -> None:
    __tracebackhide__ = True
    kinds, what, _ = _checked_by(helper)
    found = [h for h in _hypotheses(ndbg, helper) if verdict.involves(h, kinds)]
    if found:
        _fail(ndbg, verdict.kind_headline(found, kinds, what), found)


def assert_no_vanishing_gradients(ndbg: Any) -> None:
    """Fail when gradients vanish anywhere, as a root cause or as the effect of another failure."""
    __tracebackhide__ = True
    _assert_none_of(ndbg, "assert_no_vanishing_gradients")


def assert_no_exploding_gradients(ndbg: Any) -> None:
    """Fail when gradients explode anywhere."""
    __tracebackhide__ = True
    _assert_none_of(ndbg, "assert_no_exploding_gradients")


def assert_no_saturation(ndbg: Any) -> None:
    """Fail when activations saturate (tanh/sigmoid outputs stuck at their bounds)."""
    __tracebackhide__ = True
    _assert_none_of(ndbg, "assert_no_saturation")


def assert_finite(ndbg: Any) -> None:
    """Fail when a NaN or infinity appeared in inputs, outputs, gradients or the loss."""
    __tracebackhide__ = True
    _assert_none_of(ndbg, "assert_finite")


def assert_parameters_update(ndbg: Any) -> None:
    """Fail when parameters are frozen (never updated) or their updates stall (negligible steps)."""
    __tracebackhide__ = True
    _assert_none_of(ndbg, "assert_parameters_update")


def assert_no_dead_neurons(ndbg: Any, *, max_fraction: float | None = None) -> None:
    """Fail when a layer's units die (inactive on every sample).

    By default a layer fails when the debugger reports it dead (``dead_unit_fraction`` of its units, 70 % by
    default, for ``persistence`` observed steps). With ``max_fraction`` a layer fails when its fraction of dead
    units stays above ``max_fraction`` for ``persistence`` consecutive observed steps (the engine's persistence),
    e.g. ``max_fraction=0.1`` to allow at most 10 % dead units.
    """
    __tracebackhide__ = True
    helper = "assert_no_dead_neurons"
    if max_fraction is not None and not (isinstance(max_fraction, (int, float)) and 0 <= max_fraction < 1):
        raise ArgumentError(f"{helper}(max_fraction=...): expected a number in [0, 1), got {max_fraction!r}")
    kinds, what, check = _checked_by(helper)
    found = [h for h in _hypotheses(ndbg, helper) if verdict.involves(h, kinds)]
    if max_fraction is not None:
        found = [h for h in found if _over(h, kinds, check.fraction, max_fraction)]
        found += _held_above(ndbg, kinds, check, max_fraction, {h["layer"] for h in found})
    if found:
        _fail(ndbg, verdict.kind_headline(found, kinds, what), found)


def _over(h: HypothesisRecord, kinds: Sequence[str], fraction: str, limit: float) -> bool:
    values = [e["metrics"].get(fraction, 1.0) for e in h["chain"] if e["kind"] in kinds]
    return any(isinstance(v, (int, float)) and v > limit for v in values)


def _held_above(
    ndbg: Any, kinds: Sequence[str], check: Check, limit: float, reported: set[str]
) -> list[HypothesisRecord]:
    """Layers whose ``check.fraction`` series stayed above ``limit`` as long as the engine's persistence asks (it
    judges that), as the hypotheses the helper fails on."""
    held = getattr(ndbg, "held_above", None)
    if not callable(held) or not kinds or not check.fraction:
        return []
    out: list[HypothesisRecord] = []
    name = kinds[0]
    for run in held(check.fraction, limit):
        if run.layer in reported:
            continue
        where = f"'{run.layer}'" if run.layer else "the model"
        above = f"above max_fraction {limit:g}"
        text = f"{where}: up to {pct(run.peak)} {verdict.title(name)} ({above}), steps {run.start}-{run.end}"
        words = check.fraction_words.format(where=where)
        event: EventRecord = {
            "event_type": "activation",
            "kind": name,
            "layer": run.layer,
            "param": None,
            "step_start": run.start,
            "step_end": run.end,
            "from_state": None,
            "to_state": name,
            "metrics": {check.fraction: run.peak},
            "text": text,
            "where": where,
            "cause": None,
            "relation": None,
        }
        out.append(
            {
                "kind": name,
                "confidence": 1.0,
                "summary": f"{name} at {where} from step {run.start} ({above})",
                "explanation": (
                    f"Up to {pct(run.peak)} {words} over steps {run.start}-{run.end}, more than the "
                    f"{pct(limit)} allowed by max_fraction."
                ),
                "suggestion": "",
                "layer": run.layer,
                "step": run.start,
                "chain": [event],
            }
        )
    return out


def assert_learns(ndbg: Any, *, factor: float = learning.DEFAULT_FACTOR) -> None:
    """Fail unless the loss fell by ``factor`` over the run: "does it learn?", with NeuralDBG's diagnosis of why not.

    The classic smoke test of a training loop is that it can overfit one batch:
    ``assert_learns(neuraldbg.smoke_train(model, data, loss_fn, overfit=True))``.

    Statistic: the median of the first ``w`` recorded losses against the median of the last ``w``, with ``w`` a
    fifth of the recorded points, between 1 and 10 (10 for a 50-step run), so one noisy batch or spike does not
    decide. The run learns when ``last <= first / factor``; the default ``factor=2`` asks the loss to halve
    (it must be greater than 1). How many steps that takes depends on the model and the optimizer: with
    ``smoke_train``'s Adam at lr 1e-3, many small models halve the loss on one batch within 50 steps, but some
    take 100-200 (slow learners, large-scale regression targets); give them ``steps=200`` or a higher learning
    rate rather than a lower factor, which would let a barely moving loss pass. On a full dataset the loss falls
    more slowly still. The loss must be positive at the start.

    The failure message gives the verdict line with both numbers, the loss curve (step: loss at ten points)
    and then NeuralDBG's diagnosis of the run (dead layers, frozen parameters, stalled updates, ...), or says
    that it found no fault (and whether the loss is falling, only too slowly). A run that took no training step
    fails too.

    The loss comes from the run's history: recorded from the tensor each step's ``backward()`` starts from (no call
    needed in your own loop), or given to ``ndbg.observe_loss(loss)``. Works on a trace from :func:`neuraldbg.load`
    as well.
    """
    __tracebackhide__ = True
    helper = "assert_learns"
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1 or math.isinf(factor):
        raise ArgumentError(
            f"{helper}(factor=...): expected a number greater than 1 (2: the loss halves), got {factor!r}"
        )
    found = _hypotheses(ndbg, helper)
    steps = int(getattr(ndbg, "steps", 0) or 0)
    history = getattr(ndbg, "history", None)
    series = history.get("loss", "") if history is not None else None
    points = [(int(s), float(v)) for s, v in series.points()] if series is not None else []
    if steps == 0 and not points:
        _fail_to_learn(ndbg, "NeuralDBG: the run did not learn: it took no training step (0 steps observed)", [], found)
    if not points:
        raise ArgumentError(
            f"{helper}(): this run recorded no loss, so whether it learns cannot be judged: no backward pass started "
            "from a loss (backward(gradient=...) starts from the output). Call ndbg.observe_loss(loss) once per "
            "step, after computing the loss."
        )
    if len(points) < 2:
        raise ArgumentError(f"{helper}(): only one loss was recorded (step {points[0][0]}); train for 2 steps or more")
    drop = learning.loss_drop(points)
    if math.isfinite(drop.first) and drop.first <= 0:
        raise ArgumentError(
            f"{helper}() compares the loss by the factor it fell by, which needs a positive loss; this run's starts "
            f"at {learning.number(drop.first)} ("
            + (f"median of its first {drop.window} recorded losses)" if drop.window > 1 else "its first recorded loss)")
        )
    if not drop.learned(float(factor)):
        _fail_to_learn(ndbg, learning.verdict_line(drop, float(factor), steps), points, found, drop)


def _fail_to_learn(
    ndbg: Any,
    first_line: str,
    points: list[tuple[int, float]],
    found: list[HypothesisRecord],
    drop: learning.LossDrop | None = None,
) -> NoReturn:
    __tracebackhide__ = True
    parts = [first_line]
    shown: list[HypothesisRecord] = [inert_data(h) for h in found]  # names as visible escapes, one line each
    if points:
        parts.append(f"Loss curve (step: loss): {learning.curve(points)}")
    if shown:
        parts.append(verdict.headline(shown, "Why, according to NeuralDBG: training is unhealthy"))
        parts += [verdict.describe(h, i if len(shown) > 1 else None) for i, h in enumerate(shown, 1)]
    elif drop is not None and drop.fell_by >= SLOW_BUT_FALLING:
        parts.append(
            f"NeuralDBG found no training fault in this run, and the loss is falling ({drop.fell_by:.3g}x), only "
            "not fast enough for this check: train longer on the batch (more steps) or with a higher learning rate, "
            "or lower the factor."
        )
    else:
        parts.append(
            "NeuralDBG found no training fault in this run (no dead or saturated layer, no vanishing or exploding "
            "gradients, no frozen or stalled parameters, nothing non-finite). Check the learning rate, the loss "
            "function and the targets, or train for more steps."
        )
    _note_asserted(ndbg, found)
    raise AssertionError(inert("\n\n".join(parts), lines=True))
