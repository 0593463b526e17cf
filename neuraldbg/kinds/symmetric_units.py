"""Identical units: every output unit of a layer started with the same weights (a constant initialisation:
``nn.init.constant_(w, 0.05)``, ``w.data.fill_(...)``, filters copied from one), and training has not told them
apart. Each unit computes the same value, gets the same gradient and takes the same update; only a random bias,
dropout's masks or a next layer with distinct weights part them, slowly, so the layer works as a few units
repeated. Plain torch, weights 0.05 against the default initialisation: a tabular classifier's accuracy 0.64
against 0.88 (its hidden rows differ by 0.23 of their norm after 188 steps), a multi-label conv net's F1 0.0
against 0.73 (its filters move in lockstep and die together), a residual net's accuracy 0.33 against 0.85 (its
filters stay exact copies: batch norm cancels their gradient).

Zero weights in two layers or more (every layer zeroed) are the other way units start alike: a layer given a
constant input (the zero layer before it passes only its bias) or a constant error takes updates whose rows are
multiples of one row, so its units move along one direction as scaled copies (plain torch, a multi-label MLP with
every weight zeroed: F1 0.46 against 0.91, its hidden and last layers still 0.99 along one direction after 300 Adam
steps). Those are told in words of their own (metric ``zero_started``). Where the model has two outputs or fewer,
one direction is read as the fault only where a zero layer beside it holds the layer there (the lower one's units
move along the direction the upper one reads, or the lower one is still all zero): the loss of a binary classifier or
a one-output regression gives one error direction per sample, which holds a zero layer to one direction alone, and
harmlessly. The last layer of the top residual branch, zero-started as is usual, so keeps rows that are multiples of
one row, the head's row difference (plain torch: 0.01-0.05 of its energy off one direction at step 200, 0.5 by step
2000, accuracy 0.995 as from the default start), while the zeroed layers of an MLP hold each other at 0.92-1.0 of
alignment.

Read by :mod:`neuraldbg.capture.symmetry`: when the debugger attached, every row of the layer's weight was equal
and not zero (or, beside another zero weight, all zero), and on the fully observed steps since, after the optimizer
moved those weights, the rows' spread (``||W - mean row|| / ||W||``, about 1 for a default initialisation; for zero
starts the energy outside the largest row's direction) stayed at most :data:`~neuraldbg.capture.symmetry.PARTED`
(:data:`~neuraldbg.capture.symmetry.ONE_DIRECTION`). A lone zero weight (a last layer, a residual branch or an
adapter that starts at zero, whose units part at the first update) is never a candidate, nor is a normalisation
layer's gain of any shape (elementwise: ``nn.LayerNorm([C, H, W])``'s is no set of units sharing one input); a
grouped convolution's rows are compared within each group (only they read the same input channels), so depthwise
kernels that all start as one blur are no candidate. A layer
whose outputs are the model's outputs (a head, or heads summed into the output, as DLinear's two, both set to 1/L)
is dropped at its first check unless it started at zero: each unit answers to an output of its own and the loss
gives each its own gradient (plain torch: gradient rows differing by 0.69-0.81 of their norm from the first step,
the forecast at the least-squares optimum), so rows that stay alike there are the task's answer. Reported once it
held on :data:`MIN_STEPS` checks, at any length of run: the initialisation is the fault whatever the loss did.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..health import ActivationHealth, GradientHealth
from ..reasoning.rules import CausalRule
from ..reasoning.topology import Topology
from ..text import count, num, quoted
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.SYMMETRIC_UNITS

#: A spread below which the rows are the same but for float rounding (the exact copies batch norm keeps).
SAME = 1e-5
#: A spread below which the units are near-copies (random biases part them this slowly); above, up to
#: :data:`~neuraldbg.capture.symmetry.PARTED`, dropout's masks have begun to part them.
NEAR = 0.5
#: Fully observed steps on which the units were still identical after an update, at least.
MIN_STEPS = 2


def _layers(event: SemanticEvent) -> list[str]:
    """The layers a finding names (its detail lists them)."""
    return [n for n in event.detail.split(", ") if n]


class SymmetricUnits(Kind):
    name = KIND.value
    title = "identical units"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        held = {layer: v for layer, v in coverage.symmetric.items() if v[3] >= MIN_STEPS}
        if not held:
            return None
        first = min(v[1] for v in held.values())
        last = max(v[2] for v in held.values())
        layers = sorted(held, key=lambda layer: held[layer][1])
        zero = any(layer in coverage.zero_started for layer in layers)
        return run_event(
            KIND,
            first,
            last,
            ", ".join(layers),
            layers=len(layers),
            units=max(v[0] for v in held.values()),
            checks=min(v[3] for v in held.values()),
            spread=max(v[4] for v in held.values()),
            zero_started=float(zero),
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # the model as it was built: in force before the first update, so before what it sets off
        return RootLane(0, order=5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the initialisation, not the learning rate

    def rules(self) -> list[CausalRule]:
        return [
            CausalRule(
                "identical-units-die-together",
                "makes every unit behave alike, so they fall into",
                KIND,
                (ActivationHealth.DEAD, ActivationHealth.SATURATED),
                same_place_joins=True,
            ),
            CausalRule(
                "identical-units-starve-gradients",
                "leaves gradients that cancel or pile up into",
                KIND,
                (GradientHealth.VANISHING, GradientHealth.EXPLODING),
                same_place_joins=True,
            ),
        ]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        names = _layers(root)
        layers = quoted(names, 3) if names else "a layer"
        many = len(names) != 1
        units = count(m.get("units", 0.0))
        spread = m.get("spread", 0.0)
        if spread < SAME:
            now = "every unit's weights were still the same, to within rounding"
        else:
            now = (
                f"the units' weights still differed by at most {num(spread)} of the weight's norm (about 1 for a "
                "random initialisation)"
            )
        if m.get("zero_started"):
            return self._one_direction(root, layers, many, units, spread)
        alike = "nearly the same" if spread < NEAR else "much the same"
        what = (
            f"Identical units: every output unit of {layers} started with the same weights (up to {units} units per "
            f"layer), and training has not told them apart: on {count(m.get('checks', 0.0))} fully observed steps "
            f"from step {root.step_start}, after the optimizer had moved the weights, {now}. Each unit computes "
            f"{alike} value, gets {alike} gradient and takes {alike} update as the others (only a random bias or "
            f"dropout's masks tell them apart), so {'each layer' if many else 'the layer'} holds far fewer distinct "
            "units than it has."
        )
        fix = (
            "initialise the weights randomly (keep PyTorch's default initialisation, or nn.init.kaiming_uniform_ / "
            "xavier_uniform_); a constant such as nn.init.constant_(w, 0.05) or fill_() gives every unit the same "
            "weights. Zero or constant weights are safe only where the next layer tells the units apart (a last "
            "layer, a residual branch's last layer)."
        )
        return what, fix

    def _one_direction(
        self, root: SemanticEvent, layers: str, many: bool, units: str, spread: float
    ) -> tuple[str, str]:
        """The words for layers that started at zero beside other zero layers (:mod:`neuraldbg.capture.symmetry`)."""
        what = (
            f"Units moving as one: every weight of {layers} started at zero (up to {units} units per layer), as did "
            "a layer beside each, so each of these layers was given a constant input or errors along one direction "
            "by its zero neighbour and every update moved all its units along one direction: on "
            f"{count(root.metrics.get('checks', 0.0))} fully observed steps from step {root.step_start}, after the "
            "optimizer had moved the weights, each unit's weights were still a multiple of one row (at most "
            f"{num(spread)} of the weight's energy outside that row's direction; about 1 for a random "
            "initialisation). Each unit computes a scaled copy of one value, so "
            f"{'each layer holds' if many else 'the layer holds'} about one unit's worth of features however many it "
            "has."
        )
        fix = (
            "initialise the weights randomly (keep PyTorch's default initialisation, or nn.init.kaiming_uniform_ / "
            "xavier_uniform_) instead of zeroing every layer; a zero weight is safe only where its input and its "
            "error vary from sample to sample: one last layer, each residual branch's last layer, an adapter beside "
            "a random one."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"identical units in {count(event.metrics.get('layers', 0.0))} layer(s)"

    def place(self, event: SemanticEvent) -> str:
        names = _layers(event)
        return quoted(names, 3) if names else "the run"
