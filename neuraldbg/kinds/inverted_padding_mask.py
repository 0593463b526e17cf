"""An inverted padding mask: the mask given with a batch of padded token sequences hides the real tokens and shows
the padding. The two conventions are opposite, and mixing them up is easy: a Hugging Face ``attention_mask`` is 1 on
the tokens to attend to and 0 on the padding, while torch's ``key_padding_mask`` (``src_key_padding_mask`` of
``nn.Transformer`` and its encoder and decoder) is True on the padding to ignore. ``1 - attention_mask`` given to a
Hugging Face model, or ``tokens != pad`` given as a key-padding mask, makes every query attend to padding alone.

No position then reads any other token of its sequence, only the padding: a class token learns how long the
sequence is, not what it says. Plain torch: a BERT classifier (Trainer, 200 steps) whose label is a property of its
tokens reached 0.61 held-out accuracy with the mask inverted against 1.0 with it right, and a 2-layer
``nn.TransformerEncoder`` pooled at its class token 0.78 against 0.98. The loss stays where it began or falls a
little on what the lengths tell, so nothing else in the run names the cause. (Pooled over every position, the same
encoder still learned a bag-of-tokens label, 0.998 against 0.957: each position keeps its own token through the
residual connection, but nothing of the others.)

Exact in what it reads: on the first :data:`~neuraldbg.capture.forward.MASK_CHECKS` fully observed forward passes
given a padding mask of the token input's shape (the model's ``attention_mask`` argument; the ``key_padding_mask``
of an ``nn.MultiheadAttention`` call, a sequence-first input's transposed), whether the positions the mask hides
hold several token ids while all those it shows hold a single one, the padding's
(:func:`~neuraldbg.stats.tensors.mask_inverted`, computed on the device and read at the flush). A mask the right way
round hides one id, the padding, and shows the text; a mask that hides some real tokens on purpose still shows others;
a batch without padding shows the text whichever mask it is given. Reported when the mask read so on at least half
the passes that read it.

The same fault in its other form: a mask that hides every position of a batch whose tokens differ (an
``attention_mask`` of zeros, a ``key_padding_mask`` of True: built with ``zeros_like`` for ``ones_like``, or from
``input_ids == pad`` on sequences without padding). Plain torch, an ALBERT classifier given a mask of zeros: every
attention projection got exactly zero gradient, held-out accuracy 0.50 against 0.96 with a mask of ones (the sweep's
BLOOM: 0.014 against 0.988). Such a mask also puts every label where the mask hides the input, which the
labels-on-padding check would read as padding labelled with a token id: it yields to this finding.
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, quoted
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.INVERTED_PADDING_MASK


def _inverted(coverage: Coverage) -> tuple[list[str], int, int, int, bool]:
    """The sources whose mask read inverted (or hid everything) on at least half of the passes that read it ("" the
    model's ``attention_mask``, else attention layers), the first step it did, the most passes one of them was read
    on and found so on, and whether every such pass found the mask hiding every position."""
    sources = [s for s, (read, found, _, _) in coverage.inverted_masks.items() if found and 2 * found >= read]
    if not sources:
        return [], -1, 0, 0, False
    chosen = [coverage.inverted_masks[s] for s in sources]
    everything = all(c[3] == c[1] for c in chosen)
    return sources, min(c[2] for c in chosen), max(c[0] for c in chosen), max(c[1] for c in chosen), everything


def hides_everything(coverage: Coverage) -> bool:
    """Whether the model's ``attention_mask`` hid every position on at least half of the passes that read it (the
    labels-on-padding check yields to this finding: every label then sits where the mask hides the input)."""
    read, _, _, everything = coverage.inverted_masks.get("", [0, 0, -1, 0])
    return everything > 0 and 2 * everything >= read


class InvertedPaddingMask(Kind):
    name = KIND.value
    title = "padding mask inverted"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        sources, step, read, found, everything = _inverted(coverage)
        if not sources:
            return None
        layers = [s for s in sources if s]
        return run_event(
            KIND,
            step,
            max(step, coverage.last_step),
            ", ".join(layers),
            argument=float("" in sources),
            read=float(read),
            found=float(found),
            everything=float(everything),
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact from its first step: before the NaN an attention with every key hidden gives
        return RootLane(0, order=7) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False

    def place(self, event: SemanticEvent) -> str:
        layers = event.detail.split(", ") if event.detail else []
        argument = "the attention_mask" if event.metrics.get("argument") else ""
        given = f"the key_padding_mask of {quoted(layers)}" if layers else ""
        return " and ".join(w for w in (argument, given) if w)

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        layers = root.detail.split(", ") if root.detail else []
        seen = f"on {count(m.get('found', 0.0))} of {count(m.get('read', 0.0))} fully observed passes read"
        if m.get("everything"):
            return _everything_hidden(root, layers, seen)
        parts = []
        fixes = []
        if m.get("argument"):
            parts.append(
                "the attention_mask given to the model is 0 on the real tokens and 1 on the padding, where a Hugging "
                "Face model attends where it is 1"
            )
            fixes.append(
                "give the model attention_mask = (input_ids != pad_token_id).long(), 1 on the tokens and 0 on the "
                "padding, as its tokenizer returns it (do not invert it)"
            )
        if layers:
            parts.append(
                f"the key_padding_mask given to {quoted(layers)} is True on the real tokens and False on the padding, "
                "where torch ignores the keys where it is True"
            )
            fixes.append(
                "pass key_padding_mask (src_key_padding_mask for nn.Transformer and its encoder) = (tokens == pad_id), "
                "True on the padding, not (tokens != pad_id) or a Hugging Face style attention_mask"
            )
        what = (
            f"Padding mask inverted: from step {root.step_start} {' and '.join(parts)} ({seen}). Every query attends "
            "to the padding alone and never to the other tokens: a class token learns how long its sequence is, not "
            "what it says, and a sequence without padding has every key hidden."
        )
        return what, "; ".join(fixes) + "."

    def describe(self, event: SemanticEvent) -> str:
        how = "hiding every position" if event.metrics.get("everything") else "inverted"
        return f"padding mask {how} ({self.place(event)})"

    def label(self, event: SemanticEvent) -> str:
        return "padding mask inverted"

    def effect(self, event: SemanticEvent) -> str:
        return "attention to padding only"


def _everything_hidden(root: SemanticEvent, layers: list[str], seen: str) -> tuple[str, str]:
    """The explanation of a mask that hid every position (see the module's doc)."""
    given = []
    if root.metrics.get("argument"):
        given.append("the attention_mask given to the model is 0 everywhere")
    if layers:
        given.append(f"the key_padding_mask given to {quoted(layers)} is True everywhere")
    what = (
        f"Padding mask hiding every position: from step {root.step_start} {' and '.join(given)} ({seen}), though the "
        "batch holds real tokens. No query may attend to any key: the attention reads nothing of the sequence, its "
        "projections learn nothing, and the model sees each token alone."
    )
    fix = (
        "build the mask from the padding: attention_mask = (input_ids != pad_token_id).long() for a Hugging Face "
        "model (ones where there is no padding, as the tokenizer returns it), key_padding_mask = (tokens == pad_id) "
        "for torch; not zeros_like where ones_like was meant."
    )
    return what, fix
