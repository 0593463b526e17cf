"""No nonlinearity: a model whose layers compose into one affine map (its activations replaced by nn.Identity).
Ground truth is plain torch in each test: on a task a linear model cannot fit, the same network with its ReLUs
reaches a far better held-out accuracy. The twins stay silent: the network with its activations, a single linear
layer (a linear model by design), a linear stack whose fit converged, and a smoke run too short to judge."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg.capture.affine import affine_layers

KIND = "no_nonlinearity"
STEPS = 150


def rings(step: int, batch: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes by the distance from the origin in 6 dimensions: no hyperplane separates them."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch, 6, generator=g)
    return x, (x.norm(dim=1) > 2.35).long()


def mlp(activation: type[nn.Module]) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(6, 64),
        nn.BatchNorm1d(64),
        activation(),
        nn.Dropout(0.1),
        nn.Linear(64, 64),
        activation(),
        nn.Linear(64, 2),
    )


def accuracy(model: nn.Module) -> float:
    model.eval()
    x, y = rings(10_000, batch=4096)
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def run(build, watched: bool, steps: int = STEPS, make=rings, loss_fn=F.cross_entropy):
    torch.manual_seed(0)
    model = build()
    losses, dbg = support.fit(model, make, loss_fn, steps, torch.optim.Adam(model.parameters(), lr=3e-3), watched)
    return model, losses, dbg


def kinds(dbg) -> list[str]:
    return [h.kind.value for h in dbg.hypotheses()]


def test_activations_replaced_by_identity_are_found_and_the_relu_twin_is_silent():
    linear, losses, _ = run(lambda: mlp(nn.Identity), watched=False)
    relu, _, _ = run(lambda: mlp(nn.ReLU), watched=False)
    assert accuracy(linear) < accuracy(relu) - 0.15  # plain torch: a linear model cannot separate the rings

    _, watched, dbg = run(lambda: mlp(nn.Identity), watched=True)
    assert watched == losses  # the debugger changes nothing
    assert kinds(dbg)[:1] == [KIND], dbg.explain_failure()
    found = dbg.hypotheses()[0]
    assert found.root.metrics["layers"] == 3
    assert "one affine map: its 3 layers" in found.explanation and "nn.Identity()" in found.suggestion

    _, _, twin = run(lambda: mlp(nn.ReLU), watched=True)
    assert twin.healthy, twin.explain_failure()


def test_a_single_linear_layer_is_a_linear_model_by_design():
    model, _, dbg = run(lambda: nn.Linear(6, 2), watched=True)
    assert accuracy(model) < 0.75  # plain torch: it cannot fit the rings either, and was never meant to
    assert KIND not in kinds(dbg), dbg.explain_failure()


def test_a_linear_stack_whose_fit_converged_and_a_smoke_run_are_not_judged():
    def plane(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(128, 6, generator=g)
        return x, x @ torch.linspace(-1, 1, 6)[:, None]

    stack = lambda: nn.Sequential(nn.Linear(6, 16), nn.Linear(16, 1))
    _, losses, dbg = run(stack, watched=True, make=plane, loss_fn=F.mse_loss)
    assert sum(losses[-10:]) < 0.01 * sum(losses[:10])  # plain torch: the linear task is fitted
    assert KIND not in kinds(dbg), dbg.explain_failure()

    _, _, smoke = run(lambda: mlp(nn.Identity), watched=True, steps=40)
    assert KIND not in kinds(smoke) and "Its loss was not judged" in smoke.report()


def test_what_the_graph_walk_counts_as_linear():
    x = torch.randn(5, 8)
    stack = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.1), nn.Linear(16, 16), nn.Linear(16, 3))
    assert affine_layers(stack(x).grad_fn) == 3
    assert affine_layers(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 3))(torch.randn(2, 5, 8)).grad_fn) == 2
    convs = nn.Sequential(nn.Conv1d(2, 4, 3), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(4, 3))
    assert affine_layers(convs(torch.randn(3, 2, 10)).grad_fn) == 2
    # not linear in the data: an activation, a max-pool, a normalisation by the sample's own statistics, attention
    assert affine_layers(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))(x).grad_fn) is None
    pooled = nn.Sequential(nn.Conv1d(2, 4, 3), nn.MaxPool1d(2), nn.Flatten(), nn.Linear(16, 3))
    assert affine_layers(pooled(torch.randn(3, 2, 10)).grad_fn) is None
    assert affine_layers(nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 3))(x).grad_fn) is None
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    q = torch.randn(2, 5, 8)
    assert affine_layers(attention(q, q, q, need_weights=False)[0].grad_fn) is None
    # a product of two data-dependent tensors (a gate) is not linear, whatever its factors are
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    assert affine_layers((a(x) * b(x)).grad_fn) is None


def narrow_then_linear(activation: type[nn.Module]) -> nn.Sequential:
    """A first layer of 3 tanh units, then two wide layers: without their activations those compose linearly."""
    return nn.Sequential(
        nn.Linear(6, 3),
        nn.Tanh(),
        nn.Linear(3, 64),
        activation(),
        nn.Dropout(0.1),
        nn.Linear(64, 64),
        activation(),
        nn.Linear(64, 2),
    )


def test_layers_composed_with_nothing_nonlinear_between_them_are_found_in_a_nonlinear_model():
    linear, losses, _ = run(lambda: narrow_then_linear(nn.Identity), watched=False)
    relu, _, _ = run(lambda: narrow_then_linear(nn.ReLU), watched=False)
    assert accuracy(linear) < accuracy(relu) - 0.05  # plain torch: the wide layers add nothing without activations
    assert affine_layers(linear(rings(0)[0]).grad_fn) is None  # the first tanh: not one affine map

    _, watched, dbg = run(lambda: narrow_then_linear(nn.Identity), watched=True)
    assert watched == losses
    assert kinds(dbg)[:1] == [KIND], dbg.explain_failure()
    found = dbg.hypotheses()[0]
    assert found.root.detail == "2 > 5, 5 > 7" and found.root.metrics["pairs"] == 2
    assert "'2' feeds '5'; '5' feeds '7'" in found.explanation
    _, _, twin = run(lambda: narrow_then_linear(nn.ReLU), watched=True)
    assert twin.healthy, twin.explain_failure()


def pairs_of(model: nn.Module, x: torch.Tensor) -> list[tuple[str, str]]:
    """What the graph walk finds in one forward pass, with the layers' outputs named as the debugger names them."""
    from neuraldbg.capture.affine import composed_pairs
    from neuraldbg.capture.forward import _widths

    names: dict[int, str] = {}
    held: list[object] = []  # the named nodes, alive while the walk compares them by id (as the debugger holds them)
    widths = {n: w for n, m in model.named_modules() if (w := _widths(m)) is not None}

    def note(name: str):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if output.grad_fn is not None and id(output.grad_fn) not in names:
                held.append(output.grad_fn)
                names[id(held[-1])] = name

        return hook

    for name, module in model.named_modules():
        if name:
            module.register_forward_hook(note(name))
    return composed_pairs(model(x).grad_fn, names, widths)


def test_deliberate_linear_compositions_are_no_pairs():
    x = torch.randn(4, 16)
    # a low-rank factorisation (a LoRA adapter's A then B): the lower layer narrows its input
    assert pairs_of(nn.Sequential(nn.Linear(16, 2), nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2)), x) == []
    # an inverted residual block's projection that keeps its 16 channels, then the next block's expansion to 72
    # (torchvision's MobileNetV3-small: its first block has no expansion and no residual at stride 2)
    inverted = nn.Sequential(
        nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 1),
        nn.BatchNorm2d(16),
        nn.Conv2d(16, 72, 1),
        nn.BatchNorm2d(72),
        nn.ReLU(),
    )
    assert pairs_of(inverted, torch.randn(2, 16, 8, 8)) == []
    # the same width kept before a layer that keeps or narrows it is an activation forgotten, found
    assert pairs_of(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.Linear(64, 64)), x) == [
        ("2", "3")
    ]
    assert pairs_of(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.Linear(64, 2)), x) == [("2", "3")]
    # a depthwise convolution then its pointwise one (a separable convolution)
    separable = nn.Sequential(nn.Conv2d(8, 8, 3, groups=8), nn.Conv2d(8, 16, 1), nn.ReLU(), nn.Flatten())
    assert pairs_of(separable, torch.randn(2, 8, 6, 6)) == []
    # a frozen projection before a trained linear probe
    probe = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 2))
    probe[0].requires_grad_(False)
    assert pairs_of(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), probe), x) == []

    # a residual sum joins two data paths: no single linear path from one layer to the next
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return self.b(h + self.a(h))

    assert pairs_of(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), Block(), nn.ReLU()), x) == []

    # a stem whose output is also the residual stream (its first block's layer is not its only use)
    class Stream(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.f = nn.Linear(16, 32), nn.Linear(32, 32)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            h = self.stem(h)
            return torch.relu(h + torch.relu(self.f(h)))

    assert pairs_of(Stream(), x) == []
    # what is found: a feed-forward block without its activation, dropout and batch norm between
    ffn = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.Dropout(0.1), nn.Linear(64, 16), nn.ReLU())
    assert pairs_of(ffn, x) == [("0", "3")]


def grid_signal() -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D signal on a 32 x 32 grid (an image to fit, as a coordinate network does) whose best affine fit explains
    almost none of its variance."""
    g = torch.linspace(-1, 1, 32)
    xy = torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
    x, y = xy[:, 0], xy[:, 1]
    v = torch.sin(3 * torch.pi * x) * torch.cos(2 * torch.pi * y) + torch.exp(-((x - 0.3) ** 2 + (y + 0.2) ** 2) / 0.05)
    return xy, v[:, None]


def full_batch(model: nn.Module, xy: torch.Tensor, target: torch.Tensor, watched: bool, lr: float = 1e-3):
    """300 full-batch steps of Adam on the mean squared error; the losses and the debugger."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(300):
            opt.zero_grad()
            loss = F.mse_loss(model(xy), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())

    return losses, support.watching(model, loop, watched)


def coordinate_net(activation: type[nn.Module]) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(2, 64),
        activation(),
        nn.Linear(64, 64),
        activation(),
        nn.Linear(64, 64),
        activation(),
        nn.Linear(64, 1),
    )


def test_a_linear_stack_that_converged_at_its_targets_variance_is_found():
    """Full-batch training of a linear stack reaches its best affine fit and its gradients fall a hundredfold: a
    stationary point, but one at chance (hunt 23's SIREN with its sines removed: R^2 0.008)."""
    xy, target = grid_signal()
    design = torch.cat([xy, torch.ones(len(xy), 1)], dim=1)
    best_affine = float(((design @ torch.linalg.lstsq(design, target).solution - target) ** 2).mean())
    variance = float(target.var(unbiased=False))
    assert best_affine > 0.95 * variance  # plain torch: no affine map explains the signal
    losses, _ = full_batch(coordinate_net(nn.Identity), xy, target, watched=False)
    assert losses[-1] < 1.01 * best_affine  # ... and the stack reached that fit
    twin, _ = full_batch(coordinate_net(nn.Tanh), xy, target, watched=False, lr=3e-3)
    assert twin[-1] < 0.5 * variance  # the same network with activations fits far better
    watched, dbg = full_batch(coordinate_net(nn.Identity), xy, target, watched=True)
    assert watched == losses and dbg is not None
    assert kinds(dbg)[:1] == [KIND], dbg.explain_failure()


def test_a_linear_stack_that_converged_on_a_noisy_linear_task_is_silent():
    """The same stack on a linear signal with noise of its own size: it converges to the noise floor (R^2 0.5), the
    loss falls twofold, not a hundredfold; nothing nonlinear was there to learn."""
    xy, _ = grid_signal()
    noise = torch.randn(len(xy), 1, generator=torch.Generator().manual_seed(3))
    target = xy @ torch.tensor([[0.8], [-0.6]]) * 1.7 + noise
    losses, dbg = full_batch(coordinate_net(nn.Identity), xy, target, watched=True)
    assert 0.3 < losses[-1] / float(target.var(unbiased=False)) < 0.7  # plain torch: half the variance explained
    assert dbg is not None and KIND not in kinds(dbg), dbg.explain_failure()
