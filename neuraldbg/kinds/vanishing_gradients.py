"""Vanishing gradients: a layer whose parameter gradient is vanishingly small while the loss still has one to give.

A layer's gradient norm is the L2 norm over the parameters it owns directly (a bias before a BatchNorm gets an
exactly-zero gradient by construction; folding it into its layer keeps that silent).

**Vanishing** needs both an absolute and a relative test (below ``vanishing_norm`` *and* below ``vanishing_ratio``
of the largest layer at the same step), except for an exact zero or a norm below ``vanishing_floor``, which no
healthy layer shows while the loss still has a gradient to give. Four kinds of small gradient are not vanishing
gradients, and are recognised from the structure, the layer's output and its earlier readings:

* *Cancelled by construction.* A normalisation layer whose output goes straight into a BatchNorm or InstanceNorm
  (BatchNorm -> BatchNorm, LayerNorm -> BatchNorm1d, conv -> BatchNorm -> BatchNorm): the second norm standardises
  each channel again, dividing out any per-channel scale and adding back any shift the first one applies, so the
  first one's affine weight and bias get a gradient of ~0 (up to the second norm's epsilon), like a conv bias
  before a BatchNorm. Nothing is lost, and no learning rate or init changes it.
* *A small-signal regime.* Attention logits are ``s_ij = q_i . k_j / sqrt(d)`` with ``q = W_q x``, ``k = W_k x``;
  the attention output is ``sum_j p_ij v_j`` with ``p_i = softmax(s_i)``. Then

  ``dL/dq_i = (1/sqrt(d)) sum_j p_ij (g_i . (v_j - vbar_i)) k_j``, with ``g_i = dL/d(output_i)`` and
  ``vbar_i = sum_j p_ij v_j``,

  and ``dL/dW_q = sum_i dL/dq_i x_i^T`` (``dL/dW_k`` likewise, with the roles of q and k swapped). At
  initialisation the logits are near zero, so attention is near-uniform and ``v_j - vbar_i`` is only the spread of
  the values around their mean; the gradient of W_q is a product of three small factors: the keys (a projection by
  the small W_k), the spread of the values (a projection by the small W_v) and ``g`` (which reaches the attention
  through the small output projection). With BERT's init (std 0.02, hidden 64) that is ~5e-5 of the classifier's
  gradient, while W_v's gradient, which lacks two of the factors, is ~1e-2. It is not a trap: the softmax is in its
  near-linear regime, and the gradient grows as W_k, W_v and W_o grow with training. It is *saturation* that traps
  (logits so large that ``p_ij (1 - p_ij)`` is ~0 for every pair): then the query and key outputs are large. So a
  layer whose tiny gradient comes with a *quiet* output (rms below ``quiet_output_rms`` = 1.5: no sigmoid, tanh or
  softmax is saturated by such inputs, and queries and keys that quiet give logits spread by ~2 at most) is in the
  small-signal regime, provided the gradient does reach it: a layer before it in forward order gets a healthy
  gradient (otherwise the gradient vanishes through depth, as in a GRU whose update gate is stuck open, whose
  output is quiet too), and so does a layer beside it, in the same parent module (the value projection next to the
  query and the key; otherwise the whole block is cut off, as behind a gate stuck closed, however small its outputs
  are). A BERT whose embeddings are kept frozen has no layer before its first attention to show it: that query and
  key are reported (docs/limitations.md). The small gradient is then local to its
  branch: it did not vanish on its way back. Hugging Face BART and Wav2Vec2 grow their queries to an rms of
  0.3-0.7 under Adam while their keys stay at 0.2 and the query gradient at 1e-5 (an earlier bound of 0.3 flagged
  them; they train to 100 %). A normalisation layer's output is
  standardised (its rms is its gain, ~1 whatever the regime), so for it the output of the layer it feeds is read
  instead: Whisper's cross-attention pre-norm feeds only the query (rms 0.17-0.57) and gets 5e-5 to 4e-6 of
  gradient against the head's 0.5, in a run that reaches 100 %.
* *Skipped on some steps.* A residual branch dropped for the whole batch (stochastic depth in torchvision's
  mode='batch', LayerDrop) or an expert that got no tokens has an exactly-zero gradient on the steps that skip it
  and a healthy one on the others; sampled steps can happen to land on skipped ones only (a residual MLP dropping
  its blocks with p = 0.1-0.4: every 16th step from 128 to 240 was a dropped one for the last block, which trains
  on 143 of 250 steps). A layer whose gradient was exactly zero at an observed step and clearly healthy at a later
  one (by both tests, see :func:`_clearly_healthy`) is trained intermittently: its exact zeros are not reported
  from then on. A layer that trains and then gets exactly
  zero for good is still reported, and so is one zero from the start; zeros confirmed before the layer's first
  non-zero reading after them (a branch skipped on the first five steps in a row) are too.
* *Small from the start, and grown out of.* A layer whose gradient was small from its first reading and reads
  healthy later (:meth:`VanishingGradients.undone`, on the readings' history) was in a regime its initialisation
  set and training left: DeBERTa-v2's relative position table (read as a tensor by the disentangled attention,
  reached only through position projections of std 0.02: 3e-8 at step 0, 1e-3 by step 40) and Mamba's
  ``dt_proj`` (feeding a softplus held in its flat region on purpose: 6e-6, then 2e-4), in models that fit their
  tasks to 100 % and fit as well with those layers frozen outright (hunt 17). A gradient that stays small (behind
  a saturated softmax, through a deep sigmoid stack) is still reported; so is one that is exactly zero. A layer
  healthy at any earlier reading is not vanishing on a converged fit either.
* *Clipped, not vanished.* Every gradient is judged as the backward pass left it, before clipping (see
  :func:`_as_left`). Clipping some parameters and not others shrinks them against the rest; clipping all of them to
  a tiny norm (``max_grad_norm=1e-6``) puts every layer under the floor. Under SGD either holds the clipped layers
  still, and ``stalled_updates`` names the clipping; under Adam the first changes nothing.
* *Switched on later.* A layer whose gradient was exactly zero for a stretch and non-zero again before the run's
  last fully observed step (a loss term weighted 0 for a curriculum's first steps) is not reported for that stretch
  (:meth:`VanishingGradients.undone`); an exact zero that lasts to the end is.
* *The end of a fit.* A fit that has converged (:class:`~neuraldbg.detectors.base.FitProgress`: the loss's
  gradient w.r.t. the output fell tenfold, or the reported loss a hundredfold) has little left to learn, and its
  gradients shrink with it, the inner layers' often faster than the head's: a 16-block residual net with LayerNorm
  overfitting one batch under Adam ends with LayerNorm gradients of 4e-5, 3e-4 of the head's. A layer whose
  gradient was healthy at its first reading and is small (not exactly zero) on a converged fit is not vanishing.
  That includes a cross-entropy that began over chance, whose probability left off the right class fell tenfold (a
  Mamba LM whose loss fell 85-89-fold to 100 % held-out accuracy: its ``dt_proj``, healthy by step 10, reads 3e-5
  as it converges, the fit's doing).
  Gradients that vanish from the start are still reported however far the loss falls (a deep sigmoid net whose
  head alone fits), and so is an exact zero, which a fit does not produce. A first reading that is small for one
  of the reasons above (the query and key projections of attention at initialisation) is not vanishing from the
  start: a DistilBERT classifier whose key projection starts in the small-signal regime and whose loss then falls
  from 0.69 to 0.002 ends with that projection's gradient at 3e-6, 3e-4 of its head's, and is healthy.

Two exact zeros have a cause of their own, named in the explanation instead of the fixes for depth (residual
connections, normalisation, an initialisation), which would not help:

* *Factors that are all zero.* A module of the user's own (no standard layer) whose trainable parameters, two or
  more, are all exactly zero: the factors of a product, each getting its gradient through the others, so none gets
  any (a hand-written LoRA adapter with A and B both initialised to zero: every adapter gradient exactly 0 over the
  run, accuracy 0.375 against 0.733 with A random). The fix is LoRA's start: one factor random, the other zero.
* *An output the loss does not use.* A layer whose gradient is exactly zero while a layer before it in forward order
  (not inside it) gets a clearly healthy one: the loss reached that layer by another path, so the zero did not
  vanish through depth; the layer's output does not count in the loss (a two-headed net whose regression term is
  weighted 0: its head's gradient exactly 0, held-out R^2 -0.06 against 0.91 with the weight 0.5, while the trunk
  trains through the classification head). An attention whose softmax has a single key shows the same: its weight
  is 1 whatever the scores, so its query and key get exactly zero gradient while its value and the layers before
  it train (MobileViT's last stage on images under 128 px: a 2x2 feature map with patch size 2 is one patch; it
  reaches 99.5-100 % held-out accuracy). The explanation names that cause beside the others. It is not left out:
  the debugger does not read the attention's key count, and scores cut off from the loss in an attention over many
  keys give the same zeros, a real fault (scores multiplied by a 0/1 padding mask of zeros where the mask should be
  added as -inf: the weights stay uniform and the query never moves).

Root: the most downstream vanishing layer (the gradient vanishes from there back to the input), after every other
fault, which explains gradients it zeroes or shrinks. Config: ``vanishing_norm``, ``vanishing_ratio``,
``vanishing_floor``, ``quiet_output_rms``, ``fit_gradient_drop``, ``fit_loss_drop``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Collection
from dataclasses import replace
from itertools import accumulate

from ..capture import branches
from ..capture.coverage import Coverage, RunFacts
from ..config import DebugConfig
from ..detectors.base import Detector, Finding, FitProgress, LayerGradient, Observation, StepView, strength
from ..events import EventType, FailureKind, SemanticEvent
from ..health import GradientHealth, UpdateHealth
from ..reasoning.rules import CausalRule
from ..reasoning.topology import Topology
from ..text import num, quoted
from . import loss_evidence
from .base import Check, Kind, RootLane, Series, held, near

KIND = FailureKind.VANISHING_GRADIENTS


class VanishingDetector(Detector):
    name = "vanishing"
    track = "gradient"
    event_type = EventType.GRADIENT
    every_step = False

    def __init__(self) -> None:
        self._fit = FitProgress()
        self._started_healthy: dict[str, bool] = {}  # layer -> its first finite reading was not vanishing
        self._healthy_since: set[str] = set()  # layers with a healthy reading, at their first or a later one
        self._zero_seen: set[str] = set()  # layers whose gradient was exactly zero at an observed step
        self._intermittent: set[str] = set()  # ... and non-zero at a later one: skipped at times

    def observe(self, view: StepView) -> Observation | None:
        grads = _as_left(view)
        if not grads:
            return None
        cfg = view.ctx.config
        top = max((g.norm for g in grads.values() if math.isfinite(g.norm)), default=0.0)
        converged = view.data.target_grad is not None and view.data.target_grad < cfg.vanishing_floor * 1e3
        fitted = self._fit.converged(view)
        obs = Observation()
        vanishing: dict[str, dict[str, float]] = {}
        first: set[str] = set()  # layers read for the first time, small then
        reached_before: _ReachedBefore | None = None  # worked out at the step's first exact zero
        obs.saw_each(self.event_type, grads)
        for layer, g in grads.items():
            small = _small(g.norm, top, cfg)
            if layer not in self._started_healthy and not g.non_finite and math.isfinite(top):
                self._started_healthy[layer] = not (g.exact_zero or small)
                if not self._started_healthy[layer]:
                    first.add(layer)
            if not (g.non_finite or g.exact_zero or small) and math.isfinite(top):
                self._healthy_since.add(layer)
            if g.exact_zero:
                self._zero_seen.add(layer)
            elif layer in self._zero_seen and not g.non_finite and _clearly_healthy(g.norm, top, cfg):
                self._intermittent.add(layer)
            if g.non_finite or converged:
                continue  # non-finite: another state of this gradient; converged: small gradients are the fit
            metrics = {"grad_norm": g.norm, "max_layer_grad_norm": top}
            if g.exact_zero:
                if layer in self._intermittent:
                    continue  # zero on the steps that skip it (stochastic depth, LayerDrop, an expert without tokens)
                metrics["exact_zero"] = 1.0
                if _zero_factors(view, layer):
                    metrics["zero_factors"] = 1.0
                else:
                    if reached_before is None:
                        reached_before = _ReachedBefore(view, grads, top)
                    reached = reached_before(layer)
                    if reached > 0:
                        metrics["reached_before"] = reached
                vanishing[layer] = metrics
            elif small:
                if fitted and (self._started_healthy.get(layer, False) or layer in self._healthy_since):
                    continue  # healthy before, it shrank as the fit converged: the fit, not a fault
                metrics["ratio_to_max"] = g.norm / top if top > 0 else 0.0
                if self._started_healthy.get(layer) is False and layer not in self._healthy_since:
                    # small since its first reading (not excused then): undone if it grows out of it (undone)
                    metrics["small_from_first_reading"] = 1.0
                vanishing[layer] = metrics
        healthy = _Healthy(view, grads, vanishing)
        for layer, metrics in vanishing.items():
            if _cancelled(view, layer) or _quiet(view, layer, grads, healthy) or _gated(view, layer, vanishing):
                if layer in first:  # small at its first reading by construction, not vanishing: it started healthy
                    self._started_healthy[layer] = True
                continue
            s = 1.0 if "exact_zero" in metrics else strength(metrics["grad_norm"], cfg.vanishing_norm, decades=6)
            obs.findings.append(Finding(self.event_type, KIND, layer, GradientHealth.VANISHING, metrics, s))
        return obs


def _as_left(view: StepView) -> dict[str, LayerGradient]:
    """The step's layer gradients as the backward pass left them: a layer whose gradient clipping shrank is judged
    by its norm before clipping. Vanishing is the backward pass losing the gradient on its way down, and clipping
    scales what it left: all of it (``max_grad_norm=1e-6``: every layer a millionth of its size, the small-signal
    layers of attention at initialisation below the floor, and the ratios between layers as they were), or some
    parameters' and not others' (``clip_grad_norm_`` over an encoder's parameters alone, Lightning's
    ``clip_gradients`` on one of two optimizers: shrunk against the rest). A clipping that keeps the updates from
    moving the weights is ``stalled_updates``' to find, and it names the clipping."""
    grads = view.layer_gradients
    before = view.layer_norms_before_clip
    if not before:
        return grads
    return {
        layer: replace(g, norm=before[layer]) if layer in before and math.isfinite(before[layer]) else g
        for layer, g in grads.items()
    }


def _small(norm: float, top: float, cfg: DebugConfig) -> bool:
    """Whether a layer's gradient norm is vanishingly small: below ``vanishing_floor``, or below both
    ``vanishing_norm`` and ``vanishing_ratio`` of the largest layer's (``top``) at the same step."""
    return norm < cfg.vanishing_floor or (norm < cfg.vanishing_norm and norm < cfg.vanishing_ratio * top)


def _clearly_healthy(norm: float, top: float, cfg: DebugConfig) -> bool:
    """Whether a layer's gradient norm is healthy by both of :func:`_small`'s tests: at least ``vanishing_norm``
    and at least ``vanishing_ratio`` of the largest layer's. What ends a stretch of small or zero gradients (a
    branch trained at times, a start grown out of) must be this: a layer behind a saturated softmax, whose
    gradient is zero or ~1e-7 on most steps, reads 0.6 at a step where the largest layer's surges to 1e3 with it
    (5e-4 of it: not small by the absolute test, still small by the relative one), and is still vanishing."""
    return math.isfinite(norm) and norm >= cfg.vanishing_norm and norm >= cfg.vanishing_ratio * top


def _zero_factors(view: StepView, layer: str) -> bool:
    """Whether ``layer`` is a module of the user's own (no standard layer: no unit weight, no normalisation) whose
    trainable parameters, two or more, all read a norm of exactly 0: factors of a product all at zero (a LoRA
    adapter's A and B). The gradient of each factor is the others' product times the output's gradient, so it is
    exactly zero whatever the loss gives. A standard layer's bias takes its output's gradient as it is: a zero
    Linear's exact zero is the loss's doing, not its own."""
    ctx, data = view.ctx, view.data
    info = ctx.infos.get(layer)
    if info is None or info.unit_weight is not None or info.normalizes:
        return False
    read = [name for name in info.params if name in data.grad]
    norms = [_weight_norm(data.update_before.get(name), data.update.get(name)) for name in read]
    return len(norms) >= 2 and all(norm == 0.0 for norm in norms)


def _weight_norm(before: float | None, update: tuple[float, float] | None) -> float | None:
    """A parameter's norm before the step when read, else after it (None when neither was)."""
    if before is not None and math.isfinite(before):
        return before
    return update[1] if update is not None else None


class _ReachedBefore:
    """For a step's exact zeros: the largest clearly healthy gradient (:func:`_clearly_healthy` against ``top``, the
    step's largest) of a layer that comes before a given one in forward order and is not inside it (0 when none).
    The loss reached that layer by a path that does not pass through the given one, so the given one's exact zero
    did not vanish on its way back through depth: its output does not count in the loss (a loss term weighted 0, an
    output left out, a .detach()).

    Worked out once per step: the healthy layers by forward position with their running largest norm, so a layer's
    answer is one binary search (a 200-layer MLP whose first 91 layers read exactly zero behind a dead one asked it
    91 times a step, each a pass over all 200: 22 ms a fully observed step). A layer with layers inside it (whose
    outputs come before its own) is answered by a pass that leaves those out."""

    def __init__(self, view: StepView, grads: dict[str, LayerGradient], top: float) -> None:
        ctx, cfg = view.ctx, view.ctx.config
        self._position = ctx.position
        self._grads = grads
        self._healthy = sorted(
            (ctx.position((name, 0)), g.norm, name)
            for name, g in grads.items()
            if not g.exact_zero and _clearly_healthy(g.norm, top, cfg)
        )
        self._positions = [p for p, _, _ in self._healthy]
        self._largest = list(accumulate((n for _, n, _ in self._healthy), max))
        self._containers = {name.rsplit(".", k)[0] for name in grads for k in range(1, name.count(".") + 1)}

    def __call__(self, layer: str) -> float:
        here = self._position((layer, 0))
        before = bisect_left(self._positions, here)
        if layer not in self._containers:
            return self._largest[before - 1] if before else 0.0
        inside = layer + "."
        return max((n for _, n, name in self._healthy[:before] if not name.startswith(inside)), default=0.0)


def _cancelled(view: StepView, layer: str) -> bool:
    """A normalisation layer feeding a per-channel renormalisation: its affine is divided out again."""
    ctx = view.ctx
    if not ctx.infos[layer].normalizes:
        return False
    following = ctx.next_output(layer)
    return following is not None and ctx.infos[following].renormalizes_channels


class _Healthy:
    """The step's layers with a gradient that is neither vanishing nor non-finite, as :func:`_quiet` asks about
    them: the forward position of the first, and how many there are under each parent module. Worked out once per
    step, at the first question (a pass over every layer per vanishing layer made a model of many small-signal
    layers quadratic in its depth)."""

    def __init__(self, view: StepView, grads: dict[str, LayerGradient], vanishing: Collection[str]) -> None:
        self._view, self._grads, self._vanishing = view, grads, vanishing
        self._layers: set[str] | None = None
        self.first = 0  # the smallest forward position among them
        self.parents: dict[str, int] = {}

    def layers(self) -> set[str]:
        if self._layers is None:
            position = self._view.ctx.position
            self._layers = {
                other for other, og in self._grads.items() if other not in self._vanishing and not og.non_finite
            }
            self.first = min((position((other, 0)) for other in self._layers), default=0)
            for other in self._layers:
                parent = other.rpartition(".")[0]
                self.parents[parent] = self.parents.get(parent, 0) + 1
        return self._layers

    def before_and_beside(self, layer: str, here: int) -> bool:
        """Whether one of them comes before forward position ``here`` and another (or the same) one is not
        ``layer`` and shares its parent module."""
        layers = self.layers()
        if not layers or self.first >= here:
            return False
        beside = self.parents.get(layer.rpartition(".")[0], 0)
        return beside - (layer in layers) > 0


def _quiet(view: StepView, layer: str, grads: dict[str, LayerGradient], healthy: _Healthy) -> bool:
    """A tiny (not zero, not below the floor) gradient on a layer with a quiet output, while a layer before it and a
    layer beside it (same parent module) get healthy gradients: the small-signal regime of attention at
    initialisation."""
    g = grads[layer]
    ctx = view.ctx
    if g.exact_zero or g.norm < ctx.config.vanishing_floor:
        return False
    rms = view.rms((_signal(view, layer), 0))
    if not (rms < ctx.config.quiet_output_rms):  # also False for NaN: an unmeasured output proves nothing
        return False
    return healthy.before_and_beside(layer, ctx.position((layer, 0)))


def _signal(view: StepView, layer: str) -> str:
    """The layer whose output tells whether ``layer``'s signal is small: its own, or for a normalisation layer the
    output of the layer it feeds. A normalisation layer's output is standardised (its rms is its gain, ~1), so it
    says nothing about the regime; the layer after it (the query projection a cross-attention's pre-norm feeds) does.
    """
    ctx = view.ctx
    if ctx.infos[layer].normalizes:
        following = ctx.next_output(layer)
        if following is not None:
            return following
    return layer


#: A learnable gate whose elements are this small (rms) scales its branch's output, and so the gradient of every
#: layer in the branch, down a hundredfold or more: LayerScale (ConvNeXt, CaiT: 1e-6 to 1e-4), ReZero and SkipInit
#: (0). PyTorch's default initialisation gives no weight that small below a fan-in of 3,333.
GATE_RMS = 1e-2


def _gated(view: StepView, layer: str, vanishing: Collection[str]) -> bool:
    """A tiny (not zero) gradient in a residual branch scaled by a small learnable gate that itself learns: a
    parameter held by a module enclosing the layer (HF ConvNeXt's ``layer_scale_parameter``) or by a module next to
    it that is no standard layer (timm's ``LayerScale``), whose elements are below ``GATE_RMS`` and whose own
    gradient is healthy. The branch's gradient is the gate times what it would be: small by construction, and it
    grows as the gate does."""
    ctx, data = view.ctx, view.data
    g = view.layer_gradients[layer]
    if g.exact_zero or g.norm < ctx.config.vanishing_floor:
        return False
    for holder in ctx.gate_holders(layer):
        if holder in vanishing or holder not in view.layer_gradients:
            continue
        for param in ctx.infos[holder].params:
            update, numel = data.update.get(param), data.grad_numel.get(param, 0)
            before = data.update_before.get(param)
            weight = before if before is not None and math.isfinite(before) else (update[1] if update else None)
            if weight is not None and numel and weight / math.sqrt(numel) < GATE_RMS:
                return True
    return False


def _grew_out(event: SemanticEvent, facts: RunFacts) -> bool:
    """Whether the layer of ``event`` read a clearly healthy gradient (:func:`_clearly_healthy`) at a fully
    observed step after the event ended, and at none within it (an event the store merged from two small stretches
    with a healthy gap between them is not one start that training grew out of). Read from the history of the
    layer's gradient norms and of the largest layer's (``RunFacts.largest_gradient``) at the same steps: a step one
    series dropped as it thinned and the other kept is not compared."""
    history, cfg = facts.history, facts.config
    if history is None or event.metrics.get("ongoing"):
        return False
    own, largest = history.get("grad_norm", event.layer), facts.largest_gradient
    if own is None or largest is None:
        return False
    tops = dict(largest.points())

    def healthy(step: int, norm: float) -> bool:
        return step in tops and _clearly_healthy(norm, tops[step], cfg)

    grew = False
    for step, norm in own.points():
        if step < event.step_start:
            continue
        if healthy(step, norm):
            if step <= event.step_end:
                return False  # healthy within the event: two stretches merged
            grew = True
    return grew


def _routed_around(event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
    """Whether the layer of ``event`` is in a parallel copy of a block (capture/branches.py: an expert of a mixture
    computed densely, given the same tensor as the others) that gets no gradient as a whole, while its counterpart
    in another copy reads clearly healthy gradients (:func:`_clearly_healthy`): at most of the fully observed steps
    of the event, no layer of the copy does and that counterpart does. The loss reaches the block through the other
    copies, and this one is a copy the model stopped using (a router that no longer chooses an expert gives it an
    exactly-zero gradient; a mixture of 16 experts whose router settles on 4 leaves 12 so): its gradient did not
    vanish on its way back. A copy one of whose layers trains (a gradient that vanishes inside it: a member of an
    ensemble saturated within) is kept, and so is one whose counterparts are as small (a fault of the block, or of
    what feeds it)."""
    root = branches.copy_of(event.layer, coverage.parallel)
    history, largest = facts.history, facts.largest_gradient
    if root is None or history is None or largest is None:
        return False
    tops = dict(largest.points())

    def trains(layer: str) -> bool:
        series = history.get("grad_norm", layer)
        points = series.points() if series is not None else []
        within = [(s, n) for s, n in points if event.step_start <= s <= event.step_end and s in tops]
        good = sum(_clearly_healthy(n, tops[s], facts.config) for s, n in within)
        return bool(within) and 2 * good >= len(within)

    if any(trains(layer) for layer in history.layers("grad_norm") if branches.inside(layer, root)):
        return False
    return any(trains(other) for other in branches.siblings(event.layer, coverage.parallel))


def _first_reading_small(event: SemanticEvent, facts: RunFacts) -> bool:
    """Whether the layer of ``event`` read a small gradient at its first fully observed step, though the event
    itself began later: a start small by construction that a brief healthy reading interrupted before it went on
    (a selective-scan model's step-size projection: 3e-6 at step 0, 1e-4 at step 32, 2e-5 over steps 48-160, then
    healthy)."""
    history = facts.history
    own, largest = (history.get("grad_norm", event.layer), facts.largest_gradient) if history else (None, None)
    if own is None or largest is None:
        return False
    tops = dict(largest.points())
    first = next(((step, norm) for step, norm in own.points() if step in tops), None)
    if first is None or first[0] >= event.step_start:  # the event began there: its own flag says
        return False
    return math.isfinite(first[1]) and _small(first[1], tops[first[0]], facts.config)


class VanishingGradients(Kind):
    name = KIND.value
    # updates as large as the weights can leave a layer where it passes no gradient (a softmax or a saturating
    # activation pushed to its extremes): begun while or after they came, at the learning rate still in force, it is
    # that learning rate's doing
    lr_sensitive = True
    surge_victim = True
    states = (GradientHealth.VANISHING,)
    lists_own = True
    check = Check("assert_no_vanishing_gradients", "vanishing gradients")

    def detectors(self, config: DebugConfig) -> list[Detector]:
        return [VanishingDetector()]

    def undone(self, event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
        """An exact zero that ended: the layer's gradient was exactly zero for a stretch and non-zero again at a
        fully observed step before the last one (a loss term weighted 0 for the first 100 steps of a multi-task
        curriculum, then 0.5: its head trained after and learned its regression). An exact zero is a switch, not a
        gradient shrinking on its way back; one that holds to the end (the term never switched on, a detached
        branch) is still reported, and so is a small gradient that recovered after starting healthy.

        A small gradient from the layer's first reading that reads healthy after the event and at no step within it
        (:func:`_grew_out`) is undone too: a start small by construction that training grew out of. And a stretch
        of small gradients that passed: it ended, over at most :data:`.loss_evidence.PASSED_SPAN` of the run's
        steps, before the run's last quarter of losses, in a run whose loss fell (a BART under the Trainer's
        warm-up: its first encoder layer's attention read 1e-7 of the largest gradient over steps 22-108 of 600
        while cross-attention learned to line up, then the loss fell from 3.9 to 0.06 and held-out accuracy reached
        1.0)."""
        if event.kind is not KIND:
            return False
        if loss_evidence.passed_before_the_fit(event, coverage, facts.config):
            return True
        if _routed_around(event, coverage, facts):
            return True
        m = event.metrics
        if m.get("exact_zero") != 1.0:
            small_at_first = m.get("small_from_first_reading") == 1.0 or _first_reading_small(event, facts)
            return small_at_first and _grew_out(event, facts)
        return event.step_end < coverage.last_full_step

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(6, last_first=True)

    def rules(self) -> list[CausalRule]:
        return [
            CausalRule(
                "vanishing-spreads-upstream",
                "vanishes further into",
                KIND,
                (GradientHealth.VANISHING,),
                "upstream",
                same_place_joins=True,
            ),
            CausalRule("vanishing-stalls-updates", "stalls", KIND, (UpdateHealth.STALLED,), same_place_joins=True),
        ]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        # the other kinds' events in ``rest`` are what it caused (listed after this text), not layers it vanished in
        events = [root, *(e for e in rest if e.kind is KIND)]
        lowest = min(events, key=lambda e: e.metrics.get("grad_norm", math.inf))
        top = root.metrics.get("max_layer_grad_norm", 0.0)
        all_zero = all(e.metrics.get("exact_zero") == 1.0 for e in events)
        layers = sorted({e.layer for e in events}, key=topo.position)
        if all_zero and root.metrics.get("zero_factors") == 1.0:
            return _zero_factors_words(root, events, layers, topo)
        if all_zero and root.metrics.get("reached_before", 0.0) > 0:
            return _unused_output_words(root, layers, topo)
        last = topo.last_parametric()
        reference = ""
        if last is not None and last not in layers:
            value = near(series, "grad_norm", last, root.step_start)
            if value is not None:
                reference = f", {num(value)} at '{last}'"
        what = (
            f"Vanishing gradients in {len(layers)} layer{'s' if len(layers) > 1 else ''} back from "
            f"{topo.describe(root.layer)} {held(root, topo)}: gradient norm "
            f"{num(lowest.metrics.get('grad_norm', 0.0))} at '{lowest.layer}'{reference}"
            f" (largest layer gradient {num(top)})."
        )
        if all_zero:
            fix = (
                "the gradients are exactly zero: the loss does not depend on these parameters - look for a "
                ".detach(), an argmax or comparison, or a ReLU that is dead for every input on the path to the loss; "
                "two factors of a product both initialised to zero (a LoRA adapter's A and B) give each other none: "
                "initialise one of them randomly."
            )
        else:
            fix = (
                "add residual connections or normalisation layers (BatchNorm, LayerNorm), use a non-saturating "
                "activation (ReLU, GELU) instead of sigmoid/tanh, and use Kaiming (ReLU) or Xavier (tanh) "
                "initialisation."
            )
        raw = _raw_input(root, topo, series)
        if raw is not None and not all_zero:
            what += (
                f" The input batch enters {topo.describe(root.layer)}, the first layer it meets, at root-mean-square "
                f"{num(raw)}, far from unit scale: its gates and saturating units are pinned there."
            )
            fix = (
                "standardise the inputs (subtract each feature's mean, divide by its standard deviation, computed on "
                "the training data) before they reach the model; then, if gradients still vanish, " + fix
            )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        if event.metrics.get("exact_zero") == 1.0:
            return "gradient exactly zero"
        return f"gradient vanishing (norm {num(event.metrics.get('grad_norm', 0.0))})"

    def label(self, event: SemanticEvent) -> str:
        m = event.metrics
        return "zero gradient" if m.get("exact_zero") else f"vanishing gradient: {num(m.get('grad_norm', 0.0))}"

    def effect(self, event: SemanticEvent) -> str:
        return "vanishing or zero gradients"


def _zero_factors_words(
    root: SemanticEvent, events: list[SemanticEvent], layers: list[str], topo: Topology
) -> tuple[str, str]:
    """The explanation of exact zeros in modules whose trainable parameters are all zero (:func:`_zero_factors`)."""
    factors = [layer for layer in layers if any(e.layer == layer and e.metrics.get("zero_factors") for e in events)]
    others = [layer for layer in layers if layer not in factors]
    what = (
        f"Exactly zero gradient in {quoted(factors)} ({topo.types.get(root.layer, 'module')}) {held(root, topo)}: "
        f"every trainable parameter of {'it' if len(factors) == 1 else 'each'} is exactly zero, and so is its "
        "gradient. They are factors of a product (a LoRA adapter's A and B) both initialised to zero: the gradient "
        "of each is taken through the other, so each gives the other none and neither ever moves."
    )
    if others:
        what += f" The gradient is exactly zero in {quoted(others)} too."
    fix = (
        "initialise one factor of each product randomly and leave the other at zero, as LoRA does (A random, e.g. "
        "Kaiming-uniform, B zero): the product still starts at zero and both factors get a gradient."
    )
    return what, fix


def _unused_output_words(root: SemanticEvent, layers: list[str], topo: Topology) -> tuple[str, str]:
    """The explanation of an exact zero at a layer while the loss reaches layers before it by another path."""
    reached = root.metrics.get("reached_before", 0.0)
    others = [layer for layer in layers if layer != root.layer]
    what = (
        f"Exactly zero gradient at {topo.describe(root.layer)} {held(root, topo)}, while layers before it get one "
        f"(up to {num(reached)}): the gradient did not vanish on its way back, the loss never reached this layer. "
        "Its output does not count in the loss: a loss term multiplied by 0 (a loss weight of 0), an output left "
        "out of the loss, or a .detach() between it and the loss; or, for the query and key of an attention, a "
        "softmax over a single key (a sequence of length 1, a feature map that is one patch), whose weight is 1 "
        "whatever the scores."
    )
    if others:
        what += f" The gradient is exactly zero in {quoted(others)} too."
    fix = (
        "give the loss term of this output a non-zero weight (or add it to the loss, or remove the .detach()); if "
        "the output is not meant to be trained, remove the layer or set requires_grad=False on its parameters. An "
        "attention over a single key trains as its value path, unharmed: give it more keys (larger inputs, a "
        "smaller patch size) if it is meant to attend, else drop its query and key."
    )
    return what, fix


def _raw_input(root: SemanticEvent, topo: Topology, series: Series) -> float | None:
    """The input batch's root-mean-square over the first quarter of the run (its median) when it lies far from unit
    scale (see :data:`.loss_evidence.RAW_INPUT_RMS`) and ``root`` is the first layer with parameters the input meets
    (a recurrent layer fed raw values in the thousands: its gates saturate at once); else None."""
    first = next((name for name in topo.order if name and topo.roles.get(name) in ("parametric", "gated")), None)
    return loss_evidence.raw_input_rms(series, topo.last_step) if root.layer == first else None
