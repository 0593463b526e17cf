"""A decoder language model built from ``nn.TransformerEncoder`` without its causal mask (``missing_causal_mask``):
each position attends to the tokens after it, its own target among them. Ground truth is plain torch in each test:
an earlier position's logits move when a later token changes (the leak), the training loss falls far below the
floor its twin with the mask reaches, and greedy generation from a two-token prompt fails. Silent twins: the same
model with the mask; a masked language model over the same encoder, bidirectional by design (its targets are its
input's own tokens); a sequence-to-sequence copy model given a source and a target sequence (its encoder sees all
of the source by design, its decoder is masked)."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.capture.forward import GRAPH_CAUSAL_CHECKS

KIND = "missing_causal_mask"
V, T, D = 16, 16, 64
STEPS, BATCH = 160, 64
PREFIX = 4  # a prefix LM's bidirectional positions


def sequences(n: int, seed: int) -> torch.Tensor:
    """x_t = (a + k t) mod V: the first two tokens fix the rest."""
    return support.counting_sequences(n, seed, V, T)


class TinyLM(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(V + 1, D), nn.Embedding(T, D)
        layer = nn.TransformerEncoderLayer(D, 4, 2 * D, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out, self.causal = nn.Linear(D, V), causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        if self.causal:
            mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
            return self.out(self.blocks(h, mask=mask, is_causal=True))
        return self.out(self.blocks(h))


def train_lm(causal: bool, watched: bool) -> tuple[TinyLM, float, NeuralDbg | None]:
    """Next-token training: the model reads x[:, :-1] and is scored on x[:, 1:]. Returns the model, the mean loss
    of the last 20 steps and the debugger."""
    torch.manual_seed(0)
    model = TinyLM(causal)
    loss, dbg = support.next_token_fit(model, sequences(STEPS * BATCH, 1), BATCH, 1e-3, watched, last=20)
    return model, loss, dbg


def generation_accuracy(model: nn.Module) -> float:
    return support.greedy_accuracy(model, sequences(256, 999))


def leak(model: nn.Module) -> float:
    """How much position 3's logits move when the tokens after it change."""
    return support.later_token_leak(model, sequences(8, 5)[:, :-1], V)


def found(dbg: NeuralDbg | None) -> list:
    assert dbg is not None
    return [h for h in dbg.hypotheses() if h.kind.value == KIND]


def test_a_language_model_without_its_causal_mask_is_found():
    model, loss, _ = train_lm(causal=False, watched=False)
    twin, twin_loss, _ = train_lm(causal=True, watched=False)
    # plain torch: an earlier position sees later tokens; the loss falls below the floor the masked twin keeps (two
    # unpredictable tokens of fifteen targets), and generation, which has no later tokens, fails
    assert leak(model) > 1e-2 and leak(twin) == 0.0
    assert loss < 0.5 * twin_loss, (loss, twin_loss)
    assert generation_accuracy(model) < 0.5 < generation_accuracy(twin), (
        generation_accuracy(model),
        generation_accuracy(twin),
    )

    _, _, dbg = train_lm(causal=False, watched=True)
    hits = found(dbg)
    assert hits, dbg.explain_failure() if dbg else ""
    assert dbg is not None and dbg.hypotheses()[0].kind.value == KIND
    root = hits[0].root
    assert root.detail == "blocks.layers.0.self_attn, blocks.layers.1.self_attn"
    assert root.metrics["share"] >= 0.9 and root.metrics["found"] == root.metrics["read"] >= 2
    assert "generate_square_subsequent_mask" in hits[0].suggestion

    _, _, silent = train_lm(causal=True, watched=True)
    assert not found(silent), silent.explain_failure() if silent else ""


class PaddedLM(TinyLM):
    """The model of the first test given a key-padding mask (the last positions of some sequences are padding):
    padding hides no later token."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        return self.out(self.blocks(h, src_key_padding_mask=x == V))


def test_a_padded_language_model_without_its_causal_mask_is_found():
    torch.manual_seed(0)
    model = PaddedLM(causal=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = sequences(48 * BATCH, 6)
    lengths = torch.randint(10, T + 1, (48 * BATCH,), generator=torch.Generator().manual_seed(7))
    data[torch.arange(T).view(1, T) >= lengths.view(-1, 1)] = V  # padding id V, scored as ignored
    assert leak(model) > 0.0  # plain torch: an earlier position sees later tokens, padding mask or not
    with NeuralDbg(model) as dbg:
        for step in range(48):
            x = data[step * BATCH : (step + 1) * BATCH]
            targets = torch.where(x[:, 1:] == V, -100, x[:, 1:])
            opt.zero_grad()
            F.cross_entropy(model(x[:, :-1]).reshape(-1, V), targets.reshape(-1)).backward()
            opt.step()
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert not dbg._recorder.coverage.unmasked_attention  # a key-padding mask was given: masked for padding


def test_a_masked_language_model_over_the_same_encoder_is_silent():
    """Bidirectional by design: a fifth of the tokens replaced by a mask id, the loss on those positions only (the
    others ignored), their targets the input's own original tokens."""
    torch.manual_seed(0)
    dbg = support.masked_token_fit(TinyLM(causal=False), sequences(96 * BATCH, 2), BATCH, 1e-3, V)
    assert dbg._recorder.coverage.unmasked_attention  # the attention ran unmasked, as it should here
    readings = dbg._recorder.coverage.next_token
    assert readings and max(share for _, share in readings) < 0.5  # its targets are not the next tokens
    assert not found(dbg), dbg.explain_failure()


class Copier(nn.Module):
    """nn.Transformer given a source and its shifted target: the encoder unmasked by design, the decoder masked."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V + 1, D)
        self.core = nn.Transformer(D, 4, 1, 1, 2 * D, dropout=0.0, batch_first=True)
        self.out = nn.Linear(D, V)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.out(self.core(self.embed(src), self.embed(tgt), tgt_mask=mask, tgt_is_causal=True))


def test_a_sequence_to_sequence_copy_model_is_silent():
    torch.manual_seed(0)
    model = Copier()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = sequences(96 * BATCH, 4)
    with NeuralDbg(model) as dbg:
        for step in range(96):
            x = data[step * BATCH : (step + 1) * BATCH]
            start = torch.full((BATCH, 1), V)
            opt.zero_grad()
            logits = model(x, torch.cat([start, x[:, :-1]], 1))
            F.cross_entropy(logits.reshape(-1, V), x.reshape(-1)).backward()
            opt.step()
    assert dbg._recorder.coverage.unmasked_attention  # the encoder's and the cross-attention's calls
    assert not dbg._recorder.coverage.next_token  # two token inputs: not read
    assert not found(dbg), dbg.explain_failure()


class CrossAttending(nn.Module):
    """A decoder LM built from nn.TransformerDecoder, its self-attention causal, its cross-attention unmasked over a
    memory as long as the tokens (a captioner's 15 image patches, here fixed random features)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(V + 1, D), nn.Embedding(T, D)
        layer = nn.TransformerDecoderLayer(D, 4, 2 * D, dropout=0.0, batch_first=True, norm_first=True)
        self.dec = nn.TransformerDecoder(layer, 2)
        self.out = nn.Linear(D, V)
        self.register_buffer("patches", torch.randn(1, T - 1, D, generator=torch.Generator().manual_seed(8)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        memory = self.patches.expand(x.shape[0], -1, -1)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.out(self.dec(h, memory, tgt_mask=mask, tgt_is_causal=True))


def test_a_causal_decoder_whose_cross_attention_is_unmasked_over_a_memory_as_long_is_silent():
    torch.manual_seed(0)
    model = CrossAttending()
    assert leak(model) == 0.0  # plain torch: no position sees a later token
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = sequences(48 * BATCH, 9)
    with NeuralDbg(model) as dbg:
        for step in range(48):
            x = data[step * BATCH : (step + 1) * BATCH]
            opt.zero_grad()
            F.cross_entropy(model(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1)).backward()
            opt.step()
    assert dbg._recorder.coverage.unmasked_attention  # the cross-attention ran unmasked, as it should
    assert not dbg._recorder.coverage.uncausal_attention  # ... and is no self-attention
    assert not found(dbg), dbg.explain_failure()


class Captioner(nn.Module):
    """``model(image, tokens)``: a decoder over an image's 15 patch features, its tokens the second argument;
    ``causal``: its self-attention masked."""

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(V + 1, D), nn.Embedding(T, D)
        self.patch = nn.Linear(8, D)
        layer = nn.TransformerDecoderLayer(D, 4, 2 * D, dropout=0.0, batch_first=True, norm_first=True)
        self.dec = nn.TransformerDecoder(layer, 2)
        self.out, self.causal = nn.Linear(D, V), causal

    def forward(self, image: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if self.causal else None
        return self.out(self.dec(h, self.patch(image), tgt_mask=mask, tgt_is_causal=self.causal))


def test_a_captioner_given_its_tokens_second_is_read_too():
    def run(causal: bool) -> tuple[Captioner, NeuralDbg]:
        torch.manual_seed(0)
        model = Captioner(causal)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = sequences(48 * BATCH, 10)
        images = torch.randn(BATCH, T - 1, 8, generator=torch.Generator().manual_seed(11))
        with NeuralDbg(model) as dbg:
            for step in range(48):
                x = data[step * BATCH : (step + 1) * BATCH]
                opt.zero_grad()
                F.cross_entropy(model(images, x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1)).backward()
                opt.step()
        return model, dbg

    model, dbg = run(causal=False)
    images = torch.randn(8, T - 1, 8)
    # plain torch: position 3 sees the tokens after it
    assert support.later_token_leak(lambda x: model(images, x), sequences(8, 5)[:, :-1], V) > 1e-2
    hits = found(dbg)
    assert hits, dbg.explain_failure()
    assert hits[0].root.detail == "dec.layers.0.self_attn, dec.layers.1.self_attn"
    _, silent = run(causal=True)
    assert not found(silent), silent.explain_failure()


class MaskedBy(nn.Module):
    """A 2-layer LM calling ``nn.MultiheadAttention`` itself with an attention mask and no ``is_causal``: ``how``
    "ones" (a float ``torch.tril(torch.ones(T, T))``, added to the scores: 1 on the past, 0 on the future, it hides
    nothing), "bool" (True above the diagonal: hidden), "inf" (-inf above the diagonal) or "prefix" (a prefix LM's:
    causal, but the first :data:`PREFIX` positions see each other)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(V + 1, D), nn.Embedding(T, D)
        self.attn = nn.ModuleList([nn.MultiheadAttention(D, 4, batch_first=True) for _ in range(2)])
        self.ff = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.out, self.how = nn.Linear(D, V), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(n))
        later = torch.ones(n, n, dtype=torch.bool).triu(1)
        mask = {"ones": torch.tril(torch.ones(n, n)), "bool": later, "prefix": later & (torch.arange(n) >= PREFIX)}.get(
            self.how, torch.zeros(n, n).masked_fill(later, float("-inf"))
        )
        for attn in self.attn:
            h = h + attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return self.out(h + self.ff(h))


def train_masked_by(how: str, steps: int, watched: bool) -> tuple[MaskedBy, float, NeuralDbg | None]:
    torch.manual_seed(0)
    model = MaskedBy(how)
    loss, dbg = support.next_token_fit(model, sequences(steps * BATCH, 12), BATCH, 1e-3, watched)
    return model, loss, dbg


def test_a_float_tril_of_ones_given_as_the_mask_hides_nothing_and_is_found():
    model, loss, dbg = train_masked_by("ones", 96, watched=True)
    twin, twin_loss, _ = train_masked_by("inf", 96, watched=False)
    # plain torch: added to the scores, 1 on the past and 0 on the future hide no later token; its twin's -inf do
    assert leak(model) > 1e-2 and leak(twin) == 0.0
    assert loss < 0.5 * twin_loss, (loss, twin_loss)
    hits = found(dbg)
    assert hits, dbg.explain_failure() if dbg else ""
    assert hits[0].root.detail == "attn.0, attn.1"
    # read at the layers' calls on their passes, not only in the loss's graph on the passes after them
    assert dbg is not None and dbg._recorder.coverage.uncausal_attention["attn.0"] > GRAPH_CAUSAL_CHECKS


def test_a_boolean_or_infinite_causal_mask_without_is_causal_is_silent():
    for how in ("bool", "inf"):
        model, _, dbg = train_masked_by(how, 48, watched=True)
        assert leak(model) == 0.0, how  # plain torch: no position sees a later token
        assert not found(dbg), (how, dbg.explain_failure() if dbg else "")
        assert dbg is not None and not dbg._recorder.coverage.uncausal_attention, how


def test_a_prefix_lm_is_judged_on_the_positions_its_loss_scores():
    """Its first :data:`PREFIX` positions see each other by design, and its loss leaves them out (but the last,
    whose target is the first token after the prefix): silent. Scored there too, they are trained on tokens they
    see: found."""
    torch.manual_seed(0)
    model = MaskedBy("prefix")
    _, dbg = support.next_token_fit(model, sequences(48 * BATCH, 16), BATCH, 1e-3, True, unscored=PREFIX - 1)
    tokens = sequences(8, 5)[:, :-1]
    # plain torch: scored position 3 sees no later token, while position 1, in the prefix, sees positions 2 and 3
    assert leak(model) == 0.0
    assert support.later_token_leak(model, tokens, V, position=1, until=PREFIX) > 1e-2
    assert not found(dbg), dbg.explain_failure() if dbg else ""
    assert dbg is not None and not dbg._recorder.coverage.uncausal_attention

    torch.manual_seed(0)
    _, dbg = support.next_token_fit(MaskedBy("prefix"), sequences(48 * BATCH, 16), BATCH, 1e-3, True)
    assert found(dbg), dbg.explain_failure() if dbg else ""
    assert dbg is not None and dbg._recorder.coverage.uncausal_attention["attn.0"] > GRAPH_CAUSAL_CHECKS  # at calls
