"""Detached layers: the forward pass hands a later layer an earlier layer's output detached from the autograd graph
(``h.detach()``, ``h.data`` between two layers), so no gradient flows back past that point, and the layers before it
never train although an optimizer holds their parameters.

Exact in what it reads, from metadata only (nothing is read from the device): on the first 8 fully observed forward
passes (a program cuts its graph the same way on every pass), a watched layer's first argument does not require a
gradient while it lies in the same memory as the output of an earlier layer of the same pass that does (a detached
view of it; that output is still alive, so the memory is its: the event names that layer), or, after functional ops,
while layers with a gradient ran before it in that pass and the value is none of the model's own tensor arguments
(the data, normalised inside ``forward``, is such a value at the first layer, which nothing precedes); and over the
run, parameters that an optimizer stepped at a learning rate above 0, and that require a gradient, never held one on
any fully observed step, while others did. The finding needs both, and those parameters in layers that come before
the layer given the detached value: a cut that something else compensates is not one. A GAN's discriminator given
the generator's output detached (the generator trains on its own turn), truncated backpropagation through time,
forward-forward layers each trained by a local loss, an actor-critic whose critic reads the shared trunk's features
detached (the actor's loss trains the trunk) and a linear probe on a detached encoder that no optimizer holds are
all silent. A layer run under ``torch.no_grad()`` is not looked at (freezing a backbone that way is common and
deliberate), nor a cut whose detached value reaches the loss through functional ops alone without entering a watched
layer (an embedding detached into a dot product): the parameters that never held a gradient are then not told apart
from a layer whose output is computed and not used (``BertModel``'s pooler beside a head on the first token).
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import EventType, FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, quoted
from .base import Kind, RootLane, Series, layer_event

KIND = FailureKind.DETACHED_LAYERS

#: Fully observed steps with a gradient needed before parameters that never held one are called untrained.
LEAST_STEPS = 3


def _layer_of(param: str) -> str:
    return param.rpartition(".")[0]


class DetachedLayers(Kind):
    name = KIND.value
    title = "layers detached from the loss"
    run_level = True  # about the program's graph (its event names the layer whose output was detached)

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        if not coverage.cuts or coverage.graded_steps < LEAST_STEPS:
            return None
        untrained = sorted(coverage.optimized - coverage.graded)
        if not untrained:
            return None
        order = {name: i for i, name in enumerate(coverage.layer_order)}
        # a cut whose detached layer is known first, then the earliest layer cut off from what ran before it
        cuts = sorted(coverage.cuts.items(), key=lambda item: (not item[0][0], order.get(item[0][1], len(order))))
        for (upstream, downstream), seen in cuts:
            below = order.get(downstream)
            if below is None:
                continue
            layers = list(dict.fromkeys(_layer_of(p) for p in untrained))
            cut_off = sorted((layer for layer in layers if order.get(layer, below) < below), key=order.__getitem__)
            if not cut_off:
                continue
            params = [p for p in untrained if _layer_of(p) in cut_off]
            step = coverage.cut_step
            metrics = {
                "passes": float(seen),
                "parameters": float(len(params)),
                "layers": float(len(cut_off)),
                "steps": float(coverage.graded_steps),
            }
            detail = "\n".join([downstream, *cut_off])
            return layer_event(
                KIND, upstream, step, coverage.last_step, metrics, detail, event_type=EventType.ACTIVATION
            )
        return None

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: beside the activation before a loss
        return RootLane(3.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the program cuts its graph this way from the first step

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        downstream, *cut_off = root.detail.split("\n") if root.detail else ("", "")
        passes = count(m.get("passes", 0.0))
        if root.layer:
            given = (
                f"'{downstream}' is given the output of '{root.layer}' detached from the autograd graph (the same "
                f"values without a gradient: a .detach() or .data between them, seen on {passes} fully observed "
                "forward passes)"
            )
            where = f"between '{root.layer}' and '{downstream}'"
        else:
            given = (
                f"'{downstream}' is given a value that carries no gradient, though layers with one ran before it "
                f"and the value is not the model's input (a .detach(), .data, or a computation outside autograd "
                f"before it, seen on {passes} fully observed forward passes)"
            )
            where = f"before '{downstream}'"
        what = (
            f"Layers detached from the loss: from step {root.step_start}, {given}. No gradient flows back past that "
            f"point: the {count(m.get('parameters', 0.0))} parameters of {quoted(cut_off)} before it, which the "
            f"optimizer holds, held no gradient on any of the {count(m.get('steps', 0.0))} fully observed steps "
            "with a gradient, and never trained."
        )
        fix = (
            f"remove the .detach() (or .data, .item(), .numpy()) {where} so the loss trains the layers before it; "
            "if they are meant to stay fixed, set requires_grad=False on their parameters and leave them out of "
            "the optimizer."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        downstream = event.detail.split("\n", 1)[0] if event.detail else ""
        layers = count(event.metrics.get("layers", 0.0))
        return f"graph cut before '{downstream}' ({layers} layers before it never train)"

    def label(self, event: SemanticEvent) -> str:
        return "output detached from the graph"

    def effect(self, event: SemanticEvent) -> str:
        return "layers cut off from the loss"
