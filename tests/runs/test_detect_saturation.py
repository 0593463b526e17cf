"""Saturated activations on a model that truly has them (checked with plain torch), and a confident final sigmoid
that must not count."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

# --------------------------------------------------------------------------------------------- saturation


def test_tanh_saturated_from_init_is_rooted_at_the_first_saturated_layer_at_step_0():
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=4, act=nn.Tanh)
    with torch.no_grad():
        for i in (0, 2, 4, 6):
            model[i].weight.mul_(20.0)
    batches = support.regression_batches()
    out = support.capture_outputs(model, batches(0)[0], ["1"])["1"]
    assert float((out.abs() > 0.995).float().mean()) > 0.5  # plain torch: most outputs pinned at +-1

    dbg, _ = support.train(model, batches, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.SATURATED_ACTIVATIONS
    assert top.root.layer == "1"
    assert top.root.step_start == 0


def test_a_confident_final_sigmoid_is_not_saturation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
    with torch.no_grad():
        model[2].weight.mul_(30.0)  # outputs pinned near 0/1 from the start: the classifier is just confident
    gen = support.classification_batches((16,), 2)

    def batches(step: int) -> support.Batch:
        x, y = gen(step)
        return x, y.float().unsqueeze(1)

    dbg, _ = support.train(model, batches, F.binary_cross_entropy)
    assert FailureKind.SATURATED_ACTIVATIONS not in {h.kind for h in dbg.hypotheses()}


class Hashing(nn.Module):
    """Deep supervised hashing: a tanh code of 32 bits, pushed to +-1 by a quantisation loss, and a linear
    classifier on the codes (the binarised codes are the product)."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 32))
        self.code = nn.Tanh()
        self.cls = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.code(self.f(x))
        return self.cls(b), b


def _hashing(watched: bool) -> tuple[list[float], float, float, object]:
    g = torch.Generator().manual_seed(3300)
    centres = torch.randn(10, 32, generator=g) * 1.2

    def data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, 10, (n,), generator=g)
        return centres[y] + torch.randn(n, 32, generator=g), y

    xtr, ytr = data(4000)
    xte, yte = data(1000)
    torch.manual_seed(0)
    model = Hashing()
    opt = torch.optim.Adam(model.parameters(), 2e-3)
    losses: list[float] = []
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    for _ in range(300):
        idx = torch.randint(0, 4000, (64,), generator=g)
        logits, b = model(xtr[idx])
        loss = F.cross_entropy(logits, ytr[idx]) + 0.5 * ((b.abs() - 1) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if dbg is not None:
        dbg.__exit__(None, None, None)
    with torch.no_grad():
        _, b = model(xte)
        accuracy = float((model.cls(torch.sign(b)).argmax(1) == yte).float().mean())
        saturated = float((1 - model.code(model.f(xtr[:1000])) ** 2 < 0.01).float().mean())
    return losses, accuracy, saturated, dbg


def test_saturation_a_converged_fit_reaches_on_purpose_is_not_a_failure():
    losses, accuracy, saturated, _ = _hashing(watched=False)
    # plain torch: the codes end saturated (derivative under 1 % of its maximum on over half of them) once the loss
    # fell tenfold and more, and the binarised codes classify almost perfectly
    assert saturated > 0.5 and losses[-1] < 0.1 * losses[0] and accuracy > 0.95
    watched, _, _, dbg = _hashing(watched=True)
    assert watched == losses
    assert dbg is not None and dbg.healthy, dbg.explain_failure()
