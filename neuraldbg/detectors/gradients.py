"""Gradient health of each parametric layer: healthy, vanishing, exploding or non-finite.

A layer's gradient norm is the L2 norm over the parameters it owns directly (a bias before a BatchNorm gets
an exactly-zero gradient by construction; folding it into its layer keeps that silent).

**Exploding**: a norm above ``exploding_norm``, judged before clipping (``clip_grad_norm_`` hides an explosion,
it does not cure it) and measured in units of the loss's own gradient scale. Every parameter gradient is
proportional to d(loss)/d(output): a loss summed over N elements (``reduction="sum"``, a VAE's usual
reconstruction term) multiplies every gradient by N compared with its mean, with no change to what Adam-like
optimizers do. So the threshold is multiplied by the loss gradient's norm whenever that is above 1 (the
smallest seen so far: the loss's reduction is fixed for a run, while a real explosion inflates the loss gradient
too). Mean-reduced losses have loss gradients below 1 and keep the plain threshold. Once a layer explodes,
readings down to ``exploding_hold`` of the threshold continue its state without confirming it (provisional): a
clipped recurrent net whose raw norm swings between 5e2 and 7e3 from step to step is one explosion, not a series
of blips too short to count, while a single spike followed by smaller readings never becomes one.

**Vanishing** needs both an absolute and a relative test (below ``vanishing_norm`` *and* below
``vanishing_ratio`` of the largest layer at the same step), except for an exact zero or a norm below
``vanishing_floor``, which no healthy layer shows while the loss still has a gradient to give. Three kinds of small
gradient are not vanishing gradients, and are recognised from the structure and the layer's own output:

* *Cancelled by construction.* A normalisation layer whose output goes straight into a BatchNorm or
  InstanceNorm (BatchNorm -> BatchNorm, LayerNorm -> BatchNorm1d, conv -> BatchNorm -> BatchNorm): the second
  norm standardises each channel again, dividing out any per-channel scale and adding back any shift the first
  one applies, so the first one's affine weight and bias get a gradient of ~0 (up to the second norm's epsilon),
  like a conv bias before a BatchNorm. Nothing is lost, and no learning rate or init changes it.
* *A small-signal regime.* Attention logits are ``s_ij = q_i . k_j / sqrt(d)`` with ``q = W_q x``,
  ``k = W_k x``; the attention output is ``sum_j p_ij v_j`` with ``p_i = softmax(s_i)``. Then

  ``dL/dq_i = (1/sqrt(d)) sum_j p_ij (g_i . (v_j - vbar_i)) k_j``, with ``g_i = dL/d(output_i)`` and
  ``vbar_i = sum_j p_ij v_j``,

  and ``dL/dW_q = sum_i dL/dq_i x_i^T`` (``dL/dW_k`` likewise, with the roles of q and k swapped). At
  initialisation the logits are near zero, so attention is near-uniform and ``v_j - vbar_i`` is only the spread of
  the values around their mean; the gradient of W_q is a product of three small factors: the keys (a projection
  by the small W_k), the spread of the values (a projection by the small W_v) and ``g`` (which reaches the
  attention through the small output projection). With BERT's init (std 0.02, hidden 64) that is ~5e-5 of the
  classifier's gradient, while W_v's gradient, which lacks two of the factors, is ~1e-2. It is not a trap: the
  softmax is in its near-linear regime, and the gradient grows as W_k, W_v and W_o grow with training. It is
  *saturation* that traps (logits so large that ``p_ij (1 - p_ij)`` is ~0 for every pair): then the query and
  key outputs are large. So a layer whose tiny gradient comes with a *quiet* output (rms below
  ``quiet_output_rms``, logits of at most ~1 from such queries and keys) is in the small-signal regime, provided
  the gradient does reach it: a layer before it in forward order gets a healthy gradient (otherwise the gradient
  vanishes through depth, as in a GRU whose update gate is stuck open, whose output is quiet too), and so does a
  layer beside it, in the same parent module (the value projection next to the query and the key; otherwise the
  whole block is cut off, as behind a gate stuck closed, however small its outputs are).
* *The end of a fit.* A fit that has converged (:class:`~.base.FitProgress`: the loss's gradient w.r.t. the
  output fell tenfold, or the reported loss a hundredfold) has little left to learn, and its gradients shrink
  with it, the inner layers' often faster than the head's: a 16-block residual net with LayerNorm overfitting
  one batch under Adam ends with LayerNorm gradients of 4e-5, 3e-4 of the head's. A layer whose gradient was
  healthy at its first reading and is small (not exactly zero) on a converged fit is not vanishing. Gradients
  that vanish from the start are still reported however far the loss falls (a deep sigmoid net whose head
  alone fits), and so is an exact zero, which a fit does not produce.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

from ..events import EventType, FailureKind
from ..health import GradientHealth
from .base import Detector, Finding, FitProgress, LayerGradient, Observation, StepView, strength


class GradientDetector(Detector):
    name = "gradient"
    event_type = EventType.GRADIENT
    every_step = False

    def __init__(self) -> None:
        self._loss_scale: float | None = None  # smallest finite, positive d(loss)/d(output) norm seen so far
        self._exploding: set[str] = set()  # layers whose last reading was exploding
        self._fit = FitProgress()
        self._started_healthy: dict[str, bool] = {}  # layer -> its first finite reading was not vanishing

    def _scale(self, target_grad: float | None) -> float:
        """The loss's gradient scale: 1 for losses whose gradient w.r.t. the output is at most 1 (mean-reduced
        losses), the smallest loss-gradient norm so far above that (sums over many elements)."""
        if target_grad is not None and math.isfinite(target_grad) and target_grad > 0:
            self._loss_scale = target_grad if self._loss_scale is None else min(self._loss_scale, target_grad)
        return max(1.0, self._loss_scale or 0.0)

    def observe(self, view: StepView) -> Observation | None:
        grads = view.layer_gradients
        if not grads:
            return None
        cfg = view.ctx.config
        top = max((g.norm for g in grads.values() if math.isfinite(g.norm)), default=0.0)
        converged = view.data.target_grad is not None and view.data.target_grad < cfg.vanishing_floor * 1e3
        fitted = self._fit.converged(view)
        floor = cfg.vanishing_floor
        clip = view.data.grad_clip_factor or 1.0
        scale = self._scale(view.data.target_grad)
        limit = cfg.exploding_norm * scale
        obs = Observation()
        vanishing: dict[str, dict[str, float]] = {}
        for layer, g in grads.items():
            obs.saw(self.event_type, layer)
            was_exploding = layer in self._exploding
            self._exploding.discard(layer)  # added back below while it keeps exploding
            metrics = {"grad_norm": g.norm, "max_layer_grad_norm": top}
            small = g.norm < floor or (g.norm < cfg.vanishing_norm and g.norm < cfg.vanishing_ratio * top)
            if layer not in self._started_healthy and not g.non_finite and math.isfinite(top):
                self._started_healthy[layer] = not (g.exact_zero or small)
            if g.non_finite:
                obs.findings.append(self._finding(layer, GradientHealth.NON_FINITE, metrics, 1.0, True))
            elif g.norm * clip > limit or (was_exploding and g.norm * clip > limit * cfg.exploding_hold):
                # judged before clipping: clip_grad_norm_ hides, not heals
                if clip > 1:
                    metrics.update(grad_norm=g.norm * clip, clipped_grad_norm=g.norm, clip_factor=clip)
                if scale > 1:
                    metrics["loss_gradient_scale"] = scale
                s = strength(g.norm * clip, limit, decades=3, above=True)
                finding = self._finding(layer, GradientHealth.EXPLODING, metrics, s)
                if g.norm * clip <= limit:
                    finding = dataclasses.replace(finding, provisional=True)
                obs.findings.append(finding)
                self._exploding.add(layer)
                continue
            elif converged:
                continue  # the loss has (almost) nothing left to give: small gradients are the fit, not a fault
            elif g.exact_zero:
                metrics["exact_zero"] = 1.0
                vanishing[layer] = metrics
            elif small:
                if fitted and self._started_healthy.get(layer, False):
                    continue  # healthy at first, it shrank as the fit converged: the fit, not a fault
                metrics["ratio_to_max"] = g.norm / top if top > 0 else 0.0
                vanishing[layer] = metrics
        for layer, metrics in vanishing.items():
            if self._cancelled(view, layer) or self._quiet(view, layer, grads, vanishing):
                continue
            s = 1.0 if "exact_zero" in metrics else strength(metrics["grad_norm"], cfg.vanishing_norm, decades=6)
            obs.findings.append(self._finding(layer, GradientHealth.VANISHING, metrics, s))
        return obs

    @staticmethod
    def _cancelled(view: StepView, layer: str) -> bool:
        """A normalisation layer feeding a per-channel renormalisation: its affine is divided out again."""
        ctx = view.ctx
        if not ctx.infos[layer].normalizes:
            return False
        following = ctx.next_output(layer)
        return following is not None and ctx.infos[following].renormalizes_channels

    @staticmethod
    def _quiet(view: StepView, layer: str, grads: dict[str, LayerGradient], vanishing: Collection[str]) -> bool:
        """A tiny (not zero, not below the floor) gradient on a layer with a quiet output, while a layer before it
        and a layer beside it (same parent module) get healthy gradients: the small-signal regime of attention
        at initialisation."""
        g = grads[layer]
        ctx = view.ctx
        if g.exact_zero or g.norm < ctx.config.vanishing_floor:
            return False
        rms = view.rms((layer, 0))
        if not (rms < ctx.config.quiet_output_rms):  # also False for NaN: an unmeasured output proves nothing
            return False
        here = ctx.position((layer, 0))
        parent = layer.rpartition(".")[0]
        healthy = [other for other, og in grads.items() if other not in vanishing and not og.non_finite]
        return any(ctx.position((other, 0)) < here for other in healthy) and any(
            other != layer and other.rpartition(".")[0] == parent for other in healthy
        )

    def _finding(
        self, layer: str, state: GradientHealth, metrics: dict[str, float], s: float, decisive: bool = False
    ) -> Finding:
        kind: FailureKind | None = state.kind
        return Finding(self.event_type, kind, layer, state.value, metrics, s, decisive=decisive)
