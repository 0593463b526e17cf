"""A policy-gradient loss whose advantage ``R - value`` keeps the value's gradient: the policy term trains the value
head too. Found from the loss's autograd graph (a log-probability times a difference reaching parameters the
log-probability does not use). Ground truth is plain torch in each test: the policy term's gradient reaches the
value head (exactly zero for the detached twin), and the value head fits the returns worse over three seeds.
Losses that multiply log-probabilities by something else (an entropy bonus, a focal weight, returns, a detached
value, a PPO ratio's buffered advantages) stay silent, and training is bit-identical."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical

from neuraldbg import NeuralDbg

KIND = "advantage_not_detached"


class ActorCritic(nn.Module):
    """pytorch/examples' actor-critic: a shared trunk, an action head under a softmax, a value head."""

    def __init__(self, logits: bool = False) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 64)
        self.action_head = nn.Linear(64, 2)
        self.value_head = nn.Linear(64, 1)
        self.logits = logits

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.affine1(x))
        scores = self.action_head(h)
        return (scores if self.logits else F.softmax(scores, dim=-1)), self.value_head(h).squeeze(1)


def bandit(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """A contextual bandit: +1 for the action that matches the sign of the first feature, -1 otherwise, plus a
    state-dependent offset a value head can learn."""
    return ((a == (x[:, 0] > 0).long()).float() * 2 - 1) + 0.5 * x[:, 1]


def policy_terms(model: ActorCritic, x: torch.Tensor, variant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy-gradient term and the value loss of one batch, as the variant writes them."""
    scores, value = model(x)
    dist = Categorical(logits=scores) if model.logits else Categorical(probs=scores)
    a = dist.sample()
    r = bandit(x, a)
    log_prob = dist.log_prob(a)
    if variant in ("not_detached", "logits"):
        policy = (-log_prob * (r - value)).mean()
    elif variant == "entropy_bonus":
        probs = dist.probs
        policy = (-log_prob * (r - value.detach())).mean() - 0.01 * (-(probs * probs.log()).sum(1)).mean()
    elif variant == "returns_only":  # REINFORCE without a baseline
        policy = (-log_prob * r).mean()
    elif variant in ("ppo", "ppo_not_detached"):  # a clipped ratio times advantages
        with torch.no_grad():
            old = log_prob.detach() + 0.01
        advantage = r - value
        if variant == "ppo":  # ... computed without a gradient, as a rollout buffer holds them
            advantage = advantage.detach()
        ratio = (log_prob - old).exp()
        policy = -torch.min(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean()
    else:  # "detached"
        policy = (-log_prob * (r - value.detach())).mean()
    return policy, F.smooth_l1_loss(value, r)


def train(variant: str, seed: int = 0, steps: int = 150, watched: bool = False):
    torch.manual_seed(seed)
    model = ActorCritic(logits=variant == "logits")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    errors: list[float] = []
    dbg = NeuralDbg(model) if watched else None
    if dbg is not None:
        dbg.__enter__()
    try:
        g = torch.Generator().manual_seed(seed + 1)
        for _ in range(steps):
            x = torch.randn(32, 4, generator=g)
            torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))  # the actions' draws
            policy, value_loss = policy_terms(model, x, variant)
            opt.zero_grad()
            (policy + value_loss).backward()
            opt.step()
            errors.append(float(value_loss.detach()))
    finally:
        if dbg is not None:
            dbg.__exit__(None, None, None)
    return errors, dbg, model


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_the_policy_term_of_an_undetached_advantage_trains_the_value_head_and_is_found():
    # plain torch, exactly: the policy term alone has a gradient in the value head, and none when detached
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(3))
    for variant, reaches in (("not_detached", True), ("detached", False)):
        torch.manual_seed(0)
        model = ActorCritic()
        policy, _ = policy_terms(model, x, variant)
        policy.backward()
        grad = model.value_head.weight.grad
        assert (grad is not None and float(grad.abs().sum()) > 0) == reaches
    # ... and it harms: the value head fits the returns worse, over three seeds (last 50 steps)
    for seed in range(3):
        bad, _, _ = train("not_detached", seed=seed, steps=300)
        good, _, _ = train("detached", seed=seed, steps=300)
        assert sum(bad[-50:]) > 1.1 * sum(good[-50:])

    plain, _, _ = train("not_detached")
    watched, dbg, _ = train("not_detached", watched=True)
    assert watched == plain  # training unchanged
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    root = hits[0].root
    assert root.layer == "value_head" and root.step_start == 0
    assert "value.detach()" in hits[0].explanation and "'value_head'" in hits[0].explanation


@pytest.mark.parametrize("variant", ["logits", "ppo_not_detached"])
def test_logits_normalised_by_their_logsumexp_and_a_ppo_ratio_are_log_probabilities_too(variant: str):
    """``Categorical(logits=...)`` normalises by a logsumexp; PPO weighs ``exp(log_prob - old_log_prob)``."""
    _, dbg, _ = train(variant, steps=20, watched=True)
    assert dbg is not None and found(dbg), dbg.explain_failure()
    assert found(dbg)[0].root.layer == "value_head"


@pytest.mark.parametrize("variant", ["detached", "entropy_bonus", "returns_only", "ppo"])
def test_log_probabilities_weighed_by_what_carries_no_gradient_to_other_parameters_are_silent(variant: str):
    plain, _, _ = train(variant, steps=60)
    watched, dbg, _ = train(variant, steps=60, watched=True)
    assert watched == plain
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_a_focal_weight_on_the_same_heads_probabilities_is_silent():
    """``-(1 - p) * log p``: a difference times a log-probability, but both read the same logits."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(model) as dbg:
        for _ in range(30):
            x = torch.randn(64, 10, generator=g)
            y = (x[:, :3].argmax(1)).unsqueeze(1)
            log_p = F.log_softmax(model(x), dim=1).gather(1, y).squeeze(1)
            loss = (-(1 - log_p.exp()) * log_p).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert not found(dbg), dbg.explain_failure()


def test_a_separate_critic_is_named_when_watched_and_described_when_not():
    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.actor = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
            self.critic = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))

    def run(watch_both: bool) -> NeuralDbg:
        torch.manual_seed(0)
        both = Both()
        opt = torch.optim.Adam(both.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(1)
        with NeuralDbg(both if watch_both else both.actor) as dbg:
            for _ in range(10):
                x = torch.randn(32, 4, generator=g)
                dist = Categorical(logits=both.actor(x))
                a = dist.sample()
                r = bandit(x, a)
                value = both.critic(x).squeeze(1)
                loss = (-dist.log_prob(a) * (r - value)).mean() + F.mse_loss(value, r)
                opt.zero_grad()
                loss.backward()
                opt.step()
        return dbg

    hits = found(run(watch_both=True))
    assert hits and hits[0].root.layer == "critic.0"
    hits = found(run(watch_both=False))
    assert hits and hits[0].root.layer == "" and "does not watch" in hits[0].explanation


def test_a_learned_weight_from_another_head_that_is_no_difference_is_silent():
    """Learned loss attenuation (Kendall and Gal): each sample's log-likelihood weighed by ``exp(-s)`` from an
    uncertainty head, plus ``s``: that head is meant to get the product's gradient. Only a difference (an
    advantage, a return minus a value) is taken for a policy-gradient weight."""

    class Attenuated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
            self.classes = nn.Linear(32, 3)
            self.uncertainty = nn.Linear(32, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.trunk(x)
            return self.classes(h), self.uncertainty(h).squeeze(1)

    torch.manual_seed(0)
    model = Attenuated()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(model) as dbg:
        for _ in range(30):
            x = torch.randn(64, 10, generator=g)
            y = x[:, :3].argmax(1, keepdim=True)
            logits, s = model(x)
            log_p = F.log_softmax(logits, dim=1).gather(1, y).squeeze(1)
            loss = (torch.exp(-s) * -log_p + s).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert not found(dbg), dbg.explain_failure()


@pytest.mark.parametrize("detached", [False, True])
def test_a_gaussian_policy_is_judged_as_a_categorical_one(detached: bool):
    """A continuous action from ``Normal(mean, exp(log_std))``, summed over its dimensions: the log-density as
    torch.distributions computes it."""
    from torch.distributions import Normal

    class Gaussian(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = nn.Sequential(nn.Linear(4, 32), nn.Tanh())
            self.mean = nn.Linear(32, 2)
            self.log_std = nn.Parameter(torch.zeros(2))
            self.value = nn.Linear(32, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.trunk(x)
            return self.mean(h), self.value(h).squeeze(1)

    torch.manual_seed(0)
    model = Gaussian()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(model) as dbg:
        for _ in range(10):
            x = torch.randn(32, 4, generator=g)
            mean, value = model(x)
            dist = Normal(mean, model.log_std.exp())
            a = dist.sample()
            r = -(a - x[:, :2]).pow(2).sum(1)  # reward: act close to the first two features
            baseline = value.detach() if detached else value
            loss = (-dist.log_prob(a).sum(1) * (r - baseline)).mean() + F.mse_loss(value, r)
            opt.zero_grad()
            loss.backward()
            opt.step()
    hits = found(dbg)
    assert bool(hits) != detached, dbg.explain_failure()
    if hits:
        assert hits[0].root.layer == "value"
