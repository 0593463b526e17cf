"""Gradient health of each parametric layer: healthy, vanishing, exploding or non-finite.

A layer's gradient norm is the L2 norm over the parameters it owns directly (a bias before a BatchNorm gets
an exactly-zero gradient by construction; folding it into its layer keeps that silent). Vanishing needs both an
absolute and a relative test (below ``vanishing_norm`` *and* below ``vanishing_ratio`` of the largest layer at
the same step), except for an exact zero or a norm below ``vanishing_floor``, which no healthy layer shows
while the loss still has a gradient to give.
"""

from __future__ import annotations

import math

from ..events import EventType, FailureKind
from ..health import GradientHealth
from .base import Detector, Finding, Observation, StepView, strength


class GradientDetector(Detector):
    name = "gradient"
    event_type = EventType.GRADIENT
    every_step = False

    def observe(self, view: StepView) -> Observation | None:
        grads = view.layer_gradients
        if not grads:
            return None
        cfg = view.ctx.config
        top = max((g.norm for g in grads.values() if math.isfinite(g.norm)), default=0.0)
        converged = view.data.target_grad is not None and view.data.target_grad < cfg.vanishing_floor * 1e3
        floor = cfg.vanishing_floor
        clip = view.data.grad_clip_factor or 1.0
        obs = Observation()
        for layer, g in grads.items():
            obs.saw(self.event_type, layer)
            metrics = {"grad_norm": g.norm, "max_layer_grad_norm": top}
            if g.non_finite:
                obs.findings.append(self._finding(layer, GradientHealth.NON_FINITE, metrics, 1.0, True))
            elif g.norm * clip > cfg.exploding_norm:  # judged before clipping: clip_grad_norm_ hides, not heals
                if clip > 1:
                    metrics.update(grad_norm=g.norm * clip, clipped_grad_norm=g.norm, clip_factor=clip)
                s = strength(g.norm * clip, cfg.exploding_norm, decades=3, above=True)
                obs.findings.append(self._finding(layer, GradientHealth.EXPLODING, metrics, s))
            elif converged:
                continue  # the loss has (almost) nothing left to give: small gradients are the fit, not a fault
            elif g.exact_zero:
                metrics["exact_zero"] = 1.0
                obs.findings.append(self._finding(layer, GradientHealth.VANISHING, metrics, 1.0))
            elif g.norm < floor or (g.norm < cfg.vanishing_norm and g.norm < cfg.vanishing_ratio * top):
                metrics["ratio_to_max"] = g.norm / top if top > 0 else 0.0
                s = strength(g.norm, cfg.vanishing_norm, decades=6)
                obs.findings.append(self._finding(layer, GradientHealth.VANISHING, metrics, s))
        return obs

    def _finding(
        self, layer: str, state: GradientHealth, metrics: dict[str, float], s: float, decisive: bool = False
    ) -> Finding:
        kind: FailureKind | None = state.kind
        return Finding(self.event_type, kind, layer, state.value, metrics, s, decisive=decisive)
