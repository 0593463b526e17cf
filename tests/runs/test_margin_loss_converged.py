"""A margin loss met on most batches once the model has learned it (batch-hard triplets: exactly zero once every
margin of a batch is met) has converged; a policy made deterministic by a learning rate far too high, its
log-probabilities exactly 0 from mid-run on, gives nothing to learn from again: degenerate. Ground truth is plain
torch in each test."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

CLASSES = 10


def clusters(per_class: int, g: torch.Generator, centers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten classes, each a tight cluster in 10 of 32 input dimensions, the other 22 wide noise."""
    y = torch.arange(CLASSES).repeat_interleave(per_class)
    x = 1.5 * torch.randn(len(y), 32, generator=g)
    x[:, :10] = centers[y] + 0.2 * torch.randn(len(y), 10, generator=g)
    return x, y


def batch_hard(emb: torch.Tensor, y: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """The triplet loss with each anchor's farthest positive and nearest negative in the batch."""
    d = torch.cdist(emb, emb)
    same = y[:, None] == y[None, :]
    hardest_pos = (d * same).max(1).values
    hardest_neg = d.masked_fill(same, float("inf")).min(1).values
    return F.relu(hardest_pos - hardest_neg + margin).mean()


def nearest_neighbour_accuracy(
    embed, train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor]
) -> float:
    with torch.no_grad():
        found = train[1][torch.cdist(embed(test[0]), embed(train[0])).argmin(1)]
    return float((found == test[1]).float().mean())


def test_a_triplet_loss_met_on_most_batches_once_learned_is_not_an_alarm():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    centers = torch.randn(CLASSES, 10, generator=g)
    train, test = clusters(200, g, centers), clusters(100, g, centers)
    by_class = [torch.nonzero(train[1] == c).squeeze(1) for c in range(CLASSES)]
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 32))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    zero_losses = []
    with NeuralDbg(model) as dbg:
        for step in range(600):
            classes = torch.randperm(CLASSES)[:8]  # 8 classes of 8 samples each
            idx = torch.cat([by_class[c][torch.randint(0, len(by_class[c]), (8,))] for c in classes])
            opt.zero_grad()
            loss = batch_hard(F.normalize(model(train[0][idx]), dim=1), train[1][idx])
            loss.backward()
            opt.step()
            if loss.item() == 0.0:
                zero_losses.append(step)
    # plain torch: the margins are met on most batches (exactly zero loss and gradient), the first of them well
    # into the run, the hard batches still giving gradients to its end; held-out neighbours are found by class
    assert len(zero_losses) > 300 and zero_losses[0] > 50 and len(zero_losses) < 600 - 40
    assert any(step not in zero_losses for step in range(560, 600))
    embedded = nearest_neighbour_accuracy(lambda x: F.normalize(model(x), dim=1), train, test)
    raw = nearest_neighbour_accuracy(lambda x: x, train, test)
    assert embedded > 0.95 and embedded > raw + 0.1
    assert not dbg.hypotheses(), dbg.report()


def test_a_policy_made_deterministic_in_mid_run_is_a_degenerate_loss():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    policy = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    zero, certain, rewards = [], [], []
    with NeuralDbg(policy) as dbg:
        for step in range(300):
            if step == 30:  # a schedule's mistake: a rate far too high for a policy gradient from here on
                opt.param_groups[0]["lr"] = 1e5
            state = torch.randn(32, 4, generator=g)
            dist = torch.distributions.Categorical(logits=policy(state))
            action = dist.sample()
            reward = (action == (state[:, 0] > 0).long()).float()  # arm 1 pays when the first feature is positive
            opt.zero_grad()
            (-(dist.log_prob(action) * reward).mean()).backward()
            opt.step()
            zero.append(all(float(p.grad.abs().max()) == 0.0 for p in policy.parameters()))
            certain.append(bool((dist.probs.max(dim=1).values == 1.0).all()))
            rewards.append(float(reward.mean()))
    # plain torch: the policy learns at first (it pays on most of a batch), then the step at the high rate makes it
    # certain of its action on every state (probability exactly 1), so every gradient is exactly zero from then to
    # the end: nothing can move it again. (The rate change alone makes the step; which arms it settles on varies
    # with the hardware's rounding, so only certainty and the zeros are asserted.)
    first = zero.index(True)
    assert 30 <= first < 40 and all(zero[first:]) and all(certain[first + 1 :])
    assert not any(zero[:30]) and max(rewards[:30]) > 0.75
    assert FailureKind.DEGENERATE_LOSS in {h.kind for h in dbg.hypotheses()}, dbg.report()
