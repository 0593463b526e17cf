"""A layer's output detached before the next layer (``.detach()``, ``.data``): the layers before the cut never get a
gradient and never train, though the optimizer holds them. Ground truth is plain torch in each test (their ``.grad``
stays None, their weights never change, the model ends worse than its twin); programs that cut the graph on purpose
and train the cut-off layers some other way (a GAN, an actor-critic, truncated backpropagation through time, a
linear probe) stay silent, and the training is bit-identical."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "detached_layers"
CLASSES = 4


class Net(nn.Module):
    def __init__(self, cut: str = "") -> None:
        super().__init__()
        self.cut = cut
        self.features = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        if self.cut == "detach":
            h = h.detach()
        elif self.cut == "data":
            h = h.data
        return self.head(h)


def batches() -> Callable[[int], support.Batch]:
    return support.classification_batches((16,), CLASSES, batch=64)


def train(model: nn.Module, steps: int, watched: bool, params: object = None) -> tuple[list[float], NeuralDbg | None]:
    make = batches()
    opt = torch.optim.Adam(params if params is not None else model.parameters(), lr=1e-2)
    losses: list[float] = []

    def loop() -> None:
        for step in range(steps):
            x, y = make(step)
            loss = F.cross_entropy(model(x), y)
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


def accuracy(model: nn.Module) -> float:
    x, y = support.classification_batches((16,), CLASSES, batch=1024)(10_000)  # a step never trained on
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


@pytest.mark.parametrize("cut", ["detach", "data"])
def test_a_detached_feature_extractor_never_trains_and_is_found_at_the_cut(cut: str):
    torch.manual_seed(0)
    model = Net(cut)
    start = copy.deepcopy(model.features.state_dict())
    losses, _ = train(model, 150, watched=False)
    torch.manual_seed(0)
    twin = Net()
    train(twin, 150, watched=False)
    # plain torch: the layers before the cut hold no gradient and never change; the model learns less than its twin
    assert all(p.grad is None for p in model.features.parameters())
    assert all(torch.equal(start[k], v) for k, v in model.features.state_dict().items())
    assert accuracy(model) < accuracy(twin) - 0.05

    torch.manual_seed(0)
    watched, dbg = train(Net(cut), 150, watched=True)
    assert watched == losses  # the debugger changed nothing
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    root = hits[0].root
    assert root.layer == "features.3" and root.step_start == 0
    assert root.metrics["parameters"] == 4 and root.metrics["layers"] == 2
    text = hits[0].explanation
    assert "'head'" in text and "'features.0', 'features.2'" in text and ".detach()" in text


def test_the_healthy_twin_and_a_linear_probe_whose_optimizer_holds_only_the_probe_are_silent():
    torch.manual_seed(0)
    _, healthy = train(Net(), 60, watched=True)
    assert healthy is not None and not found(healthy), healthy.explain_failure()
    torch.manual_seed(0)
    probe = Net("detach")  # a frozen random encoder probed on purpose: the optimizer holds the probe alone
    _, dbg = train(probe, 60, watched=True, params=probe.head.parameters())
    assert all(p.grad is None for p in probe.features.parameters())
    assert dbg is not None and not found(dbg), dbg.explain_failure()


class Gan(nn.Module):
    """A generator and a discriminator in one module, as a LightningModule holds them."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))


def test_a_gan_whose_discriminator_reads_the_generator_detached_is_silent():
    torch.manual_seed(0)
    gan = Gan()
    opt_g = torch.optim.Adam(gan.generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(gan.discriminator.parameters(), lr=1e-3)
    real = torch.randn(512, 2) * 0.5 + 2.0
    with NeuralDbg(gan) as dbg:
        for _ in range(60):
            z = torch.randn(64, 8)
            fake = gan.generator(z)
            batch = real[torch.randint(0, 512, (64,))]
            d_loss = F.binary_cross_entropy_with_logits(
                gan.discriminator(batch), torch.ones(64, 1)
            ) + F.binary_cross_entropy_with_logits(gan.discriminator(fake.detach()), torch.zeros(64, 1))
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = F.binary_cross_entropy_with_logits(gan.discriminator(fake), torch.ones(64, 1))
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
    assert dbg._recorder.coverage.cuts  # the cut was seen: the generator's output, detached, into the discriminator
    assert all(p.grad is not None for p in gan.generator.parameters())  # plain torch: the generator trains
    assert not found(dbg), dbg.explain_failure()


class ActorCritic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 32), nn.Tanh())
        self.actor = nn.Linear(32, CLASSES)
        self.critic = nn.Linear(32, 1)
        # computed and returned, never in the loss (as BertModel's pooler is when a head reads the first token)
        self.summary = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        value = self.critic(h.detach())  # the critic's loss must not shape the shared features
        self.summary(h)
        return self.actor(h), value


@pytest.mark.parametrize("stepped", ["all", "but_summary"])
def test_a_critic_that_reads_the_shared_trunk_detached_is_silent_the_actor_trains_the_trunk(stepped: str):
    """The cut is compensated (the actor's loss trains the trunk); the layer that never gets a gradient comes after
    the cut, not before it: nothing the cut explains."""
    torch.manual_seed(0)
    model = ActorCritic()
    params = [p for name, p in model.named_parameters() if stepped == "all" or not name.startswith("summary")]
    opt = torch.optim.Adam(params, lr=1e-3)
    make = batches()
    with NeuralDbg(model) as dbg:
        for step in range(40):
            x, y = make(step)
            logits, value = model(x)
            loss = F.cross_entropy(logits, y) + F.mse_loss(value.squeeze(1), y.float())
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert dbg._recorder.coverage.cuts
    assert all(p.grad is not None for p in model.trunk.parameters())  # plain torch
    assert all(p.grad is None for p in model.summary.parameters())
    assert not found(dbg), dbg.explain_failure()


def test_truncated_backpropagation_through_time_is_silent():
    torch.manual_seed(0)
    lstm = nn.LSTM(8, 16, batch_first=True)
    head = nn.Linear(16, 8)
    model = nn.ModuleDict({"lstm": lstm, "head": head})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    make = support.sequence_batches()
    state = None
    with NeuralDbg(model) as dbg:
        for step in range(30):
            x, _ = make(step)
            out, state = lstm(x, state)
            state = tuple(s.detach() for s in state)  # carried to the next batch without its graph
            loss = F.mse_loss(head(out[:, :-1]), x[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert not found(dbg), dbg.explain_failure()


class Conv1dNet(nn.Module):
    """A 1-D CNN whose pooled features are detached after functional ops (no module's output is the cut value)."""

    def __init__(self, cut: bool, normalise_inside: bool = False) -> None:
        super().__init__()
        self.cut, self.normalise_inside = cut, normalise_inside
        self.c1 = nn.Conv1d(1, 8, 3, padding=1)
        self.c2 = nn.Conv1d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8, 3)
        self.register_buffer("mean", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalise_inside:  # the first layer is given a value computed from the data: no cut
            x = (x - self.mean) / 1.0
        x = F.max_pool1d(F.relu(self.c1(x)), 2)
        x = F.max_pool1d(F.relu(self.c2(x)), 2)
        if self.cut:
            x = x.detach()
        return self.fc(x.flatten(1))


def series(step: int) -> support.Batch:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(64, 1, 32, generator=g)
    return x, (x.mean(-1).squeeze(1) > 0).long() + (x[:, 0, :16].std(-1) > 1).long()


def test_a_cut_after_functional_ops_is_found_before_the_layer_given_the_detached_value():
    torch.manual_seed(0)
    model = Conv1dNet(cut=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with NeuralDbg(model) as dbg:
        for step in range(40):
            x, y = series(step)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert model.c1.weight.grad is None and model.c2.weight.grad is None  # plain torch: they never get one
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    root = hits[0].root
    assert root.layer == "" and root.detail.split("\n") == ["fc", "c1", "c2"]
    assert "before 'fc'" in hits[0].explanation


@pytest.mark.parametrize("normalise_inside", [False, True])
def test_the_conv1d_twin_is_silent_also_when_it_normalises_its_input_inside_forward(normalise_inside: bool):
    torch.manual_seed(0)
    model = Conv1dNet(cut=False, normalise_inside=normalise_inside)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with NeuralDbg(model) as dbg:
        for step in range(30):
            x, y = series(step)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert not found(dbg), dbg.explain_failure()
    assert not dbg._recorder.coverage.cuts  # the data (normalised or not) is no cut


class TwoInputs(nn.Module):
    """A second input met after layers with a gradient ran: the model's own argument, not a cut."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 8)
        self.b = nn.Linear(4, 8)
        self.out = nn.Linear(16, CLASSES)
        self.unused = nn.Linear(8, 8)  # run on the first tower's output, never in the loss: never gets a gradient

    def forward(self, x: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        self.unused(h)
        return self.out(torch.cat([h, self.b(extra)], dim=1))


def test_a_second_input_of_the_model_met_after_other_layers_is_no_cut():
    torch.manual_seed(0)
    model = TwoInputs()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    make = batches()
    with NeuralDbg(model) as dbg:
        for step in range(30):
            x, y = make(step)
            loss = F.cross_entropy(model(x, x[:, :4].clone()), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert model.unused.weight.grad is None
    assert not dbg._recorder.coverage.cuts
    assert not found(dbg), dbg.explain_failure()


class Seq2Seq(nn.Module):
    """A GRU encoder-decoder whose decoder starts from the encoder's final hidden state (its second argument)."""

    def __init__(self, cut: bool) -> None:
        super().__init__()
        self.cut = cut
        self.embed = nn.Embedding(12, 16)
        self.encoder = nn.GRU(16, 32, batch_first=True)
        self.decoder = nn.GRU(16, 32, batch_first=True)
        self.out = nn.Linear(32, 12)

    def forward(self, source: torch.Tensor, target_in: torch.Tensor) -> torch.Tensor:
        _, hidden = self.encoder(self.embed(source))
        if self.cut:
            hidden = hidden.detach()
        decoded, _ = self.decoder(self.embed(target_in), hidden)
        return self.out(decoded)


def reversal(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    source = torch.randint(2, 12, (32, 6), generator=g)
    target = source.flip(1)
    return source, torch.cat([torch.ones(32, 1, dtype=torch.long), target[:, :-1]], 1), target


@pytest.mark.parametrize("cut", [True, False])
def test_a_recurrent_hidden_state_detached_between_encoder_and_decoder_is_found_at_the_encoder(cut: bool):
    torch.manual_seed(0)
    model = Seq2Seq(cut)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with NeuralDbg(model) as dbg:
        for step in range(30):
            source, target_in, target = reversal(step)
            loss = F.cross_entropy(model(source, target_in).flatten(0, 1), target.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
    # plain torch: the encoder gets no gradient through a detached hidden state (the shared embedding still does)
    assert all((p.grad is None) == cut for p in model.encoder.parameters())
    hits = found(dbg)
    if not cut:
        assert not hits, dbg.explain_failure()
        return
    assert hits, dbg.explain_failure()
    assert hits[0].root.layer == "encoder" and hits[0].root.detail.split("\n") == ["decoder", "encoder"]


class TokenNet(nn.Module):
    """Token ids -> an embedding -> a Linear + ReLU -> mean over the tokens -> a head; ``cut``: the embedding's
    output detached before the Linear."""

    def __init__(self, cut: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 2)
        self.cut = cut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.emb(x)
        return self.head(self.mlp(e.detach() if self.cut else e).mean(1))


def train_tokens(model: TokenNet, freeze_after_attach: bool) -> tuple[list[float], set[str], NeuralDbg]:
    """Adam over every parameter; the embedding frozen inside the watched block (as Lightning's on_train_start
    does) when asked. Returns the losses, the parameters that changed, and the debugger."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 12, (3200, 8), generator=g)
    y = ((x == 3).sum(1) >= 1).long()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses: list[float] = []
    with NeuralDbg(model) as dbg:
        if freeze_after_attach:
            model.emb.requires_grad_(False)
        for _ in range(100):
            i = torch.randint(0, 3200, (32,), generator=g)
            loss = F.cross_entropy(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    return losses, changed, dbg


def test_an_embedding_frozen_after_the_debugger_attached_is_no_cut():
    """Its output carries no gradient because it requires none: the optimizer that holds it skips it."""
    torch.manual_seed(0)
    losses, changed, dbg = train_tokens(TokenNet(), freeze_after_attach=True)
    # plain torch: everything but the frozen embedding trains, and the loss falls
    assert changed == {"mlp.0.weight", "mlp.0.bias", "head.weight", "head.bias"}
    assert sum(losses[-10:]) < 0.8 * sum(losses[:10])
    assert found(dbg) == [] and dbg.healthy, dbg.explain_failure()


def test_the_same_embedding_detached_while_it_requires_a_gradient_is_a_cut():
    torch.manual_seed(0)
    _, changed, dbg = train_tokens(TokenNet(cut=True), freeze_after_attach=False)
    assert "emb.weight" not in changed  # plain torch: held by the optimizer, it never gets a gradient
    assert found(dbg), dbg.explain_failure()
