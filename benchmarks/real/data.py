"""Synthetic data with learnable structure, made in memory from a fixed seed (nothing is downloaded).

Every generator takes its own ``torch.Generator`` seed, so the data are the same for every variant and every
training seed of a program: a mutant and its healthy twin see the same examples.
"""

from __future__ import annotations

import math

import torch

DATA_SEED = 1234


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def prototypes(classes: int, size: int, channels: int, seed: int = DATA_SEED) -> torch.Tensor:
    """One image per class: a few Gaussian blobs and a bar at random places, in [0, 1]."""
    g = _gen(seed)
    ys, xs = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    protos = torch.zeros(classes, channels, size, size)
    for c in range(classes):
        for ch in range(channels):
            image = torch.zeros(size, size)
            for _ in range(3):
                cy, cx = (torch.rand(2, generator=g) * (size - 4) + 2).tolist()
                width = float(torch.rand(1, generator=g)) * size / 8 + size / 16
                image += torch.exp(-((ys - cy) ** 2 + (xs - cx) ** 2) / (2 * width**2))
            row = int(torch.randint(2, size - 2, (1,), generator=g))
            if torch.rand(1, generator=g) < 0.5:
                image[row, 2 : size - 2] += 0.8
            else:
                image[2 : size - 2, row] += 0.8
            protos[c, ch] = image / image.max()
    return protos


def images(
    n: int, classes: int = 10, size: int = 16, channels: int = 1, noise: float = 0.35, seed: int = DATA_SEED
) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy, shifted, rescaled copies of the class prototypes as uint8 pixels (0-255), and their labels."""
    protos = prototypes(classes, size, channels)
    g = _gen(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    out = torch.empty(n, channels, size, size)
    shifts = torch.randint(-2, 3, (n, 2), generator=g)
    scale = torch.rand(n, generator=g) * 0.6 + 0.7
    for i in range(n):
        out[i] = torch.roll(protos[labels[i]], shifts=tuple(shifts[i].tolist()), dims=(1, 2)) * scale[i]
    out += noise * torch.randn(out.shape, generator=g)
    pixels = (out.clamp(0, 1) * 255).round().to(torch.uint8)
    return pixels, labels


def markov_tokens(n: int, vocab: int = 64, seed: int = DATA_SEED, stream: int = 0) -> torch.Tensor:
    """A token stream from a fixed sparse Markov chain: each token has a few likely successors.

    ``stream`` picks an independent sample of the same chain (training and held-out text)."""
    g = _gen(seed)
    logits = torch.randn(vocab, vocab, generator=g) * 3.0
    probs = torch.softmax(logits, dim=1)
    g = _gen(seed + 1 + stream)
    out = torch.empty(n, dtype=torch.long)
    token = 0
    for i in range(n):
        token = int(torch.multinomial(probs[token], 1, generator=g))
        out[i] = token
    return out


def markov_entropy(vocab: int = 64, seed: int = DATA_SEED) -> float:
    """The chain's entropy rate in nats: the best loss a language model can reach on its text."""
    g = _gen(seed)
    probs = torch.softmax(torch.randn(vocab, vocab, generator=g) * 3.0, dim=1)
    stationary = torch.full((vocab,), 1.0 / vocab)
    for _ in range(500):
        stationary = stationary @ probs
    return float(-(stationary[:, None] * probs * probs.clamp_min(1e-12).log()).sum())


PAD, BOS, EOS = 0, 1, 2


def translation_pairs(
    n: int, vocab: int = 24, min_len: int = 3, max_len: int = 8, seed: int = DATA_SEED
) -> tuple[torch.Tensor, torch.Tensor]:
    """Source sentences and their 'translations' (reversed, each word mapped by a fixed dictionary),
    padded with PAD; targets start with BOS and end with EOS."""
    g = _gen(seed)
    words = torch.arange(3, vocab)
    dictionary = torch.cat([torch.arange(3), words[torch.randperm(len(words), generator=_gen(DATA_SEED))]])
    src = torch.full((n, max_len), PAD, dtype=torch.long)
    tgt = torch.full((n, max_len + 2), PAD, dtype=torch.long)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    for i in range(n):
        length = int(lengths[i])
        sentence = torch.randint(3, vocab, (length,), generator=g)
        src[i, :length] = sentence
        tgt[i, 0] = BOS
        tgt[i, 1 : length + 1] = dictionary[sentence.flip(0)]
        tgt[i, length + 1] = EOS
    return src, tgt


def block_graph(
    nodes: int = 400, classes: int = 4, features: int = 32, p_in: float = 0.04, p_out: float = 0.004
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A stochastic block model: (edge index 2 x E, undirected), node features (weakly class-dependent),
    labels. The neighbours carry most of the class signal, as in a citation graph."""
    g = _gen(DATA_SEED)
    labels = torch.arange(nodes) % classes
    labels = labels[torch.randperm(nodes, generator=g)]
    same = labels[:, None] == labels[None, :]
    p = torch.where(same, torch.tensor(p_in), torch.tensor(p_out))
    upper = torch.triu(torch.rand(nodes, nodes, generator=g) < p, diagonal=1)
    edges = upper.nonzero().t()
    edges = torch.cat([edges, edges.flip(0)], dim=1)
    means = torch.randn(classes, features, generator=g)
    x = 0.6 * means[labels] + torch.randn(nodes, features, generator=g) * 1.5
    return edges, x, labels


def sine_series(n: int, length: int, seed: int = DATA_SEED) -> torch.Tensor:
    """Sequences of two sinusoids of random frequency and phase with a little noise: shape (n, length)."""
    g = _gen(seed)
    t = torch.arange(length).float()
    freq = torch.rand(n, 2, generator=g) * 0.25 + 0.05
    phase = torch.rand(n, 2, generator=g) * 2 * math.pi
    amp = torch.rand(n, 2, generator=g) * 0.8 + 0.2
    series = (amp[:, :, None] * torch.sin(freq[:, :, None] * t + phase[:, :, None])).sum(1)
    return series + 0.05 * torch.randn(n, length, generator=g)
