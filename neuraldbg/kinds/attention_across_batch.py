"""The batch read as the sequence: an ``nn.MultiheadAttention`` (the one ``nn.Transformer`` and its encoder and
decoder layers call) or a recurrent layer (``nn.RNN``, ``nn.LSTM``, ``nn.GRU``: any ``nn.RNNBase``) reads its input's
axes the wrong way round. At its default ``batch_first=False`` it takes dim 0 for the sequence and dim 1 for the
batch; fed ``(batch, sequence, features)`` straight from a DataLoader, each position of an attention attends over
the same position of the other samples of the batch, never along its own sequence, and a recurrence steps from one
sample to the next down the batch (and the mirror: ``batch_first=True`` fed ``(sequence, batch, features)``).
Every sample's output then mixes its batch-mates' and misses its own context. Plain torch: a 2-layer
``nn.TransformerEncoder`` classifier reached 0.43 held-out accuracy against 1.0 for the same model built with
``batch_first=True``, and a sample's logits moved by 3.5e-2 when its batch-mates changed (by 0 in the twin); an
``nn.LSTM`` classifier whose class sits in its first token, read at ``out[:, -1]``, 0.23 against 1.0 (four
classes), the last sample's logits moving by 1.3e-2 when the samples before it changed (0 in the twin). Nothing
else in the run names it: the loss falls, slowly, on what each position holds on its own, or stays at chance,
where the labels are not at fault.

Exact in what it reads, shapes only, on the first :data:`~neuraldbg.capture.forward.LAYOUT_CHECKS` fully observed
passes: the lengths of the axes each attention or recurrent call read as its sequence and as its batch (a recurrent
layer given a packed sequence, laid out by torch, or an unbatched 2-d input is not read), kept when they are the
first two axes of the model's first tensor argument (its tokens or features, in either order), and the number of
samples the loss scores, read from its targets when they are one per sample (the ``(N,)`` labels of a
cross-entropy over ``(N, classes)``, the ``(N,)`` or ``(N, k)`` targets of a loss by value; see
:func:`~neuraldbg.capture.loss_graph.sample_targets`). A layer whose sequence axis is as long as the samples scored
and whose batch axis is not reads across the batch. A sequence-first model fed ``(sequence, batch)`` data (the
word language model of pytorch/examples batchifies its corpus so, for its ``nn.TransformerEncoder`` and its
``nn.LSTM``) has its batch axis as long as the samples: not reported. Nor is one whose targets are per token
(flattened to ``(sequence * batch,)``, ``(sequence, batch)``, or a tagger's ``(batch, sequence)`` against
``(batch, classes, sequence)``): they number no samples to compare with, so a tagger fed the wrong way round goes
unreported. Nor attention over other axes (an axial attention over an image's rows, whose lengths may equal the
batch by chance), nor a batch axis of one (attention across the batch on purpose, as BatchFormer's over
``(batch, 1, features)``; a model trained one sample a step laid out as its layer reads it). A batch of one sample
read the wrong way round is reported, worded for what it is: its sequence read as a batch of one-step sequences
(the LSTM above trained one sample a step: 0.27 held-out accuracy against 1.0, its output blind to every token but
the last). Reported when the layout read so on at least half of the passes judged. A batch as long as the sequence
cannot be told apart: both axes then hold as many as the samples. The text names the layer's class from the
model's topology, and tells a recurrent layer (any ``nn.RNNBase``, whatever its class is called) from an attention
by what the capture saw (metric ``recurrent``: how many of the layers named, listed first, are recurrent).
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, quoted
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.ATTENTION_ACROSS_BATCH


def _across(coverage: Coverage) -> tuple[list[str], list[int]]:
    """The attention and recurrent layers whose sequence axis held the samples on at least half of the passes
    judged, and the reading of the first of them to do so: [passes judged, passes found, first step, samples, batch
    axis length, batch_first]."""
    found = {name: c for name, c in coverage.batch_attention.items() if c[1] and 2 * c[1] >= c[0]}
    if not found:
        return [], []
    first = min(found.values(), key=lambda c: c[2])
    return list(found), first


class AttentionAcrossBatch(Kind):
    name = KIND.value
    title = "batch read as the sequence"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        layers, reading = _across(coverage)
        if not layers:
            return None
        judged, found, step, samples, length, batch_first = reading
        recurrent = [name for name in layers if name in coverage.recurrent]
        return run_event(
            KIND,
            step,
            max(step, coverage.last_step),
            ", ".join(recurrent + [name for name in layers if name not in coverage.recurrent]),
            recurrent=float(len(recurrent)),
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
        return quoted(event.detail.split(", ")) if event.detail else "the sequence layers"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        samples, length = m.get("samples", 0.0), count(m.get("length", 0.0))
        scored = "the one sample the loss scores" if samples == 1 else f"the {count(samples)} samples the loss scores"
        layers = root.detail.split(", ") if root.detail else []
        types = _kinds(layers, topo, m.get("recurrent"))
        recurrent = any(r for _, r in types)
        one = len(layers) == 1
        if m.get("batch_first"):
            read = (
                f"{'was' if one else 'were'} built with batch_first=True and given (sequence, batch, features): "
                f"{scored} {'is' if samples == 1 else 'are'} read as the sequence and the {length} positions as the "
                "batch"
            )
            fix = (
                f"feed {_called(types)} (batch, sequence, features): x.transpose(0, 1) before "
                f"{'it' if one else 'them'}, or build {'it' if one else 'them'} with batch_first=False to match data "
                "laid out (sequence, batch)"
            )
            after = "; fed so, it returns (batch, sequence, hidden), each sample's last step out[:, -1], not out[-1]"
        else:
            read = (
                f"{'is' if one else 'are'} at batch_first=False (torch's default) and {'was' if one else 'were'} "
                f"given (batch, sequence, features): dim 0, {scored}, is read as the sequence "
                f"and the {length} positions as the batch"
            )
            fix = (
                f"build the {'layer' if one else 'layers'} with batch_first=True ({_built(types)}), or feed "
                f"{'it' if one else 'them'} x.transpose(0, 1), laid out (sequence, batch, features)"
            )
            after = "; fed so, it returns (sequence, batch, hidden), each sample's last step out[-1], not out[:, -1]"
        # a recurrent layer's output keeps the layout it is given: laid out anew, its last step moves
        fix += f"{after if recurrent else ''}."
        what = (
            f"{_heading(types, samples)}: from step {root.step_start} {quoted(layers)} {read} (on "
            f"{count(m.get('found', 0.0))} of {count(m.get('judged', 0.0))} fully observed passes judged). "
            f"{_mixing(types, samples)}"
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"batch read as the sequence ({self.place(event)})"

    def label(self, event: SemanticEvent) -> str:
        return "batch read as the sequence"

    def effect(self, event: SemanticEvent) -> str:
        return "samples mixed with their batch-mates"


#: A layer of a judged layout, as the text names it: its class name and whether it is recurrent (an
#: ``nn.RNNBase``) rather than an ``nn.MultiheadAttention``, the only two kinds whose layouts are kept.
Layer = tuple[str, bool]


def _kinds(layers: list[str], topo: Topology, recurrent: float | None) -> list[Layer]:
    """Each named layer's class and whether it is recurrent: the first ``recurrent`` of them are (the finding lists
    them first); for an event without that count (a trace saved before it was kept), a class named after torch's
    (``RNN``, ``LSTM``, ``GRU``, or a subclass whose name ends so)."""
    types = [topo.types.get(name, "") for name in layers]
    if recurrent is None:
        return [(t, t.endswith(("RNN", "LSTM", "GRU"))) for t in types]
    return [(t, i < recurrent) for i, t in enumerate(types)]


def _heading(types: list[Layer], samples: float) -> str:
    if samples == 1:
        return "Sequence read as a batch"
    if all(r for _, r in types):
        return "Recurrence across the batch"
    if not any(r for _, r in types):
        return "Attention across the batch"
    return "Batch read as the sequence"


def _called(types: list[Layer]) -> str:
    """What the text calls the layers: ``the LSTM``, ``the attention``, or ``the layers``."""
    kinds = set(types)
    if len(kinds) == 1 and types[0][1]:
        return f"the {types[0][0]}"
    return "the attention" if not any(r for _, r in kinds) else "the layers"


def _built(types: list[Layer]) -> str:
    """How each of the layers' classes is built with batch_first=True, torch's own with their ``nn.`` prefix."""
    built = [f"nn.{t}" if t in ("RNN", "LSTM", "GRU") else t for t, r in dict.fromkeys(types) if r]
    if not all(r for _, r in types):
        built += ["nn.TransformerEncoderLayer", "nn.MultiheadAttention"]
    return ", ".join(f"{b}(..., batch_first=True)" for b in built)


def _mixing(types: list[Layer], samples: float) -> str:
    """What the layers do to the samples, read so."""
    if samples == 1:  # a batch of one read as a sequence of one step: nothing is mixed, nothing runs along it
        return (
            "With one sample a batch, its positions are read as a batch of sequences one step long: nothing runs "
            "along the sequence, and each position is processed on its own."
        )
    said = []
    if not all(r for _, r in types):
        said.append(
            "Each position attends over the same position of its batch-mates, never along its own sequence: every "
            "sample's output mixes the other samples' and misses its own context."
        )
    if any(r for _, r in types):
        said.append(
            "The recurrence steps from one sample to the next down the batch, never along a sample's own sequence: "
            "every sample's output carries its batch-mates' and misses its own context."
        )
    return " ".join(said)
