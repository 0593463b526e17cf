"""Frozen parameters: a parameter that receives a non-zero gradient and is left exactly unchanged.

Measured, not inferred from optimizer settings: on fully observed steps the weights are copied before the optimizer
steps and compared after (see :class:`~neuraldbg.detectors.base.UpdateCensus`). A parameter missing from every
optimizer, or in a group with learning rate 0, is frozen. Parameters with ``requires_grad=False`` get no gradient
and are never reported: freezing a backbone on purpose is not a fault. Nor is a step its optimizer skipped: a
parameter stepped at an earlier observed step and not at this one belongs to an optimizer that steps on other steps
(a GAN's generator while the discriminator's optimizer steps); such a step says nothing about it. (Observed every
16th step, alternating optimizers would otherwise always be seen on the same player's turn.)

Unless it was left behind (:class:`_LeftBehind`): an optimizer stepped it, none has since, another steps the rest of
the model, and its gradient, which nothing zeroes any more, builds up. A new phase of the schedule that rebuilds the
optimizer over the head (``SGD(model.head.parameters())`` where ``model.parameters()`` was meant), measured on a CNN
rebuilt at step 300 of 1,500: the features unchanged at every fully observed step from 320 to the end, their
gradient from 0.19 when last stepped to 330, nothing stepping them while the head's optimizer stepped every step,
held-out accuracy 0.66 against 0.98 for the fixed twin. What tells it from an optimizer's turn: still for at least
half the run so far (one optimizer's turn among several is a shorter share, and a parameter that moves again later
was on a long turn: see :meth:`FrozenParameters.undone`), its share of the gradient at least 4 times what it was
when last stepped and twice what it was at the first reading that found it idle, measured against the parameters
stepped at both readings. A gradient zeroed every step (``model.zero_grad()``) keeps its share whatever the training
does to the gradients' scale; a backbone frozen on purpose for a head's fine-tuning (``requires_grad`` off, or run
under ``no_grad``) keeps the stale gradient of its last step, unchanged: neither is this. Its findings date the state
from the first reading whose gradient had built up, and confirm it once the share of the run is reached. A weight
changed since the latest reading moved out of sight (its optimizer steps between the readings), and is followed
again only once it is seen stepped.

When no parameter moves at all and the optimizers hold them with learning rate 0 (a learning-rate schedule that
reached 0), that is one global stall (:mod:`.stalled_updates`), not every parameter frozen. Parameters that no
optimizer holds stay frozen even then: a backbone frozen on purpose (``requires_grad=False``) beside a head left out
of the optimizer moves nothing, yet its fault is the head's, whatever the learning rate. When no optimizer steps
any parameter of the model and nothing moves (an optimizer built over the frozen backbone alone, or
``optimizer.step()`` never called), every parameter with a gradient is frozen, marked ``none_stepped`` for the
explanation.

A frozen parameter whose weight is all zeros (the layer's unit weight, see
:attr:`~neuraldbg.model.info.LayerInfo.unit_weight`) is marked ``zero_weight``: its layer passes no gradient to its
input, and, frozen, never will (a zero-initialised head left out of the optimizer zeroes every gradient upstream of
it). Parameters frozen for the same reason are one fault.

A phase without updates that the run later ended is a schedule, not a fault, when measured updates moved the
parameter early enough to leave more of the run to come than the phase had lasted. Linear probing before fine-tuning
with a second optimizer built over every parameter: the backbone, in no optimizer that stepped during the probe's 92
steps, read still at every fully observed step up to step 80 and moving at every one from 96 to 256, the end of the
run. Block-coordinate training that steps the backbone's optimizer for two epochs, then the head's, in turn: the
head still up to step 80, moving from step 96 on its turns, idle on the backbone's. A parameter truly left out never
moves, and one joined to the optimizer only for the last half of the run or less stays reported for the steps it was
left out (see :meth:`FrozenParameters.undone`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..capture.coverage import Coverage, RunFacts
from ..config import DebugConfig
from ..detectors.base import Detector, Finding, Observation, StepView
from ..events import EventType, FailureKind, SemanticEvent
from ..health import GradientHealth, UpdateHealth
from ..reasoning.rules import CausalRule
from ..reasoning.topology import Topology
from ..text import num, quoted
from .base import Check, Kind, RootLane, Series, held

KIND = FailureKind.FROZEN_PARAMETERS


class FrozenDetector(Detector):
    name = "frozen"
    track = "update"
    event_type = EventType.UPDATE
    every_step = False

    def __init__(self) -> None:
        self._left = _LeftBehind()

    def observe(self, view: StepView) -> Observation | None:
        census = view.updates
        if census is None:
            return None
        obs = Observation()
        obs.saw_params(self.event_type, census.seen)
        held_still = census.held
        if census.at_lr_zero:  # one global stall: the parameters the optimizers hold at lr 0 are not frozen
            held_still = [(layer, param, m) for layer, param, m in held_still if not m["in_optimizer"]]
        elif not census.moving and not census.stepped_ever:  # no optimizer steps any parameter of the model
            held_still = [(layer, param, {**m, "none_stepped": 1.0}) for layer, param, m in held_still]
        for layer, param, metrics in held_still:
            obs.findings.append(Finding(self.event_type, KIND, layer, UpdateHealth.FROZEN, metrics, 1.0, param=param))
        obs.findings.extend(self._left.observe(view, census.lr is not None))
        return obs


#: An idle parameter's gradient, measured against the gradients of the parameters that still step, this many times
#: what it was against theirs when it was last stepped, or more, is many steps' gradients summed: nothing zeroes it
#: since its optimizer stopped stepping. A gradient zeroed every step keeps its share, whatever the training does to
#: the gradients' scale; a stale one that no backward pass reaches any more never changes.
BUILT_UP = 4.0
#: ... and its share must have grown this many times over since the first reading that found it idle: still building.
STILL_GROWING = 2.0
#: The share of the run so far (from its first fully observed step) that a parameter left behind must have stayed
#: still for, since its optimizer last stepped it: one optimizer's turn among several is a shorter share.
LEFT_SHARE = 0.5


@dataclass
class _Idle:
    """A parameter its optimizer stepped at an earlier reading and no longer steps, as the readings since saw it."""

    since: int  # the last reading before it stopped changing
    grad: float  # its gradient norm then, one step's gradient
    share: float  # ... against the gradients of the parameters that still step, then
    first: float = math.nan  # its share at the first reading that found it idle
    last: float = math.nan  # its gradient norm at the latest reading


class _LeftBehind:
    """Parameters an optimizer stepped once, left still since while another optimizer steps the rest, whose
    gradients build up unused: the optimizer was rebuilt over part of the model (``SGD(model.head.parameters())``
    where ``model.parameters()`` was meant). See the module docstring.

    The gradients of the latest reading and their weights' norms are kept: a parameter's gradient then is one step's
    when it was stepped then, and a weight changed since moved after that reading (the last steps before the
    optimizer was rebuilt; its optimizer steps between the readings: a GAN's player on the other's turn). Its share
    is measured against the parameters stepped now, the same ones at both readings."""

    def __init__(self) -> None:
        self._grads: dict[str, float] = {}  # the latest reading's gradient norms of the stepped parameters
        self._weights: dict[str, float] = {}  # ... and every parameter's weight norm
        self._idle: dict[str, _Idle] = {}
        self._start = -1  # the first fully observed step
        self._previous = -1  # the latest one before this one

    def observe(self, view: StepView, others_stepped: bool) -> list[Finding]:
        data, step = view.data, view.step
        previous, self._previous = self._previous, step
        if self._start < 0:
            self._start = step
        grads, weights = self._grads, self._weights
        stepped = [g for name in data.stepped if math.isfinite(g := data.grad.get(name, math.nan))]
        now = math.sqrt(sum(g * g for g in stepped))
        then = math.sqrt(sum(grads.get(name, 0.0) ** 2 for name in data.stepped))
        found: list[Finding] = []
        for name, (delta, weight) in data.update.items():
            grad = data.grad.get(name)
            if grad is None or not math.isfinite(grad) or name in data.stepped:
                self._idle.pop(name, None)
                continue
            idle = self._idle.get(name)
            if idle is None or weight != weights.get(name):  # stopped changing after the latest reading
                before = grads.get(name)
                idle = None
                if before is not None and delta == 0.0 and then > 0:
                    idle = self._idle[name] = _Idle(previous, before, before / then)
                else:  # idle since before the latest reading, or moved out of sight: followed once seen stepped
                    self._idle.pop(name, None)
            if idle is None or delta != 0.0 or grad == 0.0 or now == 0.0:
                continue
            finding = self._finding(view, name, idle, grad, grad / now, others_stepped)
            if finding is not None:
                found.append(finding)
        self._grads = {name: data.grad[name] for name in data.stepped if name in data.grad}
        self._weights = {name: weight for name, (_, weight) in data.update.items()}
        return found

    def _finding(
        self, view: StepView, name: str, idle: _Idle, grad: float, share: float, others_stepped: bool
    ) -> Finding | None:
        stale, idle.last = grad == idle.last, grad  # no backward pass reaches it any more
        if math.isnan(idle.first):
            idle.first = share
        layer = view.ctx.owners.get(name)
        if layer is None or stale or not others_stepped or share < BUILT_UP * idle.share:
            return None
        # still while the run went on for long enough, its gradient still building up: left behind (a finding that
        # only dates the state while it may yet be one optimizer's long turn)
        step = view.step
        left = share >= STILL_GROWING * idle.first and step - idle.since >= LEFT_SHARE * (step - self._start)
        metrics = {
            "grad_norm": grad,
            "in_optimizer": 0.0,
            "lr": 0.0,
            "left_behind": 1.0,
            "last_stepped": float(idle.since),
            "stepped_grad": idle.grad,
        }
        strength = 1.0 - BUILT_UP * idle.share / share  # the further it built up, the stronger: the latest reading
        return Finding(
            EventType.UPDATE, KIND, layer, UpdateHealth.FROZEN, metrics, strength, param=name, provisional=not left
        )


@dataclass(frozen=True)
class SameFrozenCause(CausalRule):
    """Parameters frozen for the same reason (left out of the optimizer, or lr 0) are one fault."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        return (
            cause.kind is KIND
            and effect.kind is KIND
            and cause.metrics.get("in_optimizer") == effect.metrics.get("in_optimizer")
        )

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return None

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        return a.metrics.get("in_optimizer") == b.metrics.get("in_optimizer")


@dataclass(frozen=True)
class FrozenZeroWeightBlocks(CausalRule):
    """A frozen layer whose weight is all zeros passes no gradient to its input, and never will: the exactly-zero
    gradients upstream of it (earlier in forward order) are its effect (a zero-initialised head left out of the
    optimizer)."""

    def explains(self, cause: SemanticEvent, effect: SemanticEvent, topo: Topology) -> bool:
        if cause.metrics.get("zero_weight") != 1.0:
            return False
        zero = effect.metrics.get("exact_zero") == 1.0 or effect.metrics.get("grad_norm") == 0.0
        return zero and super().explains(cause, effect, topo)

    def applies_to(self, cause: SemanticEvent) -> bool:
        return cause.kind is self.cause_kind and cause.metrics.get("zero_weight") == 1.0

    def earliest_effect(self, cause: SemanticEvent) -> int | None:
        return super().earliest_effect(cause)

    def covers(self, a: SemanticEvent, b: SemanticEvent, topo: Topology) -> bool:
        blocks = a.metrics.get("zero_weight") == 1.0 or b.metrics.get("zero_weight") != 1.0
        return blocks and super().covers(a, b, topo)


class FrozenParameters(Kind):
    name = KIND.value
    lists_own = True
    states = (UpdateHealth.FROZEN,)
    check = Check("assert_parameters_update", "parameters do not update")

    def undone(self, event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
        """Parameters an optimizer held at learning rate 0 for a phase of the run, that moved once a schedule raised
        it (linear probing before fine-tuning: the backbone's group at 0 for its first steps; a warm-up from 0): their
        frozen state ended at a fully observed step before the last one, while the run still stepped with a learning
        rate above 0. A group at 0 to the end, and parameters left out of every optimizer to the end, stay frozen.

        Nor are parameters seen changed out of sight (see ``Recorder._note_moved_unseen`` and
        ``Recorder._moved_between_updates``) until the last change seen of any parameter, in their own rhythm (no
        longer after their last change than between two of them): their optimizer steps after the ``with dbg:``
        block, or in a block of its own, so every update measured reads zero (``close()`` commits the step before its
        update), and micro-batches closed after the run's last step read zero too; or an optimizer of their own steps
        them on other steps than the measured ones (every 50th iteration), so two measured updates in a row find them
        unchanged and they changed in between. A parameter truly left out of the optimizer does not change, and
        stays; one that stopped changing while others went on (a group set to learning rate 0 mid-run) stays too.

        Nor is a frozen phase that measured updates ended early enough: its parameter's layer moved at a fully
        observed step after the phase, and from that first move to the last fully observed step the run went on for
        longer than the phase had held it (from its start to that move). An optimizer over the head alone for the
        probe, then a new one over every parameter; two optimizers stepped in turn, a few epochs each: the
        parameters the first phase left out are trained by the second. A layer joined to the optimizer only for the
        last half of the run or less stays reported for the steps it was left out.

        Parameters left behind (:class:`_LeftBehind`) are undone by any measured move after their state ended: they
        were on an optimizer's long turn, not left out for the rest of the run."""
        m = event.metrics
        seen = coverage.moved_unseen.get(event.param) if event.kind is KIND and event.param is not None else None
        if seen is not None and coverage.last_unseen_move - seen[0] <= seen[1]:
            # changed out of sight, in its own rhythm until the last change seen (micro-batches closed after the
            # run's last step, an optimizer stepping every k-th iteration): updated where no update is measured
            return True
        if event.kind is not KIND:
            return False
        if m.get("left_behind") == 1.0:  # left behind for the rest of the run, or an optimizer's long turn
            return _first_move_after(event, facts) is not None
        if _trained_after(event, coverage, facts):
            return True
        if m.get("in_optimizer") != 1.0 or m.get("lr", 1.0) != 0.0:
            return False
        rows = coverage.training.rows
        return event.step_end < coverage.last_full_step and bool(rows) and rows[-1].lr > 0

    def detectors(self, config: DebugConfig) -> list[Detector]:
        return [FrozenDetector()]

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(5)

    def rules(self) -> list[CausalRule]:
        return [
            FrozenZeroWeightBlocks(
                "frozen-zero-weight-blocks",
                "zeroes the gradient of",
                KIND,
                (GradientHealth.VANISHING,),
                "upstream",
                same_place_joins=True,
            ),
            SameFrozenCause("frozen-together", "is frozen like", KIND, (KIND,), joins=True),
        ]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        events = [root, *[e for e in rest if e.kind is KIND]]
        params = [e.param or e.layer for e in events]
        layers = sorted({e.layer for e in events}, key=topo.position)
        grad = max(e.metrics.get("grad_norm", 0.0) for e in events)
        missing = root.metrics.get("in_optimizer", 0.0) == 0.0
        if root.metrics.get("left_behind") == 1.0:
            return _left_behind(root, events, params, layers, topo)
        if missing and root.metrics.get("none_stepped") == 1.0:
            reason = (
                "they are not in any optimizer, and no optimizer steps any parameter of the model (an optimizer built "
                "over other parameters, such as a frozen backbone's, or an optimizer.step() that is never called)"
            )
        else:
            reason = (
                "they are not in any optimizer that stepped during the run (in none, or in one whose step() is never "
                "called: a second optimizer left out of the loop, such as a SparseAdam for a sparse embedding)"
                if missing
                else "their optimizer group has learning rate 0"
            )
        zero = [e for e in events if e.metrics.get("zero_weight") == 1.0]
        blocked = ""
        if zero:
            blocking = sorted({e.layer for e in zero}, key=topo.position)
            blocked = (
                f" {quoted([e.param or e.layer for e in zero])} {'is' if len(zero) == 1 else 'are'} all zeros and, "
                f"frozen, stay{'s' if len(zero) == 1 else ''} so: no gradient passes back through {quoted(blocking)} "
                "to the layers before."
            )
        what = (
            f"Frozen parameters: {quoted(params)} (in {quoted(layers)}) receive gradients (norm up to {num(grad)}) "
            f"but never change {held(root, topo)}: {reason}.{blocked}"
        )
        if not missing:
            fix = "give that parameter group a non-zero learning rate "
        elif root.metrics.get("none_stepped") == 1.0:
            fix = (
                "build the optimizer over the parameters that train (e.g. torch.optim.AdamW(p for p in "
                "model.parameters() if p.requires_grad)) and call optimizer.step() after backward() "
            )
        else:
            fix = (
                "pass every trainable parameter to an optimizer that steps (e.g. "
                "torch.optim.AdamW(model.parameters()); a second optimizer needs its own step() each iteration) "
            )
        fix += "- or set requires_grad=False on them if freezing is intended."
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        if event.metrics.get("left_behind") == 1.0:
            since = int(event.metrics.get("last_stepped", 0))
            return f"not updated since step {since} although it gets gradients (its optimizer stopped stepping)"
        why = "not in any optimizer" if event.metrics.get("in_optimizer", 0.0) == 0.0 else "learning rate 0"
        return f"never updated although it gets gradients ({why})"

    def label(self, event: SemanticEvent) -> str:
        return "frozen: never updated"

    def effect(self, event: SemanticEvent) -> str:
        return "frozen parameters"


def _left_behind(
    root: SemanticEvent, events: list[SemanticEvent], params: list[str], layers: list[str], topo: Topology
) -> tuple[str, str]:
    """The words for parameters an optimizer stepped once and left behind (:class:`_LeftBehind`)."""
    since = int(root.metrics.get("last_stepped", 0))
    top = max(events, key=lambda e: e.metrics.get("grad_norm", 0.0)).metrics
    grown = f"{num(top['grad_norm'])}, from {num(top.get('stepped_grad', 0.0))} when last stepped"
    what = (
        f"Frozen parameters: {quoted(params)} (in {quoted(layers)}) receive gradients but stay unchanged "
        f"{held(root, topo)}: an optimizer stepped them until after step {since} (the last fully observed step "
        "before they stopped changing) and none has since, while another optimizer steps the rest of the model. "
        f"Their gradients, which nothing zeroes any more, built up to norm {grown}: an optimizer rebuilt over "
        "part of the model (a new phase of the schedule built over model.head.parameters() where "
        "model.parameters() was meant) leaves the rest behind."
    )
    fix = (
        "build the new optimizer over every parameter that trains (e.g. torch.optim.SGD(model.parameters(), ...)) "
        "- or, if the rest is meant to stay frozen, set requires_grad=False on it."
    )
    return what, fix


def _first_move_after(event: SemanticEvent, facts: RunFacts) -> int | None:
    """The first step after ``event`` ended at which measured updates moved its layer (its update ratio, zero while
    the parameter was held still, reads the move): an optimizer stepped it again. None when none did."""
    series = facts.history.get("update_ratio", event.layer) if facts.history is not None else None
    return next((step for step, ratio in series or () if step > event.step_end and ratio > 0), None)


def _trained_after(event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
    """Whether measured updates moved ``event``'s layer after its frozen phase, from a first move that left more of
    the run to come than the phase had lasted (:meth:`FrozenParameters.undone`). The layer's update ratio is the
    measurement: zero while the parameter was held still, it reads the move that ended the phase. What followed the
    move is the detector's to judge: held still again, the parameter opens a frozen phase of its own; left alone
    while another optimizer steps, it is idle, not frozen."""
    first = _first_move_after(event, facts)
    return first is not None and coverage.last_full_step - first > first - event.step_start
