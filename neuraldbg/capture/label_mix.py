"""How mixed the classes of each training step's labels are: the evidence of data that arrive sorted by label.

The ledger hands :class:`LabelMix` the class counts of each fully observed backward pass of a classifier (the
``nll_loss`` under a cross-entropy, one label per row). A step's passes are added up before its mix is read, so a
step that takes one pass per class (a GAN's discriminator: real images, then generated ones) is one mixed step. Each
step's mix and the counts of all of them stay on the device; what they say so far is filed every few steps and read
at the flush with the step's other readings (see :func:`~neuraldbg.stats.tensors.label_mixing`).
"""

from __future__ import annotations

from torch import Tensor

from ..stats.tensors import label_mixing, step_label_mix
from .pending import Pending

#: Steps folded between two filings of what the mixes say (a filing is a few kernels and a reading at the flush).
FILE_EVERY = 4
#: Fully observed passes without a classifier's labels after which they are no longer looked for (a loop computes its
#: loss the same way every step; a regression's passes stop paying for the search).
GIVE_UP = 4
#: What is filed: the entries of :func:`~neuraldbg.stats.tensors.label_mixing`.
_ENTRIES = [("label_mixing", None, float(i)) for i in range(5)]


class LabelMix:
    """The label counts of the step in progress, and the mixes of the steps before it (see the module)."""

    def __init__(self) -> None:
        self._classes = 0
        self._step = -1
        self._counts: Tensor | None = None  # the step in progress
        self._mixes: Tensor | None = None  # the sum of the finished steps' step_label_mix readings
        self._pooled: Tensor | None = None  # ... and their label counts, those of steps that counted
        self._folded = 0
        self._misses = 0  # fully observed passes that held no classifier's labels, before the first that did

    @property
    def looking(self) -> bool:
        """Whether a fully observed pass's labels are still looked for."""
        return self._classes > 0 or self._misses < GIVE_UP

    def missed(self) -> None:
        """A fully observed pass that held no classifier's labels."""
        self._misses += 1

    def add(self, counts: Tensor, classes: int, step: int, pending: Pending) -> None:
        """One fully observed backward pass's label counts (:func:`~neuraldbg.stats.tensors.label_counts`) over
        ``classes`` classes, at training step ``step``; a pass of another number of classes (a second loss) is
        left out."""
        if self._classes and classes != self._classes:
            return
        if self._counts is not None and step == self._step and counts.device == self._counts.device:
            self._counts = self._counts + counts
            return
        self._fold(pending)
        self._classes, self._step, self._counts = classes, step, counts

    def _fold(self, pending: Pending) -> None:
        counts, self._counts = self._counts, None
        if counts is None:
            return
        mix = step_label_mix(counts)
        if self._mixes is not None and self._pooled is not None and self._mixes.device == mix.device:
            self._mixes, self._pooled = self._mixes + mix, self._pooled + counts * mix[2]
        else:
            self._mixes, self._pooled = mix, counts * mix[2]
        self._folded += 1
        if self._folded % FILE_EVERY == 0:
            pending.put_vector(_ENTRIES, label_mixing(self._mixes, self._pooled))
