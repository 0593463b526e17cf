"""The forward hook: which forwards count, and what a forward pass records (see the package docstring)."""

from __future__ import annotations

import math
import threading
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..model import causal_lm, naming
from ..model.info import LayerInfo, Role
from ..stats import tensors as stats
from ..stats.step import SlotKey
from . import branches, hooks, loss_graph, measure, switches
from .affine import affine_layers, composed_pairs
from .clock import StepMode
from .compiled import CompiledSlots
from .order import LayerOrder
from .pending import Pending, merge_max

if TYPE_CHECKING:
    from .recorder import Recorder


#: Forward passes of a causal LM whose labels are checked against its input (see :meth:`ForwardPath._check_labels`).
LABEL_CHECKS = 4
#: Fully observed forward passes whose padding masks are read against the model's token input (see _check_masks): a
#: program builds its masks the same way on every pass.
MASK_CHECKS = 4
#: Fully observed forward passes whose attention ran with no mask over the model's tokens in which those tokens are
#: kept for the loss to read as its targets' source (see _count_unmasked): a next-token objective over an attention
#: that sees every position.
CAUSAL_CHECKS = 8
#: Fully observed forward passes given one sequence of token ids, with no ``nn.MultiheadAttention`` seen running
#: unmasked, whose token input is kept for the backward call to look for an attention in the loss's graph (see
#: capture/attention_graph.py): a program builds its attention the same way on every pass.
GRAPH_CAUSAL_CHECKS = 4
#: Fully observed forward passes whose attention and recurrent calls' layouts are kept for the loss to judge (see
#: _keep_layouts): a program lays out its sequences the same way on every pass.
LAYOUT_CHECKS = 8
#: Fully observed forward passes in which the layers' arguments are looked at for a graph cut (see _note_cut): a
#: program cuts its graph the same way on every pass, and looking costs a few microseconds per layer call.
CUT_CHECKS = 8
#: Tensors of a layer's arguments and of its output looked at for a cut, at most.
_LOOKED_AT = 8
#: Fully observed forward passes in which the layers given one tensor are compared for parallel copies of a block
#: (see capture/branches.py): a model routes the same way on every pass, and looking costs a few microseconds per
#: layer call.
BRANCH_CHECKS = 8
#: Fully observed forward passes in which the scale of the data entering the layers with parameters is read (see
#: _note_entry): the model's input may be rescaled in its forward (``x / 255``, a Normalize with registered buffers)
#: before any layer learns from it, and a program does so the same way on every pass.
ENTRY_CHECKS = 8
#: Fully observed forward passes in which the watched modules (the model itself included) are watched for being given
#: a bounded activation's output on some passes and data without a graph on others, that data profiled against the
#: activation's range (see :meth:`ForwardPath._note_source`).
RANGE_CHECKS = 64
#: The key under which a bounded activation's graph node names its layer, in the node's metadata dict (see
#: _note_source): a discriminator watched by its own debugger learns which generator layer made its input.
_MADE_BY = "neuraldbg.made_by"
#: Fully observed forward passes whose autograd graph is walked to tell whether the whole model is one affine map
#: (see :mod:`neuraldbg.capture.affine`): a program builds the same graph on every pass.
AFFINE_CHECKS = 2
#: In one such pass: the first layer calls with parameters given a floating input whose input is read, whatever it
#: is fed (raw numeric columns concatenated with embeddings before the first linear layer) ...
_FIRST_ENTRIES = 4
#: ... and the layer inputs read in all, those without a gradient included (data that no parameter has touched yet:
#: an image that enters a convolution after a side branch of metadata layers).
_ENTRIES = 8


class ForwardPath:
    """Layer outputs and the model's output, from the global module forward hook."""

    def __init__(self, rec: Recorder, model: nn.Module, infos: dict[str, LayerInfo], order: list[SlotKey]) -> None:
        self._rec = weakref.proxy(rec)  # the recorder owns this part (see Recorder.__init__)
        self._config = rec.config
        self._model = weakref.ref(model)
        self._infos = infos
        self._specs = {name: measure.spec_of(info) for name, info in infos.items()}
        self._names: dict[nn.Module, str] = {}
        self._root: nn.Module | None = None
        self._thread = 0
        self.order = LayerOrder(infos, order)
        self.compiled = CompiledSlots(rec, self._specs, self.order)
        self._open = False
        self._full = False
        self._tentative: Pending | None = None  # records of an eval-mode forward, kept if a backward follows
        self.refs: dict[SlotKey, Tensor] = {}  # layer outputs of a fully observed step
        self._seen: list[tuple[str, Any]] = []  # raw layer outputs of a cheap step, looked at only if needed
        self.input: Tensor | None = None
        self.others: list[Tensor] = []  # the call's other floating arguments (see stats.other_floats)
        self.output: Tensor | None = None
        self.never_positive: dict[SlotKey, Tensor] = {}  # functionally activated layers: units never positive
        # Per-unit statistics of many outputs of one shape are taken together at the end of a full forward pass
        # (one reduction per shape, see measure.layer_outputs) rather than in each hook. The first full forward
        # measures in the hooks and learns which layers have such company and which outputs are modified in place
        # downstream (their version changes before the forward ends): those are measured in their hooks always.
        self._learned = False
        self._batched: set[SlotKey] = set()  # layers whose per-unit statistics wait for the end of the forward
        self._deferred: list[measure.Deferred] = []
        self._versions: list[tuple[SlotKey, Tensor, int]] = []  # outputs whose in-place changes are watched
        self._groups: dict[tuple[object, ...], list[SlotKey]] = {}  # the learning forward's per-unit layers
        self._prev_channel_first = False
        self.autocast = False
        self.host_reads_are_free = True
        # while the loss's graph is still to be checked (see loss_graph): the graph node of each layer's output,
        # by identity, to the layer's name (the first layer whose output it is); None: not wanted
        self.nodes: dict[int, str] | None = None
        # ... and those nodes themselves: a graph node's Python object is made on demand and, in some torch releases
        # (2.11), dropped when nothing holds it; another object may then take its id, and the next look at the node
        # gets a new one. Held until the next forward pass, the ids above stay the nodes'.
        self._noted: list[object] = []
        # forward passes of a label-shifting causal LM whose labels are still to be checked, over the debugger's life
        self._label_checks = LABEL_CHECKS if causal_lm.shifts_labels(model) else 0
        # a fully observed forward pass: the outputs that carry a gradient, by where their values lie, to their layer
        # (held until the pass is let go, as ``refs`` are: a live output's memory cannot be another tensor's), to
        # see a later layer given one detached
        self._produced: dict[int, tuple[str, Tensor]] = {}
        # ... and the layers given a value without a gradient that no layer of the pass produced, with where its
        # values lie: a cut through functional ops, unless the value is the model's own argument (checked at its end)
        self._unlinked: list[tuple[str, int]] = []
        self._cut_checks = CUT_CHECKS  # fully observed forward passes still to look at for one
        self._branch_checks = BRANCH_CHECKS  # ... and to compare the layers given one tensor in (see _note_fed)
        # this pass's layers with weights, by where the values of the tensor they were given lie: (that tensor, held
        # until the pass ends so its memory is no other's meanwhile; the layers with their class names)
        self._fed: dict[int, tuple[Tensor, list[tuple[str, str]]]] = {}
        self._entry_checks = ENTRY_CHECKS  # fully observed forward passes still to read the entering data's scale in
        self._affine_checks = AFFINE_CHECKS  # ... and to walk for a model that is one affine map
        self._range_checks = RANGE_CHECKS  # ... and to compare data with a bounded source's range in
        # the modules given a bounded activation's output: (activation, low, high, the layer whose output it was, ""
        # when no watched layer's, whether that layer is another debugger's model's)
        self._sources: dict[str, tuple[str, float, float, str, bool]] = {}
        self._entered = 0  # calls of layers with weights given a floating input in this pass
        self._entries = 0  # their inputs read in this pass
        # the attention calls of this pass without any mask: (layer, the keys' batch and sequence lengths), counted
        # when the model's call ends if their keys are its token positions (see _count_unmasked)
        self._unmasked: list[tuple[str, tuple[int, ...]]] = []
        # ... and those without an attention mask and not causal, whatever their key-padding mask, or with one that
        # lets a position see a later one: (layer, lengths, the positions it hides; None: no mask) (see
        # _count_unmasked)
        self._uncausal: list[tuple[str, tuple[int, ...], Tensor | None]] = []
        # ... and the key-padding masks given to attention calls of this pass, by layer (see _check_masks)
        self._key_masks: list[tuple[str, Tensor]] = []
        self._mask_checks = MASK_CHECKS  # fully observed passes still to read the padding masks in
        self._causal_checks = CAUSAL_CHECKS  # ... and to keep the tokens of one whose attention had no mask in
        #: the model's one token input in a fully observed pass whose attention ran with no mask over it (see
        #: _count_unmasked): the backward call's listener reads the loss's targets against it, then lets it go
        self.unmasked_tokens: Tensor | None = None
        #: ... with the layers among them given a mask that lets a position see a later one, and the positions each
        #: hides: judged on the positions the loss scores only (a prefix LM's unscored prefix sees all of itself)
        self.masked_uncausal: list[tuple[str, Tensor]] = []
        self._graph_checks = GRAPH_CAUSAL_CHECKS
        self._mask_reads = CAUSAL_CHECKS  # fully observed passes whose attention masks are read (see _later_visible)
        self._mask_read = False  # ... one was read in this pass
        #: ... and the model's one token input in a fully observed pass where no such attention was seen: the
        #: backward call's listener looks for an unmasked attention in the loss's graph (see attention_graph)
        self.graph_tokens: Tensor | None = None
        # the attention calls of this pass given a batched query, and its recurrent calls given a batched input:
        # (layer, the lengths of the axes it reads as its sequence and as its batch, batch_first); those whose axes
        # are the model input's first two are kept in ``layouts`` when its call ends, for the loss to judge (see
        # capture/ledger.py)
        self._layouts: list[tuple[str, int, int, bool]] = []
        self.layouts: list[tuple[str, int, int, bool]] = []
        self._layout_checks = LAYOUT_CHECKS  # fully observed passes still to keep them in
        self._own_hooks = False  # a watched layer has forward hooks or pre-hooks of its own (see on_module_output)
        self._modules: list[tuple[str, nn.Module]] = []  # every submodule of the model, by name (see switches.py)
        self._hooks_in_pass = False  # ... found so in the hooked pass under way
        self._containers: set[str] = set()  # the submodules that hold submodules (see owner)
        self._ranks: dict[str, int] = {}  # every submodule's place in the model's order
        self._owner_map: dict[int, list[str]] | None = None  # this pass's layer outputs by graph node (see owner)
        self._owner_nodes: list[object] = []

    def attach(self) -> None:
        model = self._model()
        if model is None:
            raise RuntimeError("the model was garbage-collected")
        self._root = model
        self._names = {module: name for name, module in naming.named_modules(model) if name in self._infos}
        self._modules = [(name, module) for name, module in naming.named_modules(model) if name]  # containers too
        self._containers = {name for name, module in self._modules if next(module.children(), None) is not None}
        self._ranks = {name: i for i, (name, _) in enumerate(self._modules)}
        self._own_hooks = self._own_hooks or any(
            m._forward_hooks or m._forward_pre_hooks for m in self._names if m is not model
        )
        self._thread = threading.get_ident()
        self.compiled.attach(self._names)

    def model_calls(self) -> hooks.ModelCalls | None:
        """What :func:`~neuraldbg.capture.hooks.on_model_calls` needs, while attached."""
        if self._root is None or hasattr(self._root, "_orig_mod"):  # a compiled module: its graphs see the hook
            return None
        return self._root, self._names, self.on_model_call, self.on_model_end, self._seen

    def detach(self) -> None:
        self._names = {}
        self._root = None
        self._noted = []
        self.compiled.detach()
        self.release()

    def on_model_call(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """The watched model's own call begins (see :func:`~neuraldbg.capture.hooks.on_model_calls`): a training
        forward pass opens here, before any layer runs. True when no layer call needs the module hook: a cheap
        step, whose layers' outputs are only kept (see :func:`~neuraldbg.capture.hooks.on_model_calls`: a
        non-finite output is traced to the layer it began in; on a GPU they are measured with the output); the
        module hook then sits the call out, torch calls every layer on its fast path, and :meth:`on_model_end` ends
        the pass."""
        rec = self._rec
        if (
            self._open
            or self._own_hooks
            or module._forward_hooks  # the module hook saw the output before the model's own hooks changed it
            or module._forward_pre_hooks
            or self._refused(root=False)  # counted by the module hook, which sees this call's end
        ):
            return False
        try:
            self._begin()
        except Exception as exc:
            rec.fail("the forward hook of the model", exc)
            return False
        return (
            not self._full
            and self.nodes is None  # the loss's graph is being checked: its nodes are named from the layers' outputs
            and not hooks.compiled_any()  # a graph compiled while the hook is out would never call it
        )

    def on_model_end(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """The watched model's own call returned, its layers unseen (see :meth:`on_model_call`)."""
        try:
            self._end(args, kwargs, output)
        except Exception as exc:
            self._rec.fail("the forward hook of the model", exc)

    def _refused(self, root: bool) -> bool:
        """Whether a watched module's call now is no training forward of this debugger's: another thread's, one
        without gradients, one inside a ``torch.func`` transform (per-sample values inside vmap or grad, not a
        training step's tensors), one that ``torch.jit.trace`` records (an export: the debugger's own operations
        would land in the traced program, and the trace's check, which runs the model again, would find it changed),
        or one while detached. ``root``: the model's own call, counted in the coverage by why."""
        coverage = self._rec.coverage
        if threading.get_ident() != self._thread:
            coverage.other_thread_forwards += root
            return True
        if _jit_tracing():
            return True
        if not torch.is_grad_enabled():
            coverage.no_grad_forwards += root
            return True
        if _transformed():
            coverage.transformed_forwards += root
            return True
        return not self._rec.active

    def on_module_output(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """The global forward hook, called after every module call in the process."""
        if torch.compiler.is_compiling():
            if not torch.compiler.is_exporting():  # torch.export's program must hold the model's operations alone
                self.compiled.record(module, args, output)
            return
        name = self._names.get(module)
        if name is None:
            return
        if module._forward_hooks or module._forward_pre_hooks:  # a layer whose output or input its own hooks change:
            self._hooks_in_pass = True  # the module hook, called before them, sees what it made: passes keep it
        if self._refused(root=not name):
            return
        rec = self._rec
        try:
            if not self._open:
                self._begin()
            if self.nodes is not None and name:
                self._note_node(name, output)
            if name and self._full and isinstance(module, nn.MultiheadAttention):
                self._note_attention(name, module, args, kwargs)
            elif name and self._full and self._layout_checks and isinstance(module, nn.RNNBase):
                self._note_recurrent(name, module, args, kwargs)
            if not name:
                self._own_hooks, self._hooks_in_pass = self._hooks_in_pass, False  # as this hooked pass found them
                if self._full and self._range_checks:  # the model's own data argument (a tensor it concatenates)
                    self._note_source(name, args, kwargs, output)
                self._end(args, kwargs, output)
            elif not self._full:
                self._seen.append((name, output))
            else:
                if self._cut_checks:
                    self._note_cut(name, args, output)
                if self._branch_checks:
                    self._note_fed(name, module, args)
                if self._entry_checks and self._entries < _ENTRIES:
                    self._note_entry(name, module, args, kwargs)
                if self._range_checks:
                    self._note_source(name, args, kwargs, output)
                self._layer(name, output)
        except Exception as exc:
            rec.fail(f"the forward hook of {repr(name) if name else 'the model'}", exc)

    # --- a forward pass -------------------------------------------------------------------------------------

    def _begin(self) -> None:
        """The first watched module of a forward pass returned: the forward pass opens."""
        rec = self._rec
        self.discard_tentative()
        if rec.clock.forward_begins():
            rec.commit()
        if rec.clock.in_closure:
            rec.backward.grads.adopt_snapshot()
        self._open = True
        self.order.forward_begins()
        self.release()
        self._prev_channel_first = False
        self._full = rec.pending.data.full
        if self._full:
            for name, value, trainable, total in switches.look(self._modules):
                rec.coverage.note_switch(name, value, trainable, total, rec.pending.data.step)
        self._entered = self._entries = 0
        self._unmasked = []
        self._uncausal = []
        self._key_masks = []
        self._layouts = []
        self.layouts = []
        self.autocast = False
        if self._full and self._range_checks:
            self._range_checks -= 1
        self._noted = []
        if self.nodes is not None:
            self.nodes = {}
        rec.coverage.forwards += 1
        if self._root is not None and not self._root.training:  # eval mode: training only if a backward follows
            self._tentative = Pending(rec.pending.data.step, self._full)
        else:
            rec.pending.data.forwards += 1
            rec.training_forwards += 1
            rec.trained_in_train_mode = True

    def input_layer(self) -> LayerInfo | None:
        """The first layer of the forward order that owns parameters or normalises: the one the input meets."""
        for name, _ in self.order.keys:
            info = self._infos.get(name)
            if name and info is not None and (info.numel or info.normalizes):
                return info
        return None

    def _note_node(self, name: str, output: Any) -> None:
        """Note which layer's output the graph node of ``output`` is (an attribute read: nothing is computed)."""
        t = stats.first_tensor(output)
        node = t.grad_fn if t is not None else None
        if node is not None and self.nodes is not None and id(node) not in self.nodes:
            self.nodes[id(node)] = name
            self._noted.append(node)

    def _note_cut(self, name: str, args: tuple[Any, ...], output: Any) -> None:
        """A fully observed forward pass: whether this layer was given, as one of its arguments, an output of an
        earlier layer of this pass detached from the graph (the same values, in the same memory, without a
        gradient: ``.detach()``, ``.data``), or, as its first, a value without a gradient no layer produced (see
        _unlinked_cuts); and this layer's own outputs, kept by where their values lie.
        Metadata only (``requires_grad``, ``data_ptr``): nothing is read from the device."""
        first = stats.first_tensor(args)
        for x in stats.tensor_arguments(args, most=_LOOKED_AT):  # a recurrent layer's hidden state is its second
            where = _where(x) if x.is_floating_point() and not x.requires_grad else None
            if where is None:
                continue
            found = self._produced.get(where)
            if found is not None and found[0] != name:
                self._cut(found[0], name)
            elif found is None and x is first and self._produced:  # a layer with a gradient ran before it
                self._unlinked.append((name, where))
        for t in stats.tensor_arguments((output,), most=_LOOKED_AT):  # each output: (output, h_n) of a GRU
            where = _where(t) if t.requires_grad else None
            if where is not None:
                self._produced.setdefault(where, (name, t))

    def _note_fed(self, name: str, module: nn.Module, args: tuple[Any, ...]) -> None:
        """A fully observed forward pass: the tensor a layer with weights was given first, by where its values lie
        (parallel copies of a block are given the same one; see capture/branches.py). Metadata only."""
        info = self._infos.get(name)
        x = stats.first_tensor(args)
        if info is None or not info.numel or x is None or (where := _where(x)) is None:
            return
        entry = self._fed.get(where)
        if entry is None or entry[0].shape != x.shape:
            self._fed[where] = (x, [(name, type(module).__name__)])
        else:
            entry[1].append((name, type(module).__name__))

    def _note_branches(self) -> None:
        """The model's forward returned: the parallel copies among the layers given one tensor (see _note_fed)."""
        fed, self._fed = self._fed, {}
        for _, layers in fed.values():
            if len(layers) >= 2:
                self._rec.coverage.parallel.update(branches.copies(layers))

    def _note_entry(self, name: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A fully observed forward pass: the scale at which the data enters the layers that learn from it, the
        root-mean-square of the input of a layer with weights (see :func:`_weighted`) given a floating input (an
        embedding given ids is not one), when it is one of the pass's first such calls or its input carries no
        gradient (data no parameter has touched). Filed as ``entry_scale`` (the largest of the pass, read at the
        flush). Its input is the one the model's forward made of its own input: ``x / 255``, a Normalize with
        registered buffers, or a module of per-feature scales that standardises each series (RevIN) before it is
        applied; the input of such a module, or of a normalisation layer, is not read (its weights only rescale
        features: the scale it is given is not the scale a weight matrix multiplies)."""
        info = self._infos.get(name)
        if info is None or not info.numel or not _weighted(module):
            return
        x = stats.data_argument(args, kwargs)
        if x is None:
            return
        self._entered += 1
        if self._entered > _FIRST_ENTRIES and x.requires_grad:
            return
        plain = stats.readable(x)
        if plain is not None and plain.numel():
            self._entries += 1
            self._target().put("entry_scale", None, stats.rms(plain))

    def _cut(self, upstream: str, downstream: str) -> None:
        """Count a graph cut before ``downstream`` (``upstream``: the layer whose output it was given detached, ""
        when that is not known) and note the forward order of the layers, which the finding reads."""
        coverage = self._rec.coverage
        cut = (upstream, downstream)
        coverage.cuts[cut] = coverage.cuts.get(cut, 0) + 1
        if coverage.cut_step < 0:
            coverage.cut_step = self._rec.pending.data.step
        coverage.layer_order = tuple(dict.fromkeys([*(key[0] for key in self.order.keys), downstream]))

    def _unlinked_cuts(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The model's forward returned: the layers given a value without a gradient that is none of the model's
        own tensor arguments (nor a view of one at its start) were cut off from what ran before them."""
        unlinked, self._unlinked = self._unlinked, []
        if not unlinked:
            return
        given = {_where(t) for t in stats.tensor_arguments(args, kwargs)}
        for name, where in unlinked:
            if where not in given:
                self._cut("", name)

    def _note_attention(
        self, name: str, module: nn.MultiheadAttention, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Keep an attention call of a fully observed step that had no mask at all: no key-padding mask, no
        attention mask, not ``is_causal`` (positional or keyword), with its keys' batch and sequence lengths
        (arguments and shapes only, nothing is read); counted when the model's call ends (see _count_unmasked).
        A batched key-padding mask is kept instead, to be read against the token input then (see _check_masks).
        A batched query's layout is kept too: the lengths of the axes the layer reads as its sequence and its batch
        (see _keep_layouts)."""
        query = kwargs.get("query", args[0] if args else None)
        if self._layout_checks and isinstance(query, Tensor) and query.dim() == 3:
            self._note_layout(name, query, bool(module.batch_first))
        masks = (
            kwargs.get("key_padding_mask", args[3] if len(args) > 3 else None),
            kwargs.get("attn_mask", args[5] if len(args) > 5 else None),
        )
        if self._mask_checks and isinstance(masks[0], Tensor) and masks[0].dim() == 2:
            self._key_masks.append((name, masks[0]))
        causal = kwargs.get("is_causal", args[7] if len(args) > 7 else False)
        weights = kwargs.get("need_weights", args[4] if len(args) > 4 else True)
        key = kwargs.get("key", args[1] if len(args) > 1 else None)
        # ``is_causal`` is a hint that torch follows only with no key-padding mask and no weights asked for (as
        # ``nn.TransformerEncoderLayer`` calls it); otherwise the attention mask given beside it decides
        hinted = causal and (masks[1] is None or (masks[0] is None and not weights))
        if hinted or not isinstance(key, Tensor) or key.dim() not in (2, 3):
            return
        if masks[1] is not None:
            # an attention mask that lets a position see a later one (a float 0/1 ``tril``, added to the scores,
            # hides nothing) is, for the causal check, no mask; any mask hides what padding needs hidden
            if self._causal_checks and self._mask_reads:
                self._mask_read = True
                hidden = _later_visible(masks[1])
                if hidden is not None:
                    self._note_uncausal(name, module, query, key, hidden)
            return
        self._note_uncausal(name, module, query, key)
        if masks[0] is None:
            self._unmasked.append((name, _key_lengths(key, module)))

    def _note_uncausal(
        self, name: str, module: nn.MultiheadAttention, query: Any, key: Tensor, hidden: Tensor | None = None
    ) -> None:
        """Keep a self-attention call that lets every position see the later ones (see _note_attention), or, given
        a mask, some of them: ``hidden``, the positions that mask hides."""
        where = _where(key)
        if key is query or (
            isinstance(query, Tensor) and query.shape == key.shape and where is not None and _where(query) == where
        ):
            # a self-attention (its keys are its queries' positions): every position sees every other one, padding
            # masked or not; a cross-attention's keys are a memory (an image's patches, an encoder's states,
            # a segment before), which a causal mask does not apply to, whatever their length
            self._uncausal.append((name, _key_lengths(key, module), hidden))

    def _note_recurrent(self, name: str, module: nn.RNNBase, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Keep a recurrent layer's layout (an ``nn.RNN``, ``nn.LSTM`` or ``nn.GRU`` call of a fully observed step):
        it has the same ``batch_first`` trap as attention, its recurrence running along the axis it reads as the
        sequence. A packed sequence (not a tensor) is laid out by torch itself, and an unbatched input, 2-d, holds no
        batch: neither is kept."""
        x = kwargs.get("input", args[0] if args else None)
        if isinstance(x, Tensor) and x.dim() == 3:
            self._rec.coverage.recurrent.add(name)  # the finding's words tell a recurrence from an attention
            self._note_layout(name, x, bool(module.batch_first))

    def _note_layout(self, name: str, x: Tensor, batch_first: bool) -> None:
        """Keep the lengths of the axes of ``x``, 3-d, that a layer reads as its sequence and as its batch
        (see _keep_layouts)."""
        first, second = int(x.shape[0]), int(x.shape[1])
        self._layouts.append((name, second, first, True) if batch_first else (name, first, second, False))

    def _count_unmasked(self, tokens: Tensor | None, only: Tensor | None) -> None:
        """The model's call ended: count its unmasked attention calls whose keys are its token positions, their
        batch and sequence lengths those of the token input (batch first or not). Keys of other lengths (image
        patches, a Perceiver's latents) hold no padding whatever the tokens hold, and a token mask would not fit
        them. The same for its self-attention calls with no attention mask, not causal (a key-padding mask or not),
        over ``only``, the model's one token input wherever it stands among its arguments (a captioner's
        ``model(image, tokens)``; none for a source and a target sequence, whose encoder sees all of the source by
        design): when there was one, those tokens are kept for the loss to read (``unmasked_tokens``). A call given a
        mask that lets some position see a later one is counted by the loss's reader instead, if a position the
        loss scores does (``masked_uncausal``)."""
        unmasked, self._unmasked = self._unmasked, []
        uncausal, self._uncausal = self._uncausal, []
        coverage = self._rec.coverage
        _count_over(unmasked, tokens, coverage.unmasked_attention)
        counts = coverage.uncausal_attention
        seen = _count_over([(name, lengths) for name, lengths, hidden in uncausal if hidden is None], only, counts)
        shape = sorted(only.shape) if only is not None else None
        masked = [(name, mask) for name, lengths, mask in uncausal if mask is not None and sorted(lengths) == shape]
        if (seen or masked) and only is not None and only.dim() == 2 and self._causal_checks:
            self._causal_checks -= 1
            self.unmasked_tokens = only
            self.masked_uncausal = masked

    def _keep_graph_tokens(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A fully observed pass with no unmasked ``nn.MultiheadAttention`` over its tokens: keep the model's one
        token input (``input_ids`` when named so, beside labels of the same shape) for the backward call's listener
        to look for an attention in the loss's graph, on the first :data:`GRAPH_CAUSAL_CHECKS` such passes."""
        ids = kwargs.get("input_ids")
        only = ids if isinstance(ids, Tensor) and ids.dim() == 2 else _only_tokens(args, kwargs)
        only = only if only is not None else _tokens_beside_targets(args, kwargs)
        only = only if only is not None else _tokens_beside_mask(args, kwargs)
        if only is None or only.dim() != 2 or only.is_floating_point() or max(only.shape) < 3:
            return
        self._graph_checks -= 1
        self.graph_tokens = only

    def owner(self, node: object) -> tuple[str, bool] | None:
        """The layer of this fully observed pass whose output ``node`` (a graph node) produced, None for none: of
        several layers sharing one output, the outermost; and whether it holds submodules (code of its own around
        them: an attention block, not the ``Linear`` given the attention's result)."""
        names = self._owners().get(id(node))
        if not names:
            return None
        held = [n for n in names if n in self._containers]
        return (min(held, key=len), True) if held else (min(names, key=len), False)

    def rank(self, name: str) -> int:
        """Where the submodule ``name`` stands in the model's own order (-1: not one of them)."""
        return self._ranks.get(name, -1)

    def _owners(self) -> dict[int, list[str]]:
        if self._owner_map is None:
            found: dict[int, list[str]] = {}
            held: list[object] = []
            for (name, _), t in self.refs.items():
                node = t.grad_fn
                if node is not None:
                    held.append(node)
                    found.setdefault(id(node), []).append(name)
            self._owner_map = found
            self._owner_nodes = held  # each node's object kept while its id is a key
        return self._owner_map

    def _keep_layouts(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The model's call ended: keep, for the loss to judge, the layouts of its attention and recurrent calls whose
        sequence and batch axes are the first two axes of its first tensor argument, in either order (a
        sequence-first model's input is (sequence, batch); a batch-first one's (batch, sequence)). Attention over
        other axes (an axial attention over an image's rows, whose batch is the images times their columns) is left
        out: its lengths may equal the samples' by chance. Shapes only."""
        layouts, self._layouts = self._layouts, []
        first = stats.tensor_arguments(args, kwargs, most=1)
        if not first or first[0].dim() < 2:
            return
        axes = sorted(first[0].shape[:2])
        self.layouts = [found for found in layouts if sorted(found[1:3]) == axes]
        if self.layouts:
            self._layout_checks -= 1

    def _check_masks(self, tokens: Tensor | None, mask: Any) -> None:
        """The model's call ended on a fully observed pass that was given padding masks: its ``attention_mask``
        argument (a Hugging Face model's: 1 attends, 0 hides) and the key-padding masks of its attention calls
        (torch's: True hides). Each one of the token input's shape (a key-padding mask of a sequence-first input:
        its transpose) is read against the tokens: whether it hid the real tokens and showed the padding
        (:func:`~neuraldbg.stats.tensors.mask_inverted`, filed by source and read at the flush)."""
        key_masks, self._key_masks = self._key_masks, []
        if tokens is None or tokens.dim() != 2:
            return
        found: list[tuple[str, Tensor]] = []
        integer = isinstance(mask, Tensor) and mask.dtype in (torch.bool, torch.long, torch.int)
        if integer and mask.shape == tokens.shape:
            found.append(("", stats.hidden_positions(mask, attend_is_one=True)))
        flipped = tokens.shape[0] != tokens.shape[1]
        for name, given in key_masks:
            if given.shape == tokens.shape:
                found.append((name, stats.hidden_positions(given, attend_is_one=False)))
            elif flipped and given.shape == tokens.shape[::-1]:
                found.append((name, stats.hidden_positions(given, attend_is_one=False).t()))
        if not found:
            return
        self._mask_checks -= 1
        target = self._target()
        for source, hidden in found:
            target.put("mask_inverted", source, stats.mask_inverted(tokens, hidden))

    def _target(self) -> Pending:
        return self._tentative if self._tentative is not None else self._rec.pending

    def _layer(self, name: str, output: Any) -> None:
        """A fully observed step: the layer's statistics, now, before anything downstream modifies it in place. An
        output without elements (an expert that no token was routed to, an empty batch) tells nothing: not measured."""
        t = stats.first_tensor(output)
        if t is None or not t.numel():
            return
        plain = stats.readable(t)
        if plain is not t:  # a sparse output: its norm from its values; no per-unit statistics
            if plain is not None:
                self.refs[self.order.key(name)] = plain
            return
        key = self.order.key(name)
        self.refs[key] = t
        target = self._target()
        target.data.numel[key] = t.numel()
        spec = self._specs[name]
        # autocast is read inside the forward pass: some wrappers (accelerate) enter it inside model.forward only
        self.autocast = self.autocast or torch.is_autocast_enabled(t.device.type)
        follows_conv = spec.role is not Role.PARAMETRIC and self._prev_channel_first
        channel_first = spec.channel_first or t.dim() >= 4 or follows_conv
        if key in self._batched:
            self._deferred.append((target, key, spec, t, channel_first))
            self._versions.append((key, t, t._version))
        else:
            measure.layer_output(target, key, spec, t, channel_first, self._config)
            if not self._learned and measure.per_unit(spec):
                self._versions.append((key, t, t._version))
                group = (spec.role, spec.center, spec.radius, channel_first, t.shape, t.dtype, t.device)
                self._groups.setdefault(group, []).append(key)
        if spec.unit_layer and key[1] == 0 and not (self.order.complete and self.order.activated_by_module(key)):
            self.never_positive[key] = stats.never_positive(t, spec.channel_first)
        if self._config.output_gradients and t.requires_grad:
            hooks.on_gradient(t, partial(self._rec.backward.on_output_gradient, key))
        self._prev_channel_first = spec.channel_first or t.dim() >= 4

    def measure_deferred(self) -> None:
        """A full forward pass ended: the per-unit statistics that waited for it, in one batch. An output modified in
        place since its hook is not measured (its reading would describe the modified values) and its layer is
        measured in its hook from then on; the first full forward learns which layers wait (see __init__)."""
        versions, self._versions = self._versions, []
        deferred, self._deferred = self._deferred, []
        changed = {key for key, t, version in versions if t._version != version}
        if not self._learned and versions:
            self._learned = True
            batched = {
                key
                for (_, _, _, _, shape, dtype, _), keys in self._groups.items()
                if len(keys) >= stats.MIN_GROUP
                and dtype is torch.float32
                and isinstance(shape, torch.Size)
                and 0 < shape.numel() <= measure.UNIT_STACK_LIMIT
                for key in keys
            }
            self._batched = batched - changed
            self._groups = {}
        elif changed:
            self._batched -= changed
            deferred = [entry for entry in deferred if entry[1] not in changed]
        if deferred:
            measure.layer_outputs(deferred, self._config)

    def _check_labels(self, kwargs: dict[str, Any]) -> None:
        """A causal LM that shifts its labels itself was called with ``input_ids`` and ``labels``: where the next
        input token differs from the current one, the share of labels that are the next token rather than the
        current one is filed (read at the flush; see :func:`~neuraldbg.stats.tensors.labels_ahead`); with an
        ``attention_mask`` of their shape, the share of the scored labels that sit where it hides the input
        (:func:`~neuraldbg.stats.tensors.scored_padding`)."""
        ids, labels = kwargs.get("input_ids"), kwargs.get("labels")
        if not (isinstance(ids, Tensor) and isinstance(labels, Tensor)):
            return
        if ids.dim() != 2 or labels.shape != ids.shape or ids.shape[1] < 3 or ids.is_floating_point():
            return
        self._label_checks -= 1
        self._target().put("labels_ahead", None, stats.labels_ahead(ids, labels))
        mask = kwargs.get("attention_mask")
        if isinstance(mask, Tensor) and mask.shape == ids.shape and mask.dtype in (torch.bool, torch.long, torch.int):
            self._target().put("scored_padding", None, stats.scored_padding(labels, mask))

    def _note_source(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """A fully observed training pass: a module (the model itself included) whose data argument is a bounded
        activation's output (another model's sigmoid or tanh: a generator's images given to a discriminator)
        remembers that activation and the layer whose output it was; given data without a graph on another pass
        (the real images), that data is profiled against the activation's range (read at the flush, see
        :func:`~neuraldbg.stats.tensors.out_of_range`): what such a source cannot reach, it cannot imitate.
        Graph nodes are looked at, nothing else is read unless that happens."""
        t = stats.first_tensor(output)
        node = t.grad_fn if t is not None else None
        if node is None:
            return
        if loss_graph.bounded_range(node) is not None:  # the node carries its layer's name to the layers it feeds
            meta = getattr(node, "metadata", None)
            if isinstance(meta, dict):
                meta.setdefault(_MADE_BY, (id(self), name))
        x = stats.data_argument(args, kwargs)
        if x is None or _where(x) is None:
            return
        if x.grad_fn is not None:
            if name not in self._sources:
                made = loss_graph.bounded_node(x.grad_fn)
                spec = loss_graph.bounded_range(made) if made is not None else None
                if spec is not None:
                    meta = getattr(made, "metadata", None)
                    by = meta.get(_MADE_BY) if isinstance(meta, dict) else None
                    layer, elsewhere = (by[1], by[0] != id(self)) if isinstance(by, tuple) else ("", False)
                    self._sources[name] = (*spec, layer, elsewhere)
            return
        source = self._sources.get(name)
        if source is None:
            return
        coverage = self._rec.coverage
        if coverage.bounded_input is None:
            coverage.bounded_input = source
        entries = [("input_range", None, float(i)) for i in range(3)]
        self._target().put_vector(entries, stats.out_of_range(x, source[1], source[2]))

    def _fingerprint(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """File one fingerprint per sample of the call's first tensor argument (its data, ids included), read at
        the flush (see :mod:`neuraldbg.stats.samples`)."""
        head = args[0] if args else None
        first = [head] if type(head) is Tensor else stats.tensor_arguments(args, kwargs, most=1)
        prints = stats.sample_prints(first[0]) if first else None
        if prints is not None:
            target = self._target()
            target.put_vector([("sample", None, 0.0)] * int(prints.shape[0]), prints)
            target.data.sample_count += int(prints.shape[0])

    def _end(self, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """The model's own forward returned: check a cheap CPU step's output now, and hook its gradient."""
        self._open = False
        if self._versions:
            self.measure_deferred()
        t = stats.first_tensor(output)
        if t is None:
            self.discard_tentative()
            return
        inp = stats.data_argument(args, kwargs)  # the data, not a mask passed after it
        cheap_cpu = not self._full and t.is_cpu and self.host_reads_are_free
        if not cheap_cpu:  # a cheap CPU step looks at the input and the other arguments only if the output is bad
            self._keep_ends(args, kwargs, inp, t)
        data = self._target().data
        data.input_numel = inp.numel() if inp is not None else data.input_numel
        data.output_numel = t.numel()
        if self._full:  # under autocast a GradScaler may scale gradients between backward and step
            if self._entry_checks:
                self._entry_checks -= 1
            if self._cut_checks:
                self._cut_checks -= 1
                self._unlinked_cuts(args, kwargs)
            if self._branch_checks:
                self._branch_checks -= 1
                self._note_branches()
            if self._affine_checks and t.requires_grad:
                self._affine_checks -= 1
                layers = affine_layers(t.grad_fn)
                self._rec.coverage.note_affine(layers)
                if layers is None and self.nodes is not None:  # not one affine map: two layers composed as one?
                    widths = {name: w for module, name in self._names.items() if (w := _widths(module)) is not None}
                    self._rec.coverage.linear_pairs.update(composed_pairs(t.grad_fn, self.nodes, widths))
            self.autocast = self.autocast or torch.is_autocast_enabled(t.device.type)
            data.classes = stats.class_count(output)
            if self.others:  # data after the first argument (raw numeric columns after categorical ids)
                batch = stats.batch_size(args, kwargs)  # data shares the batch dimension; a count or a scale does not
                found = [stats.readable(x) for x in (inp, *self.others) if x is not None and stats.batched(x, batch)]
                self._target().put("input_scale", None, stats.data_scale([x for x in found if x is not None]))
            if self._label_checks:
                self._check_labels(kwargs)
            padding = self._rec.coverage.padding_id
            mask = kwargs.get("attention_mask") if self._mask_checks else None
            masked = isinstance(mask, Tensor) or bool(self._key_masks)
            tokens = stats.token_argument(args, kwargs) if padding is not None or self._unmasked or masked else None
            if self._unmasked or self._uncausal:
                self._count_unmasked(tokens, _only_tokens(args, kwargs))
            if self._mask_read:
                self._mask_read = False
                self._mask_reads -= 1
            if self.unmasked_tokens is None and self._graph_checks:
                self._keep_graph_tokens(args, kwargs)
            if self._layouts:
                self._keep_layouts(args, kwargs)
            if masked:
                ids = kwargs.get("input_ids")  # a Hugging Face model's tokens, whatever the order of its arguments
                self._check_masks(ids if isinstance(ids, Tensor) and not ids.is_floating_point() else tokens, mask)
            if tokens is not None and padding is not None:  # read at the flush, with the step's other readings
                self._target().put("padded", None, stats.holds(tokens, padding))
            if data.classes == 1:  # one output unit: probabilities (a binary classifier's sigmoid) or not
                self._target().put("probabilities", None, stats.in_unit_interval(t))
        if t.requires_grad and self._rec.coverage.repeats.printing:  # a training pass: were its samples seen?
            self._fingerprint(args, kwargs)
        if cheap_cpu:
            self._check_ends(args, kwargs, inp, t)
        # the loss gradient w.r.t. the output is read from a tensor hook, which also marks the start of the
        # backward pass; on a cheap CPU step under an optimizer, one element of the head layer's gradient read at
        # the optimizer step stands in for it (a Python call from the autograd engine costs ~15 us)
        # (always under a GradScaler: the backward pass tells a skipped step from a forward-only one, see clock)
        wanted = self._tentative is not None or not (cheap_cpu and self._rec.clock.mode is StepMode.OPTIMIZER)
        wanted = wanted or self._rec.scaler.active
        if t.requires_grad and wanted:
            hooks.on_gradient(t, self._rec.backward.on_backward_start)
        elif self._tentative is not None:
            self.discard_tentative()  # an eval-mode output nothing can differentiate: not training

    def _keep_ends(self, args: tuple[Any, ...], kwargs: dict[str, Any], inp: Tensor | None, output: Tensor) -> None:
        """Hold the call's data, its other floating arguments and its output until the pass is let go."""
        self.input, self.output = stats.readable(inp) if inp is not None else None, stats.readable(output)
        self.others = stats.other_floats(args, kwargs, inp)  # labels handed to a model that computes its loss

    def _check_ends(self, args: tuple[Any, ...], kwargs: dict[str, Any], inp: Tensor | None, output: Tensor) -> None:
        """The cheap check of a CPU step: the output's norm, read at once (a CPU read costs no device sync). Only
        when it is non-finite are the input, the other arguments and the layer outputs, still alive, measured to
        find where it started; then they are let go. (On a GPU every layer output is measured each step instead,
        read at the flush.)"""
        data = self._target().data
        value = stats.host_norm(output)
        if value is None:
            self.release()
            return
        data.output_norm = merge_max(data.output_norm, value)
        if not math.isfinite(value):
            self._keep_ends(args, kwargs, inp, output)
            given = stats.host_norm(self.input) if self.input is not None else None
            if given is not None:
                data.input_norm = merge_max(data.input_norm, given)
            if self.others and math.isnan(float(stats.nan_flag(self.others))):
                data.input_norm = math.nan  # NaN labels (or other data) handed to the model with its input
            refs = self.layer_refs()
            if refs:
                for key, norm in zip(refs, stats.to_host(stats.norms(list(refs.values())))):
                    data.act[key] = merge_max(data.act.get(key), norm)
        self.release()

    def close(self) -> None:
        """The backward pass or the optimizer step began: a forward still open (submodules called directly) ends."""
        self._open = False
        if self._versions:
            self.measure_deferred()

    def layer_refs(self) -> dict[SlotKey, Tensor]:
        """Every layer output of this forward pass (tensors on full steps, raw outputs on cheap ones)."""
        for name, output in self._seen:
            t = stats.first_tensor(output)
            if t is not None:
                self.refs[self.order.key(name)] = t
        self._seen.clear()
        return self.refs

    def release(self) -> None:
        """Let go of this forward pass's tensors."""
        self.refs.clear()
        self._seen.clear()
        self.input = self.output = None
        self._deferred.clear()
        self._versions.clear()
        self._produced.clear()
        self._fed.clear()
        self.unmasked_tokens = None
        self.masked_uncausal = []
        self.graph_tokens = None
        self._owner_map = None
        self._owner_nodes = []
        self._unlinked = []
        self.others = []

    def next_step(self) -> None:
        self.never_positive.clear()

    # --- eval-mode forwards -------------------------------------------------------------------------------

    def confirm(self) -> None:
        """A backward pass follows an eval-mode forward: a training step run in eval mode. Keep its records."""
        staged, self._tentative = self._tentative, None
        if staged is None:
            return
        pending = self._rec.pending
        pending.absorb(staged)
        if not self._rec.trained_in_train_mode:  # a model trained in eval mode: its attachments are compared for
            self._rec.training_forwards += 1  # changes out of sight (not a validation pass of a model that trains)
        steps = self._rec.coverage.eval_steps
        if not steps or steps[-1] != pending.data.step:
            steps.append(pending.data.step)

    def discard_tentative(self) -> None:
        """An eval-mode forward that no backward pass followed: a validation pass, not training."""
        if self._tentative is not None:
            self._tentative = None
            self._rec.coverage.eval_forwards += 1
            self.never_positive.clear()
            self.release()


def _widths(module: nn.Module) -> tuple[int, int, int] | None:
    """(inputs, outputs, groups) of a trainable Linear or convolution layer; None for any other module."""
    # its own parameter, never the attribute: a parametrised weight (spectral_norm) is computed on each read, and
    # in training mode that read runs a power iteration that changes the run
    own = module._parameters
    weight = own["weight"] if "weight" in own else None  # noqa: SIM401 (a TorchScript module's table has no get)
    if not isinstance(weight, nn.Parameter) or not weight.requires_grad:
        return None  # a frozen layer (a backbone's projection before a linear probe) is no design to question
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features, 1
    if isinstance(module, nn.modules.conv._ConvNd):
        return module.in_channels, module.out_channels, module.groups
    return None


#: Layers that multiply their input by weights of their own (``nn.MultiheadAttention`` and recurrent layers own
#: their matrices under other names than ``weight``).
_WEIGHTED: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Bilinear,
    nn.modules.conv._ConvNd,
    nn.RNNBase,
    nn.MultiheadAttention,
)


def _weighted(module: nn.Module) -> bool:
    """Whether ``module`` is a layer with weights: one whose input is multiplied by a matrix or kernel it owns (a
    linear, convolutional, recurrent or attention layer, or a user's module owning a parameter of two or more
    dimensions), where the input's scale becomes its pre-activations' and its weight gradients'. Modules whose
    parameters are one value per feature (a normalisation's affine, RevIN, PReLU) are not: they rescale features."""
    if isinstance(module, _WEIGHTED):
        return True
    return any(p.dim() >= 2 for p in module.parameters(recurse=False))


def _key_lengths(key: Tensor, module: nn.MultiheadAttention) -> tuple[int, ...]:
    """An attention call's keys' batch and sequence lengths (its sequence's alone, unbatched)."""
    if key.dim() == 2:  # unbatched: (sequence, features)
        return (int(key.shape[0]),)
    # (batch, sequence, features) or (sequence, batch, features)
    return (int(key.shape[0]), int(key.shape[1])) if module.batch_first else (int(key.shape[1]), int(key.shape[0]))


def _later_visible(mask: Any) -> Tensor | None:
    """The positions an ``nn.MultiheadAttention`` attention mask hides (one grid of queries by keys, see
    :func:`~neuraldbg.stats.tensors.hidden_grid`) when it lets an earlier position see a later one, else None: an
    entry hides when True (boolean: not allowed) or at most :data:`~neuraldbg.stats.tensors.HIDDEN_SCORE`
    (floating: added to the scores; Hugging Face's older models add -10^4, torch's own masks -inf). A float
    ``torch.tril(torch.ones(T, T))`` (1 on the past, 0 on the future) hides nothing. A mask that is not square over
    its last two axes, or not a plain tensor, is taken to hide them (not judged). Reads the mask (one value to the
    host), on the first fully observed passes only."""
    if not isinstance(mask, Tensor) or mask.dim() < 2 or mask.shape[-1] != mask.shape[-2] or _where(mask) is None:
        return None
    if mask.dtype is not torch.bool and not mask.is_floating_point():
        return None
    hidden = stats.hidden_grid(stats.hidden_positions(mask, attend_is_one=False))
    return None if stats.hides_later(hidden) else hidden


def _count_over(calls: list[tuple[str, tuple[int, ...]]], tokens: Tensor | None, counts: dict[str, int]) -> bool:
    """Count into ``counts`` each attention call whose keys' lengths are the axes of ``tokens`` (in either order);
    whether one was."""
    shape = sorted(tokens.shape) if tokens is not None else None
    seen = False
    for name, lengths in calls:
        if sorted(lengths) == shape:
            counts[name] = counts.get(name, 0) + 1
            seen = True
    return seen


def _token_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """A model call's arguments of token ids, integer tensors of two or more axes (a mask, boolean or floating, is
    not one; nor are the labels of one sample each), wherever they stand."""
    return [
        value
        for value in (*args, *kwargs.values())
        if isinstance(value, Tensor)
        and value.dim() >= 2
        and not value.is_floating_point()
        and value.dtype is not torch.bool
    ]


def _only_tokens(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """A model call's one argument of token ids (see :func:`_token_arguments`); None when it has none or several."""
    found = _token_arguments(args, kwargs)
    return found[0] if len(found) == 1 else None


#: The share of positions at which one of two token arguments is the other's next token, at least, for them to be
#: read as a model's tokens and their targets (``model(idx, targets)``, as nanoGPT is called).
SHIFTED = 0.9


@torch.no_grad()
def _tokens_beside_targets(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """Of a model call's two token arguments of one ``(batch, length)`` shape, the first when the second follows it
    by one position (``model(idx, targets)``, its loss computed inside): the tokens. None otherwise. Reads both (one
    value to the host), on the first fully observed passes only."""
    found = _token_arguments(args, kwargs)
    if len(found) != 2 or found[0].dim() != 2 or found[0].shape != found[1].shape or found[0].shape[1] < 3:
        return None
    first, second = found
    # the targets after the tokens, as nanoGPT takes them: a sequence-to-sequence model's ``(source, target_in)``
    # of a copy task holds the same pair the other way round, its source following its shifted target
    return first if float((first[:, 1:] == second[:, :-1]).float().mean()) >= SHIFTED else None


@torch.no_grad()
def _tokens_beside_mask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """Of a model call's two token arguments of one ``(batch, length)`` shape, the one holding other values than 0
    and 1 when the other holds those alone (an attention mask, or segment ids, given as integers and by position:
    ``model(input_ids, attention_mask)``): the tokens. None otherwise (both of 0 and 1 alone: which is which is not
    told). Reads both (two values to the host), on the first fully observed passes only."""
    found = _token_arguments(args, kwargs)
    if len(found) != 2 or found[0].dim() != 2 or found[0].shape != found[1].shape:
        return None
    binary = [bool(((t == 0) | (t == 1)).all()) for t in found]
    if binary[0] == binary[1]:
        return None
    return found[1] if binary[0] else found[0]


def _where(t: Tensor) -> int | None:
    """Where the values of ``t`` lie: the data pointer of a plain dense tensor with elements; None for what has
    none to compare (sparse, a subclass, a meta tensor, the wrapped tensors of ``torch.func`` transforms)."""
    if type(t) not in (Tensor, nn.Parameter) or t.layout is not torch.strided or not t.numel():
        return None
    try:
        return t.data_ptr() or None
    except RuntimeError:  # a tensor without storage
        return None


#: What says whether a ``torch.func`` transform is running (looked up once: the forward hook runs per module call).
_PEEK = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)


#: Whether ``torch.jit.trace`` is recording (``torch.jit.is_tracing`` without its TorchScript branch: a hook runs
#: in Python, never in a scripted function).
_jit_tracing = torch._C._is_tracing


def _transformed() -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``...) is running: its tensors are wrapped
    per-sample values that most operations of the measurements have no batching rule for (DP-SGD's per-sample
    gradients: ``vmap(grad(loss of functional_call(model, ...)))``)."""
    return _PEEK is not None and _PEEK() is not None
