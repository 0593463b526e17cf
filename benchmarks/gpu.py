"""NeuralDBG's step-time overhead and host synchronisations on a CUDA device.

    python -m benchmarks.gpu            # the transformer of benchmarks.overhead and a GPT-2-small-sized model
    python -m benchmarks.gpu --quick    # fewer rounds

Without a CUDA device it says so and exits 0 (nothing in this project requires a GPU).

For each model, two identical copies (same initial weights, same batches on the device) train in alternating
blocks, the debugger (default preset) attached for its own blocks only; a block ends with
``torch.cuda.synchronize()`` so its wall time is the device's. The ratio is the median over rounds of the watched
block over the plain block of the same round. Host synchronisations are counted with
``torch.cuda.set_sync_debug_mode("warn")`` (one warning per synchronising call): per step over whole blocks
(the flush of a full step included, with the steps of the schedule as they come), and over cheap steps only
(steps whose neighbours are cheap too, so no flush falls in them), next to the plain loop's own count.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

from .overhead import Transformer


class GPT(nn.Module):
    """A GPT-2-small-sized causal language model: 12 pre-norm blocks, width 768, 12 heads, 50,257 tokens."""

    def __init__(self, vocab: int = 50257, d: int = 768, layers: int = 12, heads: int = 12, ctx: int = 1024) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        block = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        pos = torch.arange(n, device=tokens.device)
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        h = self.blocks(self.tok(tokens) + self.pos(pos), mask=mask, is_causal=True)
        return self.head(self.norm(h)).flatten(0, 1)


MODELS = {
    # name: (builder, vocabulary, batch, sequence, steps per block)
    "transformer 2x64, batch 16, seq 32": (Transformer, 256, 16, 32, 20),
    "GPT-2 small (124M), batch 8, seq 256": (GPT, 50257, 8, 256, 5),
}


class Copy:
    def __init__(self, build: type[nn.Module], state: dict[str, torch.Tensor], watched: bool) -> None:
        self.model = build().cuda()
        self.model.load_state_dict(state)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.dbg = NeuralDbg(self.model) if watched else None
        self.steps = 0

    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, y = batch
        self.opt.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(x), y).backward()
        self.opt.step()
        self.steps += 1

    def block(self, batches: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if self.dbg is not None:
            self.dbg.attach()
        for i in range(n):
            self.step(batches[(self.steps + i) % len(batches)])
        if self.dbg is not None:
            self.dbg.close()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n


@contextmanager
def counting_syncs() -> Iterator[list[warnings.WarningMessage]]:
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode("default")


def _syncs(caught: list[warnings.WarningMessage]) -> int:
    return sum("synchroniz" in str(w.message) for w in caught)


def measure(build: type[nn.Module], vocab: int, batch: int, seq: int, block: int, rounds: int) -> dict[str, float]:
    torch.manual_seed(0)
    state = build().state_dict()
    g = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randint(0, vocab, (batch, seq), generator=g).cuda(),
            torch.randint(0, vocab, (batch * seq,), generator=g).cuda(),
        )
        for _ in range(8)
    ]
    plain, watched = Copy(build, state, False), Copy(build, state, True)
    for c in (plain, watched):
        c.block(batches, 20)  # warm-up: kernels chosen, allocator filled, the debugger past its first steps
    ratios, plain_times = [], []
    for r in range(rounds):
        pair = (plain, watched) if r % 2 == 0 else (watched, plain)
        t = {id(c): c.block(batches, block) for c in pair}
        ratios.append(t[id(watched)] / t[id(plain)])
        plain_times.append(t[id(plain)])
    with counting_syncs() as caught:
        plain.block(batches, 32)
    plain_syncs = _syncs(caught) / 32
    with counting_syncs() as caught:
        watched.block(batches, 32)
    watched_syncs = _syncs(caught) / 32
    # cheap steps only: attached, steps whose neighbours are cheap too
    assert watched.dbg is not None
    rec, cheap, counted = watched.dbg._recorder, 0, 0
    watched.dbg.attach()
    for _ in range(64):
        step = rec.clock.step
        quiet = not any(rec.schedule.is_full(s) for s in (step - 1, step, step + 1))
        if quiet:
            with counting_syncs() as caught:
                watched.step(batches[watched.steps % len(batches)])
            cheap += 1
            counted += _syncs(caught)
        else:
            watched.step(batches[watched.steps % len(batches)])
    watched.dbg.close()
    return {
        "ratio": statistics.median(ratios),
        "plain_ms": statistics.median(plain_times) * 1e3,
        "plain_syncs": plain_syncs,
        "watched_syncs": watched_syncs,
        "cheap_syncs": counted / max(cheap, 1),
        "cheap_steps": cheap,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing measured (benchmarks.gpu needs a GPU; the rest of the project does not)")
        return 0
    rounds = 6 if args.quick else 20
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print()
    print("| model | plain step | watched / plain | host syncs per step, plain | watched | watched, cheap steps only |")
    print("|---|---|---|---|---|---|")
    for name, (build, vocab, batch, seq, block) in MODELS.items():
        r = measure(build, vocab, batch, seq, block, rounds)
        print(
            f"| {name} | {r['plain_ms']:.2f} ms | {r['ratio']:.3f}x | {r['plain_syncs']:.2f} |"
            f" {r['watched_syncs']:.2f} | {r['cheap_syncs']:.2f} ({int(r['cheap_steps'])} steps) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
