"""Weight decay far too strong, found from the optimizer's param_groups and the updates: the decay makes up most of
each step and the weights shrink. Ground truth is plain torch in each test (the weights' norm falls, the loss stays
far above its twin's, the held-out accuracy far below); twins with usual decay (AdamW 0.01-0.1, SGD 5e-4, Adam's
L2 1e-4) or none stay silent, and the training is bit-identical."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.kinds import excessive_weight_decay

CLASSES = 5
KIND = "excessive_weight_decay"
MakeOptimizer = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def classifier() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def bn_cnn() -> nn.Sequential:
    """Convolutions with BatchNorm, trained under SGD with momentum: the usual setting of coupled weight decay."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, CLASSES),
    )


def weight_norm(model: nn.Module) -> float:
    return float(torch.sqrt(sum((p.detach() ** 2).sum() for p in model.parameters())))


def train(
    model: nn.Module, make_opt: MakeOptimizer, steps: int, watched: bool, shape: tuple[int, ...] = (16,)
) -> tuple[list[float], NeuralDbg | None]:
    """A user's loop (no NeuralDBG call inside)."""
    make = support.classification_batches(shape, CLASSES, batch=64)
    opt = make_opt(list(model.parameters()))
    losses: list[float] = []

    def loop() -> None:
        for step in range(steps):
            x, y = make(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    if not watched:
        loop()
        return losses, None
    with NeuralDbg(model) as dbg:
        loop()
    return losses, dbg


def accuracy(model: nn.Module, shape: tuple[int, ...] = (16,)) -> float:
    x, y = support.classification_batches(shape, CLASSES, batch=1024)(10_000)  # held out: never trained on
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_adamw_weight_decay_10_shrinks_the_weights_holds_the_loss_up_and_is_named_with_its_setting():
    def huge(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=10.0)

    def usual(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)

    torch.manual_seed(0)
    model = classifier()
    start = weight_norm(model)
    losses, _ = train(model, huge, 300, watched=False)
    torch.manual_seed(0)
    twin = classifier()
    twin_losses, _ = train(twin, usual, 300, watched=False)
    # plain torch: the decay shrinks the weights (the twin's grow), the loss stays far above the twin's and the
    # classifier is far worse on held-out data
    assert weight_norm(model) < 0.75 * start < 0.75 * weight_norm(twin)
    assert mean(losses[-50:]) > 2 * mean(twin_losses[-50:])
    assert accuracy(model) < accuracy(twin) - 0.1

    torch.manual_seed(0)
    watched_losses, dbg = train(classifier(), huge, 300, watched=True)
    assert watched_losses == losses  # the debugger changed nothing
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    m = hits[0].root.metrics
    assert m["decay"] == 10.0 and m["decoupled"] == 1.0
    assert m["share"] >= excessive_weight_decay.SHARE
    assert m["weight_end"] < 0.9 * m["weight_start"]
    assert "weight_decay=10" in hits[0].explanation and "decoupled" in hits[0].explanation
    assert "lower weight_decay" in hits[0].suggestion


def test_sgd_weight_decay_1_on_a_batchnorm_cnn_is_named_the_coupled_way():
    shape = (3, 8, 8)

    def huge(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1.0)

    def usual(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=5e-4)

    torch.manual_seed(0)
    model = bn_cnn()
    start = weight_norm(model)
    losses, _ = train(model, huge, 120, watched=False, shape=shape)
    torch.manual_seed(0)
    twin = bn_cnn()
    twin_losses, _ = train(twin, usual, 120, watched=False, shape=shape)
    assert weight_norm(model) < 0.2 * start and weight_norm(twin) > 0.9 * start
    assert mean(losses[-30:]) > mean(twin_losses[-30:]) + 0.3
    assert accuracy(model, shape) < accuracy(twin, shape) - 0.15

    torch.manual_seed(0)
    watched_losses, dbg = train(bn_cnn(), huge, 120, watched=True, shape=shape)
    assert watched_losses == losses
    assert dbg is not None
    hits = found(dbg)
    assert hits and dbg.hypotheses()[0].kind.value == KIND, dbg.explain_failure()
    m = hits[0].root.metrics
    assert m["decay"] == 1.0 and m["decoupled"] == 0.0
    assert "coupled" in hits[0].explanation


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
        lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=3e-3),  # AdamW's default decay, 0.01
        lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1e-4),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=5e-4),
        lambda p: torch.optim.Adam(p, lr=1e-3),
    ],
    ids=["adamw_0.01", "adamw_0.1", "adamw_default", "adam_l2_1e-4", "sgd_5e-4", "adam_no_decay"],
)
def test_usual_weight_decay_is_silent_and_training_unchanged(make_opt: MakeOptimizer):
    torch.manual_seed(0)
    plain, _ = train(classifier(), make_opt, 300, watched=False)
    torch.manual_seed(0)
    losses, dbg = train(classifier(), make_opt, 300, watched=True)
    assert losses == plain
    assert mean(losses[-50:]) < 0.7 * mean(losses[:10])  # plain torch: it learns
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_a_full_batch_fit_that_converged_under_decay_is_silent():
    """One batch, AdamW 0.1 for 600 steps: the fit converges and the updates shrink to where the gradient balances
    the decay (the decay's share of a step grows), but the weights keep their scale: the decay does not rule."""
    x, y = support.classification_batches((16,), CLASSES, batch=256)(0)
    torch.manual_seed(0)
    model = classifier()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    with NeuralDbg(model) as dbg:
        for _ in range(600):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    assert float(loss.detach()) < 0.05  # plain torch: it fit the batch
    assert not found(dbg), dbg.explain_failure()


def test_the_decay_is_read_per_group_and_a_schedule_does_not_grow_the_record():
    """A Hugging Face style split: biases and norms in a group without decay, the rest with decay 10, under a
    linear schedule that changes the learning rate every step: one change of decay is noted, the group's."""
    torch.manual_seed(0)
    model = classifier()
    decayed = [p for n, p in model.named_parameters() if n.endswith("weight")]
    others = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    opt = torch.optim.AdamW(
        [{"params": others, "weight_decay": 0.0}, {"params": decayed, "weight_decay": 10.0}], lr=1e-3
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / 400)
    make = support.classification_batches((16,), CLASSES, batch=64)
    with NeuralDbg(model) as dbg:
        for step in range(300):
            x, y = make(step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()
    assert dbg._recorder.coverage.weight_decay == [(0, 10.0, True)]
    assert found(dbg), dbg.explain_failure()


def test_usual_decay_beside_a_gradient_clipped_to_a_tiny_norm_is_not_blamed():
    """SGD with the usual 5e-4 and clip_grad_norm_(1e-4): the clipped gradient is far smaller than the decay's
    term, which then rules the steps and shrinks the weights (plain torch), but the fault is the clipping: the
    decay is held against the gradient the backward pass produced."""
    make = support.classification_batches((16,), CLASSES, batch=64)

    def run(watched: bool) -> tuple[list[float], nn.Module, NeuralDbg | None]:
        torch.manual_seed(0)
        model = classifier()
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=5e-4)
        losses: list[float] = []

        def loop() -> None:
            for step in range(400):
                x, y = make(step)
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-4)
                opt.step()
                losses.append(float(loss.detach()))

        if not watched:
            loop()
            return losses, model, None
        with NeuralDbg(model) as dbg:
            loop()
        return losses, model, dbg

    torch.manual_seed(0)
    start = weight_norm(classifier())
    plain, model, _ = run(watched=False)
    assert weight_norm(model) < 0.9 * start  # plain torch: the decay shrank the weights
    losses, _, dbg = run(watched=True)
    assert losses == plain
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def layer_norm_classifier() -> nn.Sequential:
    """A wide LayerNorm whose gains (left out of the decay, as the Trainer leaves them) hold most of the norm."""
    return nn.Sequential(nn.Linear(16, 256), nn.LayerNorm(256), nn.ReLU(), nn.Linear(256, CLASSES))


def split_decay(decay: float) -> MakeOptimizer:
    """AdamW with the Hugging Face split: matrices decay, biases and LayerNorm gains do not."""

    def make(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        matrices = [p for p in params if p.dim() > 1]
        others = [p for p in params if p.dim() <= 1]
        groups = [{"params": matrices, "weight_decay": decay}, {"params": others, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=1e-3)

    return make


def test_the_shrinking_is_judged_over_the_weights_that_decay_not_the_gains_left_out():
    """AdamW weight_decay=10 on the matrices only: they shrink 7-fold while the LayerNorm gains, which hold most of
    the model's norm, keep the whole norm at 0.97 of its start (plain torch). The weights the decay applies to are
    the ones it shrinks: judged over the whole model, the shrinking would be lost."""
    torch.manual_seed(0)
    model = layer_norm_classifier()
    matrices = [p for p in model.parameters() if p.dim() > 1]
    before, whole = weight_norm(nn.ParameterList(matrices)), weight_norm(model)
    plain, _ = train(model, split_decay(10.0), 300, watched=False)
    assert weight_norm(nn.ParameterList(matrices)) < 0.2 * before
    assert weight_norm(model) > excessive_weight_decay.SHRINK * whole  # the whole norm hardly moves
    torch.manual_seed(0)
    twin, _ = train(layer_norm_classifier(), split_decay(0.01), 300, watched=False)
    assert mean(plain[-50:]) > 1.2 * mean(twin[-50:])  # the loss stays above its twin's
    torch.manual_seed(0)
    losses, dbg = train(layer_norm_classifier(), split_decay(10.0), 300, watched=True)
    assert losses == plain
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    m = hits[0].root.metrics
    assert m["decayed_only"] == 1.0 and m["weight_end"] < 0.5 * m["weight_start"]
    assert "the norm of the weights it decays" in hits[0].explanation


def test_the_same_split_with_usual_decay_is_silent():
    torch.manual_seed(0)
    plain, _ = train(layer_norm_classifier(), split_decay(0.01), 300, watched=False)
    torch.manual_seed(0)
    losses, dbg = train(layer_norm_classifier(), split_decay(0.01), 300, watched=True)
    assert losses == plain
    assert dbg is not None and not found(dbg), dbg.explain_failure()


class Encoder(nn.Module):
    """A small pre-norm transformer classifier over sequences of 12 vectors (mean-pooled)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.pos = nn.Parameter(torch.zeros(1, 12, 32))
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.enc(self.inp(x) + self.pos)).mean(1))


#: Sequences of 12 vectors labelled by a linear teacher on the whole sequence.
sequences = support.classification_batches((12, 8), CLASSES, batch=64)
#: ... and 1,024 of them at once, for a held-out accuracy that does not move with one CPU's rounding.
held_out_sequences = support.classification_batches((12, 8), CLASSES, batch=1024)


def test_a_usual_decoupled_decay_at_a_learning_rate_far_too_high_is_the_learning_rates_fault():
    """AdamW's usual weight_decay=0.05 at lr 0.2 on a transformer: each step takes lr x wd = 1% of every weight, so
    the decay is most of the steps and the weights shrink; but the same decay at lr 2e-3 trains better, and lr 0.2
    without any decay trains as badly (plain torch, held-out accuracy over 1,024 sequences: 0.29 against 0.22 and
    0.23 on one machine; 64 sequences moved by 0.1 from one CPU to another): the learning rate is the fault, and its
    finding comes alone."""

    def run(lr: float, decay: float, watched: bool) -> tuple[float, NeuralDbg | None]:
        torch.manual_seed(0)
        model = Encoder()
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=decay)
        dbg = NeuralDbg(model)

        def loop() -> None:
            for step in range(200):
                x, y = sequences(step)
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()

        if watched:
            with dbg:
                loop()
        else:
            loop()
        x, y = held_out_sequences(10_000)
        model.eval()
        with torch.no_grad():
            return float((model(x).argmax(1) == y).float().mean()), dbg if watched else None

    good, _ = run(2e-3, 0.05, watched=False)
    assert run(0.2, 0.05, watched=False)[0] < good - 0.03 and run(0.2, 0.0, watched=False)[0] < good - 0.03

    _, dbg = run(0.2, 0.05, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert dbg.hypotheses() and "lower the learning rate" in dbg.hypotheses()[0].suggestion


class Muted(nn.Module):
    """The classifier with its logits multiplied by 1e-4 (a temperature applied the wrong way round): the loss's
    gradient is tiny from the first step, whatever the decay."""

    def __init__(self) -> None:
        super().__init__()
        self.body = classifier()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * 1e-4


def test_a_usual_coupled_decay_against_a_tiny_loss_gradient_is_not_blamed():
    """SGD's usual weight_decay=5e-4 (at lr 1.0) outweighs a loss gradient made tiny by the model itself; plain
    torch: the loss stays at chance with the decay and without it, so the decay is not what holds it there."""

    def sgd(decay: float) -> MakeOptimizer:
        return lambda params: torch.optim.SGD(params, lr=1.0, weight_decay=decay)

    for decay in (5e-4, 0.0):
        torch.manual_seed(0)
        losses, _ = train(Muted(), sgd(decay), 300, watched=False)
        assert abs(mean(losses[-20:]) - torch.log(torch.tensor(float(CLASSES)))) < 1e-3  # at chance either way
    torch.manual_seed(0)
    _, dbg = train(Muted(), sgd(5e-4), 300, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert dbg.hypotheses()  # the run is still not healthy: its loss stayed at chance
