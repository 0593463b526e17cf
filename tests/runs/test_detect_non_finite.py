"""Non-finite values, rooted where they were born (checked with plain torch): a NaN batch, a layer that makes them,
a loss that turns NaN while outputs are finite."""

from __future__ import annotations

import math

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import EventType, FailureKind, NeuralDbg

# --------------------------------------------------------------------------------------------- non-finite


def test_a_nan_batch_at_step_k_is_a_data_problem_at_step_k():
    torch.manual_seed(0)
    model = support.mlp()
    clean = support.regression_batches()

    def batches(step: int) -> support.Batch:
        x, y = clean(step)
        if step == 23:
            x = x.clone()
            x[4, 2] = float("nan")
        return x, y

    dbg, _ = support.train(model, batches)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE
    assert top.root.event_type is EventType.INPUT
    assert top.root.layer == ""
    assert top.root.step_start == 23
    assert "input batch at step 23" in top.explanation
    assert len(dbg.hypotheses()) == 1


class LogLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)  # NaN for negative inputs


def test_a_non_finite_value_born_inside_a_layer_is_blamed_on_that_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), LogLayer(), nn.Linear(32, 1))
    batches = support.regression_batches()
    outs = support.capture_outputs(model, batches(0)[0], ["2", "3"])
    assert bool(torch.isfinite(outs["2"]).all()) and not bool(torch.isfinite(outs["3"]).all())

    dbg, _ = support.train(model, batches, steps=10)

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE
    assert top.root.layer == "3"
    assert top.root.step_start == 0


def test_a_loss_that_turns_nan_while_outputs_are_finite_is_blamed_on_the_loss():
    torch.manual_seed(0)
    model = support.mlp()
    calls = [0]

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(out, target)
        if calls[0] >= 12:
            loss = loss + torch.log(out.sum() * 0.0)  # log(0): the loss, not the model, goes non-finite
        calls[0] += 1
        return loss

    dbg, losses = support.train(model, support.regression_batches(), loss_fn, steps=20)
    assert torch.isfinite(torch.tensor(losses[11])) and not torch.isfinite(torch.tensor(losses[12]))

    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE
    assert top.root.event_type is EventType.LOSS
    assert top.root.step_start == 12


# --- non-finite values the model's own code deals with --------------------------------------------------------------


class Imputing(nn.Module):
    """A tabular regression whose missing values are NaN in the batch, filled inside ``forward`` with learned
    values beside a missingness indicator (a common tabular idiom); ``impute=False`` feeds the NaN on."""

    def __init__(self, impute: bool = True) -> None:
        super().__init__()
        self.impute = impute
        self.fill = nn.Parameter(torch.zeros(8))
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        missing = torch.isnan(x)
        filled = torch.where(missing, self.fill.expand_as(x), x) if self.impute else x
        return self.net(torch.cat([filled, missing.float()], dim=1))


def _missing_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(1, keepdim=True)
    return x.masked_fill(torch.rand(64, 8, generator=g) < 0.2, float("nan")), y


def _fit(model: nn.Module, batch, loss_fn, watched: bool, steps: int = 60):
    """support's loops under Adam 1e-2: the losses, and the debugger when watched."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    if watched:
        dbg, losses = support.train(model, batch, loss_fn, steps=steps, optimizer=opt)
        return losses, dbg
    return support.plain_train(model, batch, loss_fn, steps=steps, optimizer=opt), None


def test_missing_values_imputed_inside_forward_are_not_a_non_finite_failure():
    torch.manual_seed(0)
    losses, _ = _fit(Imputing(), _missing_batch, F.mse_loss, watched=False)
    # plain torch: every batch holds NaN, yet every loss is finite and the fit learns
    assert torch.isnan(_missing_batch(0)[0]).any()
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.3 * losses[0]
    torch.manual_seed(0)
    watched, dbg = _fit(Imputing(), _missing_batch, F.mse_loss, watched=True)
    assert watched == losses
    assert dbg is not None and FailureKind.NON_FINITE not in {h.kind for h in dbg.hypotheses()}, dbg.explain_failure()

    # the same NaN fed on, unimputed: the loss is NaN and it is a data problem at the input
    torch.manual_seed(0)
    _, bad = _fit(Imputing(impute=False), _missing_batch, F.mse_loss, watched=True, steps=5)
    assert bad is not None and bad.hypotheses()[0].kind is FailureKind.NON_FINITE
    assert bad.hypotheses()[0].root.step_start == 0


def _moves(legal_target: bool):
    def batch(step: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 12, generator=g)
        y = x[:, :8].argmax(1)
        mask = torch.where(torch.rand(64, 8, generator=g) < 0.5, float("-inf"), 0.0)
        mask[torch.arange(64), y] = 0.0 if legal_target else float("-inf")
        return (x, mask), y

    return batch


class Masked(nn.Module):
    """A move predictor that adds an additive legal-move mask (0 legal, -inf not) to its logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, mask = inputs
        return self.net(x) + mask


def test_a_mask_of_minus_inf_added_to_the_logits_is_not_a_non_finite_failure():
    torch.manual_seed(0)
    losses, _ = _fit(Masked(), _moves(legal_target=True), F.cross_entropy, watched=False)
    # plain torch: the logits hold -inf on every step, the loss is finite and falls
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.5 * losses[0]
    torch.manual_seed(0)
    watched, dbg = _fit(Masked(), _moves(legal_target=True), F.cross_entropy, watched=True)
    assert watched == losses
    assert dbg is not None and dbg.healthy, dbg.explain_failure()

    # a target the mask forbids: the loss is inf at once, found at step 0
    torch.manual_seed(0)
    _, bad = _fit(Masked(), _moves(legal_target=False), F.cross_entropy, watched=True, steps=5)
    assert bad is not None and bad.hypotheses()[0].kind is FailureKind.NON_FINITE
    assert bad.hypotheses()[0].root.step_start == 0


class MaskedPool(nn.Module):
    """Attention pooling over tokens with padding masked by -inf before an ``nn.Softmax`` module: a sequence that
    is all padding gives a row of NaN, zeroed by ``nan_to_num`` after the softmax (``where="attention"``) or only
    on the logits (``where="logits"``: the forward is finite, the NaN flows back into the gradients)."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.emb = nn.Embedding(10, 32, padding_idx=0)
        self.score = nn.Linear(32, 1)
        self.softmax = nn.Softmax(dim=-1)
        self.head = nn.Linear(32, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        weights = self.softmax(self.score(h).squeeze(-1).masked_fill(tokens == 0, float("-inf")))
        if self.where == "attention":
            weights = torch.nan_to_num(weights, nan=0.0)
        logits = self.head((weights[..., None] * h).sum(1))
        return torch.nan_to_num(logits, nan=0.0) if self.where == "logits" else logits


def _token_batch(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of 0-8 tokens padded to 8 (about one in nine all padding); the label: whether token 3 occurs."""
    lengths = torch.randint(0, 9, (n,), generator=g)
    tokens = torch.randint(1, 10, (n, 8), generator=g) * (torch.arange(8) < lengths[:, None])
    return tokens, ((tokens == 3).sum(1) > 0).long()


def _pool_run(where: str, steps: int = 200) -> tuple[NeuralDbg, MaskedPool, list[bool], bool]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = MaskedPool(where)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    finite, nan_rows = [], False
    with NeuralDbg(model) as dbg:
        for _ in range(steps):
            tokens, y = _token_batch(64, g)
            with torch.no_grad():
                scores = model.score(model.emb(tokens)).squeeze(-1).masked_fill(tokens == 0, float("-inf"))
                nan_rows = nan_rows or bool(torch.isnan(model.softmax(scores)).any())
            opt.zero_grad()
            loss = F.cross_entropy(model(tokens), y)
            loss.backward()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            finite.append(bool(torch.isfinite(loss)) and all(bool(torch.isfinite(gr).all()) for gr in grads))
            opt.step()
    return dbg, model, finite, nan_rows


def test_nan_rows_of_a_softmax_module_zeroed_before_the_loss_are_not_a_non_finite_failure():
    dbg, model, finite, nan_rows = _pool_run("attention")
    # plain torch: the softmax module gives NaN rows for sequences that are all padding, yet every loss and every
    # gradient is finite and the model learns the task
    tokens, y = _token_batch(2000, torch.Generator().manual_seed(2))
    with torch.no_grad():
        accuracy = float((model(tokens).argmax(1) == y).float().mean())
    assert nan_rows and all(finite)
    assert accuracy > 0.95 and accuracy > float(y.float().mean()) + 0.2
    assert dbg.healthy, dbg.explain_failure()


def test_nan_rows_of_a_softmax_module_that_reach_the_gradients_are_found_at_the_softmax():
    dbg, _, finite, nan_rows = _pool_run("logits", steps=20)
    # plain torch: the loss is finite (the logits are cleaned) but the first step's gradients hold NaN
    assert nan_rows and not finite[0]
    top = dbg.hypotheses()[0]
    assert top.kind is FailureKind.NON_FINITE and top.root.layer == "softmax" and top.root.step_start == 0
