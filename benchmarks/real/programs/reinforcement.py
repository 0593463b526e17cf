"""Reinforcement learning on cart-pole: REINFORCE and actor-critic (pytorch/examples' reinforcement_learning).

The environment is the classic cart-pole, written here in plain Python with Gym's constants and termination
rules (episodes capped at 200 steps). The agents are the examples': a Linear-Dropout-ReLU-Linear-softmax policy
trained by REINFORCE with normalised discounted returns (Adam 1e-2), and a shared-trunk actor-critic with a
value head and smooth-L1 value loss (Adam 3e-3: the examples' 3e-2 collapses on 2 of 3 seeds here). One
optimizer step per episode.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical

from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything

EPS = float(torch.finfo(torch.float32).eps)


class CartPole:
    """Gym's CartPole-v1 dynamics (Euler integration), deterministic given its random.Random."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_threshold, x_threshold, max_steps = 12 * 2 * math.pi / 360, 2.4, 200

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def reset(self) -> list[float]:
        self.state = [self.rng.uniform(-0.05, 0.05) for _ in range(4)]
        self.steps = 0
        return list(self.state)

    def step(self, action: int) -> tuple[list[float], float, bool]:
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if action == 1 else -self.force_mag
        total_mass = self.masspole + self.masscart
        polemass_length = self.masspole * self.length
        costheta, sintheta = math.cos(theta), math.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta**2 / total_mass)
        )
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * xacc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * thetaacc
        self.state = [x, x_dot, theta, theta_dot]
        self.steps += 1
        done = abs(x) > self.x_threshold or abs(theta) > self.theta_threshold or self.steps >= self.max_steps
        return list(self.state), 1.0, done


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.affine1(x)
        x = self.dropout(x)
        x = F.relu(x)
        return F.softmax(self.affine2(x), dim=1)


class ActorCritic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.action_head = nn.Linear(128, 2)
        self.value_head = nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.affine1(x))
        return F.softmax(self.action_head(x), dim=-1), self.value_head(x)


def discounted(rewards: list[float], gamma: float) -> torch.Tensor:
    returns, total = [], 0.0
    for r in reversed(rewards):
        total = r + gamma * total
        returns.insert(0, total)
    returns_t = torch.tensor(returns)
    return (returns_t - returns_t.mean()) / (returns_t.std() + EPS) if len(returns) > 1 else returns_t * 0


@torch.no_grad()
def evaluate(model: nn.Module, actor_critic: bool) -> float:
    """Mean return of the trained policy, sampled, over 10 episodes with fixed starts."""
    model.eval()
    env, total = CartPole(random.Random(4321)), 0.0
    sampler = torch.Generator().manual_seed(4321)
    for _ in range(10):
        state, done = env.reset(), False
        while not done:
            out = model(torch.tensor([state]))
            probs = out[0] if actor_critic else out
            action = int(torch.multinomial(probs.reshape(-1), 1, generator=sampler))
            state, reward, done = env.step(action)
            total += reward
    return total / 10


def reinforce_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    env = CartPole(random.Random(hp.seed))
    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=hp.lr)
    with session.watch(policy):
        for _episode in range(hp.episodes):
            state, done, log_probs, rewards = env.reset(), False, [], []
            while not done:
                probs = policy(torch.tensor([state]))
                m = Categorical(probs)
                action = m.sample()
                log_probs.append(m.log_prob(action))
                state, reward, done = env.step(int(action))
                rewards.append(reward)
            returns = discounted(rewards, 0.99)
            sign = -1.0 if hp.loss_sign_flipped else 1.0
            policy_loss = torch.cat([-lp * r * sign for lp, r in zip(log_probs, returns)]).sum()
            optimizer.zero_grad()
            policy_loss.backward()
            optimizer.step()
            session.record(policy_loss)
    return {"metric": evaluate(policy, actor_critic=False)}


def actor_critic_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    env = CartPole(random.Random(hp.seed))
    model = ActorCritic()
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.lr)
    with session.watch(model):
        for _episode in range(hp.episodes):
            state, done, saved, rewards = env.reset(), False, [], []
            while not done:
                probs, value = model(torch.tensor([state]))
                m = Categorical(probs)
                action = m.sample()
                saved.append((m.log_prob(action), value))
                state, reward, done = env.step(int(action))
                rewards.append(reward)
            returns = discounted(rewards, 0.99)
            policy_losses, value_losses = [], []
            for (log_prob, value), R in zip(saved, returns):
                advantage = R - (value.squeeze() if hp.advantage_grad else value.item())
                policy_losses.append(-log_prob * advantage)
                value_losses.append(F.smooth_l1_loss(value.squeeze(), R))
            if hp.zero_grad:
                optimizer.zero_grad()
            loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
            loss.backward()
            optimizer.step()
            session.record(loss)
    return {"metric": evaluate(model, actor_critic=True)}


REINFORCE = Program(
    family="reinforcement_learning",
    name="reinforce",
    train=reinforce_train,
    defaults=dict(lr=1e-2, episodes=150, loss_sign_flipped=False),
    metric="mean return (cart-pole, max 200)",
    higher_is_better=True,
    floor=0.15,
    relative_floor=True,
    chance=22.0,
    variants=(
        healthy("Linear-Dropout-ReLU-Linear-softmax policy, REINFORCE with normalised returns, Adam 1e-2"),
        Variant("lr_100x", "learning_rate", "Adam lr 1.0", {"lr": 1.0}, K.LR_FAR_TOO_HIGH),
        Variant(
            "loss_sign_flipped",
            "loss_function",
            "policy loss log_prob * R (gradient descent on the return)",
            {"loss_sign_flipped": True},
            K.WRONG_LOSS,
        ),
    ),
)

ACTOR_CRITIC = Program(
    family="reinforcement_learning",
    name="actor_critic",
    train=actor_critic_train,
    defaults=dict(lr=3e-3, episodes=150, zero_grad=True, advantage_grad=False),
    metric="mean return (cart-pole, max 200)",
    higher_is_better=True,
    floor=0.15,
    relative_floor=True,
    chance=22.0,
    functional_relu=("affine1",),
    variants=(
        healthy("shared Linear trunk, action and value heads, smooth-L1 value loss, Adam 3e-3"),
        Variant("no_zero_grad", "zero_grad", "optimizer.zero_grad() missing", {"zero_grad": False}, K.NO_ZERO_GRAD),
        Variant(
            "advantage_not_detached",
            "loss_function",
            "advantage R - value with the value's gradient (value.item() dropped)",
            {"advantage_grad": True},
            K.WRONG_LOSS | {"unstable_loss", "advantage_not_detached"},
        ),
    ),
)

PROGRAMS = (REINFORCE, ACTOR_CRITIC)
