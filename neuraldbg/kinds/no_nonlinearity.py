"""No nonlinearity: the whole model is one affine map. Two or more layers (Linear, convolutions) compose, one reading
what another wrote, with nothing nonlinear between them, no activation, no max-pool, no attention, so the stack computes
what a single layer could and the fit stops where a linear model's does. The usual cause is an activation forgotten:
``nn.Identity()`` where ``nn.ReLU()`` was meant, an activation built in ``__init__`` and never called in ``forward``.
Plain torch, the same programs without their activations: a tabular classifier's accuracy 0.79 against 0.88, a temporal
conv net's R^2 0.80 against 0.98, a coordinate MLP on Fourier features R^2 0.17 against 0.95.

Read from the forward pass's autograd graph on the first fully observed steps (see :mod:`neuraldbg.capture.affine`: node
types only, no value). In a model that is not one affine map (its attention or a max-pool is nonlinear), two trainable
Linear or convolution layers whose output and input meet through nodes linear in the data along one path, one of them
reading each position alone (a Linear, a 1x1 convolution) so that the other could compute the pair by itself (an
activation left out of a transformer's feed-forward block, or before a U-Net's 1x1 output convolution), are found the
same way; a lower layer that narrows its input (a LoRA adapter, a linear bottleneck) or is grouped (a depthwise
convolution) is a design, not this fault (plain torch: a ViT without its feed-forward activation 0.77 against 0.85, a
U-Net without its activations Dice 0.85 against 0.90). So are two convolutions whose kernels both span positions: they
compose into a wider kernel (two 3x3 into a 5x5, with fewer weights), a factorisation neither layer computes alone
(plain torch: a stem convolution feeding a convolution block directly, accuracy 1.000 with or without an activation
after the stem; double-convolution blocks without their first activation, 1.000 as with it). Judged, as dropout too
strong is, only on a run whose loss was judged (``loss_min_steps`` losses) and did not converge (it fell a hundredfold:
the task was linear enough and the missing activation held nothing back). A single layer (logistic regression, a linear
probe) is a linear model by design and never this finding, and so are layers side by side that each read the data and
are summed, composing nothing (DLinear's trend and seasonal heads: plain torch, its held-out error 0.0117 against 0.0112
for the least-squares linear optimum and a noise floor of 0.0100): the count is of the layers in series along one data
path, the depth of the composition, not of the layers in the graph. So are trained layers on the features of a frozen
backbone (a head with a LoRA update, a linear bottleneck adapter): the graph holds only the operations on tensors that
need a gradient, so a frozen backbone's activations are not in it, and the trained layers alone read as one affine map.
The hooks see those activations run (their units are read); a graph found affine while an activation ran is not the
whole model, and is no finding.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count
from . import loss_evidence
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.NO_NONLINEARITY

#: Layers in series composed into the one affine map, at least (one layer alone, or layers side by side, is a linear
#: model by design).
MIN_LAYERS = 2


class NoNonlinearity(Kind):
    name = KIND.value
    title = "no nonlinearity"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        layers = coverage.affine_layers
        # the graph holds only the operations on tensors that need a gradient: an activation the hooks saw run that
        # a graph found affine does not hold ran before the trained layers, on data no gradient reaches (a frozen
        # backbone), and those layers are a probe or an adapter on its features, not the whole model
        whole = layers is not None and layers >= MIN_LAYERS and not coverage.activation_ran
        pairs = sorted(coverage.linear_pairs)
        if not whole and not pairs:
            return None
        curve = loss_evidence.judged(coverage, facts.config)
        if curve is None or loss_evidence.converged(coverage, curve):
            return None  # a run too short to judge its fit, or a fit the missing activation held nothing back from
        rows = coverage.training.rows
        first = rows[0].step if rows else 0
        if whole:
            return run_event(KIND, first, max(first, coverage.last_step), "", layers=float(layers or 0))
        detail = ", ".join(f"{lower} > {upper}" for lower, upper in pairs)
        return run_event(KIND, first, max(first, coverage.last_step), detail, pairs=len(pairs))

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # the model as it was built, in force from its first step: with the run's settings, before the loss findings
        return RootLane(2.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the architecture

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        if "pairs" in root.metrics:
            pairs = [p.split(" > ") for p in root.detail.split(", ") if " > " in p]
            shown = "; ".join(f"'{lower}' feeds '{upper}'" for lower, upper in pairs[:3])
            more = f" and {len(pairs) - 3} more pairs" if len(pairs) > 3 else ""
            what = (
                f"No nonlinearity between layers: {shown}{more}, with nothing nonlinear between them (no activation; "
                "only reshapes, dropout, batch norm), and one of each pair reads each position alone (a Linear, a 1x1 "
                "convolution), so the pair computes one linear map the other layer could compute by itself: the "
                "width between them adds nothing, and the model is far less expressive than it looks."
            )
            return what, self._fix
        layers = count(root.metrics.get("layers", 0.0))
        what = (
            f"The model is one affine map: its {layers} layers in series (linear maps and convolutions) compose with "
            "nothing nonlinear between them (no activation, no max-pool, no attention in its forward pass), so "
            "together they compute what a single layer could, and the fit stops where a linear model's does."
        )
        return what, self._fix

    _fix = (
        "put an activation between the layers (nn.ReLU, nn.GELU, nn.SiLU): check that none was replaced by "
        "nn.Identity() and that forward() calls the ones __init__ builds."
    )

    def describe(self, event: SemanticEvent) -> str:
        if "pairs" in event.metrics:
            return f"{count(event.metrics['pairs'])} pair(s) of layers with nothing nonlinear between them"
        return f"one affine map of {count(event.metrics.get('layers', 0.0))} layers in series"

    def place(self, event: SemanticEvent) -> str:
        return "the model"
