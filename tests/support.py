"""Models, training loops and plain-torch ground-truth measurements shared by the tests.

Ground truth never comes from NeuralDBG: every fault a test relies on is confirmed here with plain torch
(forward hooks of our own, parameter copies), so a detector test cannot pass by agreeing with itself.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

Batch = tuple[torch.Tensor, torch.Tensor]


# --------------------------------------------------------------------------------------------- data


def regression_batches(
    in_features: int = 16, batch: int = 32, seed: int = 1, scale: float = 1.0, noise: float = 0.05
) -> Callable[[int], Batch]:
    """A learnable regression task: targets from a fixed random linear teacher (its weights ``scale`` times
    standard normal) plus noise of standard deviation ``noise``."""
    teacher = scale * torch.randn(in_features, 1, generator=torch.Generator().manual_seed(seed + 1000))

    def make(step: int) -> Batch:
        g = torch.Generator().manual_seed(seed * 100_003 + step)
        x = torch.randn(batch, in_features, generator=g)
        return x, x @ teacher + noise * torch.randn(batch, 1, generator=g)

    return make


def classification_batches(
    shape: tuple[int, ...], classes: int, batch: int = 32, seed: int = 1
) -> Callable[[int], Batch]:
    """A learnable classification task: labels from a fixed random linear teacher on flattened inputs."""
    n = 1
    for d in shape:
        n *= d
    teacher = torch.randn(n, classes, generator=torch.Generator().manual_seed(seed + 2000))

    def make(step: int) -> Batch:
        g = torch.Generator().manual_seed(seed * 100_003 + step)
        x = torch.randn(batch, *shape, generator=g)
        return x, (x.reshape(batch, -1) @ teacher).argmax(dim=1)

    return make


def token_batches(vocab: int = 40, seq: int = 10, batch: int = 16, seed: int = 1) -> Callable[[int], Batch]:
    """Next-token-like task: the target token is a fixed function of the input token."""
    mapping = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed + 3000))

    def make(step: int) -> Batch:
        g = torch.Generator().manual_seed(seed * 100_003 + step)
        x = torch.randint(0, vocab, (batch, seq), generator=g)
        return x, mapping[x].reshape(-1)

    return make


# --------------------------------------------------------------------------------------------- models


def tiny() -> nn.Sequential:
    """The README model."""
    return nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 1))


def mlp(
    width: int = 64, depth: int = 4, in_features: int = 16, out: int = 1, act: type[nn.Module] = nn.ReLU
) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(in_features, width), act()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), act()]
    layers.append(nn.Linear(width, out))
    return nn.Sequential(*layers)


class FunctionalMLP(nn.Module):
    """ReLU applied with F.relu in forward: no activation module to hook."""

    def __init__(self, in_features: int = 16, width: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, width)
        self.fc2 = nn.Linear(width, width)
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))


class SharedActMLP(nn.Module):
    """One activation module reused after every layer (a common way to write models)."""

    def __init__(self, in_features: int = 16, width: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, 1)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


def cnn(classes: int = 10) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


class ResidualBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ResidualNet(nn.Module):
    def __init__(self, in_features: int = 16, d: int = 32, blocks: int = 16, out: int = 1) -> None:
        super().__init__()
        self.inp = nn.Linear(in_features, d)
        self.blocks = nn.ModuleList([ResidualBlock(d) for _ in range(blocks)])
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


class LSTMRegressor(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 32, cell: type[nn.Module] = nn.LSTM) -> None:
        super().__init__()
        self.rnn = cell(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 40, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x))).reshape(-1, self.head.out_features)


def sequence_batches(features: int = 8, seq: int = 12, batch: int = 32, seed: int = 1) -> Callable[[int], Batch]:
    def make(step: int) -> Batch:
        g = torch.Generator().manual_seed(seed * 100_003 + step)
        x = torch.randn(batch, seq, features, generator=g)
        return x, x[:, -3:, :2].sum(dim=(1, 2)).unsqueeze(1) * 0.5

    return make


# --------------------------------------------------------------------------------------------- loops


def _steps(
    model: nn.Module,
    batches: Callable[[int], Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    steps: int,
    opt: torch.optim.Optimizer,
    on_step: Callable[[int, torch.optim.Optimizer], None] | None = None,
    weights: list[torch.Tensor] | None = None,
) -> tuple[list[float], list[float]]:
    """The training loop the helpers below share: the loss per step and, when ``weights`` are given, each step's
    :func:`median_update_ratio` over them (plain torch); ``on_step(step, opt)`` runs before each step."""
    losses: list[float] = []
    ratios: list[float] = []
    for step in range(steps):
        if on_step is not None:
            on_step(step, opt)
        x, y = batches(step)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        before = [w.detach().clone() for w in weights] if weights is not None else None
        opt.step()
        if weights is not None and before is not None:
            ratios.append(median_update_ratio(weights, before))
        losses.append(loss.item())
    return losses, ratios


def train(
    model: nn.Module,
    batches: Callable[[int], Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.mse_loss,
    steps: int = 40,
    optimizer: torch.optim.Optimizer | None = None,
    on_step: Callable[[int, torch.optim.Optimizer], None] | None = None,
    **config: object,
) -> tuple[NeuralDbg, list[float]]:
    """Train under NeuralDbg; returns the debugger and the loss per step."""
    opt = optimizer or torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, **config) as dbg:  # type: ignore[arg-type]
        losses, _ = _steps(model, batches, loss_fn, steps, opt, on_step)
    return dbg, losses


def plain_train(
    model: nn.Module,
    batches: Callable[[int], Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.mse_loss,
    steps: int = 40,
    optimizer: torch.optim.Optimizer | None = None,
) -> list[float]:
    opt = optimizer or torch.optim.Adam(model.parameters(), lr=1e-3)
    return _steps(model, batches, loss_fn, steps, opt)[0]


def fit(
    model: nn.Module,
    batches: Callable[[int], Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    steps: int,
    optimizer: torch.optim.Optimizer,
    watched: bool,
) -> tuple[list[float], NeuralDbg | None]:
    """The same loop under NeuralDbg (:func:`train`) or plain (:func:`plain_train`): the losses, and the debugger
    when watched."""
    if watched:
        dbg, losses = train(model, batches, loss_fn, steps=steps, optimizer=optimizer)
        return losses, dbg
    return plain_train(model, batches, loss_fn, steps=steps, optimizer=optimizer), None


def train_measuring_updates(
    model: nn.Module,
    batches: Callable[[int], Batch],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    steps: int,
    optimizer: torch.optim.Optimizer,
    weights: list[torch.Tensor],
    watched: bool,
    on_step: Callable[[int, torch.optim.Optimizer], None] | None = None,
) -> tuple[NeuralDbg | None, list[float], list[float]]:
    """A training loop under NeuralDbg or plain (:func:`watching`) that also measures, with plain torch, each
    optimizer step's :func:`median_update_ratio` over ``weights``: the debugger when watched, the loss per step, the
    ratio per step. ``on_step(step, optimizer)`` runs before each step (a learning rate changed mid-run)."""
    found: tuple[list[float], list[float]] = ([], [])

    def loop() -> None:
        nonlocal found
        found = _steps(model, batches, loss_fn, steps, optimizer, on_step, weights)

    dbg = watching(model, loop, watched)
    return dbg, *found


def watching(model: nn.Module, loop: Callable[[], None], watched: bool) -> NeuralDbg | None:
    """Run a test's own training ``loop`` under ``NeuralDbg(model)`` when ``watched``, else plain: the debugger, or
    None."""
    if not watched:
        loop()
        return None
    with NeuralDbg(model) as dbg:
        loop()
    return dbg


def next_token_fit(
    model: nn.Module,
    data: torch.Tensor,
    batch: int,
    lr: float,
    watched: bool,
    last: int = 10,
    unscored: int = 0,
    call: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[float, NeuralDbg | None]:
    """Next-token training of a language model on ``data`` (rows of token ids), ``batch`` rows a step under AdamW
    at ``lr``: it reads ``x[:, :-1]`` (through ``call(model, tokens)`` when given: a model of other arguments) and
    is scored on ``x[:, 1:]`` (but for its first ``unscored`` positions, given ``ignore_index``: a prefix LM's
    bidirectional prefix), watched or plain (see :func:`watching`). The mean loss of the last ``last`` steps, and
    the debugger."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses: list[float] = []

    def loop() -> None:
        for step in range(len(data) // batch):
            x = data[step * batch : (step + 1) * batch]
            opt.zero_grad()
            logits = model(x[:, :-1]) if call is None else call(model, x[:, :-1])
            targets = x[:, 1:].clone()
            targets[:, :unscored] = -100
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    dbg = watching(model, loop, watched)
    return sum(losses[-last:]) / last, dbg


def masked_token_fit(model: nn.Module, data: torch.Tensor, batch: int, lr: float, mask_id: int) -> NeuralDbg:
    """A masked language model's training, watched: ``batch`` rows of ``data`` a step (reading ``x[:, :-1]``) under
    AdamW at ``lr``, a fifth of the tokens replaced by ``mask_id`` and scored on those positions only (the others
    ignored), their targets the input's own original tokens. The debugger."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(3)

    def loop() -> None:
        for step in range(len(data) // batch):
            x = data[step * batch : (step + 1) * batch, :-1]
            hidden = torch.rand(x.shape, generator=g) < 0.2
            targets = torch.where(hidden, x, torch.full_like(x, -100))
            opt.zero_grad()
            logits = model(torch.where(hidden, mask_id, x))
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
            opt.step()

    dbg = watching(model, loop, True)
    assert dbg is not None
    return dbg


def counting_sequences(n: int, seed: int, vocab: int, length: int) -> torch.Tensor:
    """``n`` token sequences x_t = (a + k t) mod ``vocab``, ``length`` long: the first two tokens fix the rest."""
    g = torch.Generator().manual_seed(seed)
    a, k = torch.randint(0, vocab, (n, 1), generator=g), torch.randint(1, 6, (n, 1), generator=g)
    return (a + k * torch.arange(length).view(1, length)) % vocab


@torch.no_grad()
def later_token_leak(
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    tokens: torch.Tensor,
    vocab: int,
    position: int = 3,
    until: int | None = None,
) -> float:
    """How much the logits ``logits_of`` gives ``position`` of ``tokens`` move when the tokens after it (up to
    ``until``, by default all of them) change: 0 for a causal model, whose positions see no later token."""
    other = tokens.clone()
    other[:, position + 1 : until] = (other[:, position + 1 : until] + 7) % vocab
    return float((logits_of(tokens)[:, position] - logits_of(other)[:, position]).abs().max())


@torch.no_grad()
def greedy_accuracy(model: nn.Module, sequences: torch.Tensor) -> float:
    """The share of the tokens after a two-token prompt that greedy generation gets right."""
    seq = sequences[:, :2]
    for _ in range(2, sequences.shape[1]):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    return float((seq[:, 2:] == sequences[:, 2:]).float().mean())


# --------------------------------------------------------------------------------------------- plain-torch truth


def capture_outputs(model: nn.Module, x: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """Outputs of the named modules for input ``x`` (plain forward hooks, no gradient)."""
    modules = dict(model.named_modules())
    out: dict[str, torch.Tensor] = {}
    handles = [
        modules[n].register_forward_hook(lambda m, i, o, n=n: out.__setitem__(n, o.detach().clone())) for n in names
    ]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return out


def dead_unit_fraction(activations: torch.Tensor) -> float:
    """Fraction of units (last dim, or channels of a conv map) positive on no sample."""
    a = activations
    a = a.permute(0, 2, 3, 1).reshape(-1, a.shape[1]) if a.dim() == 4 else a.reshape(-1, a.shape[-1])
    return float(((a > 0).sum(0) == 0).float().mean())


def median_update_ratio(params: Iterable[torch.Tensor], before: Iterable[torch.Tensor]) -> float:
    """The median over ``params`` of ||p - b|| / ||b||, each against its copy ``b`` in ``before`` taken before the
    optimizer step: how much one step moved the weights, as the update detectors measure it."""
    return statistics.median(float((p.detach() - b).norm() / b.norm()) for p, b in zip(params, before, strict=True))


def grad_norms(model: nn.Module) -> dict[str, float]:
    """Per-parameter gradient norms after a backward pass."""
    return {n: float(p.grad.norm()) for n, p in model.named_parameters() if p.grad is not None}


def one_backward(model: nn.Module, batch: Batch, loss_fn: Callable[..., torch.Tensor] = F.mse_loss) -> None:
    model.zero_grad()
    x, y = batch
    loss_fn(model(x), y).backward()


def logits_cut_by_relu(model: nn.Sequential, batch: Batch) -> float:
    """Plain torch, for a classifier ``Linear, ReLU, Linear, ReLU`` whose last ReLU sits on its logits: the share of
    logits the ReLU cut, checked to get exactly zero gradient from ``cross_entropy`` (the model's gradients are
    cleared afterwards)."""
    x, y = batch
    logits = model[:3](x)
    logits.retain_grad()
    F.cross_entropy(model[3](logits), y).backward()
    assert logits.grad is not None
    cut = logits.detach() < 0
    assert bool((logits.grad[cut] == 0).all())
    model.zero_grad(set_to_none=True)
    return float(cut.float().mean())


def kinds(dbg: NeuralDbg) -> set[str]:
    return {h.kind.value for h in dbg.hypotheses()}


def iter_events(dbg: NeuralDbg, kind: str) -> Iterator:
    return (e for e in dbg.events if e.kind is not None and e.kind.value == kind)


def layer_gradients(model: nn.Module) -> dict[str, float]:
    """Plain torch: the gradient norm of every module over its own parameters, after a backward pass."""
    out = {}
    for name, m in model.named_modules():
        grads = [p.grad.reshape(-1) for p in m.parameters(recurse=False) if p.grad is not None]
        if grads:
            out[name] = float(torch.cat(grads).norm())
    return out


# --------------------------------------------------------------------------------------------- skip-gram

VOCAB, TOPICS = 200, 10


class SkipGram(nn.Module):
    """word2vec's skip-gram with negative sampling, initialised as word2vec is: input vectors uniform in
    +-0.5/dim, output vectors zero."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Embedding(VOCAB, 32), nn.Embedding(VOCAB, 32)
        nn.init.uniform_(self.inp.weight, -0.5 / 32, 0.5 / 32)
        nn.init.zeros_(self.out.weight)

    def forward(self, centre: torch.Tensor, context: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        u = self.inp(centre)
        positive = F.logsigmoid((u * self.out(context)).sum(-1))
        negative = F.logsigmoid(-(self.out(negatives) @ u[:, :, None]).squeeze(-1)).sum(-1)
        return -(positive + negative).mean()


def skipgram_run(
    lr: float, seed: int, watched: bool, bf16: bool = False, sgd: bool = False
) -> tuple[list[float], float, NeuralDbg | None]:
    """Sentences of 8 words of one topic each (a word's topic: its index mod 10), neighbouring words as (centre,
    context) pairs, 5 random negatives each, Adam, batches of 128, 300 steps. Returns the losses, the share of words
    whose nearest neighbour (cosine, input vectors) is of their topic, and the debugger. ``bf16``: the forward pass
    under bfloat16 autocast; ``sgd``: plain SGD instead of Adam."""
    g = torch.Generator().manual_seed(0)
    topic = torch.arange(VOCAB) % TOPICS
    sentences = []
    for _ in range(1500):
        words = torch.nonzero(topic == int(torch.randint(0, TOPICS, (1,), generator=g))).flatten()
        sentences.append(words[torch.randint(0, len(words), (8,), generator=g)])
    s = torch.stack(sentences)
    centre = torch.cat([s[:, :-1].reshape(-1), s[:, 1:].reshape(-1)])
    context = torch.cat([s[:, 1:].reshape(-1), s[:, :-1].reshape(-1)])
    torch.manual_seed(seed)
    model = SkipGram()
    opt = torch.optim.SGD(model.parameters(), lr=lr) if sgd else torch.optim.Adam(model.parameters(), lr=lr)
    draw, sampler = torch.Generator().manual_seed(seed + 100), torch.Generator().manual_seed(5)
    losses: list[float] = []

    def loop() -> None:
        order, at = torch.randperm(len(centre), generator=draw), 0
        for _ in range(300):
            if at + 128 > len(order):
                order, at = torch.randperm(len(centre), generator=draw), 0
            idx = order[at : at + 128]
            at += 128
            negatives = torch.randint(0, VOCAB, (len(idx), 5), generator=sampler)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(centre[idx], context[idx], negatives)
            loss.backward()
            opt.step()
            losses.append(loss.item())

    dbg = watching(model, loop, watched)
    with torch.no_grad():
        e = F.normalize(model.inp.weight, dim=1)
        similarity = e @ e.t()
        similarity.fill_diagonal_(-2)
        neighbours = float((topic[similarity.argmax(1)] == topic).float().mean())
    return losses, neighbours, dbg
