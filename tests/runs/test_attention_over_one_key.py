"""An attention whose softmax has a single key (a sequence of length 1; MobileViT's last stage on images under 128 px,
whose 2x2 feature map with patch size 2 is one patch) gives its query and key exactly zero gradient by construction:
the weight of one key is 1 whatever the scores. The model trains through the value path. The debugger cannot tell
this from scores cut off from the loss (the same zeros in an attention over many keys whose scores a mask of zeros
multiplies, a real fault, found below),
so it reports the zeros, and names a softmax over a single key among their causes, with a fix that says the
training is unharmed. Ground truth in plain torch: the query's and key's gradients, the value's, the accuracy."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

WIDTH = 32


class SelfAttention(nn.Module):
    """Single-head self-attention with its own query, key and value projections (as Hugging Face models have);
    ``zero_mask``: its scores are multiplied by a mask of zeros (a 0/1 padding mask multiplied in where it should
    be added as -inf, here hiding every key), which cuts them off from the loss."""

    def __init__(self, zero_mask: bool) -> None:
        super().__init__()
        self.query, self.key, self.value = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.zero_mask = zero_mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.query(x) @ self.key(x).transpose(-1, -2) / math.sqrt(WIDTH)
        if self.zero_mask:
            scores = scores * torch.zeros(scores.shape[-1])
        return torch.softmax(scores, dim=-1) @ self.value(x)


class Net(nn.Module):
    """Features cut into ``tokens`` tokens, a pre-norm attention block with a residual, mean pooling, a head."""

    def __init__(self, tokens: int, zero_mask: bool = False) -> None:
        super().__init__()
        self.tokens = tokens
        self.embed = nn.Linear(16, WIDTH * tokens)
        self.norm = nn.LayerNorm(WIDTH)
        self.attn = SelfAttention(zero_mask)
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).view(len(x), self.tokens, WIDTH)
        return self.head((h + self.attn(self.norm(h))).mean(1))


def _batch(seed: int, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed))
    return x, (x @ w).argmax(1)


def _train(model: Net) -> tuple[NeuralDbg, list[dict[str, float]], float]:
    """150 steps of Adam under the debugger: each step's gradient norms of query, key and value, and the held-out
    accuracy."""
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    norms = []
    with NeuralDbg(model) as dbg:
        for step in range(150):
            x, y = _batch(step, w)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            attn = model.attn
            norms.append({n: float(getattr(attn, n).weight.grad.norm()) for n in ("query", "key", "value")})
            opt.step()
    x, y = _batch(999, w)
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    return dbg, norms, accuracy


def test_an_attention_over_a_single_key_is_named_with_its_zeros_and_the_training_unharmed():
    torch.manual_seed(0)
    dbg, norms, accuracy = _train(Net(tokens=1))
    # plain torch: query and key exactly zero at every step, the value path trains, and so does the model
    assert all(n["query"] == 0.0 and n["key"] == 0.0 for n in norms)
    assert min(n["value"] for n in norms) > 1e-3
    assert accuracy > 0.9

    found = [h for h in dbg.hypotheses() if h.kind is FailureKind.VANISHING_GRADIENTS]
    assert found and found[0].root.layer in ("attn.query", "attn.key"), dbg.report()
    assert "softmax over a single key" in found[0].explanation
    assert "unharmed" in found[0].suggestion


def test_an_attention_over_many_keys_whose_scores_are_masked_to_zero_is_still_found():
    torch.manual_seed(0)
    model = Net(tokens=8, zero_mask=True)
    start = model.attn.query.weight.detach().clone()
    dbg, norms, _ = _train(model)
    # plain torch: the scores never reach the loss, so the query and key never learn where to attend (the weights
    # stay uniform over the 8 keys and the query never moves)
    assert all(n["query"] == 0.0 and n["key"] == 0.0 for n in norms)
    assert min(n["value"] for n in norms) > 1e-3
    assert torch.equal(model.attn.query.weight, start)

    found = [h for h in dbg.hypotheses() if h.kind is FailureKind.VANISHING_GRADIENTS]
    assert found and found[0].root.layer in ("attn.query", "attn.key"), dbg.report()
