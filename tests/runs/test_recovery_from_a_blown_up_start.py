"""A residual MLP of 12 unnormalised blocks under kaiming init starts blown up: each block adds its branch to the
stream, the scale compounds through the depth and the first loss is in the thousands. Clipped Adam-family steps
shrink the branches until the output is back at a classifier's scale, and the run then learns (sweep G's fuzz #72).
The first block's output ends at a few hundredths of its first step's, but that step was an explosion's, not a
healthy level a collapse falls from: exploding gradients may be said, a collapsed output may not. The twin, the
same network from a healthy start under weight decay so strong that its layers shrink to nothing, is still found.
Ground truth is plain torch: the losses, the held-out accuracy and forward hooks on the layers."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

KIND = "collapsed_output"
WIDTH = 64
DEPTH = 12
CLASSES = 4
STEPS = 200


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(torch.relu(self.fc1(x))))


def network(kaiming: bool) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, WIDTH), *[Block() for _ in range(DEPTH)], nn.Linear(WIDTH, CLASSES))
    if kaiming:
        for m in model.modules():
            if isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)
    return model


def blobs(step: int, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes, each a Gaussian blob around its own centre in 8 dimensions."""
    centres = 2.0 * torch.randn(CLASSES, 8, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(1000 + step)
    y = torch.randint(0, CLASSES, (batch,), generator=g)
    return centres[y] + torch.randn(batch, 8, generator=g), y


def train(model: nn.Module, opt: torch.optim.Optimizer, watched: bool):
    """The user's loop with clipping; the losses, each layer's output rms per step (plain hooks) and the debugger."""
    scales: dict[str, list[float]] = {}
    layers = {"stem": model[0], "first": model[1].fc2, "head": model[-1]}

    def note(_m: nn.Module, _i: object, out: torch.Tensor, name: str) -> None:
        scales.setdefault(name, []).append(float(out.detach().pow(2).mean().sqrt()))

    hooks = [m.register_forward_hook(lambda m_, i_, o_, n=n: note(m_, i_, o_, n)) for n, m in layers.items()]
    losses: list[float] = []

    def loop() -> None:
        for step in range(STEPS):
            x, y = blobs(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            losses.append(loss.item())

    dbg = support.watching(model, loop, watched)
    for h in hooks:
        h.remove()
    return losses, scales, dbg


def accuracy(model: nn.Module) -> float:
    model.eval()
    x, y = blobs(10_000, batch=2000)
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def nadam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.NAdam(model.parameters(), lr=2e-3, weight_decay=0.01)


def kinds(dbg) -> list[str]:
    return [h.kind.value for h in dbg.hypotheses()]


def test_a_run_that_comes_back_from_a_blown_up_start_is_no_collapse():
    model = network(kaiming=True)
    losses, scales, _ = train(model, nadam(model), watched=False)
    # plain torch: the start is an explosion (the output thousands of times the stem's), the run comes back and learns
    assert sum(losses[:10]) / 10 > 100 and sum(losses[-50:]) / 50 < 1.5, (losses[:10], losses[-50:])
    assert scales["head"][0] > 100 * scales["stem"][0]
    assert accuracy(model) > 0.8  # chance 0.25
    # ... and the first block's output ends far below its blown-up start: what the rule read as a collapse
    assert sorted(scales["first"][-50:])[25] < 0.1 * scales["first"][0]

    watched = network(kaiming=True)
    same, _, dbg = train(watched, nadam(watched), watched=True)
    assert same == losses  # the debugger changes nothing
    assert KIND not in kinds(dbg), dbg.explain_failure()


def test_the_same_network_whose_layers_decay_to_nothing_from_a_healthy_start_is_found():
    model = network(kaiming=False)
    losses, scales, _ = train(model, torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=3.0), watched=False)
    # plain torch: a healthy start, then the first block's output shrinks to nothing and the loss sits at chance
    assert scales["head"][0] < 10 * scales["stem"][0] and losses[0] < 3.0
    assert sorted(scales["first"][-50:])[25] < 0.1 * scales["first"][0]
    assert accuracy(model) < 0.5

    twin = network(kaiming=False)
    _, _, dbg = train(twin, torch.optim.SGD(twin.parameters(), lr=0.1, weight_decay=3.0), watched=True)
    assert KIND in kinds(dbg), dbg.explain_failure()
