"""BatchNorm channels that go dark for a few steps and come back (hunt 20). A Conv-BN-ReLU classifier under SGD
0.05 with momentum 0.9, the usual recipe: around step 15 nine in ten of the second BatchNorm's channels are off on
every sample, then the batch statistics and the momentum bring most of them back, and the model learns. The
debugger reported ``dead_neurons`` at that BatchNorm. Its twin at ten times the learning rate loses the layer for
good and learns nothing: found.

Ground truth by plain torch: the share of the BatchNorm's channels that are never positive on a batch, step by
step; held-out accuracy; the loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

SEED = 2


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """Five 6x6 templates at random places in 16x16 noise, standardised; 1,200 to train on, 300 held out."""
    g = torch.Generator().manual_seed(SEED)
    templates = torch.randn(5, 6, 6, generator=g)
    y = torch.randint(0, 5, (1500,), generator=g)
    x = 0.7 * torch.randn(1500, 1, 16, 16, generator=g)
    at = torch.randint(0, 11, (1500, 2), generator=g)
    for i in range(1500):
        r, c = at[i]
        x[i, 0, r : r + 6, c : c + 6] += templates[y[i]]
    return (x - x.mean()) / x.std(), y


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        h = F.max_pool2d(F.relu(self.bn2(self.conv2(h))), 2)
        return self.fc(h.flatten(1))


def run(lr: float, watched: bool) -> dict:
    x, y = data()
    torch.manual_seed(SEED + 1000)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    schedule = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
    off: list[float] = []
    losses: list[float] = []
    hook = model.bn2.register_forward_hook(
        lambda m, i, o: off.append(1 - float((o.detach() > 0).any(dim=(0, 2, 3)).float().mean()))
    )
    order = torch.Generator().manual_seed(SEED)
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.attach()
    for _ in range(6):
        perm = torch.randperm(1200, generator=order)
        for k in range(0, 1200, 32):
            i = perm[k : k + 32]
            loss = F.cross_entropy(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        schedule.step()
    if dbg is not None:
        dbg.close()
    hook.remove()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x[1200:]).argmax(1) == y[1200:]).float().mean())
    return {"off": off, "losses": losses, "accuracy": accuracy, "dbg": dbg}


def test_channels_that_went_dark_and_came_back_in_a_run_that_learned_are_not_dead_neurons() -> None:
    plain = run(0.05, watched=False)
    off, losses = plain["off"], plain["losses"]
    assert max(off[:40]) >= 0.9  # nine in ten channels off on every sample of a batch, early
    assert sum(off[len(off) // 2 :]) / (len(off) - len(off) // 2) < 0.7  # ... most of them back later
    assert plain["accuracy"] >= 0.8 and sum(losses[-20:]) / 20 < 0.5 * losses[0]
    watched = run(0.05, watched=True)
    assert watched["losses"] == losses
    dbg = watched["dbg"]
    assert FailureKind.DEAD_NEURONS not in {h.kind for h in dbg.hypotheses()}, dbg.explain_failure()


def test_channels_that_stay_dark_at_ten_times_the_learning_rate_are_dead_neurons() -> None:
    plain = run(0.5, watched=False)
    assert min(plain["off"][-40:]) == 1.0 and plain["accuracy"] < 0.3  # the layer is gone, nothing learned
    dbg = run(0.5, watched=True)["dbg"]
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.DEAD_NEURONS and top.layer == "bn2"


def test_only_a_short_stretch_that_ended_early_in_a_run_whose_loss_fell_came_back(monkeypatch) -> None:
    """The revival rule's conditions one by one, on a 200-step run whose last quarter of losses starts at step 150."""
    from types import SimpleNamespace

    from neuraldbg.capture.coverage import Coverage, RunFacts
    from neuraldbg.kinds import dead_neurons
    from neuraldbg.kinds.base import layer_event

    curve = SimpleNamespace(verdict="fell", at_chance=False, end=SimpleNamespace(first=150))
    monkeypatch.setattr(dead_neurons.loss_evidence, "read", lambda coverage, config: curve)
    coverage, facts = Coverage(last_step=199), RunFacts(trainable=10, backward_passes=200, optimizer_steps=200)

    def revived(start: int, end: int, **metrics: float) -> bool:
        event = layer_event(dead_neurons.KIND, "bn2", start, end, {"dead_fraction": 0.9, **metrics})
        return dead_neurons._revived(event, coverage, facts)

    assert revived(13, 20)
    assert not revived(13, 20, ongoing=1.0)  # still dead at the last check
    assert not revived(13, 80)  # dead over more than a quarter of the run
    assert not revived(140, 155)  # came back only within the last quarter
    for verdict, at_chance in (("flat", False), ("climbing", False), ("fell", True)):
        curve.verdict, curve.at_chance = verdict, at_chance
        assert not revived(13, 20), (verdict, at_chance)  # the loss did not fall, or fell only to chance
