"""A view across the batch: a tensor whose batch stands on a later axis (a sequence-first LSTM's ``(T, N, H)``
output, a two-layer ``h_n`` of ``(2, N, H)``) given ``view`` or ``reshape`` a shape whose first axis is as long as the
batch, ``out.view(N, -1)``, where ``out.permute(1, 0, 2).reshape(N, -1)`` was meant. A view keeps the values' order in
memory, so row ``n`` of the result is made of pieces of other samples: each sample's prediction is computed from its
batch-mates' values, and its own label cannot be learned from them. Plain torch: an LSTM classifier over
sequence-first tokens flattened so reached 0.40 held-out accuracy (its prior) against 0.99 with the permute, and a
sample's logits moved when its batch-mates changed (by 0 in the twin). Nothing else names it: the loss stays at
chance, where the labels are suspected first.

Exact in what it reads, shapes only (see :mod:`neuraldbg.capture.sample_views`): on the first
:data:`~neuraldbg.capture.sample_views.CHECKS` fully observed passes whose loss scores one target per sample, the
views and reshapes in the graph below the loss whose input holds the batch's length on a later axis, with more than
one value on the axes before it and a first axis of another length, and whose result's first axis is the batch's
length. Reported when found on at least half of the passes read. A batch as long as the tensor's first axis cannot be
told apart from a batch-first tensor and is not judged; nor is a loss with targets per token (no count of samples).
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, quoted
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.VIEW_ACROSS_BATCH


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ")"


class ViewAcrossBatch(Kind):
    name = KIND.value
    title = "view across the batch"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        read = coverage.view_passes
        views = {name: v for name, v in coverage.mixed_views.items() if read and 2 * v[2] >= read}
        if not views:
            return None
        given, made, found, step = min(views.values(), key=lambda view: view[3])
        samples = made[0]
        axis = given.index(samples, 1)
        return run_event(
            KIND,
            step,
            max(step, coverage.last_step),
            ", ".join(n for n in views if n),
            samples=float(samples),
            axis=float(axis),
            found=float(found),
            read=float(read),
            given=float(len(given)),
            **{f"given_{i}": float(n) for i, n in enumerate(given)},
            **{f"made_{i}": float(n) for i, n in enumerate(made)},
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: before the loss findings it explains
        return RootLane(0, order=8) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False

    def place(self, event: SemanticEvent) -> str:
        return f"the output of {quoted(event.detail.split(', '))}" if event.detail else "a reshaped tensor"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        given = tuple(int(m.get(f"given_{i}", 0.0)) for i in range(int(m.get("given", 0.0))))
        made = tuple(int(m[key]) for key in sorted(k for k in m if k.startswith("made_")))
        axis = int(m.get("axis", 1.0))
        order = (axis, *(i for i in range(len(given)) if i != axis))
        what = (
            f"A view across the batch: {self.place(root)}, shaped {_shape(given)} with its "
            f"{count(m.get('samples', 0.0))} samples on axis {axis}, was given view/reshape {_shape(made)} (on "
            f"{count(m.get('found', 0.0))} of the {count(m.get('read', 0.0))} fully observed passes read). A view "
            "keeps the values' order in memory, so each row of the result is made of pieces of other samples: every "
            "prediction is computed from its batch-mates' values and no sample's label can be learned from its own."
        )
        fix = (
            f"move the batch axis first before flattening: x.permute{order}.reshape({made[0] if made else 'N'}, -1) "
            "(or x.transpose(0, 1)), or build the recurrent layer with batch_first=True; for an LSTM's h_n of "
            "(layers, batch, hidden), h_n[-1] or h_n.transpose(0, 1).reshape(batch, -1)."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"a view across the batch ({self.place(event)})"

    def label(self, event: SemanticEvent) -> str:
        return "view across the batch"

    def effect(self, event: SemanticEvent) -> str:
        return "samples mixed with their batch-mates"
