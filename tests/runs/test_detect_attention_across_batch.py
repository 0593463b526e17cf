"""Attention across the batch: an ``nn.TransformerEncoder`` left at its default ``batch_first=False``, or a raw
``nn.MultiheadAttention``, fed (batch, sequence, features) straight from the data: each position attends over the
same position of the other samples. Ground truth is plain torch in each test: a sample's output changes when its
batch-mates change (the fault), and does not in the twins. Silent twins: the encoder built with
``batch_first=True``; a sequence-first classifier fed (sequence, batch) data with one label per sample; a
word-LM-style model fed (sequence, batch) data with its targets flattened per token; an axial attention over an
image's rows whose row length equals the batch size."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "attention_across_batch"
VOCAB, SEQ, BATCH, CLASSES, DIM = 10, 10, 32, 4, 32
STEPS = 24

pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor")


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(BATCH, SEQ) tokens holding a marker (1) at a random position; the label: the token after it, mod 4 (a task
    that needs attention along the sequence)."""
    g = torch.Generator().manual_seed(step)
    x = torch.randint(2, VOCAB, (BATCH, SEQ), generator=g)
    at = torch.randint(0, SEQ - 1, (BATCH,), generator=g)
    rows = torch.arange(BATCH)
    x[rows, at] = 1
    return x, x[rows, at + 1] % CLASSES


class Classifier(nn.Module):
    """Embeds (batch, sequence) tokens and hands them to the encoder as they are: right only when batch_first."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(0.5 * torch.randn(SEQ, DIM))
        layer = nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos).mean(1))


class RawAttention(nn.Module):
    """A raw nn.MultiheadAttention (batch_first=False) called on (batch, sequence, features)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(0.5 * torch.randn(SEQ, DIM))
        self.attn = nn.MultiheadAttention(DIM, 4)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        h, _ = self.attn(x, x, x)
        return self.head((x + h).mean(1))


class SequenceFirst(nn.Module):
    """The classifier laid out sequence first, as it should be at batch_first=False: tokens (sequence, batch). Built
    with batch_first=True, it is the mirror fault."""

    def __init__(self, batch_first: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(0.5 * torch.randn(SEQ, 1, DIM))
        layer = nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos).mean(0))


def train(model: nn.Module, watched: bool, sequence_first: bool = False) -> NeuralDbg | None:
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def loop() -> None:
        for step in range(STEPS):
            tokens, labels = batch(step)
            opt.zero_grad()
            F.cross_entropy(model(tokens.t() if sequence_first else tokens), labels).backward()
            opt.step()

    return support.watching(model, loop, watched)


def mates_matter(model: Callable[[torch.Tensor], torch.Tensor], sequence_first: bool = False) -> float:
    """Plain torch: how much sample 0's output moves when every other sample of its batch is replaced."""
    a, _ = batch(900)
    b = torch.cat([a[:1], batch(901)[0][1:]])
    with torch.no_grad():
        out_a = model(a.t() if sequence_first else a)
        out_b = model(b.t() if sequence_first else b)
    return float((out_a[0] - out_b[0]).abs().max())


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_an_encoder_at_batch_first_false_fed_batch_first_is_found_and_its_twin_is_silent():
    torch.manual_seed(0)
    model = Classifier(batch_first=False)
    train(model, watched=False)
    torch.manual_seed(0)
    twin = Classifier(batch_first=True)
    train(twin, watched=False)
    # plain torch: sample 0's logits depend on its batch-mates only when the encoder reads the batch as a sequence
    assert mates_matter(model) > 1e-3
    assert mates_matter(twin) < 1e-5

    torch.manual_seed(0)
    dbg = train(Classifier(batch_first=False), watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.detail == "encoder.layers.0.self_attn"
    assert hits[0].root.metrics["samples"] == BATCH and hits[0].root.metrics["length"] == SEQ
    assert "batch_first=True" in hits[0].explanation
    judged, times = dbg._recorder.coverage.batch_attention["encoder.layers.0.self_attn"][:2]
    assert judged == times > 0
    torch.manual_seed(0)
    silent = train(Classifier(batch_first=True), watched=True)
    assert silent is not None and not found(silent), silent.explain_failure()


def test_a_raw_multihead_attention_fed_batch_first_is_found():
    torch.manual_seed(0)
    model = RawAttention()
    train(model, watched=False)
    assert mates_matter(model) > 1e-3  # plain torch: the attention mixes the samples

    torch.manual_seed(0)
    dbg = train(RawAttention(), watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.detail == "attn"


def test_a_sequence_first_model_fed_sequence_first_data_is_silent():
    torch.manual_seed(0)
    model = SequenceFirst()
    train(model, watched=False, sequence_first=True)
    assert mates_matter(model, sequence_first=True) < 1e-5  # plain torch: each sample attends along its own tokens

    torch.manual_seed(0)
    dbg = train(SequenceFirst(), watched=True, sequence_first=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    judged, times = dbg._recorder.coverage.batch_attention["encoder.layers.0.self_attn"][:2]
    assert judged > 0 and times == 0  # judged: the labels are one per sample


def test_a_batch_first_encoder_fed_sequence_first_data_is_found():
    torch.manual_seed(0)
    model = SequenceFirst(batch_first=True)
    train(model, watched=False, sequence_first=True)
    assert mates_matter(model, sequence_first=True) > 1e-3  # plain torch: the mirror mixes the samples too

    torch.manual_seed(0)
    dbg = train(SequenceFirst(batch_first=True), watched=True, sequence_first=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.metrics["batch_first"] == 1.0
    assert "x.transpose(0, 1)" in hits[0].explanation


class WordModel(nn.Module):
    """pytorch/examples' word language model in small: (sequence, batch) tokens, a causal sequence-first encoder,
    a prediction per token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.0), 1)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tokens.size(0))
        return self.head(self.encoder(self.embed(tokens), mask=causal, is_causal=True))


@pytest.mark.parametrize("columns", [BATCH, 1])
def test_a_word_model_with_sequence_first_data_and_targets_per_token_is_silent(columns: int):
    stream = torch.arange(10_000) % 7 + 2  # a corpus the model can learn: each token follows from the last
    data = stream[: (stream.numel() // columns) * columns].view(columns, -1).t().contiguous()  # (steps, columns)
    bptt = SEQ

    def loop_of(model: nn.Module) -> Callable[[], None]:
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)

        def loop() -> None:
            for step in range(STEPS):
                i = step * bptt
                tokens, targets = data[i : i + bptt], data[i + 1 : i + 1 + bptt].reshape(-1)
                opt.zero_grad()
                F.cross_entropy(model(tokens).view(-1, VOCAB), targets).backward()
                opt.step()

        return loop

    torch.manual_seed(0)
    model = WordModel()
    loop_of(model)()
    with torch.no_grad():  # plain torch: a column's predictions do not depend on the other columns
        a = data[:bptt]
        b = torch.cat([a[:, :1], data[bptt : 2 * bptt, :1]], dim=1)  # another column beside the first
        assert float((model(a)[:, 0] - model(b)[:, 0]).abs().max()) < 1e-5

    torch.manual_seed(0)
    watched = WordModel()
    dbg = support.watching(watched, loop_of(watched), watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    # judged with a batch: N * T labels, the attention's sequence holds T; with one column, N * T is T: not judged
    judged, times = dbg._recorder.coverage.batch_attention.get("encoder.layers.0.self_attn", [0, 0])[:2]
    assert (judged > 0) == (columns > 1) and times == 0


class TokenRegressor(nn.Module):
    """A sequence-first model scoring one value per token: features (sequence, batch), predictions of that shape."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(1, DIM)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.0), 1)
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x.unsqueeze(-1)))).squeeze(-1)


def test_a_sequence_first_regression_with_a_target_per_token_is_silent():
    def series(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(SEQ, BATCH, generator=torch.Generator().manual_seed(step))
        return x, x.cumsum(0)  # (sequence, batch): each target sums its own column so far

    def loop_of(model: nn.Module) -> Callable[[], None]:
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)

        def loop() -> None:
            for step in range(STEPS):
                x, y = series(step)
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()

        return loop

    torch.manual_seed(0)
    model = TokenRegressor()
    loop_of(model)()
    a = series(900)[0]
    b = torch.cat([a[:, :1], series(901)[0][:, 1:]], dim=1)
    with torch.no_grad():  # plain torch: each column attends along itself only
        assert float((model(a)[:, 0] - model(b)[:, 0]).abs().max()) < 1e-5

    torch.manual_seed(0)
    watched = TokenRegressor()
    dbg = support.watching(watched, loop_of(watched), watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert not dbg._recorder.coverage.batch_attention  # (sequence, batch) targets: per token, not judged


class RowAttention(nn.Module):
    """An axial attention over each image row (sequence first: (width, batch * height, channels)); its images are
    as wide as the batch is large."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, DIM, 3, padding=1)
        self.attn = nn.MultiheadAttention(DIM, 4)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        h = self.conv(images)  # (batch, channels, height, width)
        n, c, height, width = h.shape
        rows = h.permute(3, 0, 2, 1).reshape(width, n * height, c)
        out, _ = self.attn(rows, rows, rows)
        return self.head(out.mean(0).view(n, height, c).mean(1))


def test_an_axial_attention_over_rows_as_wide_as_the_batch_is_silent():
    def images(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
        x = 0.1 * torch.randn(BATCH, 3, 4, BATCH, generator=g)  # rows of BATCH pixels
        x[:, 0] += labels[:, None, None].float()
        return x, labels

    def loop_of(model: nn.Module) -> Callable[[], None]:
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)

        def loop() -> None:
            for step in range(STEPS):
                x, labels = images(step)
                opt.zero_grad()
                F.cross_entropy(model(x), labels).backward()
                opt.step()

        return loop

    torch.manual_seed(0)
    model = RowAttention()
    loop_of(model)()
    a = images(900)[0]
    b = torch.cat([a[:1], images(901)[0][1:]])
    with torch.no_grad():  # plain torch: each image's rows attend within that image only
        assert float((model(a)[0] - model(b)[0]).abs().max()) < 1e-5

    torch.manual_seed(0)
    watched = RowAttention()
    dbg = support.watching(watched, loop_of(watched), watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert not dbg._recorder.coverage.batch_attention  # its axes are not the input's first two: not judged
