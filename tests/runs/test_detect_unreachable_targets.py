"""A loss by value on the output of an activation whose range does not hold the targets (a ReLU or a sigmoid on the
output of an autoencoder of standardised data), found from the loss graph and one profile of the saved target.
Ground truth is plain torch in each test (the loss held above the floor the out-of-range targets set, the twin
without the activation below it); outputs whose range holds their targets stay silent, and training is
bit-identical."""

from __future__ import annotations

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.kinds import unreachable_targets
from neuraldbg.stats.tensors import out_of_range

KIND = "unreachable_targets"


def autoencoder(last: nn.Module | None) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(20, 8), nn.ReLU(), nn.Linear(8, 20)]
    if last is not None:
        layers.append(last)
    return nn.Sequential(*layers)


def data(low: float = -1.0, high: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    basis = torch.rand(4, 20, generator=g) * 2 - 1  # low-rank structure the bottleneck can learn
    codes = torch.rand(2048, 4, generator=g)
    x = (codes @ basis) / 2
    return low + (high - low) * (x - x.min()) / (x.max() - x.min())


def train(model: nn.Module, x: torch.Tensor, steps: int, watched: bool, loss_fn=F.mse_loss):
    torch.manual_seed(1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []

    def loop() -> None:
        g = torch.Generator().manual_seed(2)
        for _ in range(steps):
            batch = x[torch.randint(0, len(x), (64,), generator=g)]
            loss = loss_fn(model(batch), batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    if not watched:
        loop()
        return losses, None
    with NeuralDbg(model) as dbg:
        loop()
    return losses, dbg


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


@pytest.mark.parametrize(("last", "name"), [(nn.ReLU(), "ReLU"), (nn.Sigmoid(), "sigmoid")])
def test_a_bounded_output_before_standardised_targets_is_held_above_their_floor_and_found(last: nn.Module, name: str):
    x = data(-1.0, 1.0)
    floor = float((x - x.clamp(0.0, 1.0)).pow(2).mean())  # the least MSE an output in [0, 1] or [0, inf) reaches
    torch.manual_seed(0)
    losses, _ = train(autoencoder(last), x, 300, watched=False)
    torch.manual_seed(0)
    twin, _ = train(autoencoder(None), x, 300, watched=False)
    # plain torch: the bounded output stays above the floor (a batch's own floor varies around it); the linear twin
    # goes far below it
    assert sum(losses[-20:]) / 20 >= 0.9 * floor
    assert sum(twin[-20:]) / 20 < 0.5 * floor

    torch.manual_seed(0)
    watched, dbg = train(autoencoder(last), x, 300, watched=True)
    assert watched == losses
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    root = hits[0].root
    assert root.layer == "3" and root.detail == name and root.step_start == 0
    assert root.metrics["share"] > 0.3
    assert abs(root.metrics["floor"] - floor) < 0.2 * floor  # one batch's estimate of it
    assert name in hits[0].explanation and "remove the" in hits[0].explanation


def test_a_huber_loss_on_a_relu_output_is_judged_as_the_mse_is():
    torch.manual_seed(0)
    _, dbg = train(autoencoder(nn.ReLU()), data(-1.0, 1.0), 20, watched=True, loss_fn=F.huber_loss)
    assert dbg is not None and found(dbg), dbg.explain_failure()


@pytest.mark.parametrize(
    ("last", "low", "high"),
    [
        (nn.Sigmoid(), 0.0, 1.0),  # images in [0, 1] under a sigmoid
        (nn.Tanh(), -1.0, 1.0),  # images in [-1, 1] under a tanh
        (nn.ReLU(), 0.0, 3.0),  # non-negative targets (counts, intensities) under a ReLU
        (None, -1.0, 1.0),  # a linear output
    ],
    ids=["sigmoid_01", "tanh_pm1", "relu_nonnegative", "linear"],
)
def test_outputs_whose_range_holds_their_targets_are_silent(last: nn.Module | None, low: float, high: float):
    x = data(low, high)
    torch.manual_seed(0)
    plain, _ = train(autoencoder(last), x, 60, watched=False)
    torch.manual_seed(0)
    losses, dbg = train(autoencoder(last), x, 60, watched=True)
    assert losses == plain
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_a_few_out_of_range_targets_and_binary_targets_on_the_bounds_are_within_reach():
    t = torch.rand(1000)
    t[:20] = -0.5  # 2 % outliers below a ReLU's floor
    share = out_of_range(t, 0.0, float("inf")).tolist()[0]
    assert share == pytest.approx(0.02) and share < unreachable_targets.SHARE
    labels = torch.randint(0, 2, (1000,)).float()  # 0/1 labels under a sigmoid: on the bounds, reachable
    assert out_of_range(labels, 0.0, 1.0).tolist()[:2] == [0.0, 0.0]
    assert out_of_range(torch.empty(0), 0.0, 1.0).tolist() == [0.0, 0.0, 0.0]


def test_a_feature_loss_between_two_relu_outputs_is_silent():
    """A student matching a teacher's post-ReLU features: the target is itself a ReLU's output, in range."""
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(20, 16), nn.ReLU())
    student = nn.Sequential(nn.Linear(20, 16), nn.ReLU())
    x = data(-1.0, 1.0)
    opt = torch.optim.Adam(student.parameters(), lr=1e-3)
    with NeuralDbg(student) as dbg:
        for step in range(30):
            batch = x[step * 32 : (step + 1) * 32]
            with torch.no_grad():
                target = teacher(batch)
            loss = F.mse_loss(student(batch), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert not found(dbg), dbg.explain_failure()


@pytest.mark.parametrize("case", ["few_outliers", "barely_below"])
def test_a_relu_output_with_targets_barely_or_rarely_out_of_range_is_silent(case: str):
    """Plain torch measures what the ReLU cannot reach: a few outliers (under SHARE of the targets) or many
    targets just below 0 (their floor under FLOOR of the variance). Neither is worth a finding."""
    if case == "few_outliers":
        x = data(0.0, 1.0).clone()
        x.view(-1)[::50] = -0.5  # 2 % of the elements
    else:
        x = data(0.0, 1.0).clone()
        low = x < x.flatten().quantile(0.2)
        x[low] = -0.01  # a fifth of the targets a sliver below 0
    share, floor, variance = out_of_range(x, 0.0, float("inf")).tolist()
    if case == "few_outliers":
        assert share < unreachable_targets.SHARE and floor > unreachable_targets.FLOOR * variance
    else:
        assert share > unreachable_targets.SHARE and floor < unreachable_targets.FLOOR * variance
    torch.manual_seed(0)
    _, dbg = train(autoencoder(nn.ReLU()), x, 30, watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()


def test_the_value_of_the_action_taken_picked_from_a_relu_output_is_judged():
    """A Q-network whose values pass through a ReLU, the value of each action taken gathered from them and regressed
    onto returns that are mostly negative (a grid with pits): the values cannot go below 0 (plain torch: the loss
    stays far above its twin's without the ReLU); the gather between the ReLU and the loss picks values, it does
    not change their range."""

    class Q(nn.Module):
        def __init__(self, relu: bool) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
            self.relu = relu

        def forward(self, s: torch.Tensor) -> torch.Tensor:
            q = self.net(s)
            return F.relu(q) if self.relu else q

    weights = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))

    def run(relu: bool, watched: bool) -> tuple[list[float], NeuralDbg | None]:
        torch.manual_seed(0)
        model = Q(relu)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses: list[float] = []
        dbg = NeuralDbg(model) if watched else None
        with dbg if dbg is not None else torch.enable_grad():
            for step in range(150):
                g = torch.Generator().manual_seed(step)
                s = torch.randn(64, 8, generator=g)
                a = torch.randint(0, 4, (64, 1), generator=g)
                target = ((s @ weights).gather(1, a) - 1.0).squeeze(1)  # returns, mostly below 0
                opt.zero_grad()
                loss = F.smooth_l1_loss(model(s).gather(1, a).squeeze(1), target)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses, dbg

    clamped, _ = run(relu=True, watched=False)
    free, _ = run(relu=False, watched=False)
    assert sum(clamped[-20:]) > 3 * sum(free[-20:])  # plain torch: the ReLU holds the values above the returns
    watched, dbg = run(relu=True, watched=True)
    assert watched == clamped
    assert dbg is not None and found(dbg), dbg.explain_failure()
    _, twin = run(relu=False, watched=True)
    assert twin is not None and not found(twin), twin.explain_failure()


# --- between two models: a generator whose output range does not hold the data its discriminator is shown ---------


def bars(n: int, low: float, high: float, seed: int = 0) -> torch.Tensor:
    """8x8 images of one bright bar (a row or a column) on a dark ground, scaled to [low, high], with a little
    noise kept inside that range: a data set a small GAN learns in a few hundred steps."""
    g = torch.Generator().manual_seed(seed)
    img = torch.zeros(n, 8, 8)
    idx = torch.randint(0, 8, (n,), generator=g)
    rows = torch.rand(n, generator=g) < 0.5
    for i in range(n):
        if rows[i]:
            img[i, idx[i], :] = 1.0
        else:
            img[i, :, idx[i]] = 1.0
    img = (img + 0.05 * torch.rand(n, 8, 8, generator=g)).clamp(0, 1)
    return (low + (high - low) * img).reshape(n, 64)


def gan(activation: nn.Module) -> tuple[nn.Module, nn.Module]:
    g = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), activation)
    d = nn.Sequential(nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1), nn.Sigmoid())
    return g, d


def train_gan(activation: nn.Module, x: torch.Tensor, watched: bool, steps: int = 200):
    """pytorch/examples' DCGAN loop: D on real, then on fake.detach(), then G through D; BCELoss, two Adams."""
    torch.manual_seed(0)
    netG, netD = gan(activation)
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.5, 0.999))
    criterion = nn.BCELoss()
    dbgs = (NeuralDbg(netG), NeuralDbg(netD)) if watched else ()
    for dbg in dbgs:
        dbg.__enter__()
    try:
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            real = x[torch.randint(0, len(x), (64,), generator=g)]
            netD.zero_grad()
            errD_real = criterion(netD(real).squeeze(1), torch.ones(64))
            errD_real.backward()
            fake = netG(torch.randn(64, 8, generator=g))
            errD_fake = criterion(netD(fake.detach()).squeeze(1), torch.zeros(64))
            errD_fake.backward()
            optD.step()
            netG.zero_grad()
            errG = criterion(netD(fake).squeeze(1), torch.ones(64))
            errG.backward()
            optG.step()
    finally:
        for dbg in reversed(dbgs):
            dbg.__exit__(None, None, None)
    with torch.no_grad():
        samples = netG(torch.randn(512, 8, generator=torch.Generator().manual_seed(99)))
    return samples, dbgs


def moment_gap(fake: torch.Tensor, real: torch.Tensor) -> float:
    return float((fake.mean(0) - real.mean(0)).pow(2).mean().sqrt() + (fake.std(0) - real.std(0)).pow(2).mean().sqrt())


def gan_found(dbgs: tuple) -> list:
    return [h for dbg in dbgs for h in found(dbg)]


def test_a_generator_ending_in_a_sigmoid_for_data_in_minus_one_one_is_found_from_its_discriminator():
    x = bars(2048, -1.0, 1.0)
    held_out = bars(512, -1.0, 1.0, seed=5)
    samples, _ = train_gan(nn.Sigmoid(), x, watched=False)
    twin, _ = train_gan(nn.Tanh(), x, watched=False)
    # plain torch: the sigmoid generator never makes a pixel below 0, where most of the data's pixels are, and its
    # samples' pixel moments are far from the data's; the tanh twin's are close
    assert float(samples.min()) >= 0.0 and float((held_out < 0).float().mean()) > 0.7
    assert moment_gap(samples, held_out) > 2 * moment_gap(twin, held_out)

    watched, dbgs = train_gan(nn.Sigmoid(), x, watched=True)
    assert torch.equal(watched, samples)  # training unchanged
    hits = found(dbgs[1])  # the discriminator sees both the data and the generator's output
    assert hits, dbgs[1].explain_failure()
    assert dbgs[1].hypotheses()[0].kind.value == KIND
    root = hits[0].root
    assert root.detail == "sigmoid" and root.metrics["source"] == 1.0 and root.metrics["share"] > 0.7
    assert (root.metrics["low"], root.metrics["high"]) == (0.0, 1.0)
    assert "tanh" in hits[0].explanation and "another watched model" in hits[0].explanation
    assert root.layer == "3" and root.metrics["elsewhere"] == 1.0  # the generator's sigmoid, named by its debugger
    assert not found(dbgs[0])  # the generator's own debugger never sees the data


@pytest.mark.parametrize(
    ("activation", "low", "high"),
    [(nn.Tanh(), -1.0, 1.0), (nn.Sigmoid(), 0.0, 1.0), (nn.Tanh(), 0.0, 1.0)],
    ids=["tanh_pm1", "sigmoid_01", "tanh_01"],
)
def test_a_generator_whose_range_holds_the_data_is_silent(activation: nn.Module, low: float, high: float):
    x = bars(2048, low, high)
    plain, _ = train_gan(activation, x, watched=False, steps=60)
    watched, dbgs = train_gan(activation, x, watched=True, steps=60)
    assert torch.equal(watched, plain)
    assert not gan_found(dbgs), [d.explain_failure() for d in dbgs]


def test_the_source_is_read_through_views_and_only_from_bounded_activations():
    from neuraldbg.capture.loss_graph import bounded_node, bounded_range

    def source(t: torch.Tensor):
        node = bounded_node(t.grad_fn)
        return bounded_range(node) if node is not None else None

    z = torch.randn(4, 16, requires_grad=True)
    assert source(torch.sigmoid(z).view(4, 4, 4)) == ("sigmoid", 0.0, 1.0)
    assert source(torch.tanh(z).reshape(64)) == ("tanh", -1.0, 1.0)
    assert source(torch.relu(z).transpose(0, 1)) == ("ReLU", 0.0, float("inf"))
    assert source(torch.tanh(z) * 2) is None  # a scaled tanh: its range is not the tanh's
    assert source(z @ torch.ones(16, 16)) is None


class GAN(nn.Module):
    """Both models in one module, as a LightningModule holds them: the debugger watches the container."""

    def __init__(self, activation: nn.Module) -> None:
        super().__init__()
        self.generator, self.discriminator = gan(activation)


def test_both_models_in_one_watched_module_name_the_generators_activation():
    x = bars(2048, -1.0, 1.0)
    torch.manual_seed(0)
    net = GAN(nn.Sigmoid())
    netG, netD = net.generator, net.discriminator
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.5, 0.999))
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(net) as dbg:
        for _ in range(40):
            real = x[torch.randint(0, len(x), (64,), generator=g)]
            fake = netG(torch.randn(64, 8, generator=g))
            optD.zero_grad()
            errD = F.binary_cross_entropy(netD(real), torch.ones(64, 1))
            errD = errD + F.binary_cross_entropy(netD(fake.detach()), torch.zeros(64, 1))
            errD.backward()
            optD.step()
            optG.zero_grad()
            F.binary_cross_entropy(netD(fake), torch.ones(64, 1)).backward()
            optG.step()
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.layer == "generator.3" and hits[0].root.detail == "sigmoid"
    assert "'generator.3'" in hits[0].explanation and "another watched model" not in hits[0].explanation


def test_data_out_of_range_on_too_few_steps_is_not_the_data():
    """One odd batch out of range among many inside is no design fault: the finding needs DATA_STEPS steps and
    half of those profiled."""
    from neuraldbg.capture.coverage import Coverage, RunFacts

    def judged(readings: list[tuple[int, float, float, float]]) -> bool:
        coverage = Coverage()
        coverage.bounded_input = ("sigmoid", 0.0, 1.0, "", False)
        coverage.input_ranges = readings
        coverage.last_step = 40
        facts = RunFacts(trainable=10, backward_passes=40, optimizer_steps=40)
        return unreachable_targets.UnreachableTargets().run_finding(coverage, facts) is not None

    out, inside = (0.5, 0.3, 0.5), (0.0, 0.0, 0.1)
    assert judged([(s, *out) for s in range(unreachable_targets.DATA_STEPS)])
    assert not judged([(s, *out) for s in range(unreachable_targets.DATA_STEPS - 1)])
    assert not judged([(s, *out) for s in range(4)] + [(s, *inside) for s in range(4, 12)])
    assert not judged([(s, 0.5, 0.01, 0.5) for s in range(8)])  # out, but too close to the range to matter


class ConditionalD(nn.Module):
    """A conditional discriminator: its first layer is given the image concatenated with a label embedding, so
    only the model's own data argument is the generator's output."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(2, 8)
        self.net = nn.Sequential(nn.Linear(72, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))

    def forward(self, img: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([img, self.embed(label)], 1))


@pytest.mark.parametrize(("activation", "low", "fault"), [(nn.Sigmoid(), -1.0, True), (nn.Tanh(), -1.0, False)])
def test_a_conditional_discriminator_is_judged_on_its_own_data_argument(activation, low, fault):
    x = bars(2048, low, 1.0)
    labels = x.reshape(-1, 8, 8).sum(2).argmax(1) % 2  # which half the bar is in
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), activation)
    netD = ConditionalD()
    optD, optG = torch.optim.Adam(netD.parameters(), lr=1e-3), torch.optim.Adam(netG.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with NeuralDbg(netD) as dbg:
        for _ in range(30):
            i = torch.randint(0, len(x), (64,), generator=g)
            real, label = x[i], labels[i]
            fake = netG(torch.randn(64, 8, generator=g))
            optD.zero_grad()
            errD = F.binary_cross_entropy_with_logits(netD(real, label), torch.ones(64, 1))
            errD = errD + F.binary_cross_entropy_with_logits(netD(fake.detach(), label), torch.zeros(64, 1))
            errD.backward()
            optD.step()
            optG.zero_grad()
            F.binary_cross_entropy_with_logits(netD(fake, label), torch.ones(64, 1)).backward()
            optG.step()
    # plain torch, on the data: most pixels lie below 0, out of the sigmoid's reach
    assert float((x < 0).float().mean()) > 0.7
    hits = found(dbg)
    assert bool(hits) == fault, dbg.explain_failure()
    if fault:
        assert hits[0].root.layer == "" and "a sigmoid" in hits[0].explanation  # the generator is not watched


def binary_task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable binary label (a nonlinear function of 20 standard-normal features), as 0/1 floats."""
    g = torch.Generator().manual_seed(700)
    w1, w2 = torch.randn(20, 32, generator=g), torch.randn(32, 1, generator=g)
    x = torch.randn(n, 20, generator=torch.Generator().manual_seed(seed))
    return x, (torch.tanh(x @ w1 / 4.5) @ w2 > 0).float().squeeze(1)


def train_binary(targets: str, watched: bool, steps: int = 150):
    """An MLP under BCEWithLogitsLoss given its labels as {0, 1}, {-1, 1} (``"pm1"``) or label-smoothed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = binary_task(steps * 32, 1)
    t = {"01": y, "pm1": 2 * y - 1, "smooth": y * 0.9 + 0.05}[targets]
    losses: list[float] = []

    def loop() -> None:
        for i in range(steps):
            batch = slice(i * 32, (i + 1) * 32)
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(x[batch]).squeeze(1), t[batch])
            loss.backward()
            opt.step()
            losses.append(loss.item())

    dbg = support.watching(model, loop, watched)
    xt, yt = binary_task(1000, 2)
    with torch.no_grad():
        accuracy = float(((model(xt).squeeze(1) > 0).float() == yt).float().mean())
    return losses, accuracy, dbg


def test_binary_cross_entropy_targets_in_minus_one_one_are_found_and_zero_one_or_smoothed_ones_are_silent():
    losses, accuracy, _ = train_binary("pm1", watched=False)
    _, twin_accuracy, _ = train_binary("01", watched=False)
    # plain torch: the loss is unbounded below and falls under zero, and the classifier is worse than the twin's
    assert min(losses) < -10 and accuracy < twin_accuracy - 0.05, (min(losses), accuracy, twin_accuracy)
    watched_losses, _, dbg = train_binary("pm1", watched=True)
    assert watched_losses == losses and dbg is not None
    hyps = found(dbg)
    assert hyps and hyps[0] is dbg.hypotheses()[0], dbg.report()
    assert "outside [0, 1]" in hyps[0].explanation and hyps[0].suggestion.startswith("give the binary cross-entropy")
    for targets in ("01", "smooth"):
        _, _, twin = train_binary(targets, watched=True)
        assert twin is not None and not found(twin), twin.report()
