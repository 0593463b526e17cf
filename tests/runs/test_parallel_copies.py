"""Parallel copies of a block (capture/branches.py): a mixture of experts computed densely, whose router stops
choosing some experts. Those experts get an exactly-zero gradient (their routing weight is 0) and, under weight
decay, shrink to nothing, while the other experts and the layers around them train and the model fits its task:
neither vanishing gradients nor a collapsed output. Ground truth is plain torch in each test (forward hooks and the
gradients themselves). Twins that must still be found: the same mixture whose output the loss never uses (every
expert's gradient is exactly zero: none of the copies trains) and a stack of numbered sigmoid blocks, each given the
one before's output, whose gradients vanish through depth (numbered like copies, but not parallel)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.capture import branches

STEPS = 300
make = support.classification_batches((16,), 4, batch=64)


class Mixture(nn.Module):
    """Top-2 of ``experts`` (4) computed densely (every expert given the same tensor), in a residual block;
    ``unused``: experts the router starts far away from (a bias of -20: never among the two chosen); ``used``: how
    much of the mixture the head is given (0: none)."""

    def __init__(self, unused: tuple[int, ...] = (), used: float = 1.0, experts: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.router = nn.Linear(32, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)) for _ in range(experts)
        )
        self.head = nn.Linear(32, 4)
        self.used = used
        with torch.no_grad():
            for i in unused:
                self.router.bias[i] = -20.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.inp(x))
        p = F.softmax(self.router(h), -1)
        top, chosen = p.topk(2, -1)
        weights = torch.zeros_like(p).scatter(-1, chosen, top / top.sum(-1, keepdim=True))
        out = torch.stack([expert(h) for expert in self.experts], -2)
        return self.head(h + self.used * (weights[..., None] * out).sum(-2))


def train(model: nn.Module, watched: bool, decay: float = 1e-2) -> tuple[dict[str, list[float]], NeuralDbg | None]:
    """A user's loop, Adam 1e-2 with (coupled) weight decay ``decay``; plain hooks record each expert's output
    root-mean-square and its first layer's gradient norm at every step (the ground truth)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=decay)
    truth: dict[str, list[float]] = {}
    experts = getattr(model, "experts", None)
    handles = []
    if isinstance(experts, nn.ModuleList):
        for i, expert in enumerate(experts):

            def hook(_m: nn.Module, _i: object, out: torch.Tensor, key: str = f"out{i}") -> None:
                truth.setdefault(key, []).append(float(out.detach().pow(2).mean().sqrt()))

            handles.append(expert.register_forward_hook(hook))

    def loop() -> None:
        for step in range(STEPS):
            x, y = make(step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            if isinstance(experts, nn.ModuleList):
                for i, expert in enumerate(experts):
                    grad = expert[0].weight.grad
                    truth.setdefault(f"grad{i}", []).append(0.0 if grad is None else float(grad.norm()))
            opt.step()

    try:
        return truth, support.watching(model, loop, watched)
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def accuracy(model: nn.Module) -> float:
    x, y = make(10_000)
    return float((model(x).argmax(1) == y).float().mean())


def ratio(values: list[float]) -> float:
    """The last quarter's median against the first step's."""
    tail = sorted(values[-len(values) // 4 :])
    return tail[len(tail) // 2] / values[0]


def test_an_expert_the_router_never_chooses_is_neither_vanishing_nor_collapsed():
    torch.manual_seed(0)
    plain = Mixture(unused=(3,))
    truth, _ = train(plain, watched=False)
    # plain torch: expert 3 never gets a gradient (its routing weight is 0 on every sample of every step) and
    # shrinks under weight decay to under a tenth of its first scale; two others train and keep theirs (the router
    # settles on them); the model fits its task
    assert max(truth["grad3"]) == 0.0
    assert ratio(truth["out3"]) < 0.1
    kept = [i for i in range(3) if ratio(truth[f"out{i}"]) > 0.5 and min(truth[f"grad{i}"][-STEPS // 4 :]) > 1e-2]
    assert len(kept) >= 2, {i: ratio(truth[f"out{i}"]) for i in range(4)}
    assert accuracy(plain) > 0.9

    torch.manual_seed(0)
    model = Mixture(unused=(3,))
    _, dbg = train(model, watched=True)
    assert dbg is not None
    coverage = dbg._recorder.coverage
    assert {f"experts.{i}" for i in range(4)} <= set(coverage.parallel), coverage.parallel
    assert not dbg.hypotheses(), dbg.explain_failure()


def test_a_router_that_uses_two_experts_of_eight_is_silent():
    """Most copies unused (a mixture with more experts than its task needs, whose router settles on a few)."""
    torch.manual_seed(0)
    plain = Mixture(unused=tuple(range(2, 8)), experts=8)
    truth, _ = train(plain, watched=False, decay=1e-3)
    assert all(max(truth[f"grad{i}"]) == 0.0 for i in range(2, 8))  # plain torch: six experts never get a gradient
    assert all(min(truth[f"grad{i}"]) > 0.0 for i in range(2))  # ... and the two chosen get one at every step
    assert all(ratio(truth[f"out{i}"]) < 0.1 for i in range(2, 8))  # the six shrink to under a tenth of their scale
    assert accuracy(plain) > 0.9

    torch.manual_seed(0)
    _, dbg = train(Mixture(unused=tuple(range(2, 8)), experts=8), watched=True, decay=1e-3)
    assert dbg is not None and not dbg.hypotheses(), dbg.explain_failure()


def test_experts_a_router_stops_choosing_as_it_trains_are_silent():
    """No expert is pushed away at the start: the router settles on two of the four as it trains."""
    torch.manual_seed(0)
    plain = Mixture()
    truth, _ = train(plain, watched=False)
    dropped = [i for i in range(4) if ratio(truth[f"out{i}"]) < 0.1]
    kept = [i for i in range(4) if ratio(truth[f"out{i}"]) > 0.5]
    assert dropped and len(kept) >= 2, {i: ratio(truth[f"out{i}"]) for i in range(4)}
    assert all(
        max(truth[f"grad{i}"][-STEPS // 4 :]) < 1e-3 * max(truth[f"grad{k}"][-STEPS // 4 :])
        for i in dropped
        for k in kept
    )
    assert accuracy(plain) > 0.9

    torch.manual_seed(0)
    _, dbg = train(Mixture(), watched=True)
    assert dbg is not None and not dbg.hypotheses(), dbg.explain_failure()


def test_a_mixture_whose_output_the_loss_never_uses_is_still_found():
    """Every expert's gradient is exactly zero: no copy trains, so none stands for the others."""
    torch.manual_seed(0)
    plain = Mixture(used=0.0)
    truth, _ = train(plain, watched=False)
    assert all(max(truth[f"grad{i}"]) == 0.0 for i in range(4))

    torch.manual_seed(0)
    _, dbg = train(Mixture(used=0.0), watched=True)
    assert dbg is not None
    hits = [h for h in dbg.hypotheses() if h.kind.value == "vanishing_gradients"]
    assert hits, dbg.explain_failure()
    assert hits[0].root.layer.startswith("experts."), hits[0].root.layer


class Ensemble(nn.Module):
    """Four members given the same features, their outputs averaged; ``saturated``: a member whose first sigmoid
    is saturated (its bias 20), so its first layer's gradient vanishes inside it while its later layers train."""

    def __init__(self, saturated: int | None = None) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.members = nn.ModuleList(
            nn.Sequential(nn.Linear(32, 32), nn.Sigmoid(), nn.Linear(32, 32), nn.Sigmoid(), nn.Linear(32, 4))
            for _ in range(4)
        )
        if saturated is not None:
            with torch.no_grad():
                self.members[saturated][0].bias.fill_(20.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.inp(x))
        return torch.stack([m(h) for m in self.members]).mean(0)


def sgd_run(
    build: Callable[[], nn.Module], lr: float, read: Callable[[Any], dict[str, float]], watched: bool
) -> tuple[dict[str, float], NeuralDbg | None]:
    """200 steps of plain SGD at ``lr`` on :data:`make`'s batches of a model ``build`` makes (seeded); ``read`` takes
    the gradient norms the test looks at after each backward pass (plain torch), the last step's returned."""
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    norms: dict[str, float] = {}

    def loop() -> None:
        for step in range(200):
            x, y = make(step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            norms.update(read(model))
            opt.step()

    return norms, support.watching(model, loop, watched)


def test_a_member_whose_gradient_vanishes_inside_it_is_still_found():
    """Its later layers train: the copy is used, and the zero inside it is its own."""

    def run(watched: bool) -> tuple[dict[str, float], NeuralDbg | None]:
        return sgd_run(
            lambda: Ensemble(saturated=2),
            0.05,
            lambda model: {
                f"{i}.{j}": float(m[j].weight.grad.norm()) for i, m in enumerate(model.members) for j in (0, 2)
            },
            watched,
        )

    norms, _ = run(watched=False)
    # plain torch: the saturated member's first layer gets exactly nothing, its next layer and its siblings' train
    assert norms["2.0"] == 0.0 and norms["2.2"] > 1e-3 and min(norms[f"{i}.0"] for i in (0, 1, 3)) > 1e-4, norms
    _, dbg = run(watched=True)
    assert dbg is not None
    assert {f"members.{i}" for i in range(4)} <= set(dbg._recorder.coverage.parallel)
    kept = [e for e in support.iter_events(dbg, "vanishing_gradients") if e.layer == "members.2.0"]
    assert kept, [(e.kind, e.layer) for e in dbg.events]  # not undone as a copy the model stopped using
    assert any(h.root.layer.startswith("members.2.") for h in dbg.hypotheses()), dbg.explain_failure()


class Stack(nn.Module):
    """Eight numbered sigmoid blocks, each given the output of the one before (a stack, not parallel copies)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Sigmoid()) for _ in range(8))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_numbered_blocks_of_a_stack_are_no_parallel_copies_and_their_vanishing_gradients_are_found():
    def run(watched: bool) -> tuple[dict[str, float], NeuralDbg | None]:
        return sgd_run(
            Stack,
            0.01,
            lambda model: {f"{i}": float(b[0].weight.grad.norm()) for i, b in enumerate(model.blocks)},
            watched,
        )

    norms, _ = run(watched=False)
    assert norms["0"] < 1e-3 * norms["7"]  # plain torch: the gradient shrinks through the sigmoids
    _, dbg = run(watched=True)
    assert dbg is not None
    assert not dbg._recorder.coverage.parallel
    assert "vanishing_gradients" in support.kinds(dbg), dbg.explain_failure()


def test_copies_are_numbered_blocks_of_one_class_given_one_tensor():
    fed = [("experts.0.0", "Linear"), ("experts.1.0", "Linear"), ("router", "Linear"), ("experts.2.0", "Linear")]
    assert branches.copies(fed) == {"experts.0": "experts", "experts.1": "experts", "experts.2": "experts"}
    assert branches.copies([("heads.0", "Linear"), ("heads.1", "Linear")]) == {"heads.0": "heads", "heads.1": "heads"}
    assert branches.copies([("heads.0", "Linear"), ("heads.1", "Conv1d")]) == {}  # not copies of one block
    assert branches.copies([("a.0.q", "Linear"), ("a.0.k", "Linear")]) == {}  # the same copy's layers
    assert branches.copies([("experts.0.0", "Linear")]) == {}
    parallel = {"b.1.experts.0": "b.1.experts", "b.1.experts.1": "b.1.experts", "b.1.experts.2": "b.1.experts"}
    assert branches.siblings("b.1.experts.2.2", parallel) == ["b.1.experts.0.2", "b.1.experts.1.2"]
    assert branches.siblings("b.1.router", parallel) == []
    assert branches.siblings("b.1.experts.10", parallel) == []  # experts.1 is no prefix of experts.10
