"""Dropout far too strong: a dropout layer (or a recurrent layer or attention with a dropout) drops at least
:data:`~neuraldbg.config.HEAVY_DROPOUT` of its inputs on the steps the model trained in training mode. Each
step then trains a small random part of the network on a small random part of the signal, scaled up to make up for
the rest: the gradient is mostly noise and the fit stalls far above what the model can reach, while every
gradient, activation and update looks sound (plain torch, six program families at p=0.9 against their twins at
0.1-0.5: held-out accuracy 0.55 against 0.88 on a tabular classifier, 0.49 against 0.88 on a transformer encoder,
0.60 against 0.85 on a residual net, F1 0.30 against 0.73 on a multi-label conv net, R^2 0.89 against 0.98 on a
temporal conv net).

Read from the model when the debugger attaches (the layers and their probability, see
:func:`~neuraldbg.model.layers.heavy_dropout_layers`), and from the loss's graph on the first fully observed
backward passes for a dropout that is no module (``F.dropout(x, 0.9)`` in ``forward``, an inverted dropout by hand:
:mod:`~neuraldbg.capture.dropout_graph`). A module's is not found when every training step ran in eval mode (dropout
was off: the eval-mode room's finding; one read from the graph ran). Neither is found on a run whose loss cannot
be judged (fewer than ``loss_min_steps`` losses: a smoke run says its loss was not judged), nor when the loss
converged (it fell a hundredfold: the dropout held nothing back).
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..config import HEAVY_DROPOUT
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import num, pct
from . import loss_evidence
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.EXCESSIVE_DROPOUT
#: How a dropout read from the loss's graph (no module: ``F.dropout`` in ``forward``, a mask by hand) is named.
FORWARD_CODE = "F.dropout or a dropout mask in forward()"
#: A rate read from the graph (in float32: 1 - 1 / 5 may read just below 0.8) this close to a heavy module's is that
#: module's (its masks are in the graph too), this close to the limit at it.
_SAME_RATE = 1e-3


def heavy_dropouts(coverage: Coverage) -> list[tuple[str, float]]:
    """The run's dropouts of at least :data:`~neuraldbg.config.HEAVY_DROPOUT`, each named with its rate: the modules'
    (their settings count on steps trained in training mode), and one read from the loss's graph (it ran) unless a
    module of its rate stands for it."""
    heavy = coverage.heavy_dropout if coverage.steps > len(coverage.eval_steps) else []
    rate = coverage.graph_dropout
    if rate >= HEAVY_DROPOUT - _SAME_RATE and not any(abs(p - rate) < _SAME_RATE for _, p in heavy):
        heavy = [*heavy, (FORWARD_CODE, rate)]
    return heavy


class ExcessiveDropout(Kind):
    name = KIND.value
    title = "dropout too strong"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        heavy = heavy_dropouts(coverage)
        if not heavy:
            return None
        curve = loss_evidence.judged(coverage, facts.config)
        if curve is None or loss_evidence.converged(coverage, curve):
            return None  # a run too short to judge its fit, or a fit the dropout held nothing back from
        rows = coverage.training.rows
        first = rows[0].step if rows else 0
        layers = ", ".join(f"{name} p={num(p)}" for name, p in heavy)
        return run_event(
            KIND,
            first,
            max(first, coverage.last_step),
            layers,
            p=max(p for _, p in heavy),
            layers=len(heavy),
            limit=HEAVY_DROPOUT,
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a setting of the model, in force from its first step: after acute failures, before the layer states and
        # the loss findings it leaves (as weight decay too strong)
        return RootLane(2.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the model's setting

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        p = root.metrics.get("p", 0.0)
        count = int(root.metrics.get("layers", 1.0))
        which = f" ({root.detail})" if root.detail else ""
        who = f"{count} layer{'s' if count != 1 else ''}{which} drop{'' if count != 1 else 's'}"
        if count == 1 and root.detail.startswith(FORWARD_CODE):  # no module: a dropout read from the loss's graph
            who = f"the model's forward code ({root.detail}) drops"
        what = (
            f"Dropout far too strong: {who} "
            f"up to {pct(p)} of {'their' if count != 1 else 'its'} inputs on every training step from step "
            f"{root.step_start}. Each step trains a small random part of the network on a small part of the signal "
            f"(scaled up {num(1 / max(1 - p, 1e-12))}x to make up for the rest), so the gradient is mostly noise and "
            "the fit stalls far above what the model can reach, while gradients, activations and updates look sound."
        )
        fix = (
            "lower the dropout probability: 0.5 is the usual largest on hidden layers, 0.1-0.2 on inputs, embeddings "
            "and in transformers; check that p is the probability to drop, not to keep."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"dropout up to {pct(event.metrics.get('p', 0.0))}"
