"""A view across the batch (``view_across_batch``): a tensor whose batch stands on a later axis given ``view`` a shape
whose first axis is the batch's length, so each row mixes pieces of several samples. Ground truth is plain torch in
each test: a sample's logits move when its batch-mates change (by exactly 0 in the twin), and the held-out accuracy
stays near the classes' prior while the twin's is near 1. Faults: a sequence-first LSTM's ``(T, N, H)`` output
flattened with ``view(N, -1)``, and a two-layer LSTM's ``h_n`` of ``(2, N, H)`` viewed as ``(N, 2 * H)``. Silent
twins: the same with ``permute`` first, ``h_n[-1]``, a one-layer ``h_n`` viewed as ``(N, H)`` (one value before the
batch: nothing to mix), and a batch-first CNN whose channels are as many as its samples."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

KIND = "view_across_batch"
T, V, C, N = 12, 20, 4, 32


def tokens(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels from the first and last tokens: (n, T) token ids and (n,) labels of C classes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (n, T), generator=g)
    y = ((x[:, :3] < 10).sum(1) + (x[:, -3:] < 5).sum(1)).clamp(max=C - 1)
    return x, y


class Reader(nn.Module):
    """A sequence-first LSTM over the tokens. ``how``: "view" (its output flattened with view: the fault),
    "permute" (batch first, then flattened), "hidden" (a two-layer LSTM's h_n viewed as (N, 2H): the fault),
    "last" (h_n[-1]), "single" (a one-layer LSTM's h_n viewed as (N, H))."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.emb = nn.Embedding(V, 16)
        self.lstm = nn.LSTM(16, 16, num_layers=2 if how in ("hidden", "last") else 1)
        width = T * 16 if how in ("view", "permute") else 32 if how == "hidden" else 16
        self.fc = nn.Linear(width, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, (h, _) = self.lstm(self.emb(x.t()))  # (T, N, H); h: (layers, N, H)
        n = x.shape[0]
        feature = {
            "view": lambda: out.view(n, -1),
            "permute": lambda: out.permute(1, 0, 2).reshape(n, -1),
            "hidden": lambda: h.view(n, -1),
            "last": lambda: h[-1],
            "single": lambda: h.view(n, -1),
        }[self.how]()
        return self.fc(feature)


def train(how: str, watched: bool, steps: int = 200):
    x, y = tokens(4000, 1)
    torch.manual_seed(0)
    model = Reader(how)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(2)

    def loop() -> None:
        for _ in range(steps):
            rows = torch.randint(0, 4000, (N,), generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x[rows]), y[rows]).backward()
            opt.step()

    dbg = support.watching(model, loop, watched)
    return model, dbg


@torch.no_grad()
def accuracy(model: nn.Module) -> float:
    x, y = tokens(2000, 3)
    return float((model(x).argmax(1) == y).float().mean())


@torch.no_grad()
def crosstalk(model: nn.Module) -> float:
    """How much the first sample's logits move when the other samples of its batch change."""
    x, _ = tokens(N, 4)
    other, _ = tokens(N, 5)
    other[0] = x[0]
    return float((model(x)[0] - model(other)[0]).abs().max())


def found(dbg) -> list:
    assert dbg is not None
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_a_sequence_first_output_flattened_with_view_is_found_and_its_permuted_twin_is_silent():
    model, _ = train("view", watched=False)
    twin, _ = train("permute", watched=False)
    prior = float(torch.bincount(tokens(2000, 3)[1]).max()) / 2000
    # plain torch: a sample's logits hang on its batch-mates; held-out accuracy at the prior against near 1
    assert crosstalk(model) > 1e-3 and crosstalk(twin) == 0.0
    assert accuracy(model) < prior + 0.1 < prior + 0.3 < accuracy(twin), (accuracy(model), prior, accuracy(twin))

    _, dbg = train("view", watched=True)
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND  # the loss at chance it causes comes after it
    root = hits[0].root
    assert root.detail == "lstm"
    assert (root.metrics["samples"], root.metrics["axis"]) == (N, 1)
    assert root.metrics["found"] == root.metrics["read"] >= 2
    assert "permute(1, 0, 2)" in hits[0].suggestion
    assert f"(12, {N}, 16)" in hits[0].summary() or f"(12, {N}, 16)" in dbg.explain_failure()[0]

    _, silent = train("permute", watched=True)
    assert not found(silent), silent.explain_failure()


def test_a_two_layer_hidden_state_viewed_as_one_row_per_sample_is_found():
    model, _ = train("hidden", watched=False)
    twin, _ = train("last", watched=False)
    assert crosstalk(model) > 1e-3 and crosstalk(twin) == 0.0  # plain torch
    assert accuracy(twin) > accuracy(model) + 0.1, (accuracy(model), accuracy(twin))
    _, dbg = train("hidden", watched=True)
    assert found(dbg), dbg.explain_failure()
    _, silent = train("last", watched=True)
    assert not found(silent), silent.explain_failure()


def test_a_one_layer_hidden_state_viewed_per_sample_is_silent():
    model, dbg = train("single", watched=True, steps=60)
    assert crosstalk(model) == 0.0  # plain torch: (1, N, H) viewed as (N, H) keeps each sample's row
    assert not found(dbg), dbg.explain_failure()


def test_a_batch_first_cnn_with_as_many_channels_as_samples_is_silent():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, N, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(N * 8 * 8, C))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(6)

    def loop() -> None:
        for _ in range(40):
            x, y = torch.randn(N, 3, 8, 8, generator=g), torch.randint(0, C, (N,), generator=g)
            opt.zero_grad()
            h = model[1](model[0](x))  # (N, N, 8, 8): as many channels as samples
            F.cross_entropy(model[3](h.view(N, -1)), y).backward()
            opt.step()

    dbg = support.watching(model, loop, True)
    assert dbg is not None and dbg._recorder.coverage.view_passes >= 2  # read, and judged batch first
    assert not found(dbg), dbg.explain_failure()


def test_a_sequence_first_transformer_whose_attention_views_its_batch_with_its_heads_is_silent():
    """``nn.MultiheadAttention`` at batch_first=False views its (T, N, E) queries as (T, N * heads, E / heads): the
    batch on axis 1 of both, nothing mixed; pooled over the positions, then one row per sample."""
    x, y = tokens(2000, 7)
    torch.manual_seed(0)
    emb, pos = nn.Embedding(V, 16), nn.Parameter(torch.zeros(T, 1, 16))
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0), 1, enable_nested_tensor=False)
    head = nn.Linear(16, C)
    model = nn.ModuleDict({"emb": emb, "encoder": encoder, "head": head})
    opt = torch.optim.Adam([*model.parameters(), pos], lr=3e-3)
    g = torch.Generator().manual_seed(8)

    def loop() -> None:
        for _ in range(40):
            rows = torch.randint(0, 2000, (N,), generator=g)
            opt.zero_grad()
            h = encoder(emb(x[rows].t()) + pos)  # (T, N, 16)
            F.cross_entropy(head(h.mean(0)), y[rows]).backward()
            opt.step()

    dbg = support.watching(model, loop, True)
    assert dbg is not None and dbg._recorder.coverage.view_passes >= 2
    assert not found(dbg), dbg.explain_failure()


def test_a_linear_over_a_batch_of_sequences_whose_width_is_the_batch_is_silent():
    """A Linear over (N, T, F) flattens it to (N * T, F) and gives its (N * T, N) result back as (N, T, N): the
    samples sit in the merged first axis, and the width after it is as long as the batch by chance."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, N), nn.GRU(N, N, batch_first=True))
    head = nn.Linear(N, 1)
    opt = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-3)
    g = torch.Generator().manual_seed(9)

    def loop() -> None:
        for _ in range(30):
            x, y = torch.randn(N, 12, 8, generator=g), torch.randn(N, 1, generator=g)
            opt.zero_grad()
            F.mse_loss(head(model(x)[0][:, -1]), y).backward()
            opt.step()

    dbg = support.watching(model, loop, True)
    assert dbg is not None and dbg._recorder.coverage.view_passes >= 2
    assert not dbg._recorder.coverage.mixed_views
    assert not found(dbg), dbg.explain_failure()
