"""Data not shuffled: batches sorted by label, each optimizer step one class. Ground truth is plain torch: the same
program with ``shuffle=True`` reaches a far better held-out accuracy, and the batches' labels are read directly.
Healthy twins that must stay silent: shuffled batches, imbalanced classes (one class in every batch and in the pool
alike), a GAN-style discriminator that takes one backward pass per class in each step, and a sampler of two classes
per batch."""

from __future__ import annotations

import math

import support
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from neuraldbg import NeuralDbg

CLASSES, FEATURES = 10, 20


def clusters(n: int, seed: int, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0))
    if weights is None:
        y = torch.randint(0, CLASSES, (n,), generator=g)
    else:
        y = torch.multinomial(weights, n, replacement=True, generator=g)
    return centres[y] + 1.6 * torch.randn(n, FEATURES, generator=g), y


def classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def fit(loader: DataLoader, watched: bool) -> tuple[nn.Module, list[float], NeuralDbg | None]:
    """One epoch of Adam 1e-3 over ``loader``; the model, its losses and the debugger that watched it (if any)."""
    model = classifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []

    def loop() -> None:
        for x, y in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())

    return model, losses, support.watching(model, loop, watched)


def loader(shuffle: bool, weights: torch.Tensor | None = None) -> DataLoader:
    x, y = clusters(2048, seed=1, weights=weights)
    order = torch.argsort(y, stable=True)  # the data as stored: one class after another
    torch.manual_seed(0)
    return DataLoader(TensorDataset(x[order], y[order]), batch_size=32, shuffle=shuffle)


def accuracy(model: nn.Module) -> float:
    x, y = clusters(1024, seed=2)
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def top_share(y: torch.Tensor) -> float:
    return float(torch.bincount(y).max()) / len(y)


def test_batches_sorted_by_label_are_found():
    batches = [y for _, y in loader(shuffle=False)]
    assert sum(top_share(y) for y in batches) / len(batches) > 0.95  # each batch (almost) one class
    model, plain, _ = fit(loader(shuffle=False), watched=False)
    twin, _, _ = fit(loader(shuffle=True), watched=False)
    assert accuracy(twin) - accuracy(model) > 0.2  # plain torch: sorted 0.25, shuffled 0.62
    _, watched, dbg = fit(loader(shuffle=False), watched=True)
    assert watched == plain and dbg is not None
    roots = dbg.get_root_causes()
    assert roots and roots[0].kind.value == "unshuffled_data", dbg.report()
    text = dbg.explain_failure()[0]
    assert "sorted by label" in text and "shuffle=True" in text


def test_the_same_data_shuffled_are_silent():
    _, plain, _ = fit(loader(shuffle=True), watched=False)
    _, watched, dbg = fit(loader(shuffle=True), watched=True)
    assert watched == plain and dbg is not None
    assert "unshuffled_data" not in support.kinds(dbg), dbg.report()


def test_imbalanced_classes_shuffled_are_silent():
    # one class is 93 % of the data: most batches are (almost) all of it, and so is the pool
    weights = torch.tensor([30.0] + [0.25] * (CLASSES - 1))
    batches = [y for _, y in loader(shuffle=True, weights=weights)]
    assert sum(top_share(y) for y in batches) / len(batches) > 0.9
    _, _, dbg = fit(loader(shuffle=True, weights=weights), watched=True)
    assert dbg is not None and "unshuffled_data" not in support.kinds(dbg), dbg.report()


def test_one_backward_pass_per_class_in_each_step_is_silent():
    """A discriminator's step as a GAN takes it: a pass on real samples (label 1), then one on generated ones
    (label 0), then the optimizer step. Each pass is one class; each step is half and half."""
    torch.manual_seed(0)
    disc = nn.Sequential(nn.Linear(FEATURES, 32), nn.LeakyReLU(0.2), nn.Linear(32, 2))
    gen = nn.Sequential(nn.Linear(8, FEATURES))
    opt = torch.optim.Adam(disc.parameters(), lr=1e-3)
    real_data, _ = clusters(2048, seed=1)

    def loop() -> None:
        for i in range(64):
            opt.zero_grad()
            real = real_data[i * 32 : (i + 1) * 32]
            F.cross_entropy(disc(real), torch.ones(32, dtype=torch.long)).backward()
            fake = gen(torch.randn(32, 8)).detach()
            F.cross_entropy(disc(fake), torch.zeros(32, dtype=torch.long)).backward()
            opt.step()

    dbg = support.watching(disc, loop, True)
    assert dbg is not None and "unshuffled_data" not in support.kinds(dbg), dbg.report()


def test_a_sampler_of_two_classes_per_batch_is_silent():
    x, y = clusters(2048, seed=1)
    by_class = [torch.nonzero(y == c).flatten() for c in range(CLASSES)]
    model = classifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loop() -> None:
        for i in range(64):
            a, b = (2 * i) % CLASSES, (2 * i + 1) % CLASSES
            rows = torch.cat([by_class[a][i % 8 * 16 : i % 8 * 16 + 16], by_class[b][i % 8 * 16 : i % 8 * 16 + 16]])
            opt.zero_grad()
            F.cross_entropy(model(x[rows]), y[rows]).backward()
            opt.step()

    dbg = support.watching(model, loop, True)
    assert dbg is not None and "unshuffled_data" not in support.kinds(dbg), dbg.report()


def binary_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positives, then negatives: a binary set as built by concatenating the two."""
    g = torch.Generator().manual_seed(seed)
    y = torch.cat([torch.ones(n // 2), torch.zeros(n // 2)])
    return torch.randn(n, 10, generator=g) + (y[:, None] * 2 - 1) * torch.linspace(-0.6, 0.6, 10), y


def fit_binary(shuffle: bool, watched: bool) -> tuple[float, list[float], NeuralDbg | None]:
    """One epoch of SGD with momentum on a binary classifier (BCE on logits), in order or shuffled."""
    x, y = binary_data(1024, seed=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses: list[float] = []

    def loop() -> None:
        order = torch.randperm(len(x)) if shuffle else torch.arange(len(x))
        for i in range(0, len(x), 32):
            rows = order[i : i + 32]
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(x[rows]).squeeze(1), y[rows])
            loss.backward()
            opt.step()
            losses.append(loss.item())

    dbg = support.watching(model, loop, watched)
    xt, yt = binary_data(2048, seed=2)
    with torch.no_grad():
        return float(((model(xt).squeeze(1) > 0).float() == yt).float().mean()), losses, dbg


def test_a_binary_set_of_positives_then_negatives_is_found():
    sorted_accuracy, plain, _ = fit_binary(shuffle=False, watched=False)
    shuffled_accuracy, _, _ = fit_binary(shuffle=True, watched=False)
    assert shuffled_accuracy - sorted_accuracy > 0.2  # plain torch: 0.51 against 0.88
    _, watched, dbg = fit_binary(shuffle=False, watched=True)
    assert watched == plain and dbg is not None
    roots = dbg.get_root_causes()
    assert roots and roots[0].kind.value == "unshuffled_data", dbg.report()


def test_the_binary_set_shuffled_is_silent():
    _, _, dbg = fit_binary(shuffle=True, watched=True)
    assert dbg is not None and "unshuffled_data" not in support.kinds(dbg), dbg.report()


def test_a_contrastive_loss_whose_positive_is_column_zero_is_silent():
    """InfoNCE against a queue of negatives, as MoCo writes it: the positive's logit first, so every label is 0."""
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 16))
    opt = torch.optim.SGD(encoder.parameters(), lr=0.03, momentum=0.9)
    data, _ = clusters(2048, seed=1)
    queue = F.normalize(torch.randn(256, 16), dim=1)

    def loop() -> None:
        for i in range(64):
            x = data[i * 32 : (i + 1) * 32]
            q = F.normalize(encoder(x + 0.1 * torch.randn_like(x)), dim=1)
            with torch.no_grad():
                k = F.normalize(encoder(x + 0.1 * torch.randn_like(x)), dim=1)
            logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], dim=1) / 0.07
            opt.zero_grad()
            F.cross_entropy(logits, torch.zeros(32, dtype=torch.long)).backward()
            opt.step()

    dbg = support.watching(encoder, loop, True)
    assert dbg is not None and "unshuffled_data" not in support.kinds(dbg), dbg.report()


def test_a_policy_gradient_over_episodes_of_one_action_each_is_silent():
    """A policy trained on each episode in turn, its cross-entropy per action (reduction="none") weighed by the
    return: an episode takes mostly one action, the next another one. Each step is one episode by design."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)

    def loop() -> None:
        for episode in range(64):
            states = torch.randn(32, FEATURES)
            actions = torch.full((32,), episode % 4)
            actions[:2] = (episode + 1) % 4
            returns = torch.linspace(1.0, 0.1, 32)
            opt.zero_grad()
            (F.cross_entropy(policy(states), actions, reduction="none") * returns).mean().backward()
            opt.step()

    dbg = support.watching(policy, loop, True)
    assert dbg is not None and "unshuffled_data" not in support.kinds(dbg), dbg.report()


def test_a_discriminator_stepped_on_real_then_on_generated_samples_is_silent():
    """Two optimizer steps per iteration, one per class (hunt 25): each step is one class, but the class changes at
    every step; the data are drawn at random."""
    torch.manual_seed(0)
    disc = nn.Sequential(nn.Linear(FEATURES, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    gen = nn.Sequential(nn.Linear(8, FEATURES))
    opt = torch.optim.Adam(disc.parameters(), lr=1e-3)
    real_data, _ = clusters(2048, seed=1)

    def loop() -> None:
        for _ in range(64):
            real = real_data[torch.randint(0, 2048, (32,))]
            fake = gen(torch.randn(32, 8)).detach()
            for batch, label in ((real, 1.0), (fake, 0.0)):
                opt.zero_grad()
                F.binary_cross_entropy_with_logits(disc(batch).squeeze(1), torch.full((32,), label)).backward()
                opt.step()

    dbg = support.watching(disc, loop, True)
    assert dbg is not None and "unshuffled_data" not in support.kinds(dbg), dbg.report()


def test_tasks_taken_in_turn_are_silent():
    """A multi-task loop stepping each task's head in turn, each task's labels mostly its own majority class."""
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU())
    heads = nn.ModuleList([nn.Linear(32, 3) for _ in range(3)])
    model = nn.ModuleDict({"trunk": trunk, "heads": heads})
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loop() -> None:
        for i in range(96):
            task = i % 3
            x = torch.randn(32, FEATURES)
            y = torch.where(torch.rand(32) < 0.95, task, (task + 1) % 3)
            opt.zero_grad()
            F.cross_entropy(heads[task](trunk(x)), y).backward()
            opt.step()

    dbg = support.watching(model, loop, True)
    assert dbg is not None and "unshuffled_data" not in support.kinds(dbg), dbg.report()


def test_one_utterance_of_one_speaker_per_batch_is_not_called_at_chance():
    """Frame-level speaker classification, each batch the 40 frames of one random utterance (one label): the steps
    are one class each, drawn at random, so neither sorted data nor the label frequencies of the first batches
    (hunt 25: their 0.565 nats were taken for the chance level; log 6 = 1.79)."""
    torch.manual_seed(0)
    centres = torch.randn(6, FEATURES)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 6))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []

    def loop() -> None:
        for step in range(200):
            # the first four utterances of two speakers (label frequencies of log 2 = 0.69 nats), then any
            speaker = (0, 0, 1, 1)[step] if step < 4 else int(torch.randint(0, 6, ()))
            x = centres[speaker] + 2 * torch.randn(40, FEATURES)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), torch.full((40,), speaker))
            loss.backward()
            opt.step()
            losses.append(loss.item())

    dbg = support.watching(model, loop, True)
    y = torch.randint(0, 6, (1200,), generator=torch.Generator().manual_seed(5))
    x = centres[y] + 2 * torch.randn(1200, FEATURES, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert float((model(x).argmax(1) == y).float().mean()) > 0.6  # plain torch: it learns (chance 0.17)
    assert sum(losses[-50:]) / 50 < 0.7 * math.log(6)
    assert dbg is not None and dbg.hypotheses() == [], dbg.report()


def test_backward_passes_from_a_given_gradient_stop_the_look_for_labels_and_a_classifier_keeps_it():
    """A loop whose backward passes start from a gradient it hands in (``out.backward(grad)``: no loss, so no labels
    in the graph) stops looking for a classifier's labels after a few fully observed passes (the look costs every
    full step a walk of the graph); a classifier's loop keeps looking (its labels are read every full step)."""
    x, y = clusters(256, seed=3)
    for given in (True, False):
        model = classifier()
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        with NeuralDbg(model) as dbg:
            for step in range(8):
                rows = slice(32 * step, 32 * (step + 1))
                opt.zero_grad()
                out = model(x[rows])
                if given:
                    out.backward(F.softmax(out.detach(), 1) - F.one_hot(y[rows], CLASSES).float())  # d(CE)/d(out) * n
                else:
                    F.cross_entropy(out, y[rows]).backward()
                opt.step()
        assert dbg._analyzer.full_steps == 8  # every pass fully observed: the look was offered each time
        assert dbg._recorder.ledger._mix.looking is (not given)
