"""Units that cannot tell themselves apart: a layer whose weight rows (its output units) started identical.

A constant initialisation (``nn.init.constant_(w, 0.05)``, ``fill_``, every filter copied from one) gives every
unit of a layer the same weights, so every unit computes the same output, receives the same gradient and takes the
same update: the layer behaves as one unit repeated. Only what treats the units differently parts them: a bias
left random, dropout's masks, a next layer with distinct weights; slowly, so the units stay near-copies (plain
torch, weights 0.05 with random biases: a tabular net's hidden rows after 188 steps differ by 0.23 of their norm,
a conv net's by 0.08 and 0.01, against 0.99 for the default initialisation).

Found when the debugger attaches: a candidate is a layer's unit weight of two or more rows, not all zeros, whose
rows are all equal (the first two compared first); for an embedding, whose units are its dimensions, the columns
(a constant start gives every token the vector c x (1, ..., 1): the factorisation is one-dimensional). A zero
weight alone is left out: zero-initialised last layers, residual branches and adapters are how many healthy models
start, and their units part at the first update since each gets a different error. Two zero weights or more (every
layer zeroed, ``nn.init.zeros_`` in an init loop) are candidates of another sort: a layer whose input is constant
(the layer before it zero: only its bias gets through) takes updates whose rows are multiples of one row, and the
next one, given those units, likewise; its units then move along one direction, not as copies but as signed,
scaled copies (plain torch, a multi-label MLP zeroed: its hidden weight keeps 0.99 of its energy along one row's
direction after 300 Adam steps, F1 0.46 against 0.91). Their spread is the energy outside the direction of the
largest row (0 for rows that are multiples of one, about 1 for a random start); past :data:`ONE_DIRECTION` they
parted. Each candidate is then
followed on fully observed steps, after the optimizer stepped: its spread, ``||W - mean row|| / ||W||`` (0 for
identical rows, about 1 for independent ones); past :data:`PARTED` it is dropped for good, otherwise, once its
weights moved, the spread is filed on the step (:attr:`~neuraldbg.stats.step.StepData.symmetric`). Nothing is read
on cheap steps, and a run without candidates does no work here after attaching.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from ..model.info import LayerInfo
from ..model.shards import Param
from .pending import Pending

#: A spread above which a candidate's units have parted, as a random start's are (about 1). Below it they are still
#: much alike: weights 0.05 with random biases leave 0.01-0.29 after 150-300 steps, with dropout 0.2 0.71-0.82
#: (a distilled student: accuracy 0.68 against 0.81); the default start 0.94-0.99.
PARTED = 0.8
#: A spread (the share of a zero-started layer's energy outside its largest row's direction) above which its units
#: have parted. Below, most of the layer is one unit scaled: a zeroed residual MLP's first block kept 0.19 outside at
#: step 16 (loss 1.11 at its end against 0.54 from the default start); a default start keeps about 0.9.
ONE_DIRECTION = 0.2
#: A zero weight is a candidate when it has at least this many rows, each of at least this many elements (a two-class
#: head's rows are each other's negatives however it starts: a softmax's gradient rows sum to zero; a rank-1
#: adapter's rows are single numbers, each a multiple of any other) ...
ZERO_ROWS = 3
#: ... and the model holds at least this many zero weights.
ZERO_WEIGHTS = 2


#: Layers whose units are their weight's columns (the dimensions each row, a token's vector, is spread over).
_EMBEDDINGS = frozenset({"Embedding", "EmbeddingBag"})


def _units(weight: Tensor, columns: bool) -> Tensor:
    """The weight with one unit per row: an embedding's transposed (a 1-d weight stays as it is)."""
    return weight.t() if columns and weight.dim() == 2 else weight


def _off_direction(rows: Tensor) -> float:
    """The share of ``rows``' energy (their squared norm) outside the direction of the largest row: 0 when every row
    is a multiple of one, about 1 - 1/rows for independent ones; 0 for all zeros."""
    norms = rows.norm(dim=1)
    total = float(norms.square().sum())
    if total <= 0:
        return 0.0
    top = rows[int(norms.argmax())]
    along = float((rows @ (top / top.norm())).square().sum())
    return max(0.0, 1.0 - along / total)


def _zero(weight: Tensor) -> bool:
    """Whether every element of ``weight`` is zero (the first row looked at first)."""
    return not bool(weight[0].any()) and not bool(weight.any())


def _identical_rows(weight: Tensor) -> bool:
    """Whether every row (first-dimension slice) of ``weight`` equals the first, element for element."""
    rows = weight.reshape(weight.shape[0], -1)
    if not torch.equal(rows[0], rows[1]):  # the usual answer, from two rows
        return False
    return bool(torch.equal(rows, rows[:1].expand_as(rows)))


class SymmetryWatch:
    """Follows the layers whose units started identical until they part (see the module docstring)."""

    def __init__(self) -> None:
        # layer -> (its unit weight, the first unit's weights when the debugger attached, units are columns, it
        # started at zero)
        self._candidates: dict[str, tuple[Tensor, Tensor, bool, bool]] = {}
        self.zero_started: set[str] = set()  # the candidates that started at zero
        # weights already seen with distinct units or all zeros, by identity (a tensor compares by value): never a
        # candidate, so a later attach (a ``with`` block per epoch) skips them
        self._distinct: dict[int, weakref.ref[Tensor]] = {}

    def attach(self, infos: dict[str, LayerInfo], params: list[Param]) -> None:
        """Find the candidates among the unit weights of ``infos`` that are trainable ``params`` held whole, and the
        weights of embeddings, whose units are their dimensions (the weight's columns)."""
        self._candidates = {}
        zeros: dict[str, Tensor] = {}
        by_name = {p.name: p for p in params}
        with torch.no_grad():
            for layer, info in infos.items():
                columns = info.type_name in _EMBEDDINGS
                p = by_name.get(f"{layer}.weight" if columns else info.unit_weight or "")
                if p is None or not p.whole or self._seen_distinct(p.tensor):
                    continue
                w = _units(p.tensor.detach(), columns)
                if w.dim() < 2 or w.shape[0] < 2 or not w.is_floating_point() or w.is_meta or w[0].numel() == 0:
                    continue
                if _identical_rows(w) and bool(w[0].any()):
                    self._candidates[layer] = (p.tensor, w[0].reshape(-1).clone(), columns, False)
                elif not columns and min(w.shape[0], w[0].numel()) >= ZERO_ROWS and _zero(w):
                    zeros[layer] = p.tensor
                else:
                    self._distinct[id(p.tensor)] = weakref.ref(p.tensor)
        for layer, tensor in zeros.items():
            if len(zeros) >= ZERO_WEIGHTS:
                self._candidates[layer] = (tensor, tensor.detach()[0].reshape(-1).clone(), False, True)
            else:
                self._distinct[id(tensor)] = weakref.ref(tensor)
        self.zero_started = set(zeros) if len(zeros) >= ZERO_WEIGHTS else set()

    def _seen_distinct(self, tensor: Tensor) -> bool:
        found = self._distinct.get(id(tensor))
        return found is not None and found() is tensor

    @property
    def watching(self) -> bool:
        return bool(self._candidates)

    def check(self, pending: Pending) -> None:
        """After the optimizer stepped on a fully observed step: drop the candidates whose units parted, file the
        spread of the others whose weights moved since the debugger attached."""
        found: dict[str, tuple[int, float]] = {}
        with torch.no_grad():
            for layer, (tensor, first, columns, zero) in list(self._candidates.items()):
                w = _units(tensor.detach(), columns)
                rows = w.reshape(w.shape[0], -1).double()
                if zero:
                    spread = _off_direction(rows)
                else:
                    size = float(rows.norm())
                    spread = float((rows - rows.mean(0)).norm()) / size if size > 0 else 0.0
                if not spread <= (ONE_DIRECTION if zero else PARTED):  # parted (a non-finite weight: another room's)
                    del self._candidates[layer]
                elif bool(rows.any()) if zero else not torch.equal(w[0].reshape(-1), first):  # the weights moved
                    found[layer] = (int(w.shape[0]), spread)
        pending.data.symmetric = found
