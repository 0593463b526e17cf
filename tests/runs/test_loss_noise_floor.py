"""A classifier that learns its task within its first few dozen steps and then sits at its noise floor for the rest
of a long run did not fail to decrease: its loss fell from its first readings to an end far below its chance level.
The drop from the first eighth (already at the floor) to the end was smaller than the batch-to-batch spread, and
the run was told "the model is not learning ... targets that do not match the inputs" (sweep K: a 3-class toy of
overlapping Gaussians, held-out accuracy at the Bayes optimum; a weak-signal tabular BCE, AUC at the Bayes
score's). Ground truth by plain torch in each test: the loss falls from its first 8 readings to far below chance and
held-out accuracy (AUC) reaches the Bayes optimum's. Their twins, whose labels the inputs do not give (one started
far above chance, so that its loss falls as far from its first readings; one over imbalanced classes, so that its
loss falls from log(classes) to the labels' entropy), stay at their chance level and are still found."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import DebugConfig, NeuralDbg
from neuraldbg.kinds import loss_evidence

CENTRES = torch.tensor([[0.0, 0.0], [1.2, 0.0], [0.6, 1.0]])
LOSS_KINDS = {"loss_at_chance", "loss_not_decreasing", "unstable_loss"}
BATCH = 64


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn,
    steps: int,
    g: torch.Generator,
) -> tuple[list[float], NeuralDbg]:
    """Epochs of shuffled mini-batches under the debugger: the losses of every step."""
    losses: list[float] = []
    with NeuralDbg(model) as dbg:
        while len(losses) < steps:
            perm = torch.randperm(len(x), generator=g)
            for i in range(0, len(x) - BATCH + 1, BATCH):
                idx = perm[i : i + BATCH]
                loss = loss_fn(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                if len(losses) == steps:
                    break
    return losses, dbg


def gaussians(labels: str, bias: float = 0.0) -> tuple[list[float], float, float, NeuralDbg]:
    """A 3-class classifier of overlapping Gaussians in 2-D (Bayes accuracy about 0.74) trained 1,000 steps under
    SGD with momentum; ``labels``: "inputs" (drawn from the inputs' class), "apart" (uniform, apart from the inputs)
    or "imbalanced" (0.8 / 0.1 / 0.1, apart from the inputs); ``bias``: the first class's output bias at the start
    (a start far above chance). The losses, the held-out accuracy against the labels and the Bayes classifier's."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(100)

    def data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, 3, (n,), generator=g)
        x = CENTRES[y] + 0.6 * torch.randn(n, 2, generator=g)
        if labels == "apart":
            y = torch.randint(0, 3, (n,), generator=g)
        elif labels == "imbalanced":
            y = torch.multinomial(torch.tensor([0.8, 0.1, 0.1]), n, replacement=True, generator=g)
        return x, y

    x, y = data(3000)
    held_x, held_y = data(3000)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 3))
    with torch.no_grad():
        model[2].bias.copy_(torch.tensor([bias, 0.0, 0.0]))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, dbg = train(model, opt, x, y, F.cross_entropy, 1000, g)
    with torch.no_grad():
        accuracy = float((model(held_x).argmax(1) == held_y).float().mean())
    bayes = float((torch.cdist(held_x, CENTRES).argmin(1) == held_y).float().mean())
    return losses, accuracy, bayes, dbg


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    positive, negative = scores[labels == 1], scores[labels == 0]
    return float((positive[:, None] > negative[None, :]).float().mean())


def tabular(labels_match: bool) -> tuple[list[float], float, float, float, NeuralDbg]:
    """A binary classifier of 16 tabular features whose labels follow them weakly (credit scoring: a Bayes AUC of
    about 0.77, base rate 0.4), an MLP under AdamW for 400 steps of BCE; or the same labels drawn at the base rate
    apart from the inputs. The losses, the held-out AUC, the Bayes score's, and the labels' binary entropy."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(200)
    w = torch.randn(16, generator=g)
    w = w / w.norm()
    rate = float(torch.sigmoid(torch.tensor(-0.4)))

    def data(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 16, generator=g)
        logit = 1.2 * x @ w - 0.4
        p = torch.sigmoid(logit) if labels_match else torch.full((n,), rate)
        return x, (torch.rand(n, generator=g) < p).float(), logit

    x, y, _ = data(4000)
    held_x, held_y, held_logit = data(4000)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    losses, dbg = train(model, opt, x, y, lambda out, t: F.binary_cross_entropy_with_logits(out.squeeze(1), t), 400, g)
    with torch.no_grad():
        score = auc(model(held_x).squeeze(1), held_y)
    base = float(y.mean())
    entropy = -(base * math.log(base) + (1 - base) * math.log(1 - base))
    return losses, score, auc(held_logit, held_y), entropy, dbg


def kinds(dbg: NeuralDbg) -> set[str]:
    return {h.kind.value for h in dbg.hypotheses()}


def below_chance(dbg: NeuralDbg) -> bool:
    """What the rule says of the run: its loss fell to an end clearly below its chance level."""
    coverage = dbg._recorder.coverage
    curve = loss_evidence.read(coverage, DebugConfig())
    assert curve is not None
    return loss_evidence.fell_below_chance(coverage, curve)


def test_a_classifier_that_learned_in_its_first_steps_and_sits_at_its_noise_floor_is_healthy():
    losses, accuracy, bayes, dbg = gaussians("inputs")
    first, eighth, end = mean(losses[:8]), mean(losses[:125]), mean(losses[-250:])
    # plain torch: learned within the first eighth (which already sits near the floor), far below log 3, and
    # at the Bayes optimum on held-out data
    assert first - end > 0.3 and eighth - end < 0.05 and end < 0.6 * math.log(3)
    assert accuracy > bayes - 0.02 and accuracy > 0.7
    assert below_chance(dbg)
    assert not kinds(dbg) & LOSS_KINDS, dbg.explain_failure()


def test_its_twin_whose_labels_the_inputs_do_not_give_falls_from_a_high_start_only_to_chance_and_is_found():
    losses, accuracy, _, dbg = gaussians("apart", bias=3.0)
    # plain torch: the loss falls from far above log 3 as far as the healthy run's did, and stops at log 3; a guess
    assert mean(losses[:8]) - mean(losses[-250:]) > 0.3
    assert abs(mean(losses[-250:]) - math.log(3)) < 0.02 and accuracy < 0.4
    assert not below_chance(dbg)
    assert kinds(dbg) & LOSS_KINDS, dbg.report()


def test_its_twin_over_imbalanced_labels_falls_from_log_classes_only_to_their_entropy_and_is_found():
    losses, accuracy, _, dbg = gaussians("imbalanced")
    prior = -(0.8 * math.log(0.8) + 2 * 0.1 * math.log(0.1))  # 0.64, far below log 3 = 1.10
    # plain torch: the loss falls from log 3 far below it within a few steps, to the labels' entropy, and predicts
    # the majority class
    assert losses[0] > 0.95 * math.log(3) and mean(losses[:8]) - mean(losses[-250:]) > 0.1
    assert losses[0] - mean(losses[-250:]) > 0.3
    assert abs(mean(losses[-250:]) - prior) < 0.03 and accuracy < 0.82
    assert not below_chance(dbg)
    assert kinds(dbg) & LOSS_KINDS, dbg.report()


def test_a_weak_signal_binary_classifier_at_its_noise_floor_is_healthy():
    losses, score, bayes, entropy, dbg = tabular(labels_match=True)
    first, eighth, end = mean(losses[:8]), mean(losses[:50]), mean(losses[-100:])
    # plain torch: the loss falls from its first readings near the labels' entropy to well below it; the held-out
    # AUC is the Bayes score's, to within 0.03
    assert first - end > 0.08 and eighth - end < 0.06 and end < entropy - 0.1
    assert score > bayes - 0.03 and score > 0.7
    assert below_chance(dbg)
    assert not kinds(dbg) & LOSS_KINDS, dbg.explain_failure()


def test_its_twin_whose_labels_the_inputs_do_not_give_is_found():
    losses, score, _, entropy, dbg = tabular(labels_match=False)
    # plain torch: the loss stays at the entropy of the labels' base rate; the AUC is a guess's
    assert abs(mean(losses[-100:]) - entropy) < 0.02 and abs(score - 0.5) < 0.05
    assert not below_chance(dbg)
    assert kinds(dbg) & LOSS_KINDS, dbg.report()
