"""Overhead on models of the sizes users train, one per family, side by side in one process.

    python -m benchmarks.families            # about 4 minutes on 2 CPU cores
    python -m benchmarks.families --quick    # a smoke run
    python -m benchmarks.families --model resnet --model lm

``benchmarks.overhead``'s models are small, chosen to show the per-call and per-tensor costs. A statistic that
costs in proportion to a layer's output or gradient shows only at real sizes: a channel-first feature map's
per-channel test that copied the map whole, or an argmax over a language model's logits (the full preset of the
ResNet below 1.20-1.22x before they were mended, 1.12-1.13x after; of the language model 1.27x, 1.19x: see
docs/cost.md, "Statistics at real sizes"). These families are measured the same way as ``benchmarks.overhead``
(:func:`benchmarks.overhead.measure`: identical copies in alternating blocks, the median over rounds of a watched
block over the plain block of its round, the first 50 steps of a fresh debugger apart), so a cost that grows
with the data shows up here first.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .overhead import Case, Transformer, measure


class Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm, ReLU applied functionally, a skip connection."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class ResNet(nn.Module):
    """A stem and two basic blocks of 32 channels on 32x32 images, pooled into a 10-class head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.blocks = nn.Sequential(Block(32), Block(32))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.blocks(F.relu(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(features, 1).flatten(1))


class Tagger(nn.Module):
    """An LSTM tagger: embedding, one LSTM layer of 128, a 500-tag head for every token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(500, 64)
        self.lstm = nn.LSTM(64, 128, batch_first=True)
        self.head = nn.Linear(128, 500)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(tokens))[0]).flatten(0, 1)


def resnet() -> nn.Module:
    return ResNet()


def lm() -> nn.Module:
    """``benchmarks.overhead``'s transformer at width 128 over 1,000 tokens: logits for every position."""
    return Transformer(vocab=1000, d=128)


def tagger() -> nn.Module:
    return Tagger()


def segmenter() -> nn.Module:
    """A fully convolutional segmenter: two 3x3 Conv-BN-ReLU stages, a 1x1 head of 5 classes per pixel."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 5, 1),
    )


def autoencoder() -> nn.Module:
    """An MNIST-sized autoencoder with a sigmoid output (a bounded output whose saturation is counted)."""
    return nn.Sequential(
        nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 32), nn.ReLU(), nn.Linear(32, 256), nn.ReLU(),
        nn.Linear(256, 784), nn.Sigmoid(),
    )  # fmt: skip


def multilabel() -> nn.Module:
    """A multi-label classifier: 100 independent labels under a binary cross-entropy."""
    return nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 100))


def _images(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)


def _tokens(vocab: int, batch: int, length: int) -> Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]:
    def draw(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, vocab, (batch, length), generator=g)
        return x, torch.randint(0, vocab, (batch * length,), generator=g)

    return draw


def _pixels(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 3, 64, 64, generator=g), torch.randint(0, 5, (8, 64, 64), generator=g)


def _digits(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(128, 784, generator=g)
    return x, x


def _labels(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(128, 128, generator=g), (torch.rand(128, 100, generator=g) < 0.1).float()


CASES = [
    Case("ResNet, 2 basic blocks of 32 channels, 32x32, batch 32", resnet, _images, F.cross_entropy, 2),
    Case("transformer LM 2x128, vocabulary 1,000, seq 64, batch 16", lm, _tokens(1000, 16, 64), F.cross_entropy, 2),
    Case("LSTM tagger 128, 500 tags, seq 32, batch 16", tagger, _tokens(500, 16, 32), F.cross_entropy, 4),
    Case("segmenter Conv-BN-ReLU x2, 5 classes, 64x64, batch 8", segmenter, _pixels, F.cross_entropy, 2),
    Case("autoencoder 784-256-32, sigmoid output, batch 128", autoencoder, _digits, F.binary_cross_entropy, 8),
    Case("multi-label MLP, 100 labels, batch 128", multilabel, _labels, F.binary_cross_entropy_with_logits, 16),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke run")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--model", choices=[c.build.__name__ for c in CASES], action="append", help="only these models")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        table(args.model, args.quick)
    finally:
        torch.set_num_threads(threads)  # as it was: a caller in the same process (a test) keeps its own
    return 0


def table(models: list[str] | None, quick: bool) -> None:
    """Measure each family (``models``: only these) and print the table."""
    rounds, warmup = (4, 6) if quick else (12, 40)
    python = sys.version.split()[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, python {python}")
    print()
    print("| model | plain step | default | economy | full | default, first 50 steps |")
    print("|---|---|---|---|---|---|")
    for case in CASES:
        if models and case.build.__name__ not in models:
            continue
        r = measure(case, warmup, rounds)
        print(
            f"| {case.name} | {r['plain_ms']:.2f} ms | {r['default']:.3f}x | {r['economy']:.3f}x | {r['full']:.3f}x |"
            f" {r['first50']:.2f}x |"
        )


if __name__ == "__main__":
    sys.exit(main())
