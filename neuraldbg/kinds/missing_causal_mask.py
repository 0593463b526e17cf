"""A language model without its causal mask: the model is trained to predict the next token of its own input, and
its attention runs with no mask over the token positions, so each position sees the tokens after it, its own
target among them. The loss falls by copying the target from the next position (to near 0), and generation, which
has no later tokens to look at, fails. The classic slip of a decoder built from ``nn.TransformerEncoder`` or
``nn.MultiheadAttention`` called without ``mask=`` / ``attn_mask=`` (Plain torch: a 2-layer encoder LM over
16-token sequences whose tokens follow from the first two: training loss 0.01 against 0.13 for its twin with the
mask, whose floor is the two unpredictable tokens; greedy generation from a 2-token prompt right on 0.10-0.12 of
the tokens against 1.00).

Read on the first :data:`~neuraldbg.capture.forward.CAUSAL_CHECKS` fully observed passes in which an
``nn.MultiheadAttention`` ran as a self-attention (its key the very tensor of its query) with no attention mask (or
one that hides no later position, a float ``torch.tril(torch.ones(T, T))`` added to the scores) and not
``is_causal`` (a key-padding mask or not: padding hides no later token) over keys as long as the model's token
input, that input being the call's only token argument, wherever it stands (a captioner's ``model(image, tokens)``):
of the ``nll_loss``'s targets at positions whose next input token differs from their own, the share that are that
next token (:func:`~neuraldbg.capture.loss_graph.next_token_nll`). Reported when at least :data:`MIN_PASSES`
passes were read and at least half of them were at least :data:`SHARE` next-token targets. Not judged: a model given
two token sequences (a source and a target: its encoder sees all of the source by design), targets that are the
input's own tokens (a tagger, a masked LM: at the positions where the next token differs, none of them is it), one
label per sample, a cross-attention (its keys a memory: an image's patches, an encoder's states, a previous
segment's, as long as the tokens or not), a bidirectional recurrent layer.

An attention that is no ``nn.MultiheadAttention`` (``F.scaled_dot_product_attention`` without ``is_causal`` or given
a mask that leaves a later key visible, a softmax of queries times keys written by hand with no mask between them,
or with a mask or bias added whose probabilities still weigh a later key: ALiBi alone, a float ``tril`` of ones) is
found in the loss's graph on the first :data:`~neuraldbg.capture.forward.GRAPH_CAUSAL_CHECKS` fully observed passes
given one token input (see capture/attention_graph.py), then read the same way; it is named by the layer whose code
runs it. A mask is judged on the positions whose targets the loss scores (a prefix LM's unscored prefix sees all of
itself by design). A softmax over the queries' axis (``dim=-2``) leaks whatever its mask: each weight is divided by a
sum over the later queries too; it is reported with its own words (Plain torch: the 2-block nanoGPT-style LM of the
tests, masked, then normalised over the queries: earlier logits move when later tokens change, its loss below its
twin's; the sweep's program: generation 0.30 against 0.92).
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, num, quoted
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.MISSING_CAUSAL_MASK

#: Passes read, at least.
MIN_PASSES = 2
#: The share of the telling positions whose target is the next input token, at least (a next-token objective: all
#: of them; chance, for a vocabulary of V tokens: about 1 / V).
SHARE = 0.9


class MissingCausalMask(Kind):
    name = KIND.value
    title = "causal mask missing"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        readings = coverage.next_token
        ahead = [(step, share) for step, share in readings if share >= SHARE]
        if len(readings) < MIN_PASSES or 2 * len(ahead) < len(readings) or not ahead:
            return None
        counts = coverage.uncausal_attention
        if not counts:
            return None
        most = max(counts.values())
        layers = [name for name, n in counts.items() if 2 * n >= most and name]
        return run_event(
            KIND,
            ahead[0][0],
            max(ahead[0][0], coverage.last_step),
            ", ".join(layers),
            share=min(share for _, share in ahead),
            found=len(ahead),
            read=len(readings),
            over_queries=float(bool(layers) and all(name in coverage.query_softmax for name in layers)),
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: before the loss findings it explains
        return RootLane(0, order=7) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False

    def place(self, event: SemanticEvent) -> str:
        return quoted(event.detail.split(", ")) if event.detail else "the attention"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        layers = root.detail.split(", ") if root.detail else []
        if m.get("over_queries"):
            return self._over_queries(m, layers)
        what = (
            f"Causal mask missing: the model is trained to predict the next token of its own input (on "
            f"{count(m.get('found', 0.0))} of the {count(m.get('read', 0.0))} fully observed passes read, at least "
            f"{num(100 * m.get('share', 0.0))} % of the loss's targets, where the next token differs from the current "
            f"one, are that next token), yet {quoted(layers)} attended with no mask over its token positions: every "
            "position sees the tokens after it, its own target among them. The loss falls by copying each target "
            "from the next position, and generation, which has no later tokens to look at, fails."
        )
        fix = (
            "give the attention a causal mask: nn.TransformerEncoder(...)(x, mask=nn.Transformer."
            "generate_square_subsequent_mask(T), is_causal=True), or attn_mask=that mask with is_causal=True on "
            "nn.MultiheadAttention (T: the sequence length); F.scaled_dot_product_attention(q, k, v, is_causal=True); "
            "written by hand, scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float('-inf')) "
            "before the softmax."
        )
        return what, fix

    def _over_queries(self, m: dict[str, float], layers: list[str]) -> tuple[str, str]:
        what = (
            f"Attention normalised over the queries: the model is trained to predict the next token of its own input "
            f"(on {count(m.get('found', 0.0))} of the {count(m.get('read', 0.0))} fully observed passes read, at "
            f"least {num(100 * m.get('share', 0.0))} % of the loss's targets, where the next token differs from the "
            f"current one, are that next token), yet {quoted(layers)} took the softmax of its scores over the "
            "queries' axis (dim=-2) instead of the keys': each weight is divided by a sum over every query, the later "
            "positions' included, so a position's output depends on the tokens after it, its own target among them, "
            "whatever the mask. The loss falls by reading the later positions, and generation, which has none, fails."
        )
        fix = (
            "take the softmax over the keys, the last axis of q @ k.transpose(-2, -1): scores.softmax(dim=-1), after "
            "the causal mask (scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float('-inf'))); or "
            "F.scaled_dot_product_attention(q, k, v, is_causal=True)."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        if event.metrics.get("over_queries"):
            return f"attention normalised over the queries ({self.place(event)})"
        return f"attention without a causal mask ({self.place(event)})"

    def label(self, event: SemanticEvent) -> str:
        return "causal mask missing"

    def effect(self, event: SemanticEvent) -> str:
        return "each position sees its own target"
