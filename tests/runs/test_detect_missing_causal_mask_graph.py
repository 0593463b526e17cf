"""``missing_causal_mask`` where the attention is no ``nn.MultiheadAttention``: a nanoGPT-style block calling
``F.scaled_dot_product_attention`` without ``is_causal=True``, and an attention written by hand with no mask before
its softmax, both found in the loss's graph (capture/attention_graph.py). Ground truth is plain torch in each test:
an earlier position's logits move when a later token changes (the leak), the loss falls below the floor its masked
twin keeps, generation from a two-token prompt fails. Silent twins: the same models masked (``is_causal=True``,
``masked_fill`` before the softmax, a boolean causal ``attn_mask``); a masked language model over the unmasked
attention (bidirectional by design); a causal decoder whose cross-attention reads an image memory as long as its
tokens, both given one slice of a positional table."""

from __future__ import annotations

from functools import partial

import support
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

KIND = "missing_causal_mask"
V, T, D, H = 16, 16, 32, 4
STEPS, BATCH = 100, 64
PREFIX = 4  # a prefix LM's bidirectional positions


def sequences(n: int, seed: int) -> torch.Tensor:
    """x_t = (a + k t) mod V: the first two tokens fix the rest."""
    return support.counting_sequences(n, seed, V, T)


class Attention(nn.Module):
    """nanoGPT's causal self-attention: one fused projection split in three. ``how``: "fused" (no mask), "rope"
    (rotary queries and keys, no mask), "causal" (``is_causal=True``), "bool_mask" (a boolean causal ``attn_mask``),
    "written" (by hand, no mask), "filled" (by hand, ``masked_fill`` of the later keys before the softmax),
    "inverted" (``masked_fill`` of the earlier ones), "zeros" (``tril`` of the scores), "kept" (``where`` keeping the
    earlier ones); masks added to the scores: "ones" (a float ``tril`` of ones: it hides nothing), "added" (0 on the
    past, -inf on the future), "alibi" (ALiBi's distance penalty alone), "alibi_causal" (with its causal part);
    "queries" (masked, then the softmax over the queries' axis); given to the fused kernel: "fused_zeros" (a 4-d
    ``attn_mask`` of zeros, a padding mask with no causal part), "fused_float" (0 on the past, -inf on the
    future), "prefix" (a prefix LM's: causal, but the first :data:`PREFIX` positions see each other); after the
    softmax: "dropped" (no mask, dropout on the probabilities: on a CPU a product by its mask), "filled_dropped"
    (masked, then dropout), "after" (a 0/1 causal mask applied to the probabilities, not renormalised),
    "renormalised" (the same, then divided by the rows' sums)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.c_attn, self.c_proj, self.how = nn.Linear(D, 3 * D), nn.Linear(D, D), how
        self.register_buffer("later", torch.ones(T, T, dtype=torch.bool).triu(1))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)
        if memory is not None:  # a cross-attention: keys and values from the memory
            _, k, v = self.c_attn(memory).split(D, dim=2)
        q, k, v = (t.view(b, -1, H, D // H).transpose(1, 2) for t in (q, k, v))
        later = self.later[:n, :n]
        if self.how == "rope":  # LLaMA's rotary embedding of the queries and keys, then no causal flag
            q, k = rotate(q), rotate(k)
        future = torch.zeros(n, n).masked_fill(later, float("-inf"))  # an additive causal mask
        distance = -(torch.arange(n).view(n, 1) - torch.arange(n).view(1, n)).abs().float()
        slopes = 2.0 ** -torch.arange(1, H + 1).float().view(H, 1, 1)  # ALiBi: one slope per head
        if self.how in ("fused", "rope"):
            y = F.scaled_dot_product_attention(q, k, v)
        elif self.how == "causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.how == "bool_mask":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=~later)
        elif self.how == "fused_zeros":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(b, 1, n, n))
        elif self.how == "fused_float":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=future)
        elif self.how == "prefix":  # a prefix LM's: its first PREFIX positions see each other
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=~later | (torch.arange(n) < PREFIX))
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / (D // H) ** 0.5)
            if self.how in ("filled", "queries", "filled_dropped"):
                scores = scores.masked_fill(later, float("-inf"))
            elif self.how == "inverted":  # the mask the wrong way round: the past hidden, the future shown
                scores = scores.masked_fill(later.T, float("-inf"))
            elif self.how == "zeros":  # tril leaves 0 above the diagonal, which the softmax still weighs
                scores = scores.tril()
            elif self.how == "kept":
                scores = torch.where(~later, scores, float("-inf"))
            elif self.how == "ones":  # 1 where a position may attend, 0 where not: added, it hides nothing
                scores = scores + torch.ones(n, n).tril()
            elif self.how == "added":
                scores = scores + future
            elif self.how == "alibi":
                scores = scores + slopes * distance
            elif self.how == "alibi_causal":
                scores = scores + slopes * distance + future
            weights = F.softmax(scores, dim=-2 if self.how == "queries" else -1).nan_to_num()
            if self.how in ("dropped", "filled_dropped"):
                weights = F.dropout(weights, 0.1, training=self.training)
            elif self.how in ("after", "renormalised"):
                weights = weights * (~later).float()
                if self.how == "renormalised":
                    weights = weights / weights.sum(-1, keepdim=True)
            y = weights @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, n, D))


def rotate(x: torch.Tensor) -> torch.Tensor:
    """LLaMA's rotary position embedding of (batch, heads, length, dim) queries or keys."""
    n, half = x.shape[-2], x.shape[-1] // 2
    angle = torch.arange(n).view(n, 1) / 10000 ** (torch.arange(half).view(1, half) / half)
    cos, sin = torch.cat([angle.cos(), angle.cos()], -1), torch.cat([angle.sin(), angle.sin()], -1)
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Block(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(D), Attention(how), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V + 1, D), nn.Embedding(T, D)
        self.h = nn.ModuleList([Block(how) for _ in range(2)])
        self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))


def train_lm(how: str, watched: bool):
    """Next-token training: the model reads x[:, :-1] and is scored on x[:, 1:]. Returns the model, the mean loss
    of the last 10 steps and the debugger (None when not watched)."""
    torch.manual_seed(0)
    model = GPT(how)
    loss, dbg = support.next_token_fit(model, sequences(STEPS * BATCH, 1), BATCH, 3e-3, watched)
    return model, loss, dbg


def leak(model: nn.Module) -> float:
    """How much position 3's logits move when the tokens after it change."""
    return support.later_token_leak(model, sequences(8, 5)[:, :-1], V)


def generation_accuracy(model: nn.Module) -> float:
    return support.greedy_accuracy(model, sequences(256, 999))


def found(dbg) -> list:
    assert dbg is not None
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_a_fused_attention_without_is_causal_is_found_and_its_causal_twin_is_silent():
    model, loss, _ = train_lm("fused", watched=False)
    twin, twin_loss, _ = train_lm("causal", watched=False)
    # plain torch: an earlier position sees later tokens, the loss falls below the masked twin's floor (two
    # unpredictable tokens of fifteen targets), generation, with no later tokens to look at, fails
    assert leak(model) > 1e-2 and leak(twin) == 0.0
    assert loss < 0.5 * twin_loss, (loss, twin_loss)
    assert generation_accuracy(model) < 0.5 < generation_accuracy(twin)

    _, _, dbg = train_lm("fused", watched=True)
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert dbg.hypotheses()[0].kind.value == KIND
    root = hits[0].root
    assert root.detail == "h.0.attn, h.1.attn"  # the layers whose code runs the attention, not their c_proj
    assert root.metrics["share"] >= 0.9 and root.metrics["found"] == root.metrics["read"] >= 2
    assert "is_causal=True" in hits[0].suggestion

    for how in ("causal", "bool_mask"):
        _, _, silent = train_lm(how, watched=True)
        assert not found(silent), (how, silent.explain_failure())
        assert not silent._recorder.coverage.uncausal_attention, how


def test_a_hand_written_attention_without_its_mask_is_found_and_its_masked_twin_is_silent():
    model, loss, _ = train_lm("written", watched=False)
    twin, twin_loss, _ = train_lm("filled", watched=False)
    assert leak(model) > 1e-2 and leak(twin) == 0.0  # plain torch
    assert loss < 0.5 * twin_loss, (loss, twin_loss)
    assert generation_accuracy(model) < 0.5 < generation_accuracy(twin)

    _, _, dbg = train_lm("written", watched=True)
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.detail == "h.0.attn, h.1.attn"

    _, _, silent = train_lm("filled", watched=True)
    assert not found(silent), silent.explain_failure()
    assert not silent._recorder.coverage.uncausal_attention


def test_a_masked_language_model_over_an_unmasked_fused_attention_is_silent():
    """Bidirectional by design: a fifth of the tokens replaced by a mask id, scored on those positions only, their
    targets the input's own original tokens."""
    torch.manual_seed(0)
    dbg = support.masked_token_fit(GPT("fused"), sequences(48 * BATCH, 2), BATCH, 3e-3, V)
    assert dbg._recorder.coverage.uncausal_attention  # the attention ran unmasked, as it should here
    readings = dbg._recorder.coverage.next_token
    assert readings and max(share for _, share in readings) < 0.5  # its targets are not the next tokens
    assert not found(dbg), dbg.explain_failure()


class Captioner(nn.Module):
    """A causal decoder over an image's 15 patch features: its self-attention ``is_causal``, its cross-attention
    unmasked over the patches (as long as its tokens), both streams given the same positions: a slice of one table
    plus one lookup of another (``nn.Embedding`` at ``torch.arange``); the patches' mean, projected, is added to every
    token (show-and-tell style)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.patch = nn.Embedding(V + 1, D), nn.Linear(8, D)
        self.pos = nn.Parameter(0.02 * torch.randn(T, D))
        self.table, self.glance = nn.Embedding(T, D), nn.Linear(D, D)
        self.self_attn, self.cross_attn = Attention("causal"), Attention("fused")
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, image: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        pos = self.pos[: x.shape[1]] + self.table(torch.arange(x.shape[1]))
        memory = self.patch(image) + pos
        h = self.tok(x) + pos + self.glance(memory.mean(1, keepdim=True))  # the image's pooled feature on every token
        h = h + self.self_attn(self.ln(h))
        return self.head(h + self.cross_attn(h, memory))


def test_a_causal_decoder_cross_attending_to_a_memory_as_long_as_its_tokens_is_silent():
    torch.manual_seed(0)
    model = Captioner()
    images = torch.randn(BATCH, T - 1, 8, generator=torch.Generator().manual_seed(11))
    # plain torch: no position sees a later token
    assert support.later_token_leak(lambda x: model(images, x), sequences(BATCH, 5)[:, :-1], V) == 0.0
    _, dbg = support.next_token_fit(model, sequences(48 * BATCH, 10), BATCH, 3e-3, True, call=lambda m, x: m(images, x))
    # the unmasked cross-attention is no self-attention
    assert dbg is not None and not dbg._recorder.coverage.uncausal_attention
    assert not found(dbg), dbg.explain_failure()


def test_masks_the_wrong_way_round_or_of_zeros_are_found_and_a_where_that_keeps_the_past_is_silent():
    for how in ("inverted", "zeros", "rope"):
        model, _, dbg = train_lm(how, watched=True)
        assert leak(model) > 1e-2, how  # plain torch: earlier positions see later tokens
        assert found(dbg), (how, dbg.explain_failure())
    model, _, dbg = train_lm("kept", watched=True)
    assert leak(model) == 0.0  # plain torch
    assert not found(dbg), dbg.explain_failure()


class Tasked(GPT):
    """The causal GPT of the tests above with a second head: an unmasked attention pooler over its states predicts a
    label per sequence (its first token), beside the next-token loss; the language model's path stays causal."""

    def __init__(self) -> None:
        super().__init__("causal")
        self.pooler, self.label = Attention("fused"), nn.Linear(D, V)

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return self.head(x), self.label(self.pooler(x).mean(1))


def test_an_unmasked_attention_that_feeds_another_head_alone_is_silent():
    torch.manual_seed(0)
    model = Tasked()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = sequences(48 * BATCH, 13)

    def loop() -> None:
        for step in range(48):
            x = data[step * BATCH : (step + 1) * BATCH]
            opt.zero_grad()
            logits, label = model(x[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1)) + F.cross_entropy(label, x[:, 0])
            loss.backward()
            opt.step()

    dbg = support.watching(model, loop, True)
    # plain torch: the language model's logits at position 3 ignore the later tokens
    assert support.later_token_leak(lambda x: model(x)[0], sequences(8, 5)[:, :-1], V) == 0.0
    assert dbg is not None and not dbg._recorder.coverage.uncausal_attention  # the pooler's is not the objective's
    assert not found(dbg), dbg.explain_failure()


class Called(GPT):
    """nanoGPT's own call, ``model(idx, targets)``, the loss computed inside."""

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return F.cross_entropy(super().forward(idx).reshape(-1, V), targets.reshape(-1))


def test_a_model_given_its_tokens_and_their_targets_is_read_through_the_tokens():
    torch.manual_seed(0)
    model = Called("fused")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = sequences(48 * BATCH, 14)

    def loop() -> None:
        for step in range(48):
            x = data[step * BATCH : (step + 1) * BATCH]
            opt.zero_grad()
            model(x[:, :-1], x[:, 1:]).backward()
            opt.step()

    dbg = support.watching(model, loop, True)
    # plain torch: position 3 sees the tokens after it
    assert support.later_token_leak(lambda x: GPT.forward(model, x), sequences(8, 5)[:, :-1], V) > 1e-2
    assert found(dbg), dbg.explain_failure()


class Checkpointed(GPT):
    """The fused-attention GPT with each block under non-reentrant activation checkpointing: its saved tensors are
    held by hooks that run the block's forward again when they are unpacked."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(self.ln_f(x))


def test_attention_under_activation_checkpointing_is_read_without_running_its_blocks_again():
    def run(watched: bool) -> tuple[int, object]:
        torch.manual_seed(0)
        model = Checkpointed("fused")
        calls: list[int] = []
        model.h[0].attn.c_attn.register_forward_hook(lambda m, i, o: calls.append(1))
        _, dbg = support.next_token_fit(model, sequences(24 * BATCH, 15), BATCH, 3e-3, watched)
        return len(calls), dbg

    plain, _ = run(watched=False)
    watched, dbg = run(watched=True)
    # plain torch: each step runs the block's forward twice, once more in its backward pass; the debugger's reads
    # of the graph before the backward pass unpack nothing, so they run it no third time
    assert plain == 2 * 24
    assert watched == plain
    assert found(dbg), dbg.explain_failure()  # the fused kernel's flag and shapes are read all the same


def test_masks_added_to_the_scores_are_judged_by_the_weights_they_leave_the_later_keys():
    """ALiBi alone, and a float ``tril`` of ones added as if it were a mask (1 where a position may attend), leave the
    later keys weighed: found. The same with -inf on the later keys hides them: silent. Read from the softmax's saved
    probabilities, whatever was added."""
    for how in ("ones", "alibi"):
        model, _, dbg = train_lm(how, watched=True)
        assert leak(model) > 1e-2, how  # plain torch: earlier positions see later tokens
        hits = found(dbg)
        assert hits, (how, dbg.explain_failure())
        assert hits[0].root.detail == "h.0.attn, h.1.attn" and not hits[0].root.metrics["over_queries"]
    for how in ("added", "alibi_causal"):
        model, _, dbg = train_lm(how, watched=True)
        assert leak(model) == 0.0, how  # plain torch
        assert not found(dbg), (how, dbg.explain_failure())
        assert not dbg._recorder.coverage.uncausal_attention, how


def test_a_softmax_over_the_queries_is_found_as_a_leak_whatever_its_mask():
    """Masked, then normalised over the queries' axis (``softmax(dim=-2)``): each weight is divided by a sum over the
    later queries, so an earlier position's output moves with the later tokens."""
    model, loss, _ = train_lm("queries", watched=False)
    twin, twin_loss, _ = train_lm("filled", watched=False)
    assert leak(model) > 1e-2 and leak(twin) == 0.0  # plain torch
    assert loss < twin_loss, (loss, twin_loss)  # it reads the later positions
    assert generation_accuracy(model) < generation_accuracy(twin)

    _, _, dbg = train_lm("queries", watched=True)
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    root = hits[0].root
    assert root.detail == "h.0.attn, h.1.attn" and root.metrics["over_queries"] == 1.0
    assert "over the queries" in hits[0].explanation and "softmax(dim=-1)" in hits[0].suggestion
    assert dbg._recorder.coverage.query_softmax == {"h.0.attn", "h.1.attn"}


def test_a_fused_attention_given_a_mask_that_hides_no_later_key_is_found():
    """A 4-d ``attn_mask`` of zeros (a padding mask with no causal part): found; 0 and -inf, as torch's causal mask
    is made: silent."""
    model, _, dbg = train_lm("fused_zeros", watched=True)
    assert leak(model) > 1e-2  # plain torch
    assert found(dbg), dbg.explain_failure()
    model, _, dbg = train_lm("fused_float", watched=True)
    assert leak(model) == 0.0  # plain torch
    assert not found(dbg), dbg.explain_failure()
    assert not dbg._recorder.coverage.uncausal_attention


def test_a_prefix_lm_is_judged_on_the_positions_its_loss_scores():
    """Its first :data:`PREFIX` positions see each other by design, and its loss leaves them out (but the last,
    whose target is the first token after the prefix): silent. Scored there too, the prefix's positions are trained
    on tokens they see: found."""
    torch.manual_seed(0)
    model = GPT("prefix")
    _, dbg = support.next_token_fit(model, sequences(48 * BATCH, 15), BATCH, 3e-3, True, unscored=PREFIX - 1)
    tokens = sequences(8, 5)[:, :-1]
    # plain torch: scored position 3 sees no later token, while position 1, in the prefix, sees positions 2 and 3
    assert support.later_token_leak(model, tokens, V) == 0.0
    assert support.later_token_leak(model, tokens, V, position=1, until=PREFIX) > 1e-2
    assert not found(dbg), dbg.explain_failure()
    assert dbg is not None and not dbg._recorder.coverage.uncausal_attention

    torch.manual_seed(0)
    _, dbg = support.next_token_fit(GPT("prefix"), sequences(48 * BATCH, 15), BATCH, 3e-3, True)
    assert found(dbg), dbg.explain_failure()


def test_what_follows_the_softmax_is_walked_through_when_it_keeps_each_weight_where_it_was():
    """Dropout on the probabilities (on a CPU a product by its mask) hides nothing: unmasked, found; masked, silent.
    A 0/1 causal mask applied to the probabilities leaves the later keys in their normaliser: found (plain torch: an
    earlier logit moves with the later tokens); divided again by the rows' sums, it is a causal softmax: silent."""
    for how, leaks in (("dropped", True), ("filled_dropped", False), ("after", True), ("renormalised", False)):
        model, _, dbg = train_lm(how, watched=True)
        model.eval()  # plain torch, without dropout's noise
        # (renormalised, the later keys move the rows' sums by rounding alone: ~1e-6)
        assert (leak(model) > 1e-3) is leaks and (leaks or leak(model) < 1e-4), (how, leak(model))
        assert bool(found(dbg)) is leaks, (how, dbg.explain_failure() if dbg else "")


class GivenMask(GPT):
    """Called as ``model(input_ids, attention_mask)`` by position, the mask an integer tensor of ones."""

    def forward(self, idx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(idx) * mask.unsqueeze(-1)


def test_tokens_given_beside_an_integer_mask_of_ones_are_read():
    def call(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(x, torch.ones_like(x))  # model(input_ids, attention_mask), by position

    for how, leaks in (("fused", True), ("causal", False)):
        torch.manual_seed(0)
        model = GivenMask(how)
        _, dbg = support.next_token_fit(model, sequences(48 * BATCH, 17), BATCH, 3e-3, True, call=call)
        assert (support.later_token_leak(partial(call, model), sequences(8, 5)[:, :-1], V) > 1e-2) is leaks
        assert bool(found(dbg)) is leaks, (how, dbg.explain_failure() if dbg else "")
