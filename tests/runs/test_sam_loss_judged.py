"""Sharpness-aware minimisation (SAM) keeps its loss judged: its first backward pass, at the perturbed weights'
origin, is zeroed before the step uses the second one, a discarded pass of the same objective on the same batch
under one optimizer. (A pass discarded while several optimizers step the model's parts served another part's loss,
a generator beside its discriminator: that loss says nothing of one fit and stays unjudged.) Ground truth is plain
torch: SAM given labels permuted apart from their inputs stays at chance (held-out accuracy at chance), and with
the true labels it learns."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.capture.coverage import Coverage
from neuraldbg.kinds import loss_evidence

CLASSES = 8
g = torch.Generator().manual_seed(1234)
W1, W2 = torch.randn(20, 64, generator=g) / 20**0.5, torch.randn(64, CLASSES, generator=g) / CLASSES


def labels(x: torch.Tensor) -> torch.Tensor:
    return (torch.tanh(x @ W1 * 2) @ W2).argmax(1)


def sam(permuted: bool, watched: bool, rho: float = 0.05) -> tuple[float, NeuralDbg | None]:
    """A user's SAM loop (perturb along the normalised gradient, second pass there, restore, step) on a stream of
    fresh inputs; ``permuted``: each batch's labels shuffled apart from its inputs. Returns held-out accuracy."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    stream = torch.Generator().manual_seed(0)

    def loop() -> None:
        for _ in range(300):
            x = torch.randn(64, 20, generator=stream)
            t = labels(x)
            if permuted:
                t = t[torch.randperm(64, generator=stream)]
            F.cross_entropy(model(x), t).backward()
            with torch.no_grad():
                norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
                eps = [rho * p.grad / (norm + 1e-12) for p in model.parameters()]
                for p, e in zip(model.parameters(), eps):
                    p.add_(e)
            opt.zero_grad()
            F.cross_entropy(model(x), t).backward()
            with torch.no_grad():
                for p, e in zip(model.parameters(), eps):
                    p.sub_(e)
            opt.step()
            opt.zero_grad()

    dbg = support.watching(model, loop, watched)
    x = torch.randn(1024, 20, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        return float((model(x).argmax(1) == labels(x)).float().mean()), dbg


def test_sam_given_permuted_labels_is_found_at_chance_and_with_its_labels_is_silent():
    assert sam(permuted=True, watched=False)[0] < 0.3 < 0.6 < sam(permuted=False, watched=False)[0]
    _, dbg = sam(permuted=True, watched=True)
    assert dbg is not None and dbg._recorder.coverage.discarded_backwards >= 250  # the first pass of every step
    assert dbg.hypotheses() and dbg.hypotheses()[0].kind.value == "loss_at_chance", dbg.explain_failure()
    _, healthy = sam(permuted=False, watched=True)
    assert healthy is not None and not healthy.hypotheses(), healthy.explain_failure()


def test_passes_discarded_while_several_optimizers_step_leave_the_loss_unjudged():
    one = Coverage(discarded_backwards=300, optimizers_at_once=1)
    several = Coverage(discarded_backwards=300, optimizers_at_once=2)
    assert loss_evidence.skipped(one) == ""
    assert "another part's loss" in loss_evidence.skipped(several)
