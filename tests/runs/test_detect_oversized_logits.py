"""Oversized logits at the start: a classifier whose layers multiply the signal at initialisation, so that its first
mean cross-entropy is several times log(classes). Ground truth is plain torch in each test (the first losses, the
logits' scale, each layer's output scale from hooks of our own, the twin's accuracy); the twins with a sound
initialisation or a normalised adjacency, a language model, and a classifier whose cross-entropy is summed (its
first loss is samples x log(classes) whatever its logits) stay silent."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.kinds.oversized_logits import START_FACTOR

KIND = "oversized_logits"
CLASSES = 10
STEPS = 80


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def start(losses: list[float], classes: int) -> float:
    """The first loss (before any update), in units of log(classes)."""
    return losses[0] / math.log(classes)


# --------------------------------------------------------------------------------------------- an MLP's init


def classifier(normal_init: bool) -> nn.Sequential:
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    if normal_init:  # weights ~ N(0, 1): each layer multiplies its input's scale by ~sqrt(fan-in)
        for layer in model:
            if isinstance(layer, nn.Linear):
                nn.init.normal_(layer.weight, std=1.0)
    return model


def train_classifier(
    model: nn.Module,
    watched: bool,
    loss_fn: Callable[..., torch.Tensor] = F.cross_entropy,
    lr: float = 1e-3,
    logits: Callable[[torch.Tensor], torch.Tensor] = lambda output: output,
) -> tuple[list[float], float, NeuralDbg | None]:
    """The losses, the held-out accuracy (of ``logits(output)``) and the debugger of a run of Adam at ``lr``."""
    make = support.classification_batches((32,), CLASSES, batch=64)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []

    def loop() -> None:
        for step in range(STEPS):
            x, y = make(step)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    dbg = support.watching(model, loop, watched)
    model.eval()
    with torch.no_grad():
        held = [make(10_000 + i) for i in range(4)]
        accuracy = sum(float((logits(model(x)).argmax(1) == y).float().mean()) for x, y in held) / len(held)
    return losses, accuracy, dbg


def test_a_classifier_initialised_from_normal_0_1_is_found_and_its_default_init_twin_is_silent():
    torch.manual_seed(0)
    model = classifier(normal_init=True)
    x, _ = support.classification_batches((32,), CLASSES, batch=64)(0)
    outputs = support.capture_outputs(model, x, ["0", "2", "4"])
    losses, accuracy, _ = train_classifier(model, watched=False)
    torch.manual_seed(0)
    twin_losses, twin_accuracy, _ = train_classifier(classifier(normal_init=False), watched=False)
    # plain torch: the signal grows layer over layer (unit-scale input), the first loss is far above log(10), the
    # default-init twin starts at chance and ends more accurate
    scales = [float(outputs[name].pow(2).mean().sqrt()) for name in ("0", "2", "4")]
    assert scales[0] > 3 and scales[1] > 5 * scales[0] and scales[2] > 3 * scales[1], scales
    assert start(losses, CLASSES) > 20
    assert start(twin_losses, CLASSES) < 1.2
    assert accuracy < twin_accuracy - 0.1

    torch.manual_seed(0)
    _, _, dbg = train_classifier(classifier(normal_init=True), watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    assert hits[0].root.metrics["factor"] > 20
    assert "'4'" in hits[0].explanation and "fan-in" in hits[0].explanation

    torch.manual_seed(0)
    _, _, twin = train_classifier(classifier(normal_init=False), watched=True)
    assert twin is not None and twin.healthy, twin.explain_failure()


def test_a_label_smoothed_cross_entropy_is_judged_as_a_mean_cross_entropy():
    """``cross_entropy(label_smoothing=0.1)`` (timm's and many recipes' default) is an average over the samples
    that starts at log(classes) at zero logits, like the plain one: torch builds it as a weighted nll_loss plus a
    smoothing term, and its first loss was not judged (hunt 19: a head bias of 0-45 went unseen)."""

    def smoothed(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y, label_smoothing=0.1)

    torch.manual_seed(0)
    losses, _, _ = train_classifier(classifier(normal_init=True), watched=False, loss_fn=smoothed)
    torch.manual_seed(0)
    twin_losses, _, _ = train_classifier(classifier(normal_init=False), watched=False, loss_fn=smoothed)
    assert start(losses, CLASSES) > 20 and start(twin_losses, CLASSES) < 1.2  # plain torch
    torch.manual_seed(0)
    _, _, dbg = train_classifier(classifier(normal_init=True), watched=True, loss_fn=smoothed)
    assert dbg is not None and found(dbg) and dbg.hypotheses()[0].kind.value == KIND, dbg.explain_failure()
    torch.manual_seed(0)
    _, _, twin = train_classifier(classifier(normal_init=False), watched=True, loss_fn=smoothed)
    assert twin is not None and twin.healthy, twin.explain_failure()


def test_the_loss_graph_reads_a_label_smoothed_mean_and_nothing_more() -> None:
    from neuraldbg.capture import loss_graph

    x, y = torch.randn(8, 4, requires_grad=True), torch.randint(0, 4, (8,))
    graph = loss_graph.read([F.cross_entropy(x, y, label_smoothing=0.1)])
    assert graph.mean and graph.smoothed
    assert loss_graph.read([F.cross_entropy(x, y, label_smoothing=0.1, ignore_index=2)]).mean
    assert not loss_graph.read([F.cross_entropy(x, y, label_smoothing=0.1, reduction="sum")]).mean
    assert not loss_graph.read([F.cross_entropy(x, y, label_smoothing=0.1) + x.pow(2).mean()]).mean
    plain = loss_graph.read([F.cross_entropy(x, y)])
    assert plain.mean and not plain.smoothed


def test_a_summed_cross_entropy_starts_at_samples_times_chance_and_is_not_judged():
    """reduction="sum" over 64 samples: the first loss is ~64 log(10) with logits near zero; nothing is wrong."""
    torch.manual_seed(0)

    def summed(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y, reduction="sum")

    losses, accuracy, _ = train_classifier(classifier(normal_init=False), watched=False, loss_fn=summed)
    assert start(losses, CLASSES) > 50  # plain torch: far above log(10), as a sum must be
    assert accuracy > 0.5

    torch.manual_seed(0)
    _, _, dbg = train_classifier(classifier(normal_init=False), watched=True, loss_fn=summed)
    assert dbg is not None and not found(dbg), dbg.explain_failure()


# --------------------------------------------------------------------------------------------- a graph convolution


def block_graph(nodes: int = 160, blocks: int = 4, features: int = 16) -> tuple[torch.Tensor, ...]:
    """A stochastic block model (A + I, dense), noisy features of each node's block, and the blocks as labels."""
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(nodes) % blocks
    same = labels[:, None] == labels[None, :]
    p = torch.where(same, torch.tensor(0.15), torch.tensor(0.01))
    a = (torch.rand(nodes, nodes, generator=g) < p).triu(1)
    a = (a | a.T).float() + torch.eye(nodes)
    centres = torch.randn(blocks, features, generator=g)
    x = F.one_hot(labels, blocks).float() @ centres + 3.0 * torch.randn(nodes, features, generator=g)
    return a, (x - x.mean(0)) / x.std(0), labels


def sparse_adjacency(a: torch.Tensor, normalise: bool) -> torch.Tensor:
    if normalise:  # D^-1/2 (A + I) D^-1/2: a product averages a node's neighbours instead of summing them
        d = a.sum(1).pow(-0.5)
        a = d[:, None] * a * d[None, :]
    return a.to_sparse()


class GraphConv(nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(adj, self.linear(x))


class GCN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gc1 = GraphConv(16, 16)
        self.gc2 = GraphConv(16, 4)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return self.gc2(F.dropout(F.relu(self.gc1(x, adj)), 0.5, self.training), adj)


def train_gcn(normalise: bool, watched: bool) -> tuple[list[float], NeuralDbg | None]:
    a, x, labels = block_graph()
    adj = sparse_adjacency(a, normalise)
    torch.manual_seed(0)
    model = GCN()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train = torch.arange(0, 60)
    losses: list[float] = []

    def loop() -> None:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = F.cross_entropy(model(x, adj)[train], labels[train])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    dbg = None
    if watched:
        with NeuralDbg(model) as dbg:
            loop()
    else:
        loop()
    return losses, dbg


def test_a_graph_convolution_over_an_unnormalised_adjacency_is_found_and_its_normalised_twin_is_silent():
    a, x, _ = block_graph()
    torch.manual_seed(0)
    probe = GCN()
    with torch.no_grad():  # plain torch: the product with A + I multiplies a layer's output by ~ the degree
        raw = probe.gc1.linear(x)
        summed = torch.sparse.mm(sparse_adjacency(a, False), raw)
        averaged = torch.sparse.mm(sparse_adjacency(a, True), raw)
    gain = float(summed.pow(2).mean().sqrt() / averaged.pow(2).mean().sqrt())
    assert gain > 0.5 * float(a.sum(1).mean()), gain
    losses, _ = train_gcn(normalise=False, watched=False)
    twin_losses, _ = train_gcn(normalise=True, watched=False)
    assert 4 < start(losses, 4) < 6  # far above log(4), and within reach of the threshold's neighbours
    assert start(twin_losses, 4) < 1.1

    _, dbg = train_gcn(normalise=False, watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert "D^-1/2" in hits[0].explanation and "'gc2.linear'" in hits[0].explanation
    _, twin = train_gcn(normalise=True, watched=True)
    assert twin is not None and not found(twin), twin.explain_failure()


# --------------------------------------------------------------------------------------------- a language model


class TokenModel(nn.Module):
    def __init__(self, vocab: int = 40) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 32)
        self.head = nn.Linear(32, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


def test_a_language_model_starting_at_chance_is_silent():
    make = support.token_batches(vocab=40)
    losses: list[float] = []
    torch.manual_seed(0)
    model = TokenModel()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x, y = make(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x).reshape(-1, 40), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    assert start(losses, 40) < 1.2  # plain torch: at chance, log(vocabulary)
    assert losses[-1] < 0.5 * losses[0]  # and it learns
    assert not found(dbg), dbg.explain_failure()


def test_a_confident_model_met_mid_training_on_a_shifted_task_is_not_judged():
    """The debugger attached to a run whose optimizer already holds state: the model is trained and confident, and
    the labels it now meets are shifted (a fine-tune on a new task), so its first losses are far above log(10)
    without anything wrong with its initialisation."""
    make = support.classification_batches((32,), CLASSES, batch=64)
    torch.manual_seed(0)
    model = classifier(normal_init=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(300):
        x, y = make(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    losses: list[float] = []
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x, y = make(1000 + step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), (y + 1) % CLASSES)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    assert start(losses, CLASSES) > 3  # plain torch: confidently wrong from the first step
    assert not found(dbg), dbg.explain_failure()


# --------------------------------------------------------------------------------------------- scaled cosine logits


class ArcFaceNet(nn.Module):
    """An embedding net and an ArcFace head: normalised class centres, an angular margin m on the labels' class,
    the cosines times s. The logits lie in [-s, s] whatever the weights; the margin lowers the labels' logit.
    Past pi - m, cos(theta + m) rises again: as in the reference implementation, it is then replaced by the
    monotone cos(theta) - m sin(m) (without that, every embedding moves opposite to every centre).

    ``form``: how cos(theta + m) is written: ``"acos"`` (the angle itself), ``"sqrt"`` (the angle sum, the sine
    as ``torch.sqrt(1.0 - cos.pow(2))``, the most copied ArcMarginProduct) or ``"power"`` (the sine as
    ``(1 - cos * cos) ** 0.5``)."""

    def __init__(self, s: float = 30.0, m: float = 0.5, form: str = "acos") -> None:
        super().__init__()
        self.embedder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
        self.centres = nn.Parameter(torch.empty(CLASSES, 16))
        nn.init.xavier_uniform_(self.centres)
        self.s, self.m, self.form = s, m, form

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        cosine = F.linear(F.normalize(self.embedder(x)), F.normalize(self.centres)).clamp(-1 + 1e-7, 1 - 1e-7)
        if self.form == "acos":
            shifted = torch.cos(torch.acos(cosine) + self.m)
        else:
            sine = torch.sqrt(1.0 - cosine.pow(2)) if self.form == "sqrt" else (1.0 - cosine * cosine) ** 0.5
            shifted = cosine * math.cos(self.m) - sine * math.sin(self.m)
        margin = torch.where(cosine > math.cos(math.pi - self.m), shifted, cosine - math.sin(math.pi - self.m) * self.m)
        return self.s * torch.where(F.one_hot(labels, CLASSES).bool(), margin, cosine)


@pytest.mark.parametrize("form", ["acos", "sqrt", "power"])
def test_an_arcface_head_starts_far_above_chance_by_design_and_is_not_judged(form: str):
    """s = 30 and m = 0.5 (the paper's values): the first loss is ~10 log(10) because the margin pushes the labels'
    logit down, not because the initialisation blew the signal up; the run learns its classes. The margin written
    as the angle sum (a square root of 1 - cos^2, a constant minus a power) bounds the logits alike."""
    torch.manual_seed(0)
    make = support.classification_batches((32,), CLASSES, batch=64)

    def run(watched: bool) -> tuple[list[float], float, NeuralDbg | None]:
        torch.manual_seed(0)
        model = ArcFaceNet(form=form)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        losses: list[float] = []
        dbg = NeuralDbg(model) if watched else None
        with dbg if dbg is not None else contextlib.nullcontext():
            for step in range(STEPS):
                x, y = make(step)
                opt.zero_grad()
                loss = F.cross_entropy(model(x, y), y)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        with torch.no_grad():
            held = [make(10_000 + i) for i in range(4)]
            centres = F.normalize(model.centres)
            accuracy = sum(
                float((F.normalize(model.embedder(x)) @ centres.T).argmax(1).eq(y).float().mean()) for x, y in held
            )
        return losses, accuracy / len(held), dbg

    losses, accuracy, _ = run(watched=False)
    # plain torch: the first loss is far above log(10), yet every layer's output is of unit scale or less (the
    # size is s = 30 times cosines), the loss falls and the held-out nearest-centre accuracy ends far above chance
    x, _ = make(0)
    torch.manual_seed(0)
    outputs = support.capture_outputs(ArcFaceNet().embedder, x, ["0", "2"])
    assert all(float(out.pow(2).mean().sqrt()) < 1.5 for out in outputs.values())
    assert start(losses, CLASSES) > 5
    assert sum(losses[-10:]) < sum(losses[:10]) / 2
    assert accuracy > 4 / CLASSES  # chance is 1 / CLASSES

    watched_losses, _, dbg = run(watched=True)
    assert watched_losses == losses
    assert dbg is not None and found(dbg) == [] and dbg.healthy, dbg.explain_failure()


def test_a_multi_label_classifier_with_a_pos_weight_is_not_judged_by_its_first_loss():
    # BCEWithLogitsLoss(pos_weight=10) on 3 labels: at a sound init the first loss is 3.3 log(3) (log 2 times the
    # weights), and the model learns; a weighted mean is not one sample's loss at chance
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(16, 3, generator=g)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3))
    criterion = nn.BCEWithLogitsLoss(pos_weight=torch.full((3,), 10.0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []
    with NeuralDbg(model) as dbg:
        for _ in range(STEPS):
            x = torch.randn(64, 16, generator=g)
            y = ((x @ weights) > 1.0).float()
            opt.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    assert start(losses, 3) > 3  # plain torch: what a mean at chance would call oversized
    assert sum(losses[-20:]) / 20 < 0.6 * losses[0]  # ... and it learns
    assert found(dbg) == []


def test_a_label_smoothed_loss_keeps_log_classes_as_its_chance_level_not_the_labels_entropy() -> None:
    """Smoothing mixes in a uniform target: a model that learned only the labels' frequencies does not reach their
    entropy, so imbalanced labels do not lower the chance level of a smoothed loss."""
    from neuraldbg.capture.coverage import Coverage
    from neuraldbg.kinds import loss_evidence

    coverage = Coverage(classifier_mean=True, label_classes=4, label_prior=(0.8, 400.0, 0.0, 0.7))
    coverage.training.classes = 4
    assert loss_evidence.label_prior(coverage, 0.05) == 0.8  # below the band of log 4 = 1.39: imbalanced
    coverage.classifier_smoothed = True
    assert loss_evidence.label_prior(coverage, 0.05) is None


# --------------------------------------------------------------------------------------------- features before logits


class FeaturesThenLogits(nn.Module):
    """A classifier whose forward returns its 2-d feature layer first, then its logits (the features plotted, or
    fed to a centre loss): the output's first 2-d tensor is no row of classes."""

    def __init__(self, normal_init: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 2))
        self.fc = nn.Linear(2, CLASSES)
        if normal_init:
            for layer in (*self.body, self.fc):
                if isinstance(layer, nn.Linear):
                    nn.init.normal_(layer.weight, std=1.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(x)
        return features, self.fc(features)


def test_the_classes_are_the_losss_not_those_of_a_feature_tensor_returned_before_the_logits() -> None:
    def logits_loss(output: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output[1], y)

    def run(normal_init: bool, watched: bool) -> tuple[list[float], float, NeuralDbg | None]:
        torch.manual_seed(0)
        model = FeaturesThenLogits(normal_init)
        return train_classifier(model, watched, logits_loss, lr=1e-2, logits=lambda output: output[1])

    # plain torch: the default-init model starts at log(10) (over 3 x log(2), the level of the features' width) and
    # learns; the N(0, 1) one starts far above log(10)
    losses, accuracy, _ = run(normal_init=False, watched=False)
    assert 0.9 < start(losses, CLASSES) < 1.2 and start(losses, 2) > 3
    assert accuracy > 0.3  # chance: 0.1
    big, _, _ = run(normal_init=True, watched=False)
    assert start(big, CLASSES) > 5

    _, _, healthy = run(normal_init=False, watched=True)
    assert healthy is not None and not found(healthy), healthy.explain_failure()
    _, _, dbg = run(normal_init=True, watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.metrics["classes"] == CLASSES, hits[0].root.metrics


def test_a_log_softmax_over_the_batch_starts_at_log_batch_and_is_no_oversized_logit() -> None:
    """``nll_loss(log_softmax(out, dim=0), y)``: each sample's log-probability is taken among the batch's rows, so
    the first loss is about log(batch), whatever the logits' scale: the missing_log_softmax finding names that
    fault; the logits are at unit scale and no oversized_logits is read from it."""
    classes, batch = 4, 256
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, classes))
    make = support.classification_batches((32,), classes, batch=batch)
    x, y = make(0)
    with torch.no_grad():  # plain torch: small logits, a first loss near log(batch), three times log(classes)
        logits = model(x)
        first = float(F.nll_loss(F.log_softmax(logits, dim=0), y))
    assert float(logits.abs().max()) < 2
    assert abs(first - math.log(batch)) < 0.2 and first > START_FACTOR * math.log(classes)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x, y = make(step)
            opt.zero_grad()
            F.nll_loss(F.log_softmax(model(x), dim=0), y).backward()
            opt.step()
    kinds = [h.kind.value for h in dbg.hypotheses()]
    assert "missing_log_softmax" in kinds, dbg.explain_failure()
    assert KIND not in kinds, dbg.explain_failure()
