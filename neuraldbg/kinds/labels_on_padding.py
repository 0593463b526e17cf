"""Labels on padding: a Hugging Face causal language model is given labels that score the padding its attention
mask hides, at least :data:`PADDED` of the labels it scores. A batch of sequences of different lengths is padded to
the longest; the padded positions are labelled -100 (``DataCollatorForLanguageModeling`` does it) so the loss leaves
them out. Labelled with the pad token's id instead (``labels=input_ids`` after padding by hand), every padded position
asks the model to predict padding after padding: an easy target that fills the loss, so the loss falls while the
real tokens are learned less (plain torch, a GPT-2 on counting sequences padded to three times their length: 0.73 of
the real next tokens right, against 1.0 with -100 on the padding), and the loss no longer says how well they are.

Exact in what it reads: the model's class against ``transformers``' registry of causal-LM classes (as for
:mod:`.labels_shifted_twice`), and, on the first fully observed forward passes given ``input_ids``, ``labels`` and an
``attention_mask`` of their shape, the share of the scored labels (not -100; the first position, which the model's
shift drops, left out) at positions the mask hides, computed on the device and read at the flush. Labels -100 on the
padding give 0 whatever the padding; a label kept on one position per sequence (an end-of-text token that is also the
pad token, labelled once to learn to stop) gives one over the sequence's length, under :data:`PADDED` for sequences of
four tokens or more. A model of the user's own that does not shift its labels is not judged.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import num
from .base import Kind, RootLane, Series, run_event
from .inverted_padding_mask import hides_everything

KIND = FailureKind.LABELS_ON_PADDING

#: The share of the scored labels at positions the attention mask hides, at least (-100 on the padding: 0; the
#: sweep's GPT-2 padded to three times its sequences' length: 0.75).
PADDED = 0.25


class LabelsOnPadding(Kind):
    name = KIND.value
    title = "labels on padding"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        share = coverage.scored_padding
        if share is None or share < PADDED or hides_everything(coverage):
            return None  # a mask that hides everything puts every label "on padding": inverted_padding_mask names it
        step = coverage.scored_padding_step
        return run_event(KIND, step, max(step, coverage.last_step), "", padded=share, limit=PADDED)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: beside the labels shifted twice
        return RootLane(3.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False

    def place(self, event: SemanticEvent) -> str:
        return "the labels"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        share = num(100 * root.metrics.get("padded", 0.0))
        what = (
            f"Labels on padding: from step {root.step_start} the model, a Hugging Face causal language model, was "
            f"given labels of which {share}% sit where its attention_mask hides the input: the padding is labelled "
            "with a token id instead of -100, so the loss scores it. The model learns to predict padding after "
            "padding, an easy target that fills the loss: the loss falls while the real tokens are learned less, and "
            "it no longer says how well they are."
        )
        fix = (
            "label the padding -100 so the loss leaves it out: labels = input_ids.masked_fill(attention_mask == 0, "
            "-100), as DataCollatorForLanguageModeling does."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"labels on padding ({num(100 * event.metrics.get('padded', 0.0))}% of the scored ones)"

    def label(self, event: SemanticEvent) -> str:
        return "labels on padding"

    def effect(self, event: SemanticEvent) -> str:
        return "padding scored by the loss"
