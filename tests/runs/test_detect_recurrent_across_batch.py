"""Recurrence across the batch (``attention_across_batch`` over a recurrent layer): an ``nn.LSTM`` left at its
default ``batch_first=False`` fed (batch, time, features) straight from the data runs its recurrence down the batch,
from one sample to the next, and each "sample" it returns is a time position. Ground truth is plain torch in each
test: held-out accuracy against the twin built with ``batch_first=True``, and a sample's output moving when its
batch-mates change (the fault) or not (the twins). Silent twins: the LSTM built with ``batch_first=True``; one at
``batch_first=False`` fed (time, batch) by a permute in the model; a tagger whose loss is per token; a GRU language
model fed batchified (time, batch) data with its targets flattened per token; batches of one sample."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from neuraldbg import NeuralDbg

KIND = "attention_across_batch"
VOCAB, SEQ, BATCH, CLASSES, DIM = 12, 8, 32, 4, 32
STEPS = 96  # past the 64 losses a loss at chance is judged on: the finding must lead it


def batch(step: int, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """(size, SEQ) tokens whose first one names the class, distractors after: a task that needs the recurrence to
    carry the first token along the sample's own sequence."""
    g = torch.Generator().manual_seed(step)
    labels = torch.randint(0, CLASSES, (size,), generator=g)
    x = torch.randint(CLASSES + 1, VOCAB, (size, SEQ), generator=g)
    x[:, 0] = labels + 1
    return x, labels


class Classifier(nn.Module):
    """Embeds (batch, time) tokens and hands them to the recurrent layer as they are, reading ``out[:, -1]`` as each
    sample's last step: right only when batch_first. ``permute``: the model lays them out (time, batch) first, as a
    layer at batch_first=False wants them, and reads ``out[-1]``."""

    def __init__(self, batch_first: bool, cell: type[nn.RNNBase] = nn.LSTM, permute: bool = False) -> None:
        super().__init__()
        self.permute = permute
        self.embed = nn.Embedding(VOCAB, DIM)
        self.rnn = cell(DIM, DIM, batch_first=batch_first)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.permute:
            return self.head(self.rnn(x.permute(1, 0, 2))[0][-1])
        return self.head(self.rnn(x)[0][:, -1])


class SequenceFirst(Classifier):
    """The model is given (time, batch) tokens and reads ``out[-1]``: right at batch_first=False, the mirror fault
    when built with batch_first=True."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0][-1])


def train(model: nn.Module, watched: bool, steps: int = STEPS, size: int = BATCH, first: bool = False):
    """Adam on :func:`batch`; ``first``: the tokens handed over (time, batch)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def loop() -> None:
        for step in range(steps):
            tokens, labels = batch(step, size)
            opt.zero_grad()
            F.cross_entropy(model(tokens.t() if first else tokens), labels).backward()
            opt.step()

    return support.watching(model, loop, watched)


def accuracy(model: nn.Module, first: bool = False) -> float:
    tokens, labels = batch(999, 512)
    with torch.no_grad():
        return float((model(tokens.t() if first else tokens).argmax(1) == labels).float().mean())


def mates_matter(model: Callable[[torch.Tensor], torch.Tensor], first: bool = False) -> float:
    """Plain torch: how much the last sample's output moves when every other sample of its batch is replaced (the
    last: a recurrence run down the batch carries the samples before it into it)."""
    a = batch(900)[0]
    b = torch.cat([batch(901)[0][:-1], a[-1:]])
    with torch.no_grad():
        return float((model(a.t() if first else a)[-1] - model(b.t() if first else b)[-1]).abs().max())


def found(dbg: NeuralDbg) -> list:
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def judged(dbg: NeuralDbg, layer: str = "rnn") -> tuple[int, int]:
    counts = dbg._recorder.coverage.batch_attention.get(layer, [0, 0])
    return counts[0], counts[1]


def test_an_lstm_at_batch_first_false_fed_batch_first_is_found_before_the_loss_at_chance():
    torch.manual_seed(0)
    model = Classifier(batch_first=False)
    train(model, watched=False)
    torch.manual_seed(0)
    twin = Classifier(batch_first=True)
    train(twin, watched=False)
    # plain torch: the fault stays near chance while its twin learns, and mixes a sample with its batch-mates
    assert accuracy(model) < 0.45 and accuracy(twin) > 0.9, (accuracy(model), accuracy(twin))
    assert mates_matter(model) > 1e-3 and mates_matter(twin) < 1e-5

    torch.manual_seed(0)
    dbg = train(Classifier(batch_first=False), watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND  # it leads: the labels are fine
    root, text = hits[0].root, hits[0].explanation
    assert root.detail == "rnn" and root.metrics["samples"] == BATCH and root.metrics["length"] == SEQ
    assert "nn.LSTM(..., batch_first=True)" in text and "out[-1]" in text
    assert "caused a loss at chance" in text  # the loss at chance was found, and explained by this finding
    assert "attention" not in text.lower() and "attends" not in text
    assert not any("do not match the inputs" in h.explanation for h in dbg.hypotheses())
    assert judged(dbg) == (8, 8)

    torch.manual_seed(0)
    silent = train(Classifier(batch_first=True), watched=True)
    assert silent is not None and not found(silent), silent.explain_failure()
    assert judged(silent) == (8, 0)  # judged: one label per sample, its batch axis holds them


class Encoder(nn.LSTM):
    """A user's subclass of ``nn.LSTM`` named for its role, not for torch's class."""


def test_a_recurrent_subclass_named_otherwise_is_worded_as_a_recurrence():
    """The words come from what the capture saw (an ``nn.RNNBase``), not from the class's name: the fault of the
    first test through a subclass called ``Encoder`` is a recurrence across the batch, not an attention."""
    torch.manual_seed(0)
    model = Classifier(batch_first=False, cell=Encoder)
    train(model, watched=False)
    assert accuracy(model) < 0.45 and mates_matter(model) > 1e-3  # plain torch: the fault, as with nn.LSTM

    torch.manual_seed(0)
    dbg = train(Classifier(batch_first=False, cell=Encoder), watched=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    text = hits[0].explanation
    assert hits[0].root.metrics["recurrent"] == 1.0
    assert "Recurrence across the batch" in text and "Encoder(..., batch_first=True)" in text, text
    assert "out[-1]" in text
    assert "attention" not in text.lower() and "attends" not in text


def test_a_gru_at_batch_first_true_fed_sequence_first_is_found():
    torch.manual_seed(0)
    model = SequenceFirst(batch_first=True, cell=nn.GRU)
    train(model, watched=False, first=True)
    torch.manual_seed(0)
    twin = SequenceFirst(batch_first=False, cell=nn.GRU)
    train(twin, watched=False, first=True)
    assert accuracy(model, first=True) < 0.45 and accuracy(twin, first=True) > 0.9
    assert mates_matter(model, first=True) > 1e-3 and mates_matter(twin, first=True) < 1e-5

    torch.manual_seed(0)
    dbg = train(SequenceFirst(batch_first=True, cell=nn.GRU), watched=True, steps=16, first=True)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.metrics["batch_first"] == 1.0
    assert "feed the GRU (batch, sequence, features)" in hits[0].explanation and "out[:, -1]" in hits[0].explanation
    torch.manual_seed(0)
    silent = train(SequenceFirst(batch_first=False, cell=nn.GRU), watched=True, steps=16, first=True)
    assert silent is not None and not found(silent), silent.explain_failure()
    assert judged(silent) == (8, 0)


def test_an_lstm_at_batch_first_false_given_a_permuted_input_is_silent():
    torch.manual_seed(0)
    model = Classifier(batch_first=False, permute=True)
    train(model, watched=False)
    assert accuracy(model) > 0.9 and mates_matter(model) < 1e-5  # plain torch: each sample along its own tokens

    torch.manual_seed(0)
    dbg = train(Classifier(batch_first=False, permute=True), watched=True, steps=16)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert judged(dbg) == (8, 0)


class Tagger(nn.Module):
    """A tag per token: (batch, time) tokens, a batch-first LSTM, logits (batch, time, classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.rnn = nn.LSTM(DIM, DIM, batch_first=True)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0])


@pytest.mark.parametrize("flat", [True, False])
def test_a_tagger_with_a_loss_per_token_is_silent(flat: bool):
    def tags(tokens: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(tokens, 1) % CLASSES  # each tag needs the tokens before it in its own row

    def loop_of(model: nn.Module, steps: int) -> Callable[[], None]:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)

        def loop() -> None:
            for step in range(steps):
                tokens = batch(step)[0]
                logits = model(tokens)
                opt.zero_grad()
                if flat:  # (batch * time,) targets
                    loss = F.cross_entropy(logits.reshape(-1, CLASSES), tags(tokens).reshape(-1))
                else:  # (batch, time) targets against (batch, classes, time)
                    loss = F.cross_entropy(logits.transpose(1, 2), tags(tokens))
                loss.backward()
                opt.step()

        return loop

    torch.manual_seed(0)
    model = Tagger()
    loop_of(model, 200)()
    tokens = batch(999, 512)[0]
    with torch.no_grad():  # plain torch: it learns the tags, each row on its own
        assert float((model(tokens).argmax(-1) == tags(tokens)).float().mean()) > 0.6
    assert mates_matter(model) < 1e-5

    torch.manual_seed(0)
    watched = Tagger()
    dbg = support.watching(watched, loop_of(watched, 16), watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert judged(dbg)[1] == 0


class WordModel(nn.Module):
    """pytorch/examples' word language model in small: batchified (time, batch) tokens, a GRU at its default
    batch_first=False, a prediction per token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.rnn = nn.GRU(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0])


@pytest.mark.parametrize("columns", [BATCH, 1])
def test_a_gru_word_model_with_batchified_data_is_silent(columns: int):
    stream = torch.arange(10_000) % 7 + 2  # a corpus the model can learn: each token follows from the last
    data = stream[: (stream.numel() // columns) * columns].view(columns, -1).t().contiguous()  # (time, columns)

    def loop_of(model: nn.Module) -> Callable[[], None]:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)

        def loop() -> None:
            for step in range(24):
                i = step * SEQ
                tokens, targets = data[i : i + SEQ], data[i + 1 : i + 1 + SEQ].reshape(-1)
                opt.zero_grad()
                F.cross_entropy(model(tokens).view(-1, VOCAB), targets).backward()
                opt.step()

        return loop

    torch.manual_seed(0)
    model = WordModel()
    loop_of(model)()
    with torch.no_grad():  # plain torch: a column's predictions do not depend on the other columns
        a = data[:SEQ]
        b = torch.cat([a[:, :1], data[SEQ : 2 * SEQ, :1]], dim=1)
        assert float((model(a)[:, 0] - model(b)[:, 0]).abs().max()) < 1e-5

    torch.manual_seed(0)
    watched = WordModel()
    dbg = support.watching(watched, loop_of(watched), watched=True)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    # judged with a batch: N * T labels, the GRU's sequence holds T; with one column, N * T is T: not judged
    seen, times = judged(dbg)
    assert (seen > 0) == (columns > 1) and times == 0


@pytest.mark.parametrize("first", [False, True])
def test_batches_of_one_sample_are_silent(first: bool):
    def make() -> nn.Module:  # laid out as its layer reads it: (1, time) batch first, (time, 1) sequence first
        return SequenceFirst(batch_first=False) if first else Classifier(batch_first=True)

    torch.manual_seed(0)
    model = make()
    train(model, watched=False, steps=300, size=1, first=first)
    assert accuracy(model, first=first) > 0.9  # plain torch: it learns, one sample a step

    torch.manual_seed(0)
    watched = make()
    dbg = train(watched, watched=True, steps=16, size=1, first=first)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert judged(dbg) == (0, 0)  # a batch axis of one: not judged


def test_a_batch_of_one_read_as_one_step_is_found():
    torch.manual_seed(0)
    model = Classifier(batch_first=False)
    train(model, watched=False, steps=300, size=1)
    tokens = batch(900, 1)[0]
    other = torch.cat([batch(901, 1)[0][:, :-1], tokens[:, -1:]], dim=1)
    with torch.no_grad():  # plain torch: its output reads the last token only, the class token never
        assert float((model(tokens) - model(other)).abs().max()) < 1e-6
    assert accuracy(model) < 0.45  # its twin, batch first, learns (test_batches_of_one_sample_are_silent)

    torch.manual_seed(0)
    dbg = train(Classifier(batch_first=False), watched=True, steps=16, size=1)
    assert dbg is not None
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    text = hits[0].explanation
    assert "the one sample the loss scores" in text and "one step long" in text and "batch-mates" not in text


def test_a_packed_sequence_is_not_judged():
    class Packed(Classifier):
        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            lengths = torch.full((tokens.shape[0],), SEQ)
            _, (h, _) = self.rnn(pack_padded_sequence(self.embed(tokens), lengths, batch_first=True))
            return self.head(h[-1])

    torch.manual_seed(0)
    dbg = train(Packed(batch_first=True), watched=True, steps=16)
    assert dbg is not None and not found(dbg), dbg.explain_failure()
    assert judged(dbg) == (0, 0)  # torch lays a packed sequence out itself
