"""A loss at chance when the classes are imbalanced: a classifier whose inputs say nothing about its labels learns
their frequencies and no more, so its cross-entropy settles at the entropy of those frequencies, below log(classes).
The labels an ``nll_loss`` is given on the first backward passes are counted on the device for it. Ground truth is
plain torch in each test (the loss held at the labels' entropy, the twin whose labels match its inputs far below
it); the twins stay silent and the training is bit-identical."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.stats.tensors import label_counts, label_entropy

KIND = "loss_at_chance"
#: An imbalanced prior over five classes: its entropy (1.01 nats) is far below log 5 (1.61).
PRIOR = torch.tensor([0.7, 0.1, 0.1, 0.05, 0.05])


def entropy(labels: torch.Tensor, classes: int) -> float:
    """The entropy of the labels' frequencies, in nats (plain torch)."""
    p = torch.bincount(labels.reshape(-1), minlength=classes).double()
    p = p / p.sum()
    return float(-(p[p > 0] * p[p > 0].log()).sum())


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def chance_findings(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


# --------------------------------------------------------------------------------- a character-level language model


def text_data() -> tuple[torch.Tensor, torch.Tensor, int]:
    """Sequences of characters from a small lexicon (the next character is predictable within a word), inputs and
    next-character targets; the characters' frequencies are far from equal."""
    g = torch.Generator().manual_seed(1234)
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "and", "then", "slept", "under", "tree"]
    text = " ".join(words[i] for i in torch.randint(0, len(words), (3000,), generator=g).tolist())
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    seq = 32
    count = (len(ids) - 1) // seq
    return ids[: count * seq].view(count, seq), ids[1 : count * seq + 1].view(count, seq), len(chars)


class CharGRU(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 32)
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.head = nn.Linear(64, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.emb(x))
        return self.head(h)


def train_lm(shuffled: bool, watched: bool, lr: float = 3e-3) -> tuple[list[float], NeuralDbg | None, float, int]:
    """A user's loop over six epochs: the targets' rows permuted against the inputs' (``shuffled``) or not."""
    xs, ys, vocab = text_data()
    if shuffled:
        ys = ys[torch.randperm(len(ys), generator=torch.Generator().manual_seed(7))]
    torch.manual_seed(0)
    model = CharGRU(vocab)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses: list[float] = []

    def loop() -> None:
        order = torch.Generator().manual_seed(1)
        for _ in range(6):
            perm = torch.randperm(len(xs), generator=order)
            for b in range(0, len(xs), 32):
                idx = perm[b : b + 32]
                opt.zero_grad()
                loss = F.cross_entropy(model(xs[idx]).reshape(-1, vocab), ys[idx].reshape(-1))
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))

    if not watched:
        loop()
        return losses, None, entropy(ys, vocab), vocab
    with NeuralDbg(model) as dbg:
        loop()
    return losses, dbg, entropy(ys, vocab), vocab


def test_a_language_model_given_shuffled_targets_is_at_the_entropy_of_its_characters_not_log_vocab():
    plain, _, labels, vocab = train_lm(shuffled=True, watched=False)
    twin, _, _, _ = train_lm(shuffled=False, watched=False)
    # plain torch: the loss settles at the characters' unigram entropy, well below log(vocab); the twin far below it
    assert labels < 0.9 * math.log(vocab)
    assert abs(mean(plain[-20:]) - labels) < 0.03 * labels
    assert mean(twin[-20:]) < 0.5 * labels
    losses, dbg, _, _ = train_lm(shuffled=True, watched=True)
    assert losses == plain
    assert dbg is not None
    found = chance_findings(dbg)
    assert found, dbg.report()
    m = found[0].root.metrics
    assert abs(m["prior"] - labels) < 0.02 * labels  # the labels of the first backward passes stand for all
    assert "entropy of the labels' frequencies" in found[0].explanation


def test_the_same_language_model_with_its_targets_in_place_is_silent():
    plain, _, _, _ = train_lm(shuffled=False, watched=False)
    losses, dbg, _, _ = train_lm(shuffled=False, watched=True)
    assert losses == plain
    assert dbg is not None and not chance_findings(dbg), dbg.report()


# ---------------------------------------------------------------------------------------- an imbalanced classifier

Labels = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def prior_labels(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Labels drawn from the prior, whatever the inputs: nothing in them predicts the label."""
    return torch.multinomial(PRIOR, len(x), replacement=True, generator=g)


TEACHER = torch.randn(16, 5, generator=torch.Generator().manual_seed(3))


def teacher_labels(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Labels a linear teacher gives, class 0 favoured by a bias: as imbalanced, and predictable."""
    return (x @ TEACHER + torch.tensor([6.0, 0.0, 0.0, -1.0, -1.0])).argmax(dim=1)


def train_classifier(labels: Labels, watched: bool, steps: int = 300) -> tuple[list[float], NeuralDbg | None, float]:
    """Fresh batches every step (nothing to memorise): an MLP under Adam."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(11)
    losses: list[float] = []
    seen: list[torch.Tensor] = []

    def loop() -> None:
        for _ in range(steps):
            x = torch.randn(64, 16, generator=g)
            y = labels(x, g)
            seen.append(y)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))

    if not watched:
        loop()
        return losses, None, entropy(torch.cat(seen), 5)
    with NeuralDbg(model) as dbg:
        loop()
    return losses, dbg, entropy(torch.cat(seen), 5)


def test_a_classifier_that_learns_only_the_class_prior_is_at_chance():
    plain, _, labels = train_classifier(prior_labels, watched=False)
    # plain torch: the loss falls from log 5 to the labels' entropy and stays there
    assert labels < 0.7 * math.log(5)
    assert abs(mean(plain[-50:]) - labels) < 0.05 * labels
    losses, dbg, _ = train_classifier(prior_labels, watched=True)
    assert losses == plain
    assert dbg is not None
    found = chance_findings(dbg)
    assert found, dbg.report()
    assert abs(found[0].root.metrics["prior"] - labels) < 0.1 * labels


def test_an_imbalanced_classifier_that_learns_is_silent():
    plain, _, labels = train_classifier(teacher_labels, watched=False)
    assert labels < 0.8 * math.log(5)  # as imbalanced ...
    assert mean(plain[-50:]) < 0.5 * labels  # ... and it learns far past the prior
    losses, dbg, _ = train_classifier(teacher_labels, watched=True)
    assert losses == plain
    assert dbg is not None and not dbg.hypotheses(), dbg.report()


def test_the_labels_are_counted_on_the_device_as_bincount_counts_them_leaving_out_ignore_index():
    g = torch.Generator().manual_seed(0)
    target = torch.multinomial(PRIOR, 600, replacement=True, generator=g).view(6, 100)
    target[:, -20:] = -100  # padding the loss ignores
    counts = label_counts(target, 5, -100)
    kept = target[target != -100]
    assert counts[:5].tolist() == torch.bincount(kept, minlength=5).float().tolist()
    assert counts[5] == 0
    h, n, outside, top = label_entropy(counts).tolist()
    assert top == pytest.approx(float(torch.bincount(kept, minlength=5).max()) / len(kept))
    seen = int((torch.bincount(kept, minlength=5) > 0).sum())
    assert abs(h - (entropy(kept, 5) + (seen - 1) / (2 * len(kept)))) < 1e-5  # Miller-Madow's correction
    assert (n, outside) == (len(kept), 0)
    # a token id as ignore_index (a padding token's) is left out the same way
    assert label_counts(target.clamp(min=0), 5, 0)[0] == 0


def test_a_language_model_still_at_equal_odds_is_at_chance_too_and_its_tiny_steps_are_named():
    """The language model with its targets in place, at a learning rate of 1e-6: its loss stays at log(vocab), above
    the characters' entropy (it has not even learned their frequencies). That is at chance as well, and the steps
    too small to train are what is named (stalled_updates reads the curve at chance), as for balanced classes."""
    plain, _, labels, vocab = train_lm(shuffled=False, watched=False, lr=1e-6)
    assert abs(mean(plain[-20:]) - math.log(vocab)) < 0.02 * math.log(vocab)  # plain torch: at equal odds
    assert mean(plain[-20:]) > 1.1 * labels
    losses, dbg, _, _ = train_lm(shuffled=False, watched=True, lr=1e-6)
    assert losses == plain
    assert dbg is not None
    assert dbg._recorder.coverage.label_prior  # the labels were counted: their entropy is a level below
    assert [h.kind.value for h in dbg.hypotheses()][:1] == ["stalled_updates"], dbg.report()
