"""Labels shifted twice: a Hugging Face causal language model, which shifts its labels by one position itself
(``labels=input_ids`` is the documented call), is given labels that already are the next input token
(``input_ids[:, :-1]`` with ``labels=input_ids[:, 1:]``) on at least :data:`AHEAD` of the scored positions whose
next input token differs from their own. Shifted once more inside the model, each position is then scored against
the token two places ahead: the model learns a harder task than the one it will be used for, and the held-out
next-token loss stays high.

Exact in what it reads (no threshold on how the training goes): the model's class against ``transformers``'
registry of causal-LM classes (see :mod:`neuraldbg.model.causal_lm`), and, on the first fully observed forward
passes, the share of labels equal to the next input token, computed on the device and read at the flush. It is
taken only where the next token differs from the current one, the positions where a label can tell a shift: data
that repeats its token (flattened pixel sprites, mostly background: the next token is the current one at 95% of
the positions) gives unshifted labels (``labels=input_ids``) a share of 95% over all positions, but 0 over these,
while labels shifted by hand give 1 there. A model of the user's own that does not shift its labels (it scores
logits[t] against labels[t]) needs pre-shifted labels and is not judged; nor is an encoder-decoder (its labels are
the target sequence).
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import num
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.LABELS_SHIFTED_TWICE

#: The share of scored labels that already are the next input token, where it differs from the current one, at least
#: (pre-shifted labels: 1.0; ``labels=input_ids``: 0, whatever share of the data's tokens repeat).
AHEAD = 0.9


class LabelsShiftedTwice(Kind):
    name = KIND.value
    title = "labels shifted twice"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        ahead = coverage.labels_ahead
        if ahead is None or ahead < AHEAD:
            return None
        step = coverage.labels_ahead_step
        return run_event(KIND, step, max(step, coverage.last_step), "", ahead=ahead, limit=AHEAD)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: beside the activation before a loss
        return RootLane(3.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False

    def place(self, event: SemanticEvent) -> str:
        return "the labels"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        share = num(100 * root.metrics.get("ahead", 0.0))
        what = (
            f"Labels shifted twice: from step {root.step_start} the model, a Hugging Face causal language model, "
            f"was given labels that already are the next input token at {share}% of the positions where that token "
            "differs from the current one (input_ids[:, :-1] with labels=input_ids[:, 1:]). The model shifts its "
            "labels by one position itself, so each position is scored against the token two places ahead: it "
            "learns a harder task than next-token prediction, and its next-token loss stays high."
        )
        fix = (
            "pass labels=input_ids (the same tensor, unshifted: the model shifts them), with -100 at the positions "
            "that must not be scored."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"labels already shifted ({num(100 * event.metrics.get('ahead', 0.0))}% are the next token)"

    def label(self, event: SemanticEvent) -> str:
        return "labels shifted twice"

    def effect(self, event: SemanticEvent) -> str:
        return "labels shifted twice"
