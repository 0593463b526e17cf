"""A mixture density network: K Gaussian components whose weights come from a log_softmax, its loss the negated
log of the mixture's density, ``-logsumexp(log_pi + log N(y; mu, sigma))``. Its log_softmax is no classifier's and
its K components no classes: the loss has no chance level of log(K). Ground truth is plain torch: the held-out
negative log-likelihood beats the best constant Gaussian's clearly, while the training loss ends within 5 % of
log(K), where a classifier's at chance would; the debugger stays silent and leaves training bit-identical. The
same loss read from its graph: no classifier loss; cross_entropy's is one."""

from __future__ import annotations

import math

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.capture import loss_graph

K = 3


class MDN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.weights, self.means, self.spreads = nn.Linear(64, K), nn.Linear(64, K), nn.Linear(64, K)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return F.log_softmax(self.weights(h), -1), self.means(h), self.spreads(h).clamp(-7, 5)


def nll(out: tuple[torch.Tensor, torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    log_pi, mu, log_sigma = out
    log_density = -0.5 * ((y - mu) / log_sigma.exp()) ** 2 - log_sigma - 0.5 * math.log(2 * math.pi)
    return -torch.logsumexp(log_pi + log_density, -1).mean()


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(5000, 1, generator=g) * 6 - 3
    y = 0.7 * torch.sin(2 * x) + 0.5 * torch.randn(5000, 1, generator=g)
    return x, (y - y.mean()) / y.std()


def train(watched: bool) -> tuple[list[float], float, NeuralDbg | None, MDN]:
    x, y = data()
    torch.manual_seed(0)
    model = MDN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(2)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(400):
            i = torch.randint(0, 4000, (128,), generator=g)
            opt.zero_grad()
            loss = nll(model(x[i]), y[i])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    dbg = support.watching(model, loop, watched)
    with torch.no_grad():
        held_out = float(nll(model(x[4000:]), y[4000:]))
    return losses, held_out, dbg, model


def test_a_mixture_density_network_that_fits_is_not_a_classifier_at_chance():
    losses, held_out, _, _ = train(watched=False)
    _, y = data()
    constant = float(F.gaussian_nll_loss(torch.zeros_like(y[4000:]), y[4000:], torch.ones_like(y[4000:]), full=True))
    assert held_out < constant - 0.2  # plain torch: the mixture fits, far better than the best constant Gaussian
    end = sum(losses[-100:]) / 100
    assert abs(end - math.log(K)) < 0.05 * math.log(K)  # ... ending where a 3-class classifier at chance would

    watched, _, dbg, _ = train(watched=True)
    assert watched == losses
    assert dbg is not None and dbg.healthy, dbg.explain_failure()
    assert dbg._recorder.coverage.mixture_loss and not dbg._recorder.coverage.classifier_loss


def test_the_graph_reads_a_mixtures_log_softmax_as_no_classifier_and_cross_entropy_as_one():
    torch.manual_seed(0)
    model = MDN()
    x, y = data()
    mixture = loss_graph.read([nll(model(x[:16]), y[:16])])
    assert mixture.loss == "" and mixture.mixture
    logits = model.weights(model.body(x[:16]))
    labels = torch.zeros(16, 1, dtype=torch.long)
    assert loss_graph.read([F.cross_entropy(logits, labels.squeeze(1))]).loss
    # a classifier's cross-entropy written by hand with a logsumexp of its own logits is no mixture
    by_hand = loss_graph.read([-(logits - logits.logsumexp(1, keepdim=True)).gather(1, labels).mean()])
    assert not by_hand.mixture
