"""What a model call's arguments are to the debugger: the data is the first tensor argument, a mask is not data,
and sparse tensors are read through their values.

Ground truth by plain torch in each test: the loss falls and every gradient is finite in the healthy runs; the
corrupted run really holds an inf in its data.
"""

from __future__ import annotations

import math

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg
from neuraldbg.stats import tensors as stats

VOCAB, PAD = 12, 0


class Seq2Seq(nn.Module):
    """``nn.Transformer`` called as the translation tutorial calls it: token ids first, then the causal ``-inf``
    target mask and the key-padding masks."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.src = nn.Embedding(VOCAB, d)
        self.tgt = nn.Embedding(VOCAB, d)
        self.transformer = nn.Transformer(d, 2, 1, 1, 64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, src, tgt, tgt_mask, src_pad, tgt_pad):  # type: ignore[no-untyped-def]
        h = self.transformer(
            self.src(src),
            self.tgt(tgt),
            tgt_mask=tgt_mask,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
        return self.out(h)


def reversal_batch(step: int, batch: int = 32, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy-and-reverse 'translation' with PAD at the end of some sequences."""
    g = torch.Generator().manual_seed(step)
    src = torch.randint(3, VOCAB, (batch, length), generator=g)
    cut = torch.randint(3, length + 1, (batch,), generator=g)
    src[torch.arange(length) >= cut[:, None]] = PAD
    tgt = torch.cat([torch.ones(batch, 1, dtype=torch.long), src.flip(1)], dim=1)
    return src, tgt


def train_seq2seq(watch: bool, steps: int = 30) -> tuple[list[float], bool, NeuralDbg | None]:
    torch.manual_seed(0)
    model = Seq2Seq()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []
    finite = True
    dbg = NeuralDbg(model) if watch else None
    with dbg if dbg is not None else torch.enable_grad():
        for step in range(steps):
            src, tgt = reversal_batch(step)
            tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
            mask = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1))
            logits = model(src, tgt_in, mask, src == PAD, tgt_in == PAD)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt_out.reshape(-1), ignore_index=PAD)
            opt.zero_grad()
            loss.backward()
            finite &= all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
            opt.step()
            losses.append(float(loss))
    return losses, finite, dbg


def test_an_attention_mask_holding_minus_inf_is_not_read_as_a_non_finite_input_batch() -> None:
    plain, finite, _ = train_seq2seq(watch=False)
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    assert torch.isneginf(mask).any()  # the mask holds -inf by design
    assert finite and plain[-1] < 0.8 * plain[0]  # plain torch: it learns, every gradient finite
    watched, _, dbg = train_seq2seq(watch=True)
    assert watched == plain  # the debugger changed nothing
    assert dbg is not None and dbg.hypotheses() == [], dbg.explain_failure()


def test_the_data_argument_is_the_first_tensor_and_only_when_it_is_floating_point() -> None:
    ids, features = torch.zeros(2, 3, dtype=torch.long), torch.randn(2, 3)
    mask = torch.full((3, 3), -math.inf).triu(1)
    assert stats.data_argument((ids, mask)) is None  # token ids first: no floating data, the mask is not it
    assert stats.data_argument((features, mask)) is features
    assert stats.data_argument((), {"input_ids": ids, "attention_mask": mask}) is None
    assert stats.data_argument((), {"pixel_values": features}) is features
    assert stats.data_argument(([features, ids],)) is features  # a batch given as a list


class MaskedEncoder(nn.Module):
    """Float features first, an additive mask second."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x, src_mask=mask)[:, -1])


def test_a_non_finite_value_in_the_data_is_still_found_when_a_mask_follows_it() -> None:
    torch.manual_seed(0)
    model = MaskedEncoder()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mask = nn.Transformer.generate_square_subsequent_mask(5)
    with NeuralDbg(model) as dbg:
        for step in range(12):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(16, 5, 8, generator=g)
            if step == 6:
                x[2, 1, 3] = -math.inf  # a log(0) in the data
            assert bool(torch.isfinite(x).all()) == (step != 6)
            loss = F.mse_loss(model(x, mask), x[:, :1, 0])
            opt.zero_grad()
            loss.backward()
            opt.step()
    first = dbg.hypotheses()[0]
    assert first.kind is FailureKind.NON_FINITE
    assert first.root.event_type.value == "input" and first.root.step_start == 6


class GraphConv(nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) / math.sqrt(n_in))

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        support_ = torch.sparse.mm(x, self.weight) if x.is_sparse else x @ self.weight
        return torch.sparse.mm(adj, support_)


class GCN(nn.Module):
    def __init__(self, n_in: int, classes: int) -> None:
        super().__init__()
        self.gc1 = GraphConv(n_in, 16)
        self.gc2 = GraphConv(16, classes)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return self.gc2(F.relu(self.gc1(x, adj)), adj)


def graph(nodes: int = 60, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A stochastic block model: features sparse one-hot-ish, adjacency normalised, sparse."""
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(nodes) % classes
    same = labels[:, None] == labels[None, :]
    probs = torch.where(same, torch.tensor(0.3), torch.tensor(0.02))
    a = (torch.rand(nodes, nodes, generator=g) < probs).float()
    a = ((a + a.T) > 0).float() + torch.eye(nodes)
    d = a.sum(1).rsqrt()
    adj = (d[:, None] * a * d[None, :]).to_sparse()
    features = (torch.rand(nodes, 20, generator=g) < 0.1).float()
    features[:, :classes] += F.one_hot(labels, classes).float() * (torch.rand(nodes, 1, generator=g) < 0.5)
    return features, adj, labels


def train_gcn(sparse_features: bool, watch: bool) -> tuple[list[float], NeuralDbg | None]:
    features, adj, labels = graph()
    x = features.to_sparse() if sparse_features else features
    torch.manual_seed(0)
    model = GCN(20, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    dbg = NeuralDbg(model) if watch else None
    with dbg if dbg is not None else torch.enable_grad():
        for _ in range(40):
            opt.zero_grad()
            loss = F.cross_entropy(model(x, adj), labels)
            loss.backward()
            opt.step()
            losses.append(float(loss))
    return losses, dbg


def test_sparse_node_features_are_measured_through_their_values_and_do_not_stop_the_diagnosis() -> None:
    dense, _ = train_gcn(sparse_features=False, watch=False)
    sparse, _ = train_gcn(sparse_features=True, watch=False)
    assert sparse[-1] < 0.5 * sparse[0]  # plain torch: it learns
    assert max(abs(a - b) for a, b in zip(dense, sparse)) < 1e-4  # the same model: sparse or dense features
    watched, dbg = train_gcn(sparse_features=True, watch=True)
    assert watched == sparse
    assert dbg is not None and dbg.hypotheses() == [], dbg.explain_failure()
    assert dbg.history.get("grad_norm", "gc1") is not None  # observed, not skipped


def test_a_norm_of_a_tensor_whose_values_cannot_be_read_is_none_and_a_sparse_one_is_its_values_norm() -> None:
    t = torch.tensor([[0.0, 3.0], [4.0, 0.0]])
    assert stats.host_norm(t.to_sparse()) == 5.0
    assert stats.host_norm(t.to_sparse_csr()) == 5.0
    assert stats.host_norm(torch.empty(3, device="meta")) is None


def test_a_failure_of_the_debugger_is_quoted_by_its_first_line_only() -> None:
    from neuraldbg.capture.recorder import short_error

    message = "Could not run 'aten::op' with arguments from the 'SparseCPU' backend. " + "x" * 5000 + "\nmore"
    long = RuntimeError(message)
    text = short_error(long)
    assert text.startswith("RuntimeError('Could not run 'aten::op'") or text.startswith('RuntimeError("Could not')
    assert len(text) < 230 and "more" not in text
    assert short_error(RuntimeError("x")) == repr(RuntimeError("x"))


def test_a_with_block_nested_in_another_of_the_same_debugger_keeps_watching_after_it() -> None:
    torch.manual_seed(0)
    model = support.mlp(width=32, depth=3)
    with torch.no_grad():
        model[4].bias.fill_(-20.0)  # the ReLU after it is dead for every input (checked below)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = support.regression_batches()

    def steps(first: int, count: int) -> None:
        for step in range(first, first + count):
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()

    dbg = NeuralDbg(model)
    with dbg:
        with dbg:  # a helper that opens its own block on the same debugger
            steps(0, 3)
        assert dbg.attached  # the inner exit did not detach it
        steps(3, 12)
    assert not dbg.attached
    x, _ = batches(99)
    assert support.dead_unit_fraction(support.capture_outputs(model, x, ["5"])["5"]) == 1.0
    assert dbg.steps == 15
    dead = [h for h in dbg.hypotheses() if h.kind is FailureKind.DEAD_NEURONS]
    assert dead and dead[0].root.layer == "5" and dead[0].root.step_end >= 14


def test_training_through_functional_call_with_copied_parameters_is_an_incomplete_observation() -> None:
    from torch.func import functional_call

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    params = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    opt = torch.optim.SGD(params.values(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    y = x[:, :1] * 2 - x[:, 1:2]
    losses = []
    with NeuralDbg(model) as dbg:
        for step in range(40):
            i = (step * 32) % 256
            opt.zero_grad()
            loss = F.mse_loss(functional_call(model, params, (x[i : i + 32],)), y[i : i + 32])
            loss.backward()
            opt.step()
            losses.append(float(loss))
    assert losses[-1] < 0.3 * losses[0]  # plain torch: it learns, through the copies
    assert all(p.grad is None for p in model.parameters())  # the model's own parameters never get a gradient
    kinds = [h.kind for h in dbg.hypotheses()]
    assert kinds == [FailureKind.INCOMPLETE_OBSERVATION], dbg.explain_failure()
    assert "functional_call" in dbg.hypotheses()[0].explanation


def test_a_forgotten_backward_pass_is_still_no_gradient() -> None:
    torch.manual_seed(0)
    model = support.mlp(width=16, depth=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = support.regression_batches()
    with NeuralDbg(model) as dbg:
        for step in range(20):
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(model(x), y)  # loss.backward() forgotten
            opt.step()
    assert all(p.grad is None for p in model.parameters())
    assert [h.kind for h in dbg.hypotheses()] == [FailureKind.NO_GRADIENT]
