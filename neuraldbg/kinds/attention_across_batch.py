"""Attention across the batch: an ``nn.MultiheadAttention`` (the one ``nn.Transformer`` and its encoder and decoder
layers call) reads its input's axes the wrong way round. At its default ``batch_first=False`` it takes dim 0 for
the sequence and dim 1 for the batch; fed ``(batch, sequence, features)`` straight from a DataLoader, each position
attends over the same position of the other samples of the batch, never along its own sequence (and the mirror:
``batch_first=True`` fed ``(sequence, batch, features)``). Every sample's output then mixes its batch-mates' and
misses its own context. Plain torch: a 2-layer ``nn.TransformerEncoder`` classifier reached 0.43 held-out accuracy
against 1.0 for the same model built with ``batch_first=True``, and a sample's logits moved by 3.5e-2 when its
batch-mates changed (by 0 in the twin). Nothing else in the run names it: the loss falls, slowly, on what each
position holds on its own.

Exact in what it reads, shapes only, on the first :data:`~neuraldbg.capture.forward.LAYOUT_CHECKS` fully observed
passes: the lengths of the axes each attention call read as its sequence and as its batch, kept when they are the
first two axes of the model's first tensor argument (its tokens or features, in either order), and the number of
samples the loss scores, read from its targets when they are one per sample (the ``(N,)`` labels of a
cross-entropy over ``(N, classes)``, the ``(N,)`` or ``(N, k)`` targets of a loss by value; see
:func:`~neuraldbg.capture.loss_graph.sample_targets`). A layer whose sequence axis is as long as the samples scored
and whose batch axis is not attends across the batch. A sequence-first model fed ``(sequence, batch)`` data (the
word language model of pytorch/examples batchifies its corpus so) has its batch axis as long as the samples: not
reported. Nor is one whose targets are per token (flattened to ``(sequence * batch,)``, or ``(sequence, batch)``):
they number no samples to compare with. Nor attention over other axes (an axial attention over an image's rows,
whose lengths may equal the batch by chance), nor a batch axis of one (attention across the batch on purpose, as
BatchFormer's over ``(batch, 1, features)``). Reported when the layout read so on at least half of the passes
judged. A batch as long as the sequence cannot be told apart: both axes then hold as many as the samples.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, quoted
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.ATTENTION_ACROSS_BATCH


def _across(coverage: Coverage) -> tuple[list[str], list[int]]:
    """The attention layers whose sequence axis held the samples on at least half of the passes judged, and the
    reading of the first of them to do so: [passes judged, passes found, first step, samples, batch axis length,
    batch_first]."""
    found = {name: c for name, c in coverage.batch_attention.items() if c[1] and 2 * c[1] >= c[0]}
    if not found:
        return [], []
    first = min(found.values(), key=lambda c: c[2])
    return list(found), first


class AttentionAcrossBatch(Kind):
    name = KIND.value
    title = "attention across the batch"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        layers, reading = _across(coverage)
        if not layers:
            return None
        judged, found, step, samples, length, batch_first = reading
        return run_event(
            KIND,
            step,
            max(step, coverage.last_step),
            ", ".join(layers),
            judged=float(judged),
            found=float(found),
            samples=float(samples),
            length=float(length),
            batch_first=float(batch_first),
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: before the loss findings it explains
        return RootLane(0, order=8) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False

    def place(self, event: SemanticEvent) -> str:
        return quoted(event.detail.split(", ")) if event.detail else "the attention layers"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        samples, length = count(m.get("samples", 0.0)), count(m.get("length", 0.0))
        layers = root.detail.split(", ") if root.detail else []
        one = len(layers) == 1
        if m.get("batch_first"):
            read = (
                f"{'was' if one else 'were'} built with batch_first=True and given (sequence, batch, features): the "
                f"{samples} samples the loss scores are read as the sequence and the {length} positions as the batch"
            )
            fix = (
                "feed the attention (batch, sequence, features): x.transpose(0, 1) before it, or build the layers "
                "with batch_first=False to match data laid out (sequence, batch)."
            )
        else:
            read = (
                f"{'is' if one else 'are'} at batch_first=False (torch's default) and {'was' if one else 'were'} "
                f"given (batch, sequence, features): dim 0, the {samples} samples the loss scores, is read as the "
                f"sequence and the {length} positions as the batch"
            )
            fix = (
                "build the layers with batch_first=True (nn.TransformerEncoderLayer(..., batch_first=True), "
                "nn.MultiheadAttention(..., batch_first=True)), or feed them x.transpose(0, 1), laid out (sequence, "
                "batch, features)."
            )
        what = (
            f"Attention across the batch: from step {root.step_start} {quoted(layers)} {read} (on "
            f"{count(m.get('found', 0.0))} of {count(m.get('judged', 0.0))} fully observed passes judged). Each "
            "position attends over the same position of its batch-mates, never along its own sequence: every "
            "sample's output mixes the other samples' and misses its own context."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"attention across the batch ({self.place(event)})"

    def label(self, event: SemanticEvent) -> str:
        return "attention across the batch"

    def effect(self, event: SemanticEvent) -> str:
        return "samples mixed with their batch-mates"
