"""Dead neurons: ReLU-family units that are active on (almost) no sample of the batch.

Two sources of evidence, both per unit rather than per value (per-value definitions are what made earlier tools
alarm on healthy MNIST models):

* the output of a ReLU-family module (``nn.ReLU``, ``nn.ReLU6``, ``nn.LeakyReLU(0)``): a unit is dead on a batch
  when it is positive on at most ``dead_sample_fraction`` of the samples;
* a Linear / Conv / norm layer whose output is activated functionally (``F.relu`` in ``forward``): a unit is dead
  when its pre-activation is never positive *and* its weight row receives exactly zero gradient.

A layer is dead when at least ``dead_unit_fraction`` of its units are; its event is dated from when it first
crossed ``dead_onset_fraction`` on the way (a layer dies over a few steps). A narrow layer must also have more dead
units than chance gives it (:func:`chance_dead_fraction`): a unit whose inputs keep one sign on every sample (the
pooled, non-negative features a squeeze-and-excitation bottleneck reads) is off on all of them for half of the
initialisations, so 3 of 4 such units are off in 5 of 16 healthy runs. The model's output layer (a ReLU on the
logits, after the last parametric layer) is dead from its first dead unit that the loss pulls on (a nonzero
gradient of the loss on that output): a hidden layer loses capacity it may spare, but such a unit is an output (a
class, a target) the model can no longer produce, and its weight row never gets a gradient again. Output units the
loss leaves at 0 (a forward-forward layer's goodness, the square of each unit) keep the hidden layers' rule.

A batch of one sample says little: a healthy unit, positive on about half of its inputs, is silent on it half the
time, and a narrow layer often looks 70 % dead. So a dead reading stays provisional (it dates the event but does not
confirm it) until the consecutive observed steps it held over add up to ``dead_min_observations`` observations per
unit (samples, times positions for sequences and maps, which a unit must be silent on all of). With the usual
batches a single step is enough.

Dead units are a fault of a layer that trains. Units of a ReLU whose feeding layer (the nearest one with parameters
before it) got no parameter gradient at the step, while others did, are not judged: ``requires_grad=False`` froze it
on purpose (a pretrained backbone under a new head), nothing of it is learned, and its units that never fire on
these inputs harm no training. A model with no trainable parameter at all has no dead-unit fault: style transfer
through a frozen VGG-like net leaves 10-12 of its last ReLU's 64 channels never positive on the optimised image, the
same 12 as on the style image itself, while the image is learned. A layer activated functionally is measured only
where its weight rows got a gradient, so it follows the same rule.

Root: the first dead layer in forward order (the layers after it are starved by it, the layers before it get no
gradient through it). Config: ``dead_sample_fraction``, ``dead_onset_fraction``, ``dead_unit_fraction``,
``dead_min_observations``.
"""

from __future__ import annotations

import functools
import math

from ..capture.coverage import Coverage, RunFacts
from ..config import DebugConfig
from ..detectors.base import Detector, Finding, Observation, StepView
from ..events import EventType, FailureKind, SemanticEvent
from ..health import ActivationHealth, GradientHealth, UpdateHealth
from ..reasoning.rules import CausalRule
from ..reasoning.topology import Topology
from ..stats.step import SlotKey
from ..text import count, num, pct
from . import loss_evidence, optimizer_settings
from .base import Check, Kind, RootLane, Series, held

KIND = FailureKind.DEAD_NEURONS

#: How rare a count of dead units must be among healthy initialisations of a narrow layer before it is a finding.
CHANCE = 0.05


@functools.lru_cache(maxsize=256)
def chance_dead_fraction(units: int) -> float:
    """The smallest fraction of a hidden layer's ``units`` that is dead by chance in fewer than ``CHANCE`` of
    healthy runs, each unit off on every sample with probability 1/2 (its pre-activation's sign fixed by its
    initial weights when the inputs keep one sign); 1.0 (every unit) when even that is not so rare. From 32
    units on it is below the 70 % of ``dead_unit_fraction``, which then decides alone."""
    if units >= 32:
        return 0.0
    tail = 0
    for dead in range(units, 0, -1):
        tail += math.comb(units, dead)
        if tail / 2**units >= CHANCE:
            return min(1.0, (dead + 1) / units)
    return 1.0


class DeadUnitsDetector(Detector):
    name = "dead"
    event_type = EventType.ACTIVATION
    every_step = False

    def __init__(self) -> None:
        self._held: dict[SlotKey, float] = {}  # observations per unit over the current run of dead readings

    def observe(self, view: StepView) -> Observation | None:
        data = view.data
        if not data.dead and not data.func_dead:
            return None
        ctx = view.ctx
        obs = Observation()
        for source, counts in (("module", data.dead), ("functional", data.func_dead)):
            for key, (dead, units) in counts.items():
                norm = data.act.get(key)
                if units <= 0 or (norm is not None and not math.isfinite(norm)):
                    continue  # non-finite outputs are the non-finite detector's business
                if source == "module" and not self._trains(view, key):
                    # units of a layer that does not train: nothing of it is learned, so units that never fire on
                    # these inputs harm no training (a frozen feature net while an input is optimised). A layer
                    # activated functionally is measured only when its weight rows got a gradient.
                    obs.saw(self.event_type, key[0], call=key[1])
                    self._held[key] = 0.0
                    continue
                # an output layer is dead from its first dead unit that the loss pulls on (the fraction of one
                # unit); a unit the loss leaves at 0 (a representation's goodness) keeps the hidden layers' rule
                pulled = data.output_dead_pulled
                output = pulled is not None and pulled[1] == units and pulled[0] > 0 and not ctx.is_hidden(key)
                if output and pulled is not None:
                    dead = min(dead, pulled[0])
                threshold = 1 / units if output else max(ctx.config.dead_unit_fraction, chance_dead_fraction(units))
                onset = min(threshold, ctx.config.dead_onset_fraction)
                obs.saw(self.event_type, key[0], call=key[1])
                fraction = dead / units
                per_unit = data.numel.get(key, units) / units
                held_for = self._held.get(key, 0.0) + per_unit if fraction >= threshold and dead > 0 else 0.0
                self._held[key] = held_for
                if fraction >= onset and dead > 0:
                    metrics = {"dead_fraction": fraction, "dead_units": dead, "units": float(units)}
                    if output:
                        metrics["output_layer"] = 1.0
                    if source == "functional":
                        metrics["functional"] = 1.0
                    if "output_layer" in metrics:  # one dead output is already a fault: strength from there on
                        s = 0.5 + 0.5 * fraction
                    else:
                        s = (fraction - threshold) / (1 - threshold) if threshold < 1 else 1.0
                    obs.findings.append(
                        Finding(
                            self.event_type,
                            KIND,
                            key[0],
                            ActivationHealth.DEAD,
                            metrics,
                            max(0.0, min(1.0, s)),
                            call=key[1],
                            provisional=fraction < threshold or held_for < ctx.config.dead_min_observations,
                        )
                    )
        return obs

    def _trains(self, view: StepView, key: SlotKey) -> bool:
        """Whether the layer that feeds the activation output ``key`` (the nearest layer with parameters before it
        in forward order) trains: it got a parameter gradient at this step, which ``requires_grad=False`` leaves it
        without, while others got one. An activation with no such layer before it, or a step with no parameter
        gradient at all (none reached the model: the no-gradient finding's), is judged as it is; a model with no
        trainable parameter is left out by :meth:`DeadNeurons.undone`."""
        feeding, grads = view.ctx.feeding(key), view.layer_gradients
        return feeding is None or not grads or feeding in grads


#: Dead units of a hidden layer the fit got past: the run's last quarter of losses averages at most this share of its
#: first eighth's (see :meth:`DeadNeurons.undone`).
SPARED_FALL = 0.1
#: Dead units of a hidden layer that leave it this share of its units or less are never spared: the loss may still
#: fall tenfold through what is left, but the layer lost nearly all it could carry (hunt 24: a set transformer at 50x
#: its learning rate kept 4 of its head's 64 ReLU units, its loss fell 37-fold, its held-out error was 25x its twin's).
HOLLOWED = 0.1


def _revived(event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
    """Units of a hidden layer that came back: the layer read alive again after a dead stretch over at most
    :data:`.loss_evidence.PASSED_SPAN` of the run's steps, before the run's last quarter of losses, and the run's loss
    fell (against its own spread; not to chance). A ReLU unit gets no gradient of its own while dead, but a BatchNorm's
    batch statistics, the layers before it and the optimizer's momentum move its pre-activation back: hunt 20's CNN (SGD
    0.05, momentum 0.9) had 94 % of a BatchNorm's channels off on every sample at steps 13-20 and 34-53 % at the end,
    and reached its twins' held-out accuracy. Dead units that stay dead to the last check, or a loss that did not fall,
    are not undone."""
    return loss_evidence.passed_before_the_fit(event, coverage, facts.config)


def _touched(event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
    """Whether the dead units of a narrow hidden layer, one whose threshold chance sets (fewer than 32 units, see
    :func:`chance_dead_fraction`), touched that threshold and fell back: past it on fewer than half of the run's
    observations of the state, short of it at the latest, while the run's loss fell (against its own spread; not to
    chance). A narrow layer's count moves by whole units, and a unit whose pre-activation sits near its bias's sign
    flips off and on as the layers before it move: NeuMF's MLP tower over embeddings initialised at 0.01 (the
    paper's code) has 8 of one layer's 16 units off on every sample of a batch at its first step, 13 for some 20
    steps of Adam, 8 again after (6 of another layer's 8, 7 for a dozen steps), while its loss falls sixfold and its
    held-out hit rate is its twin's with LeakyReLU. A layer killed (a negative bias, a learning rate far too high)
    stays past the threshold."""
    m = event.metrics
    units = int(m.get("units", 0))
    if not 0 < units < 32 or chance_dead_fraction(units) <= facts.config.dead_unit_fraction:
        return False
    solid, seen = m.get("solid"), m.get("observations", 1.0)
    if solid is None or 2 * solid >= seen or m.get("last_solid", 1.0):
        return False
    curve = loss_evidence.read(coverage, facts.config)
    return curve is not None and curve.verdict == "fell" and not curve.at_chance


class DeadNeurons(Kind):
    name = KIND.value
    lr_sensitive = True
    surge_victim = True
    confirms_escalation = True  # units dying during an explosion or a surge: what they do
    states = (ActivationHealth.DEAD,)
    count_metrics = frozenset({"units", "dead_units"})
    check = Check(
        "assert_no_dead_neurons",
        "dead neurons",
        fraction="dead_fraction",
        fraction_words="of the units of {where} were inactive on every sample",
    )

    def detectors(self, config: DebugConfig) -> list[Detector]:
        return [DeadUnitsDetector()]

    def undone(self, event: SemanticEvent, coverage: Coverage, facts: RunFacts) -> bool:
        """Dead units of a hidden layer, not all of its units, that died early in the run (within its first eighth
        of losses) and did not keep the fit from converging: the mean loss of the run's last quarter is at most
        ``SPARED_FALL`` of the first eighth's, and below it by more than the loss's batch-to-batch spread. The
        layer lost capacity it could spare: pytorch/examples' MNIST network under Adadelta at 1.0 has 56 % of
        ``fc1``'s 128 units off after its first step and 67 % at the end (73-78 % in between), while its loss falls
        from 2.1 to 0.02 and its held-out accuracy reaches 100 %; at a tenfold lower rate 43-52 % die and it
        reaches the same. A layer wholly dead passes no gradient, one left with :data:`HOLLOWED` of its units or
        less cannot carry what it must, a dead output unit is a class the model can no longer produce, and dead
        units that leave the loss at chance, flat or a few times lower (a bias that kills a layer, a learning rate
        far too high) are not undone. Nor are dead units a fault of a model with no trainable parameter through which
        backward passes ran (an input optimised through a frozen feature net): nothing of it trains."""
        m = event.metrics
        if event.kind is not KIND:
            return False
        if not facts.trainable and facts.backward_passes:
            return True  # a model with no trainable parameter (a frozen feature net an input is optimised through)
        if m.get("output_layer"):
            return False
        if _revived(event, coverage, facts) or _touched(event, coverage, facts):
            return True
        if not m.get("dead_fraction", 1.0) < 1.0 - HOLLOWED:
            return False
        curve = loss_evidence.read(coverage, facts.config)
        if curve is None or event.step_start > curve.start.last or curve.end.first <= event.step_start:
            return False
        return loss_evidence.fell_below(curve, curve.start.mean, SPARED_FALL)

    def lane(self, event: SemanticEvent) -> RootLane | None:
        return RootLane(3)

    def rules(self) -> list[CausalRule]:
        def rule(
            name: str,
            relation: str,
            effects: tuple[ActivationHealth | GradientHealth | UpdateHealth, ...],
            where: str = "any",
        ) -> CausalRule:
            return CausalRule(name, relation, KIND, effects, where, same_place_joins=True)

        return [
            rule("dead-zeroes-upstream-gradients", "zeroes the gradient of", (GradientHealth.VANISHING,), "upstream"),
            rule(
                "dead-starves-downstream",
                "starves",
                (ActivationHealth.DEAD, ActivationHealth.SATURATED),
                "downstream",
            ),
            rule("dead-stalls-updates", "stalls", (UpdateHealth.STALLED,)),
        ]

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        units = int(m.get("units", 0))
        frac = m.get("dead_fraction", 0.0)
        functional = m.get("functional") == 1.0
        who = topo.describe(root.layer)
        feeding = root.layer if functional else topo.feeding(root.layer)
        if functional:
            what = (
                f"Dead neurons: {pct(frac)} of the {units} units of {who} have a pre-activation <= 0 on every "
                f"sample and receive exactly zero gradient {held(root, topo)}."
            )
        else:
            fed = f", fed by {topo.describe(feeding)}" if feeding else ""
            what = (
                f"Dead neurons in {who}{fed}: {pct(frac)} of {units} units inactive on (almost) every sample "
                f"{held(root, topo)}."
            )
        target = f"'{feeding}'" if feeding else "the layer before it"
        if m.get("output_layer") == 1.0:
            dead = round(m.get("dead_units", 0))
            what = (
                f"Dead output units: {dead} of the {units} outputs of {who} ({pct(frac)}) are never positive "
                f"{held(root, topo)}, so the model outputs 0 for them on every sample and their weight rows in "
                f"{target} receive exactly zero gradient: what those outputs stand for (a class, a target) can no "
                "longer be learned. A ReLU-family activation on the model's output is the usual cause."
            )
            fix = (
                "remove the ReLU after the last layer: CrossEntropyLoss and BCEWithLogitsLoss take raw logits; for an "
                "output that must be non-negative use softplus, or an activation that cannot die (LeakyReLU, GELU)."
            )
            return what, fix
        largest = _largest_update(series, feeding, root.step_start) if feeding else None
        if root.step_start > topo.first_step and largest is not None and largest < KICK:
            raw = loss_evidence.raw_input_rms(series, topo.last_step)
            normalise = (
                f"normalise the inputs (their root-mean-square is {num(raw)}; normalised data is about 1), then "
                if raw is not None
                else ""
            )
            fix = (
                f"{normalise}check that the labels follow their inputs: the units of {who} died by step "
                f"{root.step_start} under updates of ordinary size (at most {num(largest)} of the weights of "
                f"{target} per step), so no single large step killed them; ReLU units drift off when the inputs are "
                "far from unit scale or the loss gives them nothing to learn. A LeakyReLU or GELU cannot die."
            )
        elif root.step_start > topo.first_step:
            died = (
                f"the units died at step {root.step_start}, when a large update pushed the pre-activations of "
                f"{target} below zero; a LeakyReLU or GELU cannot die."
            )
            momentum, fix = optimizer_settings.step_size_fix(series, root.step_start, died)
            what += momentum  # the momentum, not the learning rate alone, made the steps that large
        else:
            fix = (
                f"the pre-activations of {target} are negative for every input from the start - check its "
                "initialisation and bias (a large negative bias, or weights scaled wrong); use Kaiming "
                "initialisation, or a LeakyReLU/GELU, which cannot die."
            )
            faint = loss_evidence.faint_input_rms(series, topo.last_step)
            if faint is not None and feeding and topo.feeding(feeding) is None:  # the first layer the data meets
                what += (
                    f" The input batch's root-mean-square is {num(faint)}, far below unit scale: the pre-activations "
                    f"of {target} are almost its bias alone, so a unit whose bias is negative is off on every input."
                )
                fix = (
                    f"scale the inputs to about unit scale (their root-mean-square is {num(faint)}: data divided "
                    "twice, by 255 or by a standard deviation, come out this small), e.g. pixels in [0, 1] or "
                    "standardised; a new initialisation or activation would not give back what the inputs lost."
                )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        units = event.metrics.get("units")
        of = f" of {count(units)} units" if units else " of its units"
        return f"{pct(event.metrics.get('dead_fraction', 0.0))}{of} dead (never positive)"

    def label(self, event: SemanticEvent) -> str:
        m = event.metrics
        return f"dead: {pct(m.get('dead_fraction', 0.0))} of {int(m.get('units', 0))} units"

    def effect(self, event: SemanticEvent) -> str:
        return "dead units"


#: An update of at least this share of a layer's weights in one step, before units died, is a step large enough to
#: have pushed them off (a corrupt batch's momentum-carried kick, a learning rate far too high: 0.1-1); healthy
#: training moves weights by about 0.1 % per step, and units that die under updates below it died gradually.
KICK = 0.02
#: How many steps before the units' death the updates of the layer feeding them are looked at.
KICK_WINDOW = 64


def _largest_update(series: Series | None, layer: str, onset: int) -> float | None:
    """The largest update/weight ratio ||dW||/||W|| of ``layer`` recorded over the :data:`KICK_WINDOW` steps up to
    ``onset``; None when none was recorded there (the kick may have come between the recorded steps)."""
    points = series("update_ratio", layer) if series is not None else []
    found = [v for step, v in points if onset - KICK_WINDOW <= step <= onset and math.isfinite(v)]
    return max(found) if found else None
