"""Attention over padding: the loss leaves a token id out (its ``ignore_index``: the padding token, as sequence
models use it), the model's token input holds that id, and an attention layer (``nn.MultiheadAttention``, the one
``nn.Transformer`` and its encoder and decoder layers call) runs with no mask at all (no key-padding mask, no
attention mask, not causal) over keys that are the token positions: its keys' batch and sequence lengths are those
of the model's token input (batch first or not).

Every query of such a layer attends to the padding positions too: its output mixes in vectors that carry no
content and change with how much padding each batch happens to hold, while the loss says those positions are
not data. A causal self-attention (an attention mask or ``is_causal``) is not reported: with padding at the end, no
real token attends to a later one. Nor is an attention whose keys are something else: an image captioner's
caption states attending over 16 image patches, a Perceiver's latents (8 keys) attending to each other, or token
queries attending to those latents hold no padding among their keys, and a (batch, tokens) mask would not fit
them (appending padding to a captioner's captions moves its logits at the real positions by exactly 0). A key
sequence made of the tokens and something more (a class token put before them, image patches concatenated with
them) is not recognised either. Judged from the arguments of the attention calls on fully observed steps (their
masks' presence and their keys' shape, nothing read), the loss's autograd graph
(:mod:`neuraldbg.capture.loss_graph`) and one reduction of the token input per fully observed step
(``(tokens == pad).any()``, read at the flush that already syncs). A loss with torch's default ``ignore_index``
(-100, the Hugging Face convention for labels) names no token and is not judged; nor are attention modules of other
classes (a Hugging Face model's own, given ``attention_mask``).
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, quoted
from .base import LAST_RANK, Kind, RootLane, Series, run_event

KIND = FailureKind.UNMASKED_PADDING


class UnmaskedPadding(Kind):
    name = KIND.value
    title = "attention over padding"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        layers = list(coverage.unmasked_attention)
        if coverage.padding_id is None or not coverage.padded_steps or not layers:
            return None
        return run_event(
            KIND,
            0,
            max(0, coverage.last_step),
            ", ".join(layers),
            padding_id=float(coverage.padding_id),
            padded_steps=float(coverage.padded_steps),
            token_steps=float(coverage.token_steps),
            layers=float(len(layers)),
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # after every fault of a layer, before the loss findings it explains
        return RootLane(LAST_RANK, order=2) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False  # a structure of the program

    def place(self, event: SemanticEvent) -> str:
        return "the attention layers"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        layers = root.detail.split(", ") if root.detail else []
        pad = int(m.get("padding_id", 0.0))
        what = (
            f"Attention over padding: the loss ignores token {pad} (its ignore_index: the padding token), the "
            f"model's token input held it on {count(m.get('padded_steps', 0.0))} of "
            f"{count(m.get('token_steps', 0.0))} fully observed steps, and {quoted(layers)} attended with no mask "
            "at all (no key_padding_mask, no attn_mask, not causal). Every query there mixes in the padding "
            "positions, which carry no content and vary with each batch's padding, while the loss treats them as "
            "no data."
        )
        fix = (
            f"pass the padding mask to every attention call: src_key_padding_mask=(src == {pad}), "
            f"memory_key_padding_mask=(src == {pad}) and tgt_key_padding_mask=(tgt == {pad}) for nn.Transformer, "
            f"key_padding_mask=(tokens == {pad}) for nn.MultiheadAttention."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"attention over padding token {int(event.metrics.get('padding_id', 0.0))}"

    def label(self, event: SemanticEvent) -> str:
        return f"unmasked padding ({count(event.metrics.get('layers', 0.0))} layers)"

    def effect(self, event: SemanticEvent) -> str:
        return "attention over padding"
