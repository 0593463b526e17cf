"""Which losses hold a policy-gradient term (``loss_graph.weighs_log_probabilities``), read from graphs built
here: log-probabilities of picked actions weighed by returns, a detached or an undetached advantage, a PPO ratio, a
Normal's log-density, a rollout stacked step by step; and the losses that are not one: a cross-entropy by
torch or by hand, a focal weight, an entropy bonus, a scaled log-probability term."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical, Normal

from neuraldbg.capture.loss_graph import weighs_log_probabilities

torch.manual_seed(0)
POLICY = nn.Linear(4, 3)
VALUE = nn.Linear(4, 1)
X = torch.randn(8, 4)
ACTIONS = torch.randint(0, 3, (8,))
RETURNS = torch.randn(8)
LOG_STD = nn.Parameter(torch.zeros(3))
ADVANTAGE = "advantage"  # a Gaussian policy's learned spread


def log_probs() -> torch.Tensor:
    return Categorical(logits=POLICY(X)).log_prob(ACTIONS)


def test_log_probabilities_of_picked_actions_weighed_by_returns_or_advantages_are_a_policy_gradient():
    value = VALUE(X).squeeze(1)
    assert weighs_log_probabilities([-(log_probs() * RETURNS).mean()]) == ADVANTAGE  # REINFORCE
    assert weighs_log_probabilities([-(log_probs() * (RETURNS - value).detach()).mean()]) == ADVANTAGE
    assert weighs_log_probabilities([-(log_probs() * (RETURNS - value)).mean()]) == ADVANTAGE  # an advantage undetached
    ratio = (log_probs() - (log_probs().detach() + 0.01)).exp()  # against the old policy's
    assert weighs_log_probabilities([-torch.min(ratio * RETURNS, ratio.clamp(0.8, 1.2) * RETURNS).mean()]) == ADVANTAGE
    positive = RETURNS.abs() + 0.1  # a ratio weighs advantages whatever their signs
    assert (
        weighs_log_probabilities([-torch.min(ratio * positive, ratio.clamp(0.8, 1.2) * positive).mean()]) == ADVANTAGE
    )
    gaussian = Normal(POLICY(X), LOG_STD.exp()).log_prob(torch.randn(8, 3)).sum(-1)
    assert weighs_log_probabilities([-(gaussian * RETURNS).mean()]) == ADVANTAGE
    steps = [Categorical(logits=POLICY(x)).log_prob(a) for x, a in zip(X.split(2), ACTIONS.split(2))]
    assert (
        weighs_log_probabilities([-(torch.stack(steps) * RETURNS.view(4, 2)).mean()]) == ADVANTAGE
    )  # a rollout stacked
    # ... and inside a sum of terms, as an actor-critic's loss holds it
    total = -(log_probs() * RETURNS).mean() + 0.5 * F.mse_loss(value, RETURNS)
    assert weighs_log_probabilities([total]) == ADVANTAGE


def test_classification_losses_and_terms_made_from_the_same_log_probabilities_are_no_policy_gradient():
    logits = POLICY(X)
    assert not weighs_log_probabilities([F.cross_entropy(logits, ACTIONS)])
    one_hot = F.one_hot(ACTIONS, 3).float()
    assert not weighs_log_probabilities([-(F.log_softmax(logits, 1) * one_hot).sum(1).mean()])  # picks nothing
    picked = F.log_softmax(logits, 1).gather(1, ACTIONS.unsqueeze(1)).squeeze(1)
    assert not weighs_log_probabilities([(-(1 - picked.exp()) * picked).mean()])  # a focal weight
    probs = F.softmax(logits, 1)
    assert not weighs_log_probabilities([(probs * probs.log()).sum(1).mean()])  # an entropy bonus


def test_picked_log_probabilities_weighed_by_what_is_never_negative_may_be_either_and_are_looked_at_again():
    """Class weights, a padding mask or a smoothing share under a hand-written cross-entropy, and returns before a
    critic learned (every one positive): ``"weight"``, which the ledger looks at again on later full steps."""
    picked = F.log_softmax(POLICY(X), 1).gather(1, ACTIONS.unsqueeze(1)).squeeze(1)
    class_weights = torch.tensor([1.0, 2.0, 0.5])[ACTIONS]
    assert weighs_log_probabilities([-(picked * class_weights).mean()]) == "weight"
    mask = (torch.arange(8) < 6).float()
    assert weighs_log_probabilities([-(picked * mask).sum() / mask.sum()]) == "weight"
    assert weighs_log_probabilities([-(log_probs() * RETURNS.abs()).mean()]) == "weight"
