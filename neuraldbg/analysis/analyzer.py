"""The host side of a run: detectors over each observed step, the tracker, the history, and the run-level findings.

:class:`Analyzer` is the recorder's sink. It is pure Python over host floats; a failing detector (a user's
plugin, say) is switched off with a warning, never allowed to break the training loop.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..capture.coverage import Coverage, RunFacts
from ..config import DebugConfig
from ..detectors.base import Context, Detector, Observation, StepView
from ..errors import NeuralDbgWarning
from ..events import SemanticEvent
from ..kinds import optimizer_settings
from ..kinds.base import Kind
from ..model.info import LayerInfo, owner_of_params
from ..stats.history import History, Series
from ..stats.step import SlotKey, StepData
from ..stats.training import input_rms
from .tracker import Tracker

#: The losses whose targets are values to fit (a mean squared error, a Huber loss): their targets' root-mean-square
#: is kept as the history series ``target_rms``, the scale the model's output must reach.
REGRESSION_LOSSES = ("mse", "huber")


class Analyzer:
    """Runs the detectors over each committed step, and the run-level checks of ``kinds`` over what was observed."""

    def __init__(
        self,
        config: DebugConfig,
        infos: dict[str, LayerInfo],
        order: list[SlotKey],
        detectors: Sequence[Detector],
        kinds: Sequence[Kind] = (),
    ) -> None:
        self.ctx = Context(config, infos, order, owner_of_params(infos))
        self.detectors = list(detectors)
        self._every_step = [d for d in self.detectors if d.every_step]
        # run-level kinds, and layer kinds that also judge the run as a whole (a stall over the whole run)
        self._run_kinds = [k for k in kinds if k.run_level or type(k).run_finding is not Kind.run_finding]
        self._undoing = [k for k in kinds if type(k).undone is not Kind.undone]  # kinds whose findings a run undoes
        self.tracker = Tracker(config, kinds)
        self.history = History(config.history_points)
        self._largest = Series(config.history_points)  # the largest layer gradient of each fully observed step
        self.steps_observed = 0
        self.full_steps = 0
        self.last_step = -1
        self.coverage = Coverage()
        self._facts: Callable[[], RunFacts] = _no_facts
        self._events_key: tuple[Any, ...] | None = None
        self._events: list[SemanticEvent] = []

    def watch_coverage(self, coverage: Coverage, facts: Callable[[], RunFacts]) -> None:
        """Count each analysed step into ``coverage``; ``facts()`` gives the recorder's counts for its findings. A
        recorder's method is held weakly: the recorder hands this analyzer each step it commits, and a reference back
        would make the two a cycle only the garbage collector frees (see :data:`~neuraldbg.capture.recorder._attached`);
        without its recorder, the counts are zero."""
        self.coverage = coverage
        method = weakref.WeakMethod(facts) if inspect.ismethod(facts) else None
        self._facts = facts if method is None else lambda: (method() or _no_facts)()

    def _quiet(self, detector: Detector, record: StepData) -> bool:
        """A cheap step that holds nothing ``detector`` would report, while no state it found is open."""
        return detector.quiet_on(record) and not self.tracker.has_open(detector.track_name)

    def consume(self, records: Sequence[StepData]) -> bool:
        """Analyse committed steps; True when a new abnormal state began (worth observing densely)."""
        started = self.tracker.started
        for record in records:
            if not record.full and all(self._quiet(d, record) for d in self._every_step):
                self._count(record)  # a quiet cheap step: nothing for any detector to see
                if record.loss is not None:
                    self.history.add("loss", "", record.step, record.loss)
                if record.loss_scale is not None:
                    self.history.add("loss_scale", "", record.step, record.loss_scale)
                continue
            view = StepView(record, self.ctx)
            seen: list[tuple[str, Observation]] = []
            for detector in list(self.detectors if record.full else self._every_step):
                if not record.full and self._quiet(detector, record):
                    continue  # a quiet cheap step changes nothing the tracker knows
                try:
                    obs = detector.observe(view)
                except Exception as exc:
                    self.detectors.remove(detector)
                    if detector in self._every_step:
                        self._every_step.remove(detector)
                    warnings.warn(
                        f"NeuralDBG disabled detector {detector.name!r}: it failed with {exc!r}",
                        NeuralDbgWarning,
                        stacklevel=2,
                    )
                    continue
                if obs is not None:
                    seen.append((detector.track_name, obs))
            self.tracker.update(record.step, seen)
            self._count(record)  # first: the history's input scale is capped by this step's entry scale too
            self._record_history(view)
        return self.tracker.started > started

    def _count(self, record: StepData) -> None:
        self.coverage.observe(record)
        self.steps_observed += 1
        self.full_steps += record.full
        self.last_step = max(self.last_step, record.step)

    def _record_history(self, view: StepView) -> None:
        data, add, step = view.data, self.history.add, view.step
        if data.loss is not None:
            add("loss", "", step, data.loss)
        if data.loss_scale is not None:  # a GradScaler's scale (it halves at each skipped step)
            add("loss_scale", "", step, data.loss_scale)
        if data.target_grad is not None:
            add("loss_gradient", "", step, data.target_grad)
        if data.baseline_kind in REGRESSION_LOSSES and len(data.target_baseline) == 5:  # the scale to fit
            add("target_rms", "", step, data.target_baseline[4])
        if not data.full:
            return
        if data.stepped:
            add("lr", "", step, max(data.stepped.values()))
        for name, value in data.settings.items():  # eps, momentum (kinds/optimizer_settings.py)
            add(name, "", step, value)
        rms = input_rms(data, self.coverage.training.entry_scale)
        if math.isfinite(rms):
            add("input_rms", "", step, rms)
        each = self.history.add_each
        grads = view.layer_gradients
        if grads:
            norms = [g.norm for g in grads.values()]
            each("grad_norm", step, zip(grads, norms))
            # the largest layer's, at the same steps (vanishing_gradients)
            self._largest.add(step, max([n for n in norms if n > 0.0 and math.isfinite(n)], default=0.0))
            if data.settings.get(optimizer_settings.EPS):
                total = sum([n * n for n in norms], 0.0)
                weights = sum([g.numel for g in grads.values()])
                if weights and math.isfinite(total):
                    # the gradients' root-mean-square per weight, which an adaptive optimizer's eps is weighed against
                    add(optimizer_settings.GRAD_RMS, "", step, math.sqrt(total / weights))
        ratios = [(layer, u.ratio) for layer, u in view.layer_updates.items()]
        each("update_ratio", step, [(layer, ratio) for layer, ratio in ratios if math.isfinite(ratio)])
        dead = {**data.func_dead, **data.dead}
        if dead:
            each("dead_fraction", step, [(k[0], d / units) for k, (d, units) in dead.items() if k[1] == 0 and units])
        if data.saturated:
            saturated = data.saturated.items()
            each("saturated_fraction", step, [(k[0], n / units) for k, (n, units) in saturated if k[1] == 0 and units])
        infos, layer_rms = self.ctx.infos, view.rms
        # layers with parameters: where an explosion is rooted (activations follow them)
        each("output_rms", step, [(k[0], layer_rms(k)) for k in data.act if k[1] == 0 and infos[k[0]].numel])
        if data.out_grad:
            each("output_grad_norm", step, [(k[0], norm) for k, norm in data.out_grad.items() if k[1] == 0])

    def run_findings(self) -> list[SemanticEvent]:
        """The run-level findings over what was observed so far."""
        facts = self._facts()
        return [e for k in self._run_kinds if (e := k.run_finding(self.coverage, facts)) is not None]

    def events(self, final: bool = False) -> list[SemanticEvent]:
        """The tracker's events, less those the rest of the run undid (:meth:`Kind.undone`), and the run-level
        findings, by onset; the same list until something changes."""
        base = self.tracker.events(final)
        if self._undoing and base:
            facts = dataclasses.replace(self._facts(), history=self.history, largest_gradient=self._largest)
            kept = [e for e in base if not any(k.undone(e, self.coverage, facts) for k in self._undoing)]
            base = kept if len(kept) < len(base) else base  # a new list only when the run undid one
        run = self.run_findings()
        # the tracker's events by identity (a run that undid one gives a new list of the same events at every call;
        # the cached list holds them, so an identity here is still theirs), the run-level findings by value (made
        # anew at every call): unchanged, the same list and the same event objects as last time, which a question
        # asked of them (a hypothesis, the trace's index of events) relies on
        key = (
            tuple(map(id, base)),
            *((e.kind, e.step_start, e.step_end, e.detail, *map(_comparable, e.metrics.values())) for e in run),
        )
        if key != self._events_key:
            self._events_key = key
            self._events = sorted([*base, *run], key=lambda e: (e.step_start, e.step_end)) if run else base
        return self._events

    def layer_order(self) -> list[str]:
        """Layer names in forward execution order (first calls only), then layers never seen in forward."""
        seen: list[str] = []
        names: set[str] = set()
        for layer, _ in self.ctx.order:
            if layer not in names:
                names.add(layer)
                seen.append(layer)
        rest = [n for n, info in self.ctx.infos.items() if n not in names and (n or info.numel)]
        return seen + rest


def _no_facts() -> RunFacts:
    return RunFacts(0, 0, 0)


def _comparable(value: float) -> float | str:
    """A metric as the events' cache compares it: NaN, which equals nothing (not even itself, unless the very same
    object), as a word; else a run-level finding with a NaN metric would be made anew, with new objects, at every
    question."""
    return "nan" if value != value else value
