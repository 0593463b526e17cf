"""The reads behind ``missing_causal_mask``'s masks, shape by shape: whether a mask hides every later key
(:func:`~neuraldbg.stats.tensors.hides_later`), in the rows a loss scores only, and which positions a next-token
``nll_loss`` scores (:func:`~neuraldbg.capture.loss_graph.scored_positions`). The runs that need them are in
tests/runs/test_detect_missing_causal_mask_graph.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from neuraldbg.capture import loss_graph
from neuraldbg.stats import tensors as stats

T = 6
LATER = torch.ones(T, T, dtype=torch.bool).triu(1)  # True: a later key, hidden by a causal mask


def test_a_causal_mask_hides_every_later_key_in_every_batch_element_and_head():
    assert stats.hides_later(LATER)
    assert stats.hides_later(LATER.expand(2, 3, T, T))  # batch and heads, one grid each
    assert stats.hides_later(LATER | torch.eye(T, dtype=torch.bool).roll(-2, 1).tril())  # more hidden: still causal
    one_open = LATER.expand(2, 3, T, T).clone()
    one_open[1, 2, 0, T - 1] = False  # one head of one element lets position 0 see the last key
    assert not stats.hides_later(one_open)
    assert not stats.hides_later(~LATER)  # the wrong way round
    assert not stats.hides_later(torch.zeros(2, 1, 1, T, dtype=torch.bool))  # a padding mask, broadcast over queries


def test_a_mask_per_batch_element_and_head_is_kept_as_one_grid():
    """Hidden where every element and head hides: the grid a mask of shape (batch, heads, T, T) is judged by."""
    per_head = LATER.expand(2, 3, T, T).clone()
    per_head[0, 1, 2, 4] = False  # one head of one element lets position 2 see position 4
    grid = stats.hidden_grid(per_head)
    assert grid.shape == (T, T) and not grid[2, 4] and grid[2, 5] and not grid[4, 2]
    assert stats.hidden_grid(LATER) is LATER  # one grid already


def test_a_mask_is_judged_in_the_rows_given_only():
    prefix = LATER.clone()
    prefix[:, :3] = False  # a prefix LM's: every position sees the first three
    scored = torch.tensor([False, False, True, True, True, True])
    assert not stats.hides_later(prefix)
    assert stats.hides_later(prefix, scored)  # the rows that see later keys are not scored
    assert not stats.hides_later(prefix, torch.tensor([False, True, True, True, True, True]))
    assert not stats.hides_later(prefix, torch.ones(T + 1, dtype=torch.bool))  # rows of another length: all count


def test_a_float_mask_hides_at_minus_ten_thousand_or_below():
    future = torch.zeros(T, T).masked_fill(LATER, float("-inf"))
    assert stats.hides_later(stats.hidden_positions(future, attend_is_one=False))
    assert stats.hides_later(stats.hidden_positions(future.clamp(min=-1e4), attend_is_one=False))
    assert not stats.hides_later(stats.hidden_positions(future.clamp(min=-1e3), attend_is_one=False))
    ones = torch.ones(T, T).tril()  # 1 where a position may attend: added to the scores, it hides nothing
    assert not stats.hides_later(stats.hidden_positions(ones, attend_is_one=False))


def nll_node(targets: torch.Tensor, tokens: torch.Tensor, classes: int = 5) -> object:
    """The ``nll_loss`` node of a cross-entropy over ``targets``, as the ledger finds it below the loss."""
    logits = torch.randn(targets.numel(), classes, requires_grad=True)
    found = loss_graph.next_token_nll([F.cross_entropy(logits, targets.reshape(-1))], tokens)
    assert found is not None
    return found[0]


def test_scored_positions_follow_the_targets_layout_and_ignore_index():
    tokens = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 1]])
    targets = torch.cat([tokens[:, 1:], torch.tensor([[1], [2]])], 1)  # the next token at every position
    targets[:, :2] = -100  # a prefix left out
    scored = loss_graph.scored_positions(nll_node(targets, tokens), tokens)
    assert scored is not None and scored.tolist() == [False, False, True, True, True, True]
    shifted = tokens[:, 1:].clone()  # one target fewer than positions: the last has no next token
    scored = loss_graph.scored_positions(nll_node(shifted, tokens), tokens)
    assert scored is not None and scored.tolist() == [True, True, True, True, True, False]
    assert loss_graph.scored_positions(nll_node(shifted, tokens), tokens[:, :3]) is None  # targets that do not fit
