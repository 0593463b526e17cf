"""How mixed the classes of each training step's labels are: the evidence of data that arrive sorted by label.

The ledger hands :class:`LabelMix` the class counts of each fully observed backward pass of a classifier (the
``nll_loss`` under a cross-entropy, one label per row, or a binary cross-entropy's single target column). A step's
passes are added up before its mix is read, so a step that takes one pass per class (a GAN's discriminator: real
images, then generated ones) is one mixed step. Each step's most frequent class and its share are computed on the
device and filed with the step's index, to be read at the flush with the other readings (see
:func:`~neuraldbg.stats.tensors.step_label_mix`).
"""

from __future__ import annotations

from torch import Tensor

from ..stats.tensors import step_label_mix
from .pending import Pending

#: Fully observed passes without a classifier's labels after which they are no longer looked for (a loop computes its
#: loss the same way every step; a regression's passes stop paying for the search).
GIVE_UP = 4


class LabelMix:
    """The label counts of the step in progress (see the module)."""

    def __init__(self) -> None:
        self._classes = 0
        self._step = -1
        self._counts: Tensor | None = None  # the step in progress
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
        left out. The step before is filed once a pass of a later one comes."""
        if self._classes and classes != self._classes:
            return
        if self._counts is not None and step == self._step and counts.device == self._counts.device:
            self._counts = self._counts + counts
            return
        if self._counts is not None:
            entries = [("label_step", self._step, float(i)) for i in range(3)]
            pending.put_vector(entries, step_label_mix(self._counts))
        self._classes, self._step, self._counts = classes, step, counts
