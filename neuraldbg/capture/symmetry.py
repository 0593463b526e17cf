"""Units that cannot tell themselves apart: a layer whose weight rows (its output units) started identical.

A constant initialisation (``nn.init.constant_(w, 0.05)``, ``fill_``, every filter copied from one) gives every unit
of a layer the same weights, so every unit computes the same output, receives the same gradient and takes the same
update: the layer behaves as one unit repeated. Only what treats the units differently parts them: a bias left
random, dropout's masks, a next layer with distinct weights; slowly, so the units stay near-copies (plain torch,
weights 0.05 with random biases: a tabular net's hidden rows after 188 steps differ by 0.23 of their norm, a conv
net's by 0.08 and 0.01, against 0.99 for the default initialisation).

Found when the debugger attaches: a candidate is a layer's unit weight of two or more rows, not all zeros, whose
rows are all equal (the first two compared first); for an embedding, whose units are its dimensions, the columns (a
constant start gives every token the vector c x (1, ..., 1): the factorisation is one-dimensional). A normalisation
layer's gain is never one, whatever its shape: it is elementwise, each element scaling a feature of its own
(``nn.LayerNorm([C, H, W])``'s gain of ones: no two rows share an input; plain torch, its channels' gradient rows
differ by 0.82 of their norm). In a grouped convolution only the rows of one group read the same input channels: the
rows are compared, and later spread, within each group, and a group of one row (a depthwise convolution's, whose
kernels may all start as one blur) holds no units alike (plain torch, depthwise kernels all one binomial filter:
their gradient rows differ by 0.97 of their norm, their channels' outputs correlate at 0.37). A zero weight alone is
left out: zero-initialised last layers, residual branches and adapters are how many healthy models start, and their
units part at the first update since each gets a different error. Two zero weights or more (every layer zeroed,
``nn.init.zeros_`` in an init loop) are candidates of another sort: a layer whose input is constant (the layer
before it zero: only its bias gets through) takes updates whose rows are multiples of one row, and the next one,
given those units, likewise; its units then move along one direction, not as copies but as signed, scaled copies
(plain torch, a multi-label MLP zeroed: its hidden weight keeps 0.99 of its energy along one row's direction after
300 Adam steps, F1 0.46 against 0.91). Their spread is the energy outside the direction of the largest row (0 for
rows that are multiples of one, about 1 for a random start); past :data:`ONE_DIRECTION` they parted.

One direction is the fault where a zero neighbour holds the layer there, but where the loss's error has one
direction per sample the loss can do so alone. A binary classifier's (two softmax classes, one logit) or a
one-output regression's error does, so a zero layer whose outputs reach the model's output through linear maps only
(the top residual branch's last layer, added into the stream the head reads) is moved along ``W_head^T e``, one
direction, whatever it is given: its rows are multiples of one row, no copies, and nothing is lost, as the output
reads it along that direction alone (plain torch, a residual MLP of 4 pre-norm blocks with zeroed branches, 2
classes: the stream's error keeps 1e-14 of its energy off the head's row difference, the top branch's rows 0.01-0.05
off one direction at step 200 and 0.5 by step 2000, their spread 0.98-1.0, accuracy 0.995 as from the default
start). With three outputs or more the loss gives two directions or more and such a layer parts at once (3 classes:
0.36-0.45 off), so there one direction already tells of a neighbour. With two or fewer (the output's last
dimension; none read counts too) the neighbour's hold is read itself: the lower layer's units move along the
direction the upper one reads, so the upper one is given inputs along one direction (the lower one's output) and the
lower one errors along one (``W^T e`` of a weight of one direction), or the lower one is still all zero and passes a
constant. A moved zero candidate is then dropped for good unless another zero candidate whose outputs are as many as
its input channels (or the other way round) holds it so, by :data:`GLUED` (plain torch: 0.92-1.0 in an MLP with
every layer zeroed, binary or 4 classes, Adam or SGD; 0.01-0.21 between a residual MLP's zeroed branches of matching
widths). The shapes stand for the wiring, which is not seen here; a wrong match needs the directions to align as
well. A normalisation between two zero layers bends the direction one passes the other, so there the hold is missed.

Each candidate is then followed on fully observed steps, after the optimizer stepped. One that is not zero-started
and whose outputs are the model's outputs (a layer the forward pass ends with, its outputs as many as the model's: a
head, heads run side by side and summed) is dropped at once: each unit answers to an output of its own, so the loss
gives each a gradient of its own, and rows that stay alike are the task's answer, not copies (plain torch, DLinear's
two heads both set to 1/L as its authors do: their gradient rows differ by 0.69-0.81 of their norm from the first
step, its forecast's held-out error 0.0132 against the least-squares optimum's 0.0129, while the heads' rows still
differ by only 0.2-0.6). A zero-started one is kept there: given a constant input it moves as one direction whatever
its errors. For the others: their spread, ``||W - mean row|| / ||W||`` (0 for identical rows, about 1 for
independent ones); past :data:`PARTED` it is dropped for good, otherwise, once its weights moved, the spread is
filed on the step (:attr:`~neuraldbg.stats.step.StepData.symmetric`). Nothing is read on cheap steps, and a run
without candidates does no work here after attaching.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from ..model.info import LayerInfo
from ..model.shards import Param
from ..stats.step import StepData
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
#: A zero weight beside another holds it to one direction when the direction the lower one's units move along (its
#: outputs) and the direction the upper one reads (its inputs) are at least this aligned (|cosine|). Plain torch, Adam
#: and SGD: an MLP with every layer zeroed, binary or 4 classes, 0.92-1.0 from step 10 to 200; the zeroed last layers
#: of a residual MLP's branches whose widths match, 0.01-0.21.
GLUED = 0.5


#: Layers whose units are their weight's columns (the dimensions each row, a token's vector, is spread over).
_EMBEDDINGS = frozenset({"Embedding", "EmbeddingBag"})


def _units(weight: Tensor, columns: bool) -> Tensor:
    """The weight with one unit per row: an embedding's transposed (a 1-d weight stays as it is)."""
    return weight.t() if columns and weight.dim() == 2 else weight


def _direction(rows: Tensor) -> Tensor:
    """The unit vector along the largest of ``rows`` (two dimensions, not all zero)."""
    top = rows[int(rows.norm(dim=1).argmax())]
    return torch.div(top, top.norm())


def _off_direction(rows: Tensor) -> float:
    """The share of ``rows``' energy (their squared norm) outside the direction of the largest row: 0 when every row
    is a multiple of one, about 1 - 1/rows for independent ones; 0 for all zeros."""
    total = float(rows.square().sum())
    if total <= 0:
        return 0.0
    along = float((rows @ _direction(rows)).square().sum())
    return max(0.0, 1.0 - along / total)


#: A zero-started weight's one direction seen from its two sides: how much of it each unit holds (one entry per
#: output, the direction its outputs move along) and what it reads (one entry per input channel); None while every
#: element is still zero.
Sides = tuple[Tensor, Tensor] | None


def _sides(weight: Tensor) -> Sides:
    """The :data:`Sides` of ``weight`` (output units first, input channels second, a kernel's positions after)."""
    rows = weight.detach().reshape(weight.shape[0], -1).double()
    if not bool(rows.any()):
        return None
    along = _direction(rows)
    units = rows @ along
    # a convolution's direction spreads each input channel over its kernel positions: the channels of its largest one
    return units / units.norm(), _direction(along.reshape(weight.shape[1], -1).t())


def _holds(lower: Sides, upper: Sides) -> bool:
    """Whether a zero-started layer and the one it feeds hold each other to one direction: the lower one still all
    zero passes only its bias, a constant input; otherwise its outputs move along the direction the upper one reads,
    so the upper one is given inputs along one direction and the lower one errors along one (``W^T e`` of a weight of
    one direction)."""
    if lower is None:
        return True
    return upper is not None and abs(float(lower[0] @ upper[1])) >= GLUED


def _held_by_neighbour(layer: str, weights: dict[str, Tensor], sides: dict[str, Sides]) -> bool:
    """Whether another zero-started weight of ``weights`` holds ``layer``'s units to one direction: one whose outputs
    are as many as its input channels (it may feed it) or the other way round, and :func:`_holds`. The shapes stand
    for the wiring the debugger does not see; a wrong match needs the directions to align too."""
    outputs, inputs = weights[layer].shape[:2]
    for other, weight in weights.items():
        if other == layer:
            continue
        if weight.shape[0] == inputs and _holds(sides[other], sides[layer]):
            return True
        if weight.shape[1] == outputs and _holds(sides[layer], sides[other]):
            return True
    return False


def _zero(weight: Tensor) -> bool:
    """Whether every element of ``weight`` is zero (the first row looked at first)."""
    return not bool(weight[0].any()) and not bool(weight.any())


def _grouped(weight: Tensor, groups: int) -> Tensor:
    """The rows (first-dimension slices) of ``weight`` by group, ``(groups, rows per group, row size)``: a grouped
    convolution's rows of one group read the same input channels, those of different groups different ones."""
    return weight.reshape(groups, weight.shape[0] // groups, -1)


def _identical_rows(weight: Tensor, groups: int) -> bool:
    """Whether every row of ``weight`` equals the first of its group, element for element, in groups of two rows or
    more (a row alone in its group has nothing to be identical to)."""
    rows = _grouped(weight, groups)
    if rows.shape[1] < 2 or not torch.equal(rows[:, 0], rows[:, 1]):  # the usual answer, from two rows
        return False
    return bool(torch.equal(rows, rows[:, :1].expand_as(rows)))


def _output_layers(data: StepData, weighted: frozenset[str]) -> set[str]:
    """The layers of ``weighted`` whose outputs are the model's outputs: this step's forward order (its layer outputs,
    filed in the order the forward pass made them) walked back from its end, past containers (a layer holding
    others: its output is made from theirs), up to the first other layer (an activation, a normalisation); of the
    layers met, those whose calls' outputs hold as many elements as the model's output (heads run side by side and
    summed, a head applied at every time step)."""
    made: dict[str, int] = {}
    for (layer, _), n in data.numel.items():
        made[layer] = made.get(layer, 0) + n
    found: set[str] = set()
    for layer in reversed(made):
        if layer in weighted:
            if made[layer] == data.output_numel:
                found.add(layer)
        elif not (layer == "" or any(other.startswith(layer + ".") for other in made)):
            break
    return found


class SymmetryWatch:
    """Follows the layers whose units started identical until they part (see the module docstring)."""

    def __init__(self) -> None:
        # layer -> (its unit weight, the first unit's weights when the debugger attached, units are columns, it
        # started at zero, the groups its rows are compared within)
        self._candidates: dict[str, tuple[Tensor, Tensor, bool, bool, int]] = {}
        self.zero_started: set[str] = set()  # the candidates that started at zero
        # weights already seen with distinct units or all zeros, by identity (a tensor compares by value): never a
        # candidate, so a later attach (a ``with`` block per epoch) skips them
        self._distinct: dict[int, weakref.ref[Tensor]] = {}
        # the layers whose unit weight's rows are output features (no embedding, no normalisation): those a forward
        # pass ends with may make the model's output (see _output_layers)
        self._weighted: frozenset[str] = frozenset()

    def attach(self, infos: dict[str, LayerInfo], params: list[Param]) -> None:
        """Find the candidates among the unit weights of ``infos`` that are trainable ``params`` held whole, and the
        weights of embeddings, whose units are their dimensions (the weight's columns)."""
        self._candidates = {}
        zeros: dict[str, Tensor] = {}
        by_name = {p.name: p for p in params}
        self._weighted = frozenset(
            layer
            for layer, info in infos.items()
            if info.unit_weight and not info.normalizes and info.type_name not in _EMBEDDINGS
        )
        with torch.no_grad():
            for layer, info in infos.items():
                if info.normalizes:
                    continue  # its gain and shift are elementwise, one per feature: no units sharing one input
                columns = info.type_name in _EMBEDDINGS
                p = by_name.get(f"{layer}.weight" if columns else info.unit_weight or "")
                if p is None or not p.whole or self._seen_distinct(p.tensor):
                    continue
                w = _units(p.tensor.detach(), columns)
                if w.dim() < 2 or w.shape[0] < 2 or not w.is_floating_point() or w.is_meta or w[0].numel() == 0:
                    continue
                groups = info.groups if w.shape[0] % info.groups == 0 else 1
                if _identical_rows(w, groups) and bool(w[0].any()):
                    self._candidates[layer] = (p.tensor, w[0].reshape(-1).clone(), columns, False, groups)
                elif not columns and min(w.shape[0], w[0].numel()) >= ZERO_ROWS and _zero(w):
                    zeros[layer] = p.tensor
                else:
                    self._distinct[id(p.tensor)] = weakref.ref(p.tensor)
        for layer, tensor in zeros.items():
            if len(zeros) >= ZERO_WEIGHTS:
                self._candidates[layer] = (tensor, tensor.detach()[0].reshape(-1).clone(), False, True, 1)
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
        outputs = _output_layers(pending.data, self._weighted)
        # an output of two values or fewer (or none read): the loss's error may hold a zero layer to one direction
        one = pending.data.classes <= 2
        zeros = {layer: c[0] for layer, c in self._candidates.items() if c[3]} if one else {}
        with torch.no_grad():
            sides = {layer: _sides(weight) for layer, weight in zeros.items()}
            for layer, (tensor, first, columns, zero, groups) in list(self._candidates.items()):
                if layer in outputs and not zero:  # each unit answers to an output of its own, not a copy
                    del self._candidates[layer]
                    continue
                w = _units(tensor.detach(), columns)
                rows = w.reshape(w.shape[0], -1).double()
                if zero:
                    if one and bool(rows.any()) and not _held_by_neighbour(layer, zeros, sides):
                        del self._candidates[layer]  # one direction, if any, is the loss's own: see the docstring
                        continue
                    spread = _off_direction(rows)
                else:
                    size = float(rows.norm())
                    by_group = _grouped(rows, groups)
                    spread = float((by_group - by_group.mean(1, keepdim=True)).norm()) / size if size > 0 else 0.0
                if not spread <= (ONE_DIRECTION if zero else PARTED):  # parted (a non-finite weight: another room's)
                    del self._candidates[layer]
                elif bool(rows.any()) if zero else not torch.equal(w[0].reshape(-1), first):  # the weights moved
                    found[layer] = (int(w.shape[0]), spread)
        pending.data.symmetric = found
