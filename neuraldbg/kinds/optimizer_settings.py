"""Optimizer settings besides the learning rate that size the steps, and the words that name them.

Two settings far outside their usual range make the steps far too small or far too large on their own, and the
learning-rate advice a finding gives otherwise does not undo them:

* **An adaptive optimizer's eps far above the gradients' root-mean-square** (Adam, AdamW, RMSprop, Adagrad, ...):
  its step ``lr * m / (sqrt(v) + eps)`` is about ``lr`` per weight while ``sqrt(v)``, the gradients' scale, is far
  above ``eps``; far below it the step is about ``lr * g / eps``, SGD at ``lr / eps``, shrunk by eps over the
  gradients' scale. Sweep M: a small transformer classifier under ``Adam(lr=1e-3, eps=1.0)`` (eps taken for a
  "stability" knob) moved its weights by about 1e-5 of their norm a step and reached held-out accuracy 0.26, against
  1.00 at the default eps=1e-8; it was told to raise the learning rate 110x, which would make it SGD at a larger rate.
* **Momentum of 0.99 or more** (SGD's, or RMSprop's): the velocity adds up about ``1 / (1 - momentum)`` gradients, so
  each step is that many times ``lr`` times the gradient. Sweep M: an MLP regression under
  ``SGD(lr=0.1, momentum=0.999)`` (an effective learning rate of 100) had a layer's ReLU units all dead from step 7,
  held-out R^2 -0.09; the advice it got, a learning rate 10x lower at the same momentum, still gave -0.12, while
  momentum 0.9 at the same learning rate gave 0.92.

The capture reads them from the optimizers' ``param_groups`` on fully observed steps (host reads, beside the
learning rate) into the history's series :data:`EPS` and :data:`MOMENTUM`: the largest ``eps`` of an adaptive
optimizer's groups, and the largest ``momentum`` of the groups that do not dampen it; and, beside an eps, the
gradients' root-mean-square per weight over the model (:data:`GRAD_RMS`). A finding names the setting
first where it explains it, and keeps its learning-rate advice otherwise.
"""

from __future__ import annotations

from ..text import num
from .base import Series, near

#: The series of an adaptive optimizer's largest ``eps``.
EPS = "eps"
#: The series of the gradients' root-mean-square per weight over the model, recorded beside :data:`EPS`.
GRAD_RMS = "grad_rms"
#: The series of the largest undampened ``momentum``.
MOMENTUM = "momentum"
#: The largest usual eps (PyTorch's default is 1e-8; 1e-6 is common under mixed precision).
USUAL_EPS = 1e-6
#: An eps at least this many times the gradients' root-mean-square shrinks the steps by about that much: the step
#: ``lr * g / (|g| + eps)`` is a tenth of ``lr`` or less.
EPS_OVER_GRADIENTS = 10.0
#: Momentum at or above this adds up 100 gradients or more in each step (0.9, the usual value, adds up 10).
HEAVY_MOMENTUM = 0.99
#: The momentum the fixes suggest.
USUAL_MOMENTUM = 0.9


def eps_explains(series: Series | None, start: int, end: int) -> tuple[str, str] | None:
    """The words (an addition to the finding's explanation, and the fix) for steps too small that an adaptive
    optimizer's eps explains: its eps, recorded nearest to ``start``, is above :data:`USUAL_EPS` and at least
    :data:`EPS_OVER_GRADIENTS` times the gradients' root-mean-square per weight (the largest recorded from ``start``
    to ``end``). None when it is not (or they were not recorded)."""
    eps = near(series, EPS, "", start)
    if eps is None or eps <= USUAL_EPS:
        return None  # an eps in its usual range: gradients below it are vanishing, not the eps's doing
    points = series(GRAD_RMS, "") if series is not None else []
    grad_rms = max((v for step, v in points if start <= step <= end), default=near(series, GRAD_RMS, "", start))
    if grad_rms is None or not 0 < EPS_OVER_GRADIENTS * grad_rms <= eps:
        return None
    times = _times(eps / grad_rms)
    what = (
        f" The optimizer's eps={num(eps)} is about {times} times the gradients' root-mean-square ({num(grad_rms)} per"
        f" weight): an adaptive step lr * m / (sqrt(v) + eps) is then about lr * gradient / eps, about {times} times"
        " smaller than the step of about lr per weight the optimizer is meant to take."
    )
    fix = (
        f"use the default eps=1e-8 (eps={num(eps)} turns the adaptive optimizer into SGD at learning rate lr / eps); "
        "raising the learning rate instead would keep it that way."
    )
    return what, fix


def momentum_explains(series: Series | None, step: int) -> tuple[str, str] | None:
    """The words (an addition to the finding's explanation, and the fix) for a finding of steps too large that a
    momentum of :data:`HEAVY_MOMENTUM` or more explains, recorded nearest to ``step``; None when it is not that high
    (or was not recorded)."""
    momentum = near(series, MOMENTUM, "", step)
    if momentum is None or not HEAVY_MOMENTUM <= momentum < 1:
        return None
    gain = 1 / (1 - momentum)
    lr = near(series, "lr", "", step)
    effective = f", an effective learning rate of {num(lr * gain)} at lr={num(lr)}" if lr is not None else ""
    what = (
        f" The optimizer's momentum={num(momentum)} makes each step add up about {_times(gain)} gradients: about "
        f"{_times(gain)} times lr x gradient{effective}."
    )
    fix = (
        f"use momentum={USUAL_MOMENTUM} (each step about {_times(1 / (1 - USUAL_MOMENTUM))} times lr x gradient): "
        f"momentum={num(momentum)} multiplies the learning rate by {_times(gain)} and carries each gradient on for "
        f"about {_times(gain)} steps, which a lower learning rate does not undo."
    )
    return what, fix


def step_size_fix(series: Series | None, step: int, because: str) -> tuple[str, str]:
    """For a finding of steps that grew too large at ``step`` (``because``: the sentence that says how they did
    harm): the words it adds to the explanation and its fix. The momentum's (see :func:`momentum_explains`) when it
    explains the steps, else none and the learning rate's."""
    heavy = momentum_explains(series, step)
    if heavy is not None:
        return heavy[0], f"{heavy[1]} {because[0].upper()}{because[1:]}"
    lr = near(series, "lr", "", step)
    now = f" (now {num(lr)})" if lr is not None else ""
    return "", f"lower the learning rate{now} or clip gradients: {because}"


def _times(x: float) -> str:
    """A large factor in whole numbers ("1,000"), not in a power of ten ("1e+03")."""
    return f"{round(x):,}" if x < 1e6 else num(x)
