"""Zero-initialised residual branches in a binary classifier: the last layer of each branch starts at zero, as the
fix text of symmetric_units recommends. With two classes, the error reaching the residual stream is the same
direction for every sample (``(p1 - y1)(w_head1 - w_head2)``), so the top branch's last layer is moved along one
direction only: its rows stay multiples of one row. They are not copies, and nothing is lost: the head reads the
stream only along that direction. Ground truth in plain torch: the accuracy equals the default start's, the stream's
error has one direction, and the rows stay multiples of one row. The twins where the fault is real are still found
in a binary classifier: a constant start, and every layer zeroed (each zero layer then holds the next to one
direction)."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.capture import symmetry

KIND = "symmetric_units"
STEPS = 120
WIDTH = 32


def make(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes by the XOR of two coordinates' signs: no function of one projection of the input separates them."""
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
    return x, (x[:, 0] * x[:, 1] > 0).long()


class Block(nn.Module):
    """A pre-norm residual block: x + fc2(gelu(fc1(norm(x))))."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def residual(zero_branches: bool) -> nn.Sequential:
    model = nn.Sequential(nn.Linear(16, WIDTH), *[Block(WIDTH) for _ in range(3)], nn.Linear(WIDTH, 2))
    if zero_branches:
        for block in model[1:4]:
            nn.init.zeros_(block.fc2.weight)
            nn.init.zeros_(block.fc2.bias)
    return model


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 2))


def filled(model: nn.Module, value: float) -> nn.Module:
    """Every weight matrix set to ``value`` (0: every layer zeroed); the biases keep their random start."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.fill_(value)
    return model


def run(build, watched: bool, optimizer: str = "adam"):
    torch.manual_seed(0)
    model = build()
    if optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, dbg = support.fit(model, make, F.cross_entropy, STEPS, opt, watched)
    return model, losses, dbg


def accuracy(model: nn.Module) -> float:
    model.eval()
    with torch.no_grad():
        held = [make(10_000 + i) for i in range(4)]
        return sum(float((model(x).argmax(1) == y).float().mean()) for x, y in held) / len(held)


def off_direction(rows: torch.Tensor) -> float:
    """The share of the rows' energy outside their top singular direction: 0 when every row is a multiple of one."""
    s = torch.linalg.svdvals(rows.detach().reshape(rows.shape[0], -1).double())
    return float(1 - s[0] ** 2 / (s**2).sum())


def spread(weight: torch.Tensor) -> float:
    """``||W - mean row|| / ||W||``: 0 for identical rows (copies), about 1 for independent ones."""
    rows = weight.detach().reshape(weight.shape[0], -1).double()
    return float((rows - rows.mean(0)).norm() / rows.norm())


def kinds(dbg: NeuralDbg | None) -> list[str]:
    assert dbg is not None
    return [h.kind.value for h in dbg.hypotheses()]


def test_zero_started_branches_of_a_binary_classifier_are_the_losss_one_direction_and_silent():
    model, losses, _ = run(lambda: residual(True), watched=False)
    default, _, _ = run(lambda: residual(False), watched=False)
    # plain torch: it learns as well as the default start ...
    assert sum(losses[-10:]) < 0.5 * sum(losses[:10])
    assert accuracy(model) > 0.85 and accuracy(model) >= accuracy(default) - 0.02
    # ... the error reaching the stream has one direction for every sample, the head's two rows' difference ...
    x, y = make(10_000)
    stream = model[:4](x).detach().requires_grad_(True)
    F.cross_entropy(model[4](stream), y).backward()
    assert stream.grad is not None and off_direction(stream.grad) < 1e-9
    head = model[4].weight.detach()
    assert off_direction(torch.cat([stream.grad, (head[0] - head[1])[None]])) < 1e-9
    # ... so the top branch's last layer kept its rows multiples of one row, which are no copies of one another
    top = model[3].fc2.weight
    assert off_direction(top) < symmetry.ONE_DIRECTION and spread(top) > 0.5

    _, watched, dbg = run(lambda: residual(True), watched=True)
    assert watched == losses  # the debugger changes nothing
    assert KIND not in kinds(dbg), dbg and dbg.explain_failure()


def test_a_constant_start_in_a_binary_classifier_is_still_found():
    faulty, losses, _ = run(lambda: filled(mlp(), 0.05), watched=False, optimizer="sgd")
    healthy, _, _ = run(mlp, watched=False, optimizer="sgd")
    # plain torch: it fits worse, and its hidden units are still near-copies of each other
    assert accuracy(faulty) < accuracy(healthy) - 0.05
    assert spread(faulty[0].weight) < 0.5 and spread(faulty[2].weight) < 0.5

    _, watched, dbg = run(lambda: filled(mlp(), 0.05), watched=True, optimizer="sgd")
    assert watched == losses
    assert kinds(dbg)[:1] == [KIND], dbg and dbg.explain_failure()
    assert dbg is not None and dbg.hypotheses()[0].root.metrics.get("zero_started", 0.0) == 0.0


def test_every_layer_zeroed_in_a_binary_classifier_is_still_found():
    faulty, losses, _ = run(lambda: filled(mlp(), 0.0), watched=False, optimizer="sgd")
    healthy, _, _ = run(mlp, watched=False, optimizer="sgd")
    # plain torch: it barely learns, and both hidden layers' rows are multiples of one row, each held there by the
    # other (the first one's units move along the direction the second one reads)
    assert accuracy(faulty) < accuracy(healthy) - 0.2
    assert off_direction(faulty[0].weight) < 0.01 and off_direction(faulty[2].weight) < 0.01

    _, watched, dbg = run(lambda: filled(mlp(), 0.0), watched=True, optimizer="sgd")
    assert watched == losses
    assert kinds(dbg)[:1] == [KIND], dbg and dbg.explain_failure()
    found = dbg.hypotheses()[0].root
    assert set(found.detail.split(", ")) == {"0", "2"} and found.metrics["zero_started"] == 1.0
