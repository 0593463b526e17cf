"""Saturation that harmed nothing is no failure; saturation that harmed the fit still is.

Saturation is a fault because it harms: the gradient through the saturated units dies, or the fit stalls while they
are pinned. A model may saturate by design or as it learns and still fit: a gated PixelCNN's tanh*sigmoid gates
(half of a tanh at its bounds while the loss fell twentyfold), a gated RNN's forget gate with chrono initialisation
(saturated on purpose: memory over long spans). Such saturation is undone when the layer feeding the activation kept
a gradient and the fit converged through it (see :mod:`neuraldbg.kinds.saturated_activations`), when the training
drove the units there: saturation present from the first step is the scale a layer starts at and is still judged
(the chrono gate is that: a known false alarm, kept here as a strict xfail with its plain-torch truth).

Each program's ground truth is measured in plain torch: the share of the activation's outputs where its derivative
is below 1 % of its maximum, the loss, held-out accuracy, the gradient of the layer feeding the activation, and a
twin that shows what the saturation did (a saner learning rate, the default initialisation, the gate's bias at 0).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

Batch = tuple[torch.Tensor, torch.Tensor]


class Run:
    """What a training run gave: the debugger (None unwatched); at each step the loss, the activation's saturated
    share, the gradient norm of the layer feeding it and its share of the largest layer's; the held-out accuracy."""

    def __init__(self, dbg: NeuralDbg | None) -> None:
        self.dbg = dbg
        self.losses: list[float] = []
        self.saturated: list[float] = []
        self.grads: list[float] = []
        self.shares: list[float] = []
        self.accuracy = math.nan

    def onset(self) -> int:
        """The first step at which more than half of the activation's outputs were saturated."""
        return next(i for i, share in enumerate(self.saturated) if share > 0.5)

    def median_loss(self, start: int, end: int | None = None) -> float:
        return statistics.median(self.losses[start:end])

    def late_loss(self) -> float:
        """The median loss over the run's last quarter."""
        return self.median_loss(-len(self.losses) // 4)

    def saturation_roots(self) -> list[str]:
        """The root layers of the saturation hypotheses, most likely first."""
        assert self.dbg is not None
        return [h.root.layer for h in self.dbg.hypotheses() if h.kind is FailureKind.SATURATED_ACTIVATIONS]


def layer_gradient(layer: nn.Module) -> float:
    """The norm of the gradients of a layer's own parameters together."""
    return math.sqrt(sum(float(p.grad.norm()) ** 2 for p in layer.parameters(recurse=False) if p.grad is not None))


def train(
    model: nn.Module,
    batch: Callable[[int], Batch],
    steps: int,
    optimizer: torch.optim.Optimizer,
    activation: nn.Module,
    feeding: nn.Module,
    watched: bool = True,
) -> Run:
    run = Run(NeuralDbg(model) if watched else None)

    def saturated(_m: nn.Module, _i: object, out: torch.Tensor) -> None:
        y = out.detach()
        derivative = 1 - y**2 if isinstance(activation, nn.Tanh) else 4 * y * (1 - y)  # relative to its maximum
        run.saturated.append(float((derivative < 1e-2).float().mean()))

    hook = activation.register_forward_hook(saturated)
    layers = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    if run.dbg is not None:
        run.dbg.__enter__()
    for step in range(steps):
        x, y = batch(step)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        run.grads.append(layer_gradient(feeding))
        run.shares.append(run.grads[-1] / max(layer_gradient(m) for m in layers))
        optimizer.step()
        run.losses.append(loss.item())
    if run.dbg is not None:
        run.dbg.__exit__(None, None, None)
    hook.remove()
    return run


def converged_at_chance_start(run: Run) -> bool:
    """Plain torch: a classifier that began at chance converged when the gradient its cross-entropy implies,
    ``1 - exp(-loss)``, fell tenfold (the median over the last quarter against the first loss)."""
    return -math.expm1(-run.late_loss()) <= 0.1 * -math.expm1(-run.losses[0])


# --------------------------------------------------------------------------- a gated block that saturates as it learns


class Gated(nn.Module):
    """A gated activation unit as in a gated PixelCNN or WaveNet: tanh(a) * sigmoid(b) from one projection."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 2 * width)
        self.tanh = nn.Tanh()
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.proj(x).chunk(2, -1)
        return self.tanh(a) * self.gate(b)


class GatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.block = Gated(32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(torch.relu(self.inp(x))))


def gated(lr: float, samples: int, watched: bool = True) -> Run:
    """A 4-class problem a random linear teacher labels, ``samples`` training points drawn 64 at a time, 200 steps
    of Adam at ``lr``; the held-out accuracy on 1000 fresh points."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 16, generator=g)
    teacher = torch.randn(16, 4, generator=g)
    y = (x @ teacher).argmax(1)
    x_test = torch.randn(1000, 16, generator=g)
    torch.manual_seed(0)
    model = GatedNet()

    def batch(_: int) -> Batch:
        i = torch.randint(0, samples, (64,), generator=g)
        return x[i], y[i]

    run = train(
        model, batch, 200, torch.optim.Adam(model.parameters(), lr), model.block.tanh, model.block.proj, watched
    )
    with torch.no_grad():
        run.accuracy = float((model(x_test).argmax(1) == (x_test @ teacher).argmax(1)).float().mean())
    return run


def test_a_gated_block_that_saturates_as_it_learns_and_fits_is_silent():
    run, calm = gated(5e-2, 512), gated(1e-2, 512, watched=False)
    onset = run.onset()
    # plain torch: the tanh saturates while the loss is still well above its end (the fit had not converged, so the
    # rule that exempts saturation reached after convergence does not apply), stays saturated, and the loss then falls
    # a further twentyfold; the layer feeding the tanh keeps its gradient; the model predicts held-out points as well as
    # the same model at a fifth of the learning rate, which never saturates
    assert 0 < onset < 50 and statistics.median(run.saturated[onset:]) > 0.6
    assert run.median_loss(onset, onset + 8) > 0.1 and run.late_loss() < 0.05 * run.median_loss(onset, onset + 8)
    assert statistics.median(run.grads[onset:]) > 0.5 * run.grads[0]
    assert max(calm.saturated) < 0.5 and run.accuracy > calm.accuracy - 0.02
    assert converged_at_chance_start(run)

    assert run.dbg is not None and run.dbg.healthy, run.dbg.explain_failure()


def test_the_same_gated_block_whose_loss_stalls_once_saturated_is_found():
    run, calm = gated(5e-2, 2048), gated(1e-2, 2048, watched=False)
    onset = run.onset()
    # plain torch: saturated from mid-run on, the loss stops where it was at the onset, at more than twice the loss of
    # the same model at a fifth of the learning rate, which never saturates
    assert onset > 0 and statistics.median(run.saturated[onset:]) > 0.6
    assert run.late_loss() > 0.9 * run.median_loss(onset, onset + 8)
    assert max(calm.saturated) < 0.5 and run.late_loss() > 2 * calm.late_loss()

    assert run.saturation_roots()[:1] == ["block.tanh"], run.dbg and run.dbg.report()


# ------------------------------------------------------------------------- a forget gate saturated on purpose (chrono)

SEQ, VOCAB, TMAX = 60, 8, 1000


def recall_batch(g: torch.Generator, size: int = 32) -> Batch:
    """Sequences whose first token is the label (0 or 1) among random distractors: recall it at the end."""
    x = torch.randint(2, VOCAB, (size, SEQ), generator=g)
    y = torch.randint(0, 2, (size,), generator=g)
    x[:, 0] = y
    return x, y


class GatedLinearRNN(nn.Module):
    """h_t = f_t * h_(t-1) + (1 - f_t) * v_t with a sigmoid forget gate f; with ``chrono`` its bias is log U(1,
    TMAX - 1) (Tallec & Ollivier 2018): gates near 1 hold memory over about TMAX steps."""

    def __init__(self, width: int, chrono: bool) -> None:
        super().__init__()
        self.f = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.gate = nn.Sigmoid()
        if chrono:
            with torch.no_grad():
                self.f.bias.copy_(torch.log(torch.empty(width).uniform_(1, TMAX - 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f, v = self.gate(self.f(x)), self.v(x)
        h = torch.zeros_like(v[:, 0])
        for t in range(x.size(1)):
            h = f[:, t] * h + (1 - f[:, t]) * v[:, t]
        return h


class Recall(nn.Module):
    def __init__(self, chrono: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.rnn = GatedLinearRNN(16, chrono)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(x)))


def recall(chrono: bool, watched: bool = True) -> Run:
    torch.manual_seed(0)
    model = Recall(chrono)
    g = torch.Generator().manual_seed(1)
    optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    run = train(model, lambda _: recall_batch(g), 150, optimizer, model.rnn.gate, model.rnn.f, watched)
    x, y = recall_batch(torch.Generator().manual_seed(2), 256)
    with torch.no_grad():
        run.accuracy = float((model(x).argmax(1) == y).float().mean())
    return run


@pytest.mark.xfail(
    strict=True,
    reason="a known false alarm (docs/limitations.md): saturation there from the first step is judged as the scale "
    "the layer starts at, and a chrono-initialised gate is saturated from its first step on purpose",
)
def test_a_forget_gate_saturated_on_purpose_by_chrono_initialisation_is_silent():
    run, unsaturated = recall(chrono=True), recall(chrono=False, watched=False)
    # plain torch: most gate outputs saturated from the first step to the last; the loss falls from chance to a
    # hundredth of it and held-out recall is perfect, while the same model with the gate's bias at 0 (unsaturated,
    # the "fix") stays at chance
    assert run.saturated[0] > 0.5 and statistics.median(run.saturated[-20:]) > 0.5
    assert run.late_loss() < 0.05 * run.losses[0] and run.accuracy > 0.97
    assert max(unsaturated.saturated) < 0.5 and unsaturated.late_loss() > 0.6 and unsaturated.accuracy < 0.7

    assert run.dbg is not None and run.dbg.healthy, run.dbg.explain_failure()


# ------------------------------------------------------------------------------------------- saturation that harms


def tanh_mlp(scale: float) -> Run:
    """A tanh MLP classifier on a linear teacher's labels, its hidden weights scaled by ``scale``, Adam 1e-3."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    with torch.no_grad():
        for i in (0, 2):
            model[i].weight.mul_(scale)

    def batch(_: int) -> Batch:
        i = torch.randint(0, 512, (64,), generator=g)
        return x[i], y[i]

    return train(model, batch, 150, torch.optim.Adam(model.parameters(), 1e-3), model[1], model[0], scale != 1.0)


def test_a_tanh_mlp_saturated_by_weights_ten_times_too_large_that_fits_worse_is_found():
    run, default = tanh_mlp(10.0), tanh_mlp(1.0)
    # plain torch: saturated from the first step to the last; its loss falls, but ends at more than twice the loss of
    # the same MLP at its default initialisation, which never saturates
    assert run.saturated[0] > 0.5 and statistics.median(run.saturated[-20:]) > 0.5
    assert max(default.saturated) < 0.05 and run.late_loss() > 2 * default.late_loss()
    assert not converged_at_chance_start(run)

    assert run.saturation_roots()[:1] == ["1"], run.dbg and run.dbg.report()


class DeadBranch(nn.Module):
    """A branch through a tanh whose projection is 10,000 times too large, beside a ReLU path: pinned at +-1 for
    almost every input, the tanh passes almost no gradient to its projection, while the fit goes on through the
    other path."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.proj = nn.Linear(16, 32)
        self.branch = nn.Tanh()
        self.res = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)
        with torch.no_grad():
            self.proj.weight.mul_(1e4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.inp(x)) + self.res(self.branch(self.proj(x))))


def test_saturation_that_killed_its_feeding_layers_gradient_is_found_though_the_fit_converged():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(1)
    torch.manual_seed(0)
    model = DeadBranch()

    def batch(_: int) -> Batch:
        i = torch.randint(0, 512, (64,), generator=g)
        return x[i], y[i]

    run = train(model, batch, 200, torch.optim.Adam(model.parameters(), 1e-2), model.branch, model.proj)
    # plain torch: the branch is saturated throughout and on most steps its projection's gradient is below a
    # thousandth of the largest layer's (the vanishing-gradients room's relative test), while the loss converges
    # through the other path
    assert min(run.saturated) > 0.99 and statistics.median(run.shares) < 1e-3
    assert converged_at_chance_start(run)

    assert run.saturation_roots()[:1] == ["branch"], run.dbg and run.dbg.report()


def test_a_gate_saturated_from_its_first_step_by_its_scale_is_found_though_the_fit_converged():
    """The diagnosis benchmark's ``holdout_saturated_se_gate_temperature``: a squeeze-excitation gate whose logits
    are divided by a temperature of 0.01 is pinned at 0 or 1 from step 0, and the network still fits its easy
    patterns. Saturation there from the first step is the scale the layer starts at: judged whatever the fit did
    next (only what the training drove to the bounds is undone)."""
    from benchmarks import diagnosis
    from benchmarks.scenarios.holdout import SCENARIOS

    scenario = next(s for s in SCENARIOS if s.name == "holdout_saturated_se_gate_temperature")
    result = diagnosis.run(scenario)
    saturated = [h for h in result.hypotheses if h.kind is FailureKind.SATURATED_ACTIVATIONS]
    assert saturated, [h.explanation for h in result.hypotheses]
    assert saturated[0].root.step_start == 0 and saturated[0].root.layer == "se.gate"
    assert result.correct
