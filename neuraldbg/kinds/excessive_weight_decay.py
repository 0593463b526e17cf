"""Weight decay far too strong: the optimizer's decay, not the loss's gradient, makes up most of every update, and the
weights shrink over the run. The decay pulls every weight towards zero at each step; when it outweighs the
gradient, the weights settle where the two balance, far smaller than the task needs, and the loss stops well above
what the model could reach (plain torch, AdamW weight_decay=10 at lr 1e-3 against the same program without decay:
a U-Net's loss 0.97 against 0.63, its weights shrunk 4-fold; a character GRU 1.56 against 0.62 nats; a recommender's
loss held at ln 2 for 500 steps; SGD weight_decay=1 on a residual net: the weights' norm 4.2 to 0.05, the loss at
ln 4).

Read from the optimizer's ``param_groups`` at each step (see :mod:`neuraldbg.capture.ledger`: the largest
``weight_decay`` of a group holding watched parameters) and the fully observed steps' update/weight ratio, weights'
and gradients' norms (see :class:`~neuraldbg.stats.training.TrainingFacts`). The decay's share of a step:

* decoupled (``AdamW``; ``decoupled_weight_decay=True``): each step removes lr x weight_decay of the weights, against
  the step's whole ||dW|| / ||W|| (scaled by the decayed weights' share of the norm when some groups do not decay);
* coupled (``SGD``, ``Adam``, ``RMSprop``: L2 added to the gradient): weight_decay x ||W|| against the norm of the
  loss's own gradient, which the optimizer receives beside it (before clipping: a gradient clipped to a tiny norm
  is the clipping's fault, not the decay's).

Found when, over the second half of the run, the median share is at least :data:`SHARE` and the weights' norm over
the last tenth of the run is at most :data:`SHRINK` of the first tenth's, or the decay is at least
:data:`HELD_DECAY`, whatever the norm did (such a decay holds the weights near their start where training grows
them). A decay that already won, shrinking the weights' norm to at most :data:`SHRUNK` of its start, is judged over
the run's first half when its late share is small: by then the weights are near zero and it has little left to
take. A coupled decay whose term was smaller than the loss's own gradient when the run began (its median share over
the run's first tenth under :data:`START_SHARE`) is not judged by its later share: that share grew only because the
loss's gradient fell as the loss settled on its floor (see :func:`_led_by_the_loss`). The norm is that of the weights
the decay applies to, when the optimizer leaves some groups undecayed (the Hugging Face Trainer decays no bias and
no LayerNorm gain, which hold most of a BERT's norm: under weight_decay=10 its decayed weights' norm goes 4.9 to 4.7
while the whole norm stays at 18.5-18.9). Usual settings give shares of about 1e-2
(AdamW 0.01-0.1, SGD 5e-4: at most 0.05 over eight program families); weight decay 10 (AdamW) or 1 (SGD, Adam)
gives 0.6-1.9. A decoupled decay of a usual size (at most :data:`USUAL_DECOUPLED`) is never this fault: its share
of the steps is large only under a learning rate far too high, whose finding it is; nor is a coupled one of a usual
size (at most :data:`USUAL_COUPLED`), whose term is large only against a loss gradient that is tiny.
"""

from __future__ import annotations

import math
import statistics

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..health import ActivationHealth, GradientHealth, UpdateHealth
from ..reasoning.rules import CausalRule
from ..reasoning.topology import Topology
from ..text import num, pct
from .base import Kind, RootLane, Series, loss_ends, run_event

KIND = FailureKind.EXCESSIVE_WEIGHT_DECAY

#: A loss whose last quarter averages at most this share of its first losses reached its floor (see _fitted).
FITTED = 1e-2
#: The decay's median share of a step over the second half of the run, at least (usual settings: about 0.01, at
#: most 0.05 over eight program families; AdamW weight_decay=10, SGD weight_decay=1: 0.6-1.9).
SHARE = 0.5
#: The weights' norm over the last tenth of the run against the first tenth's, at most (a decay that dominates
#: shrinks them: 0.01-0.83 under the faults above; the same programs with usual or no decay keep or grow them,
#: 1.0-6.3).
SHRINK = 0.9
#: The weights' norm over the last tenth of the run against the first tenth's, at most, for a decay that already won:
#: they shrank by an order of magnitude or more, so by the run's second half the decay has little left to take and
#: its share of the step is small there (plain torch, Adam weight_decay=1 on a GRU classifier: the norm 6.1 to 0.02,
#: the share 11-35 over the first half and 0.01-0.5 over the second, held-out accuracy 0.34 against 0.93 without the
#: decay). Its share is then judged over the run's first half, where it did the shrinking.
SHRUNK = 0.1
#: A coupled decay's median share over the run's first tenth, under which the loss's own gradient led the steps when
#: the run began (plain torch, weight_decay=0.01 under Adagrad or SGD with momentum on a transformer LM at a grammar's
#: entropy and on mixtures of experts fitting label-smoothed targets: 0.35-0.66 at the start, 0.9-1.8 once the loss
#: sat on its floor, the same held-out accuracy as without decay). Decays that hold the loss above that floor start at
#: 1.5-26 (weight_decay=0.03 on the mixture of experts, 0.03 of held-out accuracy lost; 1 on a BatchNorm CNN, a GRU,
#: the LM).
START_SHARE = 1.0
#: A decoupled decay (AdamW's) of at most this is a usual setting (0.01-0.1): when it makes up most of the steps, a
#: learning rate far too high makes it so (each step takes lr x weight_decay of the weights), and that learning
#: rate is the fault (plain torch, a pre-norm transformer under AdamW weight_decay=0.05: accuracy 0.20 at lr 0.2
#: with or without the decay, 0.36 at lr 2e-3; the weights shrank 76 -> 34 at lr 0.2).
USUAL_DECOUPLED = 0.1
#: A decay of at least this (ten times the usual AdamW's largest) that makes up most of the steps is the fault even
#: when the weights it decays do not shrink: the steps hold them where the decay balances the gradient, where
#: training would grow them (plain torch, a tiny BERT under AdamW weight_decay=10 with the Hugging Face split, 192
#: and 320 steps: its decayed weights' norm 0.95-1.03 of its start where the same program without decay grows it
#: 1.5-1.6-fold; loss 0.41-0.49 against 0.13-0.29, held-out accuracy 0.92-0.95 against 0.96-1.0, 0.47-0.51
#: against 1.0 at two other seeds).
HELD_DECAY = 1.0
#: A coupled decay (L2 added to the gradient) of at most this is a usual one (SGD's 1e-4 to 5e-4): its term
#: outweighs the loss's own gradient only where that gradient is tiny, which is that gradient's fault (a graph
#: attention whose softmax runs over all 4,000 edges of the graph at once gives every edge ~1/4,000 of weight: its
#: loss's gradient is tiny from the first step and the loss stays at chance with weight_decay=5e-4 or 0).
USUAL_COUPLED = 5e-4
#: Fully observed steps with a share, at least (a smoke run is not judged).
MIN_ROWS = 8


def _decay_at(noted: list[tuple[int, float, bool]], step: int) -> tuple[float, bool]:
    """The weight decay in force at ``step`` (0 before the first noted, or when none was)."""
    found = (0.0, False)
    for start, decay, decoupled in noted:
        if start > step:
            break
        found = (decay, decoupled)
    return found


def shares(coverage: Coverage) -> list[tuple[int, float, float, bool]]:
    """For each fully observed step with a weight decay and the numbers it needs: (step, the decay's share of the
    step, the decay, decoupled)."""
    noted = coverage.weight_decay
    found: list[tuple[int, float, float, bool]] = []
    if not noted:
        return found
    for row in coverage.training.rows:
        decay, decoupled = _decay_at(noted, row.step)
        if decay <= 0:
            continue
        if decoupled:
            share = row.lr * decay / row.update_ratio if row.update_ratio > 0 else math.nan
            if math.isfinite(row.decayed_norm) and row.weight_norm > 0:
                share *= row.decayed_norm / row.weight_norm  # the decay takes lr x wd of the decayed weights only
        else:
            # against the gradient the backward pass produced: clipping to a tiny norm is its own fault
            loss_grad = row.grad_norm * row.clip
            share = decay * row.weight_norm / loss_grad if loss_grad > 0 else math.nan
        if math.isfinite(share):
            found.append((row.step, share, decay, decoupled))
    return found


def _norms(coverage: Coverage, field: str) -> tuple[float, float]:
    """The median of ``field`` over the first and the last tenth of the run's rows."""
    training = coverage.training
    return training.median(field, 0.0, 0.1), training.median(field, 0.9, 1.0)


class ExcessiveWeightDecay(Kind):
    name = KIND.value
    title = "weight decay too strong"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        found = shares(coverage)
        if len(found) < MIN_ROWS:
            return None
        training = coverage.training
        w0, w1 = _norms(coverage, "decayed_norm")
        some = math.isfinite(w0) and math.isfinite(w1) and w0 > 0  # only some groups decay: their weights
        if not some:
            w0, w1 = _norms(coverage, "weight_norm")
        if not (math.isfinite(w0) and math.isfinite(w1) and w0 > 0):
            return None
        half = len(found) // 2
        late_share = statistics.median(s for _, s, _, _ in found[half:])
        early = late_share < SHARE and w1 <= SHRUNK * w0  # the decay already won: judged where it shrank them
        judged = found[:half] if early else found[half:]
        share = statistics.median(s for _, s, _, _ in judged)
        if share < SHARE:
            return None
        decay = statistics.median(d for _, _, d, _ in judged)
        held = w1 > SHRINK * w0
        if held and decay < HELD_DECAY:
            return None  # the weights kept their size under a decay that is not far beyond the usual
        if _fitted(coverage):
            return None  # the decay held nothing back: the loss reached its floor
        decoupled = sum(c for *_, c in judged) * 2 > len(judged)
        if not decoupled and not early and _led_by_the_loss(found):
            return None  # its share grew only as the loss's gradient fell at the loss's floor: it trims, not holds
        if decoupled and decay <= USUAL_DECOUPLED:
            return None  # a usual decay made large by the learning rate: the learning rate's finding
        if not decoupled and decay <= USUAL_COUPLED:
            return None  # a usual L2 made large by a loss gradient that is tiny: that gradient's finding
        metrics = {
            "share": share,
            "decay": decay,
            "decoupled": float(decoupled),
            "lr": training.median("lr", 0.5, 1.0),
            "weight_start": w0,
            "weight_end": w1,
            "share_from": float(judged[0][0]),
            "share_to": float(judged[-1][0]),
            "early": float(early),
            "late_share": late_share,
            "limit": SHARE,
            "decayed_only": float(some),
            "held": float(held),
        }
        metrics |= loss_ends(coverage)
        start = coverage.weight_decay[0][0]
        return run_event(KIND, start, max(start, coverage.last_step), "", **metrics)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a setting of the run, measured in its updates: after acute failures (an explosion, a NaN), before the layer
        # states it leaves behind (units dead or gradients vanishing in shrunken layers) and the loss findings
        return RootLane(2.5) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # the optimizer's setting, in force from its first step

    def rules(self) -> list[CausalRule]:
        shrinks = "shrinks the weights into"
        effects = (
            GradientHealth.VANISHING,
            ActivationHealth.DEAD,
            ActivationHealth.SATURATED,
            UpdateHealth.STALLED,
            FailureKind.COLLAPSED_OUTPUT,
        )
        return [CausalRule("decay-shrinks-the-weights", shrinks, KIND, effects, same_place_joins=True)]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        decay, share, lr = m.get("decay", 0.0), m.get("share", 0.0), m.get("lr", math.nan)
        when = _window(m, root.step_start)
        if m.get("decoupled"):
            rate = lr * decay if math.isfinite(lr) else math.nan
            how = (
                f"Weight decay far too strong: the optimizer's weight_decay={num(decay)} is decoupled (as AdamW's): "
                f"at learning rate {num(lr)} each step takes {pct(rate)} of every weight away"
                + (f" (1/e in {num(1 / rate)} steps)" if rate > 0 else "")
                + f". {when.capitalize()} the decay alone was {num(share)} times the size of the whole step (lr x "
                "weight_decay against ||dW||/||W||, the median; about 0.01 under usual settings)"
            )
        else:
            how = (
                f"Weight decay far too strong: the optimizer's weight_decay={num(decay)} adds weight_decay x W to "
                f"the gradient (L2, coupled, as SGD's and Adam's): {when} that term was {num(share)} times "
                "the loss's own gradient (weight_decay x ||W|| against ||g||, the median; about 0.01 under usual "
                "settings)"
            )
        which = "the norm of the weights it decays" if m.get("decayed_only") else "the weights' norm"
        norms = f"{num(m.get('weight_start', 0.0))} to {num(m.get('weight_end', 0.0))}"
        if m.get("held"):
            moved = f"{which} was held near its start ({norms} over the run: training without the decay grows it)"
        else:
            moved = f"{which} fell from {norms} over the run"
        if m.get("early"):
            moved += f" (by the run's second half little was left to take: the share there was {num(m['late_share'])})"
        what = (
            f"{how}, and {moved}. The steps pull the weights towards zero rather than "
            "along the loss's gradient: they settle where the two balance, smaller than the task needs, and the loss "
            "stays above what the model could reach"
        )
        if "last_loss" in m:
            what += f" (it went from {num(m['first_loss'])} to {num(m['last_loss'])})"
        fix = (
            f"lower weight_decay (now {num(decay)}): 0.01-0.1 is usual for AdamW, 1e-4 to 5e-4 for the coupled L2 of "
            "SGD or Adam; leave biases and normalisation layers out of the decay."
        )
        return what + ".", fix

    def describe(self, event: SemanticEvent) -> str:
        m = event.metrics
        against = "the step" if m.get("decoupled") else "the gradient"
        return f"weight decay {num(m.get('decay', 0.0))} (the decay {num(m.get('share', 0.0))} times {against})"

    def label(self, event: SemanticEvent) -> str:
        return f"weight decay {num(event.metrics.get('decay', 0.0))}"

    def effect(self, event: SemanticEvent) -> str:
        return "weight decay too strong"

    def place(self, event: SemanticEvent) -> str:
        return "the optimizer"


def _window(metrics: dict[str, float], start: int) -> str:
    """Over which steps the decay's share was judged, as words: the run's second half, or the first while the decay
    shrank the weights (see :data:`SHRUNK`)."""
    first = int(metrics.get("share_from", start))
    if metrics.get("early"):
        return f"over steps {first}-{int(metrics.get('share_to', first))}, while the weights shrank,"
    return f"from step {first}"


def _led_by_the_loss(found: list[tuple[int, float, float, bool]]) -> bool:
    """Whether the loss's own gradient outweighed a coupled decay when the run began: the decay's median share over
    the first tenth of the steps with a share is under :data:`START_SHARE`. The decay's term, weight_decay x ||W||,
    only falls as the weights shrink, so a share that became large later did so because the loss's gradient fell:
    the loss settled on a floor above zero (a grammar's entropy, the KL to label-smoothed targets), where its
    gradient is small and the decay trims the initialisation's extra norm at no cost (plain torch: the held-out
    accuracy the same with and without the decay, the loss at the grammar's entropy). A decay that holds the loss
    above its floor outweighs the gradient from the first steps. A decay judged over the first half because it
    already shrank the weights tenfold (the caller's ``early``) did more than trim and is not excused."""
    first = found[: max(1, len(found) // 10)]
    return statistics.median(s for _, s, _, _ in first) < START_SHARE


def _fitted(coverage: Coverage) -> bool:
    """Whether the loss reached its floor: the mean of the run's last quarter at most :data:`FITTED` of its first
    losses' mean, for a loss that stays positive. Then the decay dominates each step because the loss's gradient
    has all but vanished, not because it outweighs a fit still to be made: strong decay on purpose after the
    training set is fitted (grokking: AdamW weight_decay=1 on modular addition, the training loss 3.16 to 3.7e-7,
    held-out accuracy 0.90-0.98 over three seeds against 0.00-0.01 at 0.1 and 0.01). Decay far too strong holds
    the loss well above that (0.44-1.6 from 1.1-2.5 on eight program families)."""
    trace = coverage.losses
    if not trace.first or not trace.positive:
        return False
    first = statistics.fmean(v for _, v in trace.first)
    end = trace.stretch(0.75, 1.0)
    return end is not None and first > 0 and end.mean <= FITTED * first
