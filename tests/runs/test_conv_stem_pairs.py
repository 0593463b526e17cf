"""A stem convolution that feeds a convolution block with nothing between (sweep G's cnn2d, fuzz #36). The two
compose into one linear map, but two kernels that span positions compose into a wider one (two 3x3 into a 5x5,
with fewer weights): a factorisation, not a layer that adds nothing, and the network learns as well with or without
an activation after its stem. A pair that adds nothing, a convolution then a pointwise (1x1) one or two Linears,
is still found. Ground truth is plain torch: the held-out accuracy, and what one convolution can compute."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from test_detect_no_nonlinearity import pairs_of
from torch import nn

KIND = "no_nonlinearity"
WIDTH = 16


class Net(nn.Module):
    """A 3x3 stem, then one block of a convolution (``kernel``) and SiLU, a mean pool and a linear head."""

    def __init__(self, stem_act: bool, kernel: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, WIDTH, 3, padding=1)
        self.act = nn.SiLU() if stem_act else nn.Identity()
        self.block = nn.Sequential(nn.Conv2d(WIDTH, WIDTH, kernel, padding=kernel // 2), nn.SiLU())
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.act(self.stem(x))).mean((-2, -1)))


def images(step: int, batch: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Two smooth templates, shifted by up to 2 pixels, with noise."""
    templates = F.interpolate(torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(3)), size=(16, 16))
    g = torch.Generator().manual_seed(500 + step)
    y = torch.randint(0, 2, (batch,), generator=g)
    shifts = torch.randint(-2, 3, (batch, 2), generator=g).tolist()
    x = torch.stack([torch.roll(templates[c], (a, b), (1, 2)) for c, (a, b) in zip(y.tolist(), shifts)])
    return x + 0.5 * torch.randn(x.shape, generator=g), y


def smoothed(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy to label-smoothed targets: its floor is not zero, so a fit does not fall a hundredfold."""
    return F.cross_entropy(logits, y, label_smoothing=0.1)


def run(stem_act: bool, kernel: int, watched: bool):
    torch.manual_seed(0)
    model = Net(stem_act, kernel)
    opt = torch.optim.NAdam(model.parameters(), lr=3e-3)
    losses, dbg = support.fit(model, images, smoothed, 150, opt, watched)
    x, y = images(10_000, batch=500)
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean()), losses, dbg


def kinds(dbg) -> list[str]:
    return [h.kind.value for h in dbg.hypotheses()]


def test_two_spreading_kernels_compose_into_a_wider_one_that_neither_computes_alone():
    stem, conv = nn.Conv2d(3, WIDTH, 3, padding=2), nn.Conv2d(WIDTH, WIDTH, 3)
    impulse = torch.zeros(1, 3, 9, 9)
    impulse[0, 0, 4, 4] = 1.0
    with torch.no_grad():
        reach = (conv(stem(impulse)) - conv(stem(torch.zeros_like(impulse)))).abs().sum((0, 1)) > 0
    assert int(reach.any(0).sum()) == 5  # plain torch: the pair's kernel spans 5x5, neither of its own spans 3x3
    assert pairs_of(Net(False), torch.randn(2, 3, 8, 8)) == []
    # a 3x3 then a 1x1: the 1x1 folds into the 3x3 (one 3x3 convolution computes the pair), still a pair
    assert pairs_of(Net(False, kernel=1), torch.randn(2, 3, 8, 8)) == [("stem", "block.0")]


def test_a_stem_without_activation_before_a_conv_block_is_silent_and_a_pointwise_twin_is_found():
    plain, losses, _ = run(stem_act=False, kernel=3, watched=False)
    with_act, _, _ = run(stem_act=True, kernel=3, watched=False)
    assert plain > 0.95 and with_act > 0.95  # plain torch: the activation after the stem changes nothing
    assert sum(losses[-15:]) > 0.01 * sum(losses[:15])  # not converged a hundredfold: the run is judged
    _, watched, dbg = run(stem_act=False, kernel=3, watched=True)
    assert watched == losses
    assert KIND not in kinds(dbg), dbg.explain_failure()

    stem, pointwise = nn.Conv2d(3, WIDTH, 3, padding=1), nn.Conv2d(WIDTH, WIDTH, 1)
    folded = nn.Conv2d(3, WIDTH, 3, padding=1)
    with torch.no_grad():  # plain torch: one 3x3 convolution computes the stem and the 1x1 after it
        folded.weight.copy_(torch.einsum("oc,cikl->oikl", pointwise.weight[:, :, 0, 0], stem.weight))
        folded.bias.copy_(pointwise.weight[:, :, 0, 0] @ stem.bias + pointwise.bias)
        x = torch.randn(2, 3, 8, 8)
        assert torch.allclose(folded(x), pointwise(stem(x)), atol=1e-5)
    _, _, twin = run(stem_act=False, kernel=1, watched=True)
    assert KIND in kinds(twin), twin.explain_failure()
