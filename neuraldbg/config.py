"""Every threshold and knob of the engine, in one frozen dataclass.

Each default names where it comes from. "smdebug" is SageMaker Debugger's built-in rules, "AUTOTRAINER" is
Zhang et al., ICSE 2021, "DeepDiagnosis" is Wardat et al., ICSE 2022; "calibrated" means the value was chosen
on NeuralDBG's own diagnosis benchmark (``python -m benchmarks.diagnosis``), where published values alarmed on
healthy runs or missed real faults.

Named presets trade cost for resolution, like Cockpit's economy / business / full:

* ``"default"``: every step gets cheap always-on checks (non-finite values and magnitudes of every layer's
  output, the learning rate); full statistics (gradients, per-unit activity, saturation, parameter updates) run
  on every step at the start of training, then on a schedule, and densely again after anything suspicious.
* ``"full"``: full statistics on every step.
* ``"economy"``: a sparser schedule for long runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class DebugConfig:
    """Thresholds and sampling of a :class:`~neuraldbg.NeuralDbg` run."""

    # --- sampling: which steps get full statistics --------------------------------------------------------
    dense_steps: int = 16  # the first N steps are all fully observed: faults present from step 0 are common
    dense_stride: int = 0  # ... every Nth of them, where 0 means 1 for models of up to ``dense_modules``
    # watched modules and proportionally more for bigger ones: a fully observed step costs work per module, so
    # for a model of many narrow layers it costs more than a training step (a 400-module MLP: ~1.6 steps), while
    # 3 observations spanning 5 steps still confirm a fault present from step 0 within the dense phase
    dense_modules: int = 128  # the module count up to which the dense phase observes every step
    early_every: int = 16  # then every Nth step ... (Cockpit: 1.04x overhead when tracking every 16th step)
    early_steps: int = 256  # ... until this step (smoke tests and the start of training, where faults show)
    full_every: int = 64  # and every Nth step after that; the triggers below cover what happens in between
    trigger_window: int = 8  # full statistics for N steps after a learning-rate change or a suspicious signal
    output_gradients: bool = False  # also record the gradient w.r.t. each layer's output (a tensor hook per layer
    # on fully observed steps; the model output's gradient is always read): off by default, it costs a Python call
    # from the autograd engine per layer
    track_updates: bool = True  # measure parameter changes ||dW|| on fully observed steps (copies the weights)

    # --- persistence ---------------------------------------------------------------------------------------
    persistence: int = 3  # observed steps a state must hold to become an event, unless decisive (NaN, exact 0)
    persistence_steps: int = 5  # ... spanning at least this many steps, unless it still holds at the end: the
    # transients of the first steps (zero-initialised residual branches, BatchNorm statistics settling) resolve
    # within a few steps
    # (DeepDiagnosis and smdebug both use windows of 3-5 steps; requiring persistence is the main remedy
    #  for the false alarms reported for these tools)

    # --- gradients -----------------------------------------------------------------------------------------
    vanishing_norm: float = 1e-4  # a layer's gradient norm below this ... (AUTOTRAINER: first-layer norm < 1e-4;
    # the seed's 1e-6 misses a GRU whose gates are stuck, with gradients of 1e-5 against 1e-1 in its head)
    vanishing_ratio: float = 1e-3  # ... and below this fraction of the largest layer norm at the same step
    # (AUTOTRAINER: first/last layer gradient ratio < 1e-3; the relative test keeps healthy nets whose
    #  gradients are uniformly small, e.g. near convergence, silent)
    vanishing_floor: float = 1e-9  # below this a layer's gradient is vanishing whatever the other layers do,
    # unless the gradient of the loss w.r.t. the model's output is itself tiny (a converged fit)
    exploding_norm: float = 1e3  # a layer's gradient norm above this is exploding (seed default: norm > 1e3), in
    # the run's own units: times the loss's pull on the output (half the sum of |d(loss)/d(output)|, smallest so
    # far: the error in the targets' units for a mean-reduced loss, times the element count for a summed one, at
    # most 1 for a mean cross-entropy) and times the rms of the input batch (smallest so far), each when above 1. A
    # weight gradient is the gradient arriving at its layer times that layer's input, both in these units; Adam-like
    # optimizers do not see them (calibrated: a VAE with reduction="sum" trains normally at norms of 2-12k, a
    # super-resolution net on 0-255 pixels at 4e3-1e5, style transfer with a 1e10-weighted loss at 1e8)
    exploding_growth: float = 100.0  # ... or above ``exploding_norm`` itself and this many times the layer's first
    # reading: a gradient that grew a hundredfold since the run began is diverging whatever the run's units (an
    # SGD run at a learning rate 100x too high: 5 at step 0, 1.8e3 at step 3, 1e12 at step 4; healthy runs in
    # large units grow at most 25x, a style-transfer network learning to output 0-255 pixels; calibrated)
    exploding_hold: float = 0.1  # once a layer explodes, readings above this fraction of the threshold continue
    # its state without confirming it while it comes back above the threshold within ``persistence_steps`` steps
    # (hysteresis; calibrated: a clipped GRU whose raw norm swings between 5e2 and 7e3 from step to step was never
    # one state for 5 steps, so its explosion went unreported), not once it has fallen and stays below
    quiet_output_rms: float = 1.5  # a tiny gradient on a layer whose output rms is below this, while a layer
    # before it and one beside it get healthy gradients, is local to its branch, not vanishing: no saturation
    # shrinks it (derived: on inputs of rms <= 1.5 tanh keeps 0.46 of its slope on average and sigmoid 0.71, and
    # query and key outputs of rms r give attention logits q.k/sqrt(d) spread by ~r^2 <= 2.25, a softmax far from
    # saturation; BERT's query/key at init: 0.16; HF BART's and Wav2Vec2's queries grow to 0.3-0.7 under Adam while
    # their keys stay at 0.2 and their gradients at 1e-5, healthy runs, 0.3 flagged them; a tiny BERT under a cosine
    # schedule grows its first keys to 1.24-1.28 while its loss falls to 0.03, held-out accuracy 100 %, 1 flagged it)

    fit_gradient_drop: float = 0.1  # the fit has converged (small gradients and updates are the fit, not vanishing
    # gradients or a stall) once the loss's gradient w.r.t. the model's output is at most this fraction of its
    # first value (derived: a mean squared error's output gradient is proportional to the square root of the loss,
    # so 0.1 is a loss fallen 100-fold; cross-entropy's is about proportional to the loss near a fit; calibrated:
    # a 16-block residual net with LayerNorm overfitting one batch under Adam has LayerNorm gradients of 4e-5,
    # 3e-4 of its largest layer's, once its loss fell from 7.8 to 1e-2 and its output gradient 28-fold)
    fit_loss_drop: float = 0.01  # ... or once the loss, when reported with ``observe_loss``, is at most this
    # fraction of its first value (two orders of magnitude)

    # --- activations -----------------------------------------------------------------------------------------
    dead_sample_fraction: float = 0.0  # a unit is dead when active on at most this fraction of the samples of
    # a batch: by default on none, over ``persistence`` batches (smdebug uses < 1 %: set 0.01 for that; at 0 a
    # unit's largest value over the batch decides, ten times cheaper than counting)
    dead_onset_fraction: float = 0.5  # a dying layer's event starts when this fraction of its units is dead
    # (smdebug's 50 %) and counts once ``dead_unit_fraction`` of them are, for ``persistence`` observations
    dead_unit_fraction: float = 0.7  # a layer is dead when at least this fraction of its units is dead
    # (DeepDiagnosis and AUTOTRAINER: 70 %; smdebug's 50 % fires on healthy deep plain MLPs with PyTorch's
    #  default init, where about half the units of the deep layers are constant-sign for every input); a layer of
    #  fewer than 32 units also needs more dead units than chance gives it (kinds/dead_neurons.py)
    dead_min_observations: int = 8  # a dead reading is provisional until the steps it held over add up to this
    # many observations per unit (samples x positions): a healthy ReLU unit, positive on about half its inputs,
    # is silent on n of them with probability 2^-n, so one batch of one sample proves nothing (calibrated on
    # fuzzed runs with batches of 1-8, tests/fuzz: batch 1 gave false dead layers; 8 gives 2^-8 per unit)
    saturation_derivative: float = 1e-2  # an output is saturated when the activation's derivative there is
    # below this fraction of its maximum (tanh: |y| > 0.995, sigmoid: y < 0.0025 or y > 0.9975; calibrated:
    # DeepDiagnosis' |x| > 5 for tanh is 1.8e-4, smdebug's bounds are 1e-7 and miss most saturated layers)
    saturated_fraction: float = 0.5  # a layer is saturated when more than this fraction of its outputs is
    # (smdebug and DeepDiagnosis: > 50 % of the layer)
    anomalous_rms: float = 1e3  # an output whose root-mean-square exceeds this is anomalous (calibrated:
    # healthy layers stay within 0.01-100; smdebug's poor-init rule uses a variance ratio instead)
    amplifying_gain: float = 10.0  # a layer whose output rms is this many times its input's amplifies: it
    # localises an explosion to the layer with oversized weights (PyTorch's default init gives ~0.6, Kaiming ~1.4;
    # smdebug's poor-init rule flags a max/min layer-variance ratio above 10)

    # --- parameter updates ---------------------------------------------------------------------------------
    stalled_ratio: float = 1e-5  # update/weight ratio ||dW||/||W|| below this is stalled
    # (DeepDiagnosis: lr*||dW||/||W|| outside [1e-5, 1e-1] is a learning-rate problem; smdebug uses 1e-8)
    exploding_update_ratio: float = 0.1  # median update/weight ratio above this: each step rewrites a tenth of the
    # weights or more, the learning rate is far too high (DeepDiagnosis' upper bound, 1e-1; smdebug's is 10). Each
    # layer's update is measured against its weights before the step, and before the first observed step when
    # they were smaller then (oversized updates inflate the weights they are measured against). Checked on the
    # real-programs benchmark: healthy programs stay below 0.06 on three steps running (0.12 on a first step),
    # learning rates 100x too high reach 0.18-1.9

    # --- the loss (recorded from the backward pass, or given to observe_loss) -----------------------------------
    loss_min_steps: int = 64  # losses needed before the curve is judged (its first eighth and last quarter then
    # give means to within a third and a quarter of the loss's batch-to-batch spread); a shorter run is a smoke
    # run, too short to tell a loss that is stuck from one that has not started to fall: inconclusive
    # (calibrated: the test suite's healthy smoke runs of 30-60 steps include CNNs still at chance at step 40)
    loss_chance_band: float = 0.05  # a classifier's loss that ends within this fraction of log(classes), the
    # loss of predicting every class with equal probability, is at chance (calibrated on the real-programs
    # benchmark: healthy classifiers end at most at 0.86 log C, a pair classifier of 67 % accuracy; shuffled or
    # random labels at 0.95-1.0)
    loss_large_update: float = 0.1  # updates of at least this fraction of the weights' norm per step (the whole
    # model's ||dW||/||W||) are a learning rate too high for the loss to settle (DeepDiagnosis' upper bound on the
    # update/weight ratio; healthy programs of the benchmark: at most 0.07 over their first quarter)
    loss_trained: float = 0.5  # the per-step update ratios ||dW||/||W|| of a run add up to at least this before
    # a loss that stays at chance or flat counts as stuck rather than not trained yet (calibrated: the healthy
    # programs of the real-programs benchmark learn with sums of 0.4-17; a smoke run of 40 steps at the Trainer's
    # default learning rate sums to ~0.03 and is inconclusive)

    # --- memory ----------------------------------------------------------------------------------------------
    max_events: int = 2000  # stored events; beyond, the earliest and the strongest are kept
    history_points: int = 256  # points kept per series (gradient norms, loss) for reports; resolution halves
    # when full, so memory stays flat on long runs

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_field(f.name, getattr(self, f.name))

    def replace(self, **changes: Any) -> DebugConfig:
        """A copy with some fields changed (validated like the constructor)."""
        check_options(changes, "DebugConfig.replace()")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Bounds checked for each field: (kind, lower bound, upper bound); bounds are inclusive.
_BOUNDS: dict[str, tuple[str, float, float]] = {
    "dense_steps": ("int", 0, math.inf),
    "dense_stride": ("int", 0, math.inf),
    "dense_modules": ("int", 1, math.inf),
    "full_every": ("int", 1, math.inf),
    "early_every": ("int", 1, math.inf),
    "early_steps": ("int", 0, math.inf),
    "trigger_window": ("int", 0, math.inf),
    "persistence": ("int", 1, 1000),
    "persistence_steps": ("int", 1, 100000),
    "vanishing_norm": ("float", 0, math.inf),
    "vanishing_ratio": ("float", 0, 1),
    "vanishing_floor": ("float", 0, math.inf),
    "exploding_norm": ("float", 0, math.inf),
    "exploding_growth": ("float", 1, math.inf),
    "exploding_hold": ("float", 0, 1),
    "quiet_output_rms": ("float", 0, math.inf),
    "fit_gradient_drop": ("float", 0, 1),
    "fit_loss_drop": ("float", 0, 1),
    "dead_sample_fraction": ("float", 0, 1),
    "dead_onset_fraction": ("float", 0, 1),
    "dead_unit_fraction": ("float", 0, 1),
    "dead_min_observations": ("int", 1, math.inf),
    "saturation_derivative": ("float", 0, 1),
    "saturated_fraction": ("float", 0, 1),
    "anomalous_rms": ("float", 0, math.inf),
    "amplifying_gain": ("float", 0, math.inf),
    "stalled_ratio": ("float", 0, math.inf),
    "exploding_update_ratio": ("float", 0, math.inf),
    "loss_min_steps": ("int", 8, math.inf),
    "loss_chance_band": ("float", 0, 1),
    "loss_large_update": ("float", 0, math.inf),
    "loss_trained": ("float", 0, math.inf),
    "max_events": ("int", 10, math.inf),
    "history_points": ("int", 8, math.inf),
}


def _check_field(name: str, value: Any) -> None:
    if name in ("output_gradients", "track_updates"):
        if not isinstance(value, bool):
            raise ConfigError(f"DebugConfig.{name}: expected true or false, got {value!r}")
        return
    kind, low, high = _BOUNDS[name]
    if kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
        expected = "an integer"
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        expected = "a finite number"
    if not ok or not (low <= value <= high):
        bounds = f">= {low:g}" if high == math.inf else f"between {low:g} and {high:g}"
        raise ConfigError(f"DebugConfig.{name}: expected {expected} {bounds}, got {value!r}")


def check_options(options: Mapping[str, Any], where: str, also: Iterable[str] = ()) -> None:
    """Raise :class:`ConfigError` for any key of ``options`` that is not a :class:`DebugConfig` field, naming
    ``where`` it was given and the closest valid name. ``also``: the other keywords the entry point takes (a
    typo of one of them, ``pluggins=``, is suggested as that keyword)."""
    fields = [f.name for f in dataclasses.fields(DebugConfig)]
    unknown = [key for key in options if key not in fields]
    if not unknown:
        return
    others = list(also)
    named = ", ".join(f"{key!r}{did_you_mean(key, [*fields, *others])}" for key in unknown)
    plural = "s" if len(unknown) > 1 else ""
    accepted = f"{', '.join(others)} or a DebugConfig field" if others else "a DebugConfig field"
    raise ConfigError(f"{where}: unknown option{plural} {named}; expected {accepted}: {', '.join(sorted(fields))}")


#: The keywords of ``NeuralDbg()`` that its run takes as they are (not DebugConfig fields), and all of its keywords
#: besides the DebugConfig fields: every entry point that builds a debugger checks its options against them.
#: A dropout probability at least this high drops so much of a layer's input that training stalls far above what
#: the model can reach (the usual settings: 0.1-0.2 on inputs and in transformers, 0.5 on hidden layers, 0.6 in
#: pytorch/examples' REINFORCE policy; six program families at 0.9: held-out accuracy 0.49-0.60 against 0.85-0.88,
#: F1 0.30 against 0.73).
HEAVY_DROPOUT = 0.8

RUN_KEYWORDS = ("grad_scaler", "gather", "gather_timeout")
ENGINE_KEYWORDS = ("config", "preset", "plugins", *RUN_KEYWORDS)


PRESETS: dict[str, DebugConfig] = {
    "default": DebugConfig(),
    "full": DebugConfig(dense_steps=0, early_every=1, full_every=1),
    "economy": DebugConfig(dense_steps=8, early_every=32, early_steps=128, full_every=128, trigger_window=4),
}


def check_preset(preset: object, where: str) -> None:
    """Raise :class:`ConfigError` for a name that is not a preset, naming ``where`` and the closest preset."""
    if preset not in PRESETS:
        raise ConfigError(
            f"{where}: unknown preset {preset!r}{did_you_mean(preset, PRESETS)}; expected one of {', '.join(PRESETS)}"
        )


def make_config(
    config: DebugConfig | Mapping[str, Any] | None = None,
    preset: str | None = None,
    where: str = "NeuralDbg()",
    also: Iterable[str] = (),
    **overrides: Any,
) -> DebugConfig:
    """Build a config from a preset name, an existing config or a mapping, and keyword overrides.

    ``where`` names the entry point in error messages, ``also`` the other keywords it takes (suggested for a
    misspelt option, see :func:`check_options`). A key of a ``config`` mapping is checked as coming from
    ``where``'s config."""
    others = tuple(also)
    if preset is not None:
        check_preset(preset, where)
        base = PRESETS[preset]
    else:
        base = PRESETS["default"]
    if isinstance(config, DebugConfig):
        if preset is not None:
            raise ConfigError(f"{where}: give a DebugConfig or a preset, not both (got preset={preset!r})")
        base = config
    elif config is not None:
        if not isinstance(config, Mapping):
            raise ConfigError(f"{where}: config must be a DebugConfig or a mapping, got {type(config).__name__}")
        check_options(config, f"{where}: config")
        overrides = {**dict(config), **overrides}
    check_options(overrides, where, others)
    return dataclasses.replace(base, **overrides) if overrides else base
