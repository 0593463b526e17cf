"""Inside a torch.compile graph: statistics as tensor work into fixed slots, read at the optimizer step.

A hook traced by Dynamo must not graph-break (no ``.item()``, no host reads, no unsupported Python) and must not
make Dynamo recompile from step to step (no growing lists, no flags that change between steps). So a compiled
forward only packs each layer's statistics into one tensor (:func:`~neuraldbg.capture.measure.compiled_layer_output`)
stored in a dictionary whose keys are fixed when the debugger attaches, and every hook also rewrites one "tick"
slot. Outside the graph, at the optimizer step, :meth:`CompiledSlots.pull` sees the tick changed, commits the
previous step if it is complete, and files the slots into the step in progress: the model's input and output on
every step, every layer on fully observed steps.

The model's own hook does no tensor work when compiling: for a model class of the user's, torch.compile runs the
model's hooks outside its graph, and a hook doing tensor work there would be compiled as a second graph of its own.
So the input is measured by the hook of the first leaf module (in definition order, the one the input reaches
first in nearly every model) and the output stands for the last leaf module's output. What a compiled forward
cannot tell (the loss gradient, which needs a tensor hook, and the step boundary of a run without an optimizer)
is left out: such runs are counted by optimizer steps.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..stats import tensors as stats
from . import measure
from .order import LayerOrder

if TYPE_CHECKING:
    from .recorder import Recorder

_TICK = "\x00tick"  # rewritten by every compiled hook: changes whenever a compiled forward ran
_INPUT = "\x00input"


class CompiledSlots:
    """The slots compiled forwards write, and their reading at the optimizer step."""

    def __init__(self, rec: Recorder, specs: dict[str, measure.LayerSpec], order: LayerOrder) -> None:
        self._rec = weakref.proxy(rec)  # the recorder owns this part (see Recorder.__init__)
        self._config = rec.config
        self._specs = specs
        self._order = order
        self._names: dict[nn.Module, str] = {}
        self._slots: dict[str, Tensor] = {}
        self._pulled: dict[str, Tensor] = {}
        self._first_leaf = ""  # its hook measures the model's input
        self._last_leaf = ""  # its output stands for the model's output

    def attach(self, names: dict[nn.Module, str]) -> None:
        self._names = names
        leaves = [name for module, name in names.items() if name and next(module.children(), None) is None]
        self._first_leaf, self._last_leaf = (leaves[0], leaves[-1]) if leaves else ("", "")
        # each slot starts as a tensor of the size its hook will write: Dynamo guards on the size of the values of
        # a dictionary a graph writes to, so a slot that changed size would cost a recompilation
        self._slots = {name: torch.zeros(measure.packed_size(spec)) for name, spec in self._specs.items()}
        self._slots[_TICK] = torch.zeros(1)
        self._slots[_INPUT] = torch.zeros(2)
        self._pulled = dict(self._slots)

    def detach(self) -> None:
        self._names = {}

    def record(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """The forward hook inside a compiled graph (traced by Dynamo): tensor work into the slots, nothing else."""
        name = self._names.get(module)
        if not name or not torch.is_grad_enabled():  # the model's own hook: see the module docstring
            return
        t = stats.first_tensor(output)
        if t is None:
            return
        packed = measure.compiled_layer_output(self._specs[name], t, self._config)
        self._slots[name] = packed
        self._slots[_TICK] = packed[:1]
        if name == self._first_leaf:
            inp = stats.data_argument(args)  # the data, not a mask passed after it
            if inp is not None:
                norm = torch.linalg.vector_norm(inp.detach().float())
                self._slots[_INPUT] = torch.stack([norm, norm.new_tensor(float(inp.numel()))])

    def pull(self) -> None:
        """At the optimizer step: file what compiled forwards left in the slots since the last step."""
        slots = self._slots
        if not slots or slots[_TICK] is self._pulled[_TICK]:
            return  # no compiled forward since the last step (the slots still hold what was pulled)
        rec = self._rec
        if rec.clock.forward_begins():
            rec.commit()
        if rec.clock.in_closure:
            rec.backward.grads.adopt_snapshot()
        rec.coverage.forwards += 1
        pending = rec.pending
        for name, spec in self._specs.items():
            packed = slots[name]
            if packed is self._pulled[name]:
                continue
            self._pulled[name] = packed
            if name == self._last_leaf:
                pending.put("output", None, packed[0])
                pending.put("output_numel", None, packed[1])
            if pending.data.full:
                measure.file_compiled(pending, self._order.first(name), spec, packed)
        if slots[_INPUT] is not self._pulled[_INPUT]:
            self._pulled[_INPUT] = slots[_INPUT]
            pending.put("input", None, slots[_INPUT][0])
            pending.put("input_numel", None, slots[_INPUT][1])
        self._pulled[_TICK] = slots[_TICK]
