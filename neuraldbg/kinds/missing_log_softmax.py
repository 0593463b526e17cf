"""A missing log-softmax: ``nll_loss`` (``nn.NLLLoss``) or ``ctc_loss`` (``nn.CTCLoss``) given values that are not
log-probabilities, most often the raw logits of the last layer (for ``ctc_loss`` the classes are its input's last
dimension; the rest reads the same). ``nll_loss`` does not normalise its input; it only picks the target class's
entry and negates it. On raw logits the loss is minimised by making that one logit large, whatever the others do:
the loss runs below zero towards minus infinity, the gradient never says which wrong class scored higher, and the
classes are not learned against each other.

Found from the loss's autograd graph and one reading of values on the first backward passes that reach the model
(see :mod:`neuraldbg.capture.loss_graph`): the ``nll_loss`` node's input came from no ``log_softmax`` (a
``cross_entropy``, or ``nll_loss(log_softmax(x))``, is exact by construction and not read), so the input it saved is
checked on the device before the backward pass frees it: the log-sum-exp of each row over the classes is 0 for
log-probabilities, whatever computed them (``torch.log(softmax(x))``, ``x - x.logsumexp(1, keepdim=True)``, the log
of a mixture's probabilities), and the largest ``|log-sum-exp|`` is read at the flush. Raw logits of a fresh 10-class
head read about log(10) = 2.3 or more; float32 log-probabilities read below 1e-5. Rows whose classes are all masked
to -inf are left out.

A ``log_softmax`` over another dimension than the classes (``dim=0``: across the batch, a classic slip) is read the
same way: its rows are not log-probabilities over the classes, and the text names the dimension.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import num
from .base import Kind, RootLane, Series, layer_event, loss_ends

KIND = FailureKind.MISSING_LOG_SOFTMAX

#: The largest |log-sum-exp| over the classes of a row of log-probabilities, at most: rounding of float16 or
#: bfloat16 log-probabilities and an ``eps`` inside ``log(p + eps)`` stay orders of magnitude below it, while a
#: raw logit row of a fresh head is near log(classes) (0.69 and up).
GAP = 0.1


class MissingLogSoftmax(Kind):
    name = KIND.value
    title = "missing log-softmax"
    run_level = True  # about the program's loss as a whole (its event still names the layer of the logits)

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        gap = coverage.log_prob_gap
        if gap is None or not gap > GAP:
            return None
        layer, step = coverage.nll_layer, coverage.log_prob_step
        metrics = {"gap": gap, "limit": GAP, "ctc": float(coverage.nll_loss == "ctc_loss")}
        if coverage.nll_dim >= 0:
            metrics["dim"] = float(coverage.nll_dim)
        metrics |= loss_ends(coverage)
        return layer_event(KIND, layer, step, coverage.last_step, metrics)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: beside the activation before a loss
        return RootLane(3.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the program computes its loss this way from the first step

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        where = f"the output of '{root.layer}'" if root.layer else "the model's output"
        if "dim" in m:
            return _explain_across(root, where)
        ctc = bool(m.get("ctc"))
        loss = "ctc_loss (CTCLoss)" if ctc else "nll_loss (NLLLoss)"
        how = (
            "ctc_loss does not normalise its input, it adds up the entries of the target's alignments as they are, so "
            "the loss falls by making those entries large whatever the other classes score"
            if ctc
            else "nll_loss does not normalise its input, it only negates the target class's entry, so the loss falls "
            "by making that one value large whatever the other classes score"
        )
        what = (
            f"A missing log-softmax: from step {root.step_start}, {loss} is given {where}, which is not "
            f"log-probabilities: the log-sum-exp of its rows over the classes reaches {num(m.get('gap', 0.0))} "
            f"(0 for log-probabilities). {how}: it runs below zero without bound and the classes are never learned "
            "against each other."
        )
        if "last_loss" in m and m["last_loss"] < 0:
            what += f" The loss went from {num(m['first_loss'])} to {num(m['last_loss'])}."
        if ctc:
            fix = (
                "give ctc_loss log-probabilities over the classes: F.log_softmax(logits, dim=-1) on its (T, N, C) "
                "input (as torch's CTCLoss documentation does)."
            )
        else:
            fix = (
                "give nll_loss log-probabilities (F.log_softmax(logits, dim=1), or nn.LogSoftmax(dim=1) as the "
                "model's last layer), or replace it with cross_entropy (CrossEntropyLoss) on the raw logits, which "
                "applies log_softmax itself."
            )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        if "dim" in event.metrics:
            return f"nll_loss on a log_softmax over dimension {int(event.metrics['dim'])}, not the classes"
        loss = "ctc_loss" if event.metrics.get("ctc") else "nll_loss"
        return f"{loss} on values that are not log-probabilities (log-sum-exp {num(event.metrics.get('gap', 0.0))})"

    def label(self, event: SemanticEvent) -> str:
        if "dim" in event.metrics:
            return f"log_softmax over dimension {int(event.metrics['dim'])}"
        return f"{'ctc_loss' if event.metrics.get('ctc') else 'nll_loss'} without log_softmax"

    def effect(self, event: SemanticEvent) -> str:
        return "a loss without log-softmax"


def _explain_across(root: SemanticEvent, where: str) -> tuple[str, str]:
    """The words of a log_softmax over another dimension than the classes."""
    m = root.metrics
    dim = int(m["dim"])
    across = (
        "the batch: each sample's scores are normalised against the other samples'"
        if dim == 0
        else ("it, not against the other classes")
    )
    what = (
        f"A log-softmax over the wrong dimension: from step {root.step_start}, nll_loss (NLLLoss) is given "
        f"{where} normalised by a (log-)softmax over dimension {dim}, not over its classes (dimension 1), so its "
        f"rows are not log-probabilities: their log-sum-exp over the classes reaches {num(m.get('gap', 0.0))} (0 for "
        f"log-probabilities). It normalises across {across}, and the loss no longer weighs the classes against "
        "each other."
    )
    fix = (
        "normalise over the classes: F.log_softmax(logits, dim=1) (or dim=-1 for (N, C) logits), or use "
        "cross_entropy (CrossEntropyLoss) on the raw logits, which applies log_softmax over the classes itself."
    )
    return what, fix
