"""What each backward pass did to the watched parameters' gradients: whether it reached the model, the loss it
started from, and whether it added to a gradient the optimizer had already applied.

Seen through the wrapper of ``torch.autograd.backward`` (:func:`neuraldbg.capture.hooks.on_backward_calls`): just
before a backward pass runs, the ``.grad`` of each tracked parameter is noted by identity and version counter (an
attribute read, no device work); just after it, the parameters whose ``.grad`` changed are those it reached. A
backward pass that reached none of them is another model's (the other network of a GAN) and is not this
debugger's business.

**The loss of a step** is the loss whose gradient the optimizer applies: the sum of the losses of the backward
passes whose gradients are in ``.grad`` when the optimizer steps. A backward pass that finds the gradients reset
(``None``, a new tensor, or zeroed in place since the last backward pass or optimizer step) begins a new sum;
one that finds them as the last backward pass left them adds to it (gradient accumulation: micro-batch losses
divided by the number of micro-batches, as Lightning and the Trainer do, sum to the step's mean loss). So a GAN's
discriminator, whose ``.grad`` also receives the generator's backward pass until ``netD.zero_grad()`` clears it,
is given ``errD_real + errD_fake``, never ``errG``. Inside ``optimizer.step(closure)`` the first sum is kept: the
loss at the parameters the step started from, which is what ``step`` returns (LBFGS evaluates the closure several
times). A root that is not a loss (``backward(gradient=...)``) leaves the step without a loss. The loss is kept as
a detached 0-d tensor and read at the next flush (no host sync); a GradScaler's scale is divided out.

**Gradients not zeroed.** Right after an owned optimizer's step, each tracked parameter's ``.grad`` is noted. A
backward pass that starts while a ``.grad`` is still exactly that tensor, unmodified since (same identity, same
version counter), adds the new gradient to the one already applied: if no reset follows before the next step
(a GAN's ``netD.zero_grad()`` after the generator's backward pass), the optimizer steps with the sum of every
earlier step's gradient. Exact, with no statistics: legitimate accumulation (several backward passes, then the
step, then ``zero_grad``), ``zero_grad(set_to_none=False)``, ``model.zero_grad()``, ``p.grad = None`` and
``p.grad.zero_()`` all reset the gradient first. Zeroing through ``p.grad.data.zero_()`` bypasses the version
counter, so the carried gradient's largest magnitude is also measured (on the device, read at the flush): a
carried gradient that is all zeros was reset after all. Without an optimizer object (a manual update
``p.data.add_(p.grad, alpha=-lr)``), the anchor is the previous backward pass: the head parameter's ``.grad`` is the
same tensor, not all zeros, while the parameter changed in between (a few of its elements compared on the device).

**Gradients thrown away.** The other way round: a backward pass that finds the gradients reset while an earlier
backward pass since the optimizer's last step had left its own there threw that gradient away unused. Counted per
pass, and per stretch of backward passes between two optimizer steps (counters and a flag, no tensor read): an
``optimizer.step()`` once per epoch after a ``zero_grad()`` every batch throws away all but the last of each epoch's
passes; a GAN's discriminator, whose ``.grad`` also receives the generator's backward pass until its next
``zero_grad()``, throws away one pass in two or three.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..model.info import owner_of_params
from ..stats import samples
from ..stats.tensors import (
    binary_counts,
    dense,
    finite_per_row,
    grad_of,
    hides_later,
    is_none,
    label_counts,
    label_entropy,
    largest_magnitude,
    log_prob_gap,
    merge_moments,
    out_of_range,
    outside_unit,
    positive_labels,
    sample_outcomes,
    target_baseline,
    target_moments,
    target_profile,
)
from . import attention_graph, collector, dropout_graph, hooks, loss_graph, sample_views
from .clock import StepMode
from .label_mix import LabelMix
from .pending import merge_max

if TYPE_CHECKING:
    from .recorder import Recorder

#: Parameters whose gradients are followed (spread over the model, the first and the last always among them): a
#: backward pass is attributed to the model when it reaches one of them.
TRACKED = 64
#: Carried gradients whose largest magnitude is measured to confirm a carry-over.
_CONFIRMED = 3
#: Elements of the head parameter compared across a manual update.
_SAMPLE = 16
#: Backward passes reaching the model whose loss graph is checked for an activation before the loss (the first
#: ones: a loop computes its loss the same way every step).
LOSS_CHECKS = 4
#: Backward passes reaching the model whose binary cross-entropy's or mean squared error's targets are profiled for
#: its chance level (more than :data:`LOSS_CHECKS`: a variance from a few batches is off by a tenth; the moments
#: stay on the device and are read with the steps' other readings, no sync of their own).
TARGET_CHECKS = 32
#: Passes between two filings of the chance level the target moments give so far (each filing is a few kernels and
#: a reading at the flush; a judged run has 64 losses and at least 16 fully observed steps).
FILE_TARGETS_EVERY = 4
#: Changes of the optimizers' weight decay kept (a run sets it once; a schedule of it changes it every step).
DECAY_CHANGES = 64

_State = tuple[Tensor, int] | None


#: What the first backward passes read before their graph is freed: a regression target's profile, how far an
#: nll_loss input is from log-probabilities (with the node that produced it), how much of a bounded output's targets
#: it cannot reach (with what bounds it), how often each class is an nll_loss's label (with the number of classes),
#: the per-column moments of a binary cross-entropy's or a mean squared error's targets (with the loss's kind and the
#: count of values outside [0, 1]), the classes a row chose among, each sample's own loss and hit (see
#: stats.samples), how much of a clamped binary cross-entropy input lay outside [0, 1], how often each class is
#: an nll_loss's label on a fully observed step (with the number of classes; see capture/label_mix.py), and how many
#: positive labels a binary cross-entropy on a softmax's output asks of each of its rows (with the softmax's node and
#: the node whose output it took).
_LossReadings = tuple[
    Tensor | None,
    tuple[Tensor, int, str, int, int] | None,
    tuple[Tensor, loss_graph.BoundedPrediction] | None,
    tuple[Tensor, int] | None,
    tuple[str, Tensor, Tensor] | None,
    Tensor | None,
    tuple[Tensor, Tensor] | None,
    tuple[Tensor, loss_graph.ClampedScores] | None,
    tuple[Tensor, int] | None,
    tuple[Tensor, int, int] | None,
]
#: The readings of a backward pass whose graph was not looked at.
_NO_READINGS: _LossReadings = (None, None, None, None, None, None, None, None, None, None)


#: A ``.grad`` as an optimizer step or a backward pass left it: a weak reference to it, its version counter, and
#: whether an optimizer step left it. A tuple: a backward pass marks every tracked parameter anew.
_Mark = tuple[weakref.ref[Tensor], int, bool]


class GradLedger:
    """See the module docstring. One per recorder; :meth:`before` is its backward-call listener."""

    def __init__(self, rec: Recorder) -> None:
        self._rec = weakref.proxy(rec)  # the recorder owns this part (see Recorder.__init__)
        self._tensors: list[Tensor] = []
        self._names: list[str] = []
        self._marks: list[_Mark | None] = []
        self._index: dict[str, int] = {}
        self._owned_indices: tuple[frozenset[str] | None, list[int]] = (None, [])  # the last owner's, by index
        self._carry: tuple[list[str], Tensor | None] | None = None  # carried-over gradients awaiting the step
        self._open = False  # a backward pass reached the model since its optimizer last stepped
        self._dropped = 0  # ... of which this many threw away the gradient of an earlier one (see _account)
        self._forwards_at = 0  # the model's forward passes counted when a backward pass last reached it
        self._reached: set[int] = set()  # tracked parameters a backward pass reached since their optimizer stepped
        # a fully observed step: a few gradients the last backward pass left (indices, tensors and their versions)
        self._left: tuple[list[int], list[Tensor], list[int]] | None = None
        self._sample: tuple[weakref.ref[Tensor], Tensor] | None = None  # manual updates: head .grad, parameter
        self._thread = 0
        # backward passes whose loss graph is still to be checked, over the debugger's life: a run continued after
        # close() (attach() again, a with block per epoch) goes on from there (the loop computes its loss as
        # before), rather than checking its first passes again (while detached, no backward pass is listened to)
        self._loss_checks = LOSS_CHECKS
        self._dropout_checks = dropout_graph.PASSES
        self._held: list[object] = []  # the graph nodes of the loss checks of the last backward call (see before)
        # the label counts so far (on the device), the classes; like the label mix below, kept over the debugger's
        # life (the passes that count are the loss checks', which a continued run goes on with)
        self._labels: tuple[Tensor, int] | None = None
        self._targets: tuple[str, Tensor, Tensor] | None = None  # a BCE's / an MSE's target moments so far
        # backward passes whose targets were looked for, over the debugger's life (at most TARGET_CHECKS): a run
        # continued after close() (attach() again, a with block per epoch) goes on from there rather than reading
        # them all again
        self._target_passes = 0
        self._looked = False  # this backward pass's targets were looked for
        self._view_checks = sample_views.CHECKS  # fully observed passes still to look for views that mix samples in
        self._mix = LabelMix()  # how mixed each fully observed step's labels are
        # optimizer -> (its groups' sizes and whether each decays, the names of the decaying groups' parameters)
        self._decayed: dict[int, tuple[tuple[tuple[int, bool], ...], frozenset[str] | None]] = {}

    def attach(self) -> None:
        params = self._rec.backward.params
        seen: dict[int, tuple[str, Tensor]] = {}
        for p in params:
            seen.setdefault(id(p.tensor), (p.name, p.tensor))
        unique = list(seen.values())
        if len(unique) > TRACKED:
            step = (len(unique) - 1) / (TRACKED - 1)
            unique = [unique[round(i * step)] for i in range(TRACKED)]
        # a run continued after close(): each gradient's mark as the last attachment left it (its weak reference and
        # version tell whether anything reset the gradient since), so a step begun in this attachment that adds to
        # the gradient the last one applied is seen; and the manual-update anchor of that step (``_sample``)
        kept = dict(zip(self._names, self._marks, strict=False))
        self._names = [n for n, _ in unique]
        self._tensors = [t for _, t in unique]
        self._marks = [kept.get(n) for n in self._names]
        self._index = {n: i for i, n in enumerate(self._names)}
        self._owned_indices = (None, [])
        self._carry = None
        self._open = False
        self._dropped = 0
        self._reached = set()
        self._left = None
        self._thread = threading.get_ident()
        self._decayed = {}
        self._rec.forward.nodes = {} if self._loss_checks else None

    def detach(self) -> None:
        self._tensors = []  # the marks and the manual-update anchor stay for the next attach() (weak references)
        self._reached = set()
        self._left = None
        self._carry = None
        self._held = []
        self._rec.forward.nodes = None

    # --- a backward call ----------------------------------------------------------------------------------

    @collector.paused
    def before(self, loss: Tensor | None) -> Callable[[bool], None] | None:
        """A backward pass is about to run (the listener of :func:`~neuraldbg.capture.hooks.on_backward_calls`)."""
        rec = self._rec
        if not rec.active or not self._tensors or threading.get_ident() != self._thread:
            return None
        try:
            # a compiled forward files its step at the next optimizer step: file it now, before this backward
            # pass's loss is given to the step in progress (else the loss of step k would go to step k - 1)
            rec.forward.compiled.pull()
            grads = list(map(grad_of, self._tensors))
            states: list[_State] | None = None  # None: every .grad is None (zero_grad's default), none carried
            carried: list[int] = []
            if not all(map(is_none, grads)):
                states = []
                marks = self._marks
                for i, g in enumerate(grads):
                    state = None if g is None else (g, g._version)
                    states.append(state)
                    mark = marks[i]
                    if state is not None and mark is not None and mark[2] and _unchanged(mark, state):
                        carried.append(i)
            check = self._confirmation(carried) if carried else None
            manual = self._manual_check() if rec.clock.mode is not StepMode.OPTIMIZER else None
            # the targets are looked for on fully observed steps only (a cheap step stays cheap; a smoke run's
            # first steps are mostly full ones)
            data = rec.pending.data
            forward = rec.forward
            if not (
                data.full
                or self._loss_checks
                or forward.layouts
                or forward.unmasked_tokens is not None
                or forward.masked_uncausal
                or forward.graph_tokens is not None
            ):  # a cheap step once the first passes are checked: nothing below looks at its graph
                self._looked = False
                self._held = []
                return partial(self._after, loss, states, carried, check, manual, [], _NO_READINGS)
            self._looked = self._target_passes < TARGET_CHECKS and data.full
            counted = data.sample_count if data.full and data.step >= samples.LOSSES_FROM else 0
            mixing = data.full and self._mix.looking
            # a policy-gradient term whose weights were never negative yet is looked for again on every full step
            recheck = data.full and rec.coverage.policy_candidate and not rec.coverage.policy_gradient
            # the attention layouts a fully observed forward pass kept, judged by the samples the loss scores
            layouts = rec.forward.layouts
            if layouts:
                rec.forward.layouts = []
            # ... and the tokens of a fully observed pass whose attention had no mask over them, read against the
            # loss's targets (a next-token objective over an attention that sees every position)
            tokens = rec.forward.unmasked_tokens
            rec.forward.unmasked_tokens = None
            masked, rec.forward.masked_uncausal = rec.forward.masked_uncausal, []
            # ... or, with no such attention among the layers, the token input of a pass whose attention may be in
            # the graph only (F.scaled_dot_product_attention, a hand-written one)
            graph_tokens = rec.forward.graph_tokens
            rec.forward.graph_tokens = None
            others = (
                self._loss_checks
                or self._looked
                or counted
                or mixing
                or recheck
                or layouts
                or tokens is not None
                or graph_tokens is not None
            )
            # ... and views that mix samples, on the first fully observed passes
            viewing = self._view_checks > 0 and data.full
            roots = hooks.backward_roots() if others or viewing else []
            # the samples the loss scores, when it scores one target each: the views and the layouts read them
            targets = loss_graph.sample_targets(roots) if roots and (viewing or layouts) else None
            if viewing and roots:
                self._view_checks -= 1
                if targets is not None:
                    views = sample_views.mixed(roots, targets[0], rec.forward.owner)
                    rec.coverage.note_views(views, data.step)
                if not others:
                    roots = []
            if layouts and targets is not None:
                rec.coverage.note_layouts(targets, layouts, data.step)
            objective = loss_graph.next_token_nll(roots, graph_tokens) if graph_tokens is not None and roots else None
            if objective is not None:
                scored = loss_graph.scored_positions(objective[0], graph_tokens)
                seen = attention_graph.unmasked([objective[0]], set(graph_tokens.shape), rec.forward.owner, scored)
                if seen:
                    counts = rec.coverage.uncausal_attention
                    for name in sorted({name for name, _ in seen}, key=rec.forward.rank):
                        counts[name] = counts.get(name, 0) + 1
                    over = {name for name, how in seen if how == attention_graph.OVER_QUERIES}
                    rec.coverage.query_softmax.update(over)
                    rec.pending.put("next_token", None, objective[1])
            aimed = loss_graph.next_token_nll(roots, tokens) if tokens is not None and roots else None
            if tokens is not None and aimed is not None:
                if masked:  # masks that let a position see a later one: does a position the loss scores?
                    scored = loss_graph.scored_positions(aimed[0], tokens)
                    counts = rec.coverage.uncausal_attention
                    for name, hidden in masked:
                        if not hides_later(hidden, scored):
                            counts[name] = counts.get(name, 0) + 1
                rec.pending.put("next_token", None, aimed[1])
            if not roots and not mixing:  # nothing to read in the graph (every cheap step): no reading below
                self._held = []
                return partial(self._after, loss, states, carried, check, manual, roots, _NO_READINGS)
            checked = roots if self._loss_checks else []
            # readings before and after the pass compare graph nodes by identity: the nodes are held until the next
            # backward call (see loss_graph.hold)
            self._held = loss_graph.hold(checked) if checked else []
            if checked and self._dropout_checks:  # dropout applied in the forward code: the pass frees its masks
                self._dropout_checks -= 1
                self._note_dropout(self._held)
            # a mean squared error's target is profiled now: the backward pass frees what the graph saved
            found = loss_graph.regression(checked) if checked else None
            profile = target_profile(found.target) if found is not None else None
            if found is not None and found.outputs > 1 and rec.coverage.repeated_target is None:
                layer = (rec.forward.nodes or {}).get(found.node, "")
                rec.coverage.repeated_target = (found.outputs, layer, rec.pending.data.step)
            # ... and so is the input of an nll_loss that no log_softmax produced: are its values log-probabilities?
            nll = loss_graph.log_probabilities(checked) if checked else None
            gap = (log_prob_gap(nll.values), nll.node, nll.loss, nll.direct, nll.dim) if nll is not None else None
            # ... and the input of a clamp that made a binary cross-entropy's input: were they probabilities?
            clamped = loss_graph.clamped_scores(checked) if checked else None
            clamp = (outside_unit(clamped.values), clamped) if clamped is not None else None
            # ... and the targets of a binary cross-entropy on a softmax's output: how many labels each row holds
            soft = loss_graph.softmax_under_bce(checked) if checked else None
            positives = (positive_labels(soft.target, soft.dim), soft.node, soft.below) if soft is not None else None
            # ... and the targets of a loss by value on a bounded activation's output: can it reach them?
            bounded = loss_graph.bounded_prediction(checked) if checked else None
            reach = (out_of_range(bounded.target, bounded.low, bounded.high), bounded) if bounded is not None else None
            # ... and the class indices of an nll_loss: how often is each class a label?
            labels = loss_graph.class_labels(checked) if checked else None
            counts = (label_counts(labels.target, labels.classes, labels.ignore), labels.classes) if labels else None
            options = finite_per_row(labels.values) if labels is not None and labels.values is not None else None
            # ... and each sample's own loss, beside the fingerprints its forward pass filed (see stats.samples)
            found_labels = labels or (loss_graph.class_labels(roots) if roots and (counted or mixing) else None)
            own = found_labels if counted else None
            # ... and, on a fully observed step, the classes of a classifier's labels (one per row, the loss their
            # mean or sum: a policy gradient weighs each row's term by hand): how mixed are they within a step?
            mix = None
            if mixing and found_labels is not None and found_labels.reduced and found_labels.target.dim() == 1:
                target = found_labels.target
                mix = (label_counts(target, found_labels.classes, found_labels.ignore), found_labels.classes)
            per_sample = None
            if own is not None and own.values is not None:
                per_sample = sample_outcomes(own.values, own.target, own.ignore, counted)
            # ... and a loss that compares each prediction with other samples' targets (shapes only, nothing read)
            if checked and rec.coverage.crossed_loss is None:
                self._note_crossed(checked)
            # ... and a policy-gradient term whose advantage carries a gradient to a value head (graph nodes only)
            if checked and rec.coverage.undetached is None:
                self._note_undetached(checked)
            if (checked or recheck) and roots and not rec.coverage.policy_gradient:
                weighed = loss_graph.weighs_log_probabilities(roots)
                rec.coverage.policy_gradient = weighed == "advantage"
                rec.coverage.policy_candidate = rec.coverage.policy_candidate or weighed == "weight"
            # ... and the targets of a binary cross-entropy or a mean squared error: their base rates or variances
            looked_for = self._looked or (mixing and mix is None and found_labels is None)
            targeted = loss_graph.loss_targets(roots) if roots and looked_for else None
            binary = targeted.target if targeted is not None and targeted.kind == "bce" else None
            if mixing and mix is None and binary is not None and binary.numel() == binary.shape[0]:
                mix = (binary_counts(binary), 2)  # one binary label per row
            if mixing and mix is None:
                self._mix.missed()
            targeted = targeted if self._looked else None
            moments = None
            if targeted is not None:
                moments = (targeted.kind, *target_moments(targeted.target, targeted.kind == "bce"))
            readings = (profile, gap, reach, counts, moments, options, per_sample, clamp, mix, positives)
            return partial(self._after, loss, states, carried, check, manual, roots, readings)
        except Exception as exc:
            rec.fail("the backward-call listener", exc)
            return None

    def _note_crossed(self, roots: list[Tensor]) -> None:
        """Note a loss that broadcast its predictions against other samples' targets, with the layer whose output
        the prediction is (see :func:`~neuraldbg.capture.loss_graph.crossed`)."""
        rec = self._rec
        nodes = rec.forward.nodes or {}
        found = loss_graph.crossed(roots, nodes)
        if found is not None:
            step = rec.pending.data.step
            rec.coverage.crossed_loss = (found.loss, found.prediction, found.compared, nodes.get(found.node, ""), step)

    def _note_undetached(self, roots: list[Tensor]) -> None:
        """Note a loss that weighs a log-probability by a difference (an advantage) that carries a gradient to
        parameters the log-probability does not use, with the layers that hold them (see
        :func:`~neuraldbg.capture.loss_graph.undetached_weight`); an empty tuple when no watched layer holds them."""
        rec = self._rec
        found = loss_graph.undetached_weight(roots)
        if found is None:
            return
        held = {id(t) for t in found.parameters}
        owners = owner_of_params(rec.infos)
        names = [p.name for p in rec.backward.params if id(p.tensor) in held]
        layers = tuple(dict.fromkeys(owners.get(name, name.rpartition(".")[0]) for name in names))
        rec.coverage.undetached = (layers, rec.pending.data.step)

    def _confirmation(self, carried: list[int]) -> Tensor | None:
        """The largest magnitude of a few carried gradients, on the device (0: they were zeroed through ``.data``)."""
        grads = [self._tensors[i].grad for i in self._smallest(carried)]
        return _largest_magnitude([g for g in grads if g is not None])

    def _smallest(self, indices: list[int]) -> list[int]:
        """The :data:`_CONFIRMED` smallest non-empty tracked parameters among ``indices`` (the cheapest to read)."""
        tensors = self._tensors
        return sorted((i for i in indices if tensors[i].numel()), key=lambda i: tensors[i].numel())[:_CONFIRMED]

    def _manual_check(self) -> Tensor | None:
        """Without an optimizer: 1 when the head parameter's ``.grad`` is the tensor the last backward pass left,
        not all zeros, while the parameter changed since (a manual update that kept the gradient), else 0."""
        sample = self._sample
        if sample is None:
            return None
        head = self._head()
        if head is None:
            return None
        g = head.grad
        if g is None or sample[0]() is not g:
            return None
        local = dense(g.detach())
        if local is None or not local.numel():
            return None
        with torch.no_grad():
            changed = (_first_elements(head) != sample[1]).any()
            nonzero = largest_magnitude(local) > 0
            carried: Tensor = (changed & nonzero).float()
            return carried

    def _head(self) -> Tensor | None:
        head = self._rec.backward.grads.head()
        return head.tensor if head is not None and head.piece is None else None

    @collector.paused
    def _after(
        self,
        loss: Tensor | None,
        states: list[_State] | None,
        carried: list[int],
        check: Tensor | None,
        manual: Tensor | None,
        roots: list[Tensor],
        readings: _LossReadings,
        completed: bool,
    ) -> None:
        rec = self._rec
        if not completed or not rec.active:
            return
        try:
            reached: list[int] = []
            fresh = False
            marks = self._marks
            for i, g in enumerate(map(grad_of, self._tensors)):
                if g is None:
                    continue
                before = None if states is None else states[i]
                version = g._version
                if before is not None and before[0] is g and before[1] == version:
                    continue
                reached.append(i)
                mark = marks[i]
                fresh = fresh or before is None or not _unchanged(mark, before)
                marks[i] = _remark(mark, g, version, after_step=False)
            if not reached:
                return
            self._reached.update(reached)
            self._forwards_at = rec.coverage.forwards
            if rec.pending.data.full:
                self._note_left(reached)
            self._account(loss, reached, carried, check, fresh)
            own = readings[6]
            if own is not None:  # read at the flush beside the fingerprints
                rec.pending.put_vector([("sample_loss", None, 0.0)] * int(own[0].shape[0]), own[0])
                rec.pending.put_vector([("sample_hit", None, 0.0)] * int(own[1].shape[0]), own[1])
            if self._loss_checks:
                self._check_loss(roots, readings)
            elif readings[4] is not None:
                self._file_targets(readings[4])
            if readings[4] is None and self._looked:  # a pass of another loss counts too: the walk stops
                self._target_passes += 1
            if readings[8] is not None:
                self._mix.add(*readings[8], rec.pending.data.step, rec.pending)
            if manual is not None:
                rec.pending.put("carried", None, manual)
                head = self._rec.backward.grads.head()
                if head is not None:
                    rec.pending.data.carried = (head.name,)
            if rec.clock.mode is not StepMode.OPTIMIZER:
                head_tensor = self._head()
                g = head_tensor.grad if head_tensor is not None else None
                if head_tensor is None or g is None:
                    self._sample = None
                else:
                    self._sample = (weakref.ref(g), _first_elements(head_tensor).clone())
        except Exception as exc:
            rec.fail("the backward-call listener", exc)

    def _account(
        self, loss: Tensor | None, reached: list[int], carried: list[int], check: Tensor | None, fresh: bool
    ) -> None:
        rec = self._rec
        pending = rec.pending
        # the carried gradients a backward pass added to (carried ones are few, or none: no set of every reached one)
        on = set(carried).intersection(reached) if carried else set()
        if rec.clock.mode is StepMode.OPTIMIZER and not rec.clock.in_closure:
            self._count_discarded(fresh)
        if on:  # beside fresh gradients too: an optimizer whose zero_grad was left out, beside one that has it
            self._carry = ([self._names[i] for i in sorted(on)], check)
        elif fresh:
            self._carry = None
        self._open = True
        scale = rec.scaler.tensor()
        if loss is not None and scale is not None:
            loss = loss / scale
        pending.capture(loss, restart=fresh or bool(on), keep_first=rec.clock.in_closure)

    def _count_discarded(self, fresh: bool) -> None:
        """A backward pass between optimizer steps: it threw away the gradient of an earlier one when it found the
        gradients reset (``fresh``) after a backward pass since the optimizer last stepped (``_open``): that pass's
        gradient was never applied (a step once per epoch after a ``zero_grad()`` every batch; a GAN's discriminator,
        whose ``.grad`` also holds the generator's backward pass until its ``zero_grad()``). Counters only."""
        coverage = self._rec.coverage
        coverage.optimizer_backwards += 1
        if fresh and self._open:
            coverage.discarded_backwards += 1
            if coverage.first_discarded < 0:
                coverage.first_discarded = self._rec.pending.data.step
            self._dropped += 1

    def _check_loss(self, roots: list[Tensor], readings: _LossReadings) -> None:
        """One of the first backward passes that reached the model: an activation between its logits and a loss
        that normalises them itself is noted in the coverage, with the layer whose output it is (or, for a
        functional activation, the layer whose output it took); the profile of a mean squared error's target
        (``profile``, taken before the pass) and how far an ``nll_loss``'s input is from log-probabilities
        (``gap``: the reading and the node that produced the input) and how much of a bounded output's targets lie
        out of its reach (``reach``) and the entropy of the labels of an ``nll_loss`` counted so far (``counts``:
        this pass's counts, added to the earlier ones') and the chance level of a binary cross-entropy or a mean
        squared error from its targets' moments so far (``moments``) are filed for the flush."""
        profile, gap, reach, counts, moments, options, _, clamp, _, positives = readings
        rec = self._rec
        self._loss_checks -= 1
        graph = loss_graph.read(roots)  # no roots (a backward pass from a given gradient, not a loss): nothing
        rec.coverage.mixture_loss = rec.coverage.mixture_loss or graph.mixture
        if not rec.coverage.input_layer_normalizes:
            first = rec.forward.input_layer()
            rec.coverage.input_layer_normalizes = first is not None and first.normalizes
        if graph.loss and not rec.coverage.classifier_loss:
            rec.coverage.classifier_loss = graph.loss
            rec.coverage.classifier_mean = graph.mean
            rec.coverage.classifier_cosine = graph.cosine
            rec.coverage.classifier_smoothed = graph.smoothed
            rec.coverage.padding_id = graph.ignored
        if profile is not None:  # read at the flush, with the step's readings
            rec.pending.put_vector([("regression_target", None, float(i)) for i in range(4)], profile)
        nodes = rec.forward.nodes or {}
        if gap is not None:
            rec.coverage.nll_layer = rec.coverage.nll_layer or nodes.get(gap[1]) or nodes.get(gap[3], "")
            rec.coverage.nll_loss = gap[2]
            rec.coverage.nll_dim = gap[4]
            rec.pending.put("log_prob_gap", None, gap[0])
        if clamp is not None:
            share, clamped = clamp
            rec.coverage.clamped_layer = rec.coverage.clamped_layer or nodes.get(clamped.below) or ""
            rec.pending.put("clamped_outside", None, share)
        if reach is not None:
            values, bounded = reach
            if rec.coverage.bounded_output is None:
                layer = nodes.get(bounded.node) or nodes.get(bounded.below, "")
                rec.coverage.bounded_output = (bounded.activation, bounded.low, bounded.high, layer)
            rec.pending.put_vector([("target_range", None, float(i)) for i in range(3)], values)
        if counts is not None:
            so_far = self._labels
            if so_far is not None and so_far[1] == counts[1] and so_far[0].device == counts[0].device:
                counts = (so_far[0] + counts[0], counts[1])
            self._labels = counts
            entries = [("label_prior", None, float(i)) for i in range(4)]
            rec.pending.put_vector(entries, label_entropy(counts[0]))
            rec.pending.data.label_classes = counts[1]
        if moments is not None:
            self._file_targets(moments)
        if options is not None:  # the classes the loss chose among (a contrastive loss: the batch, less its mask)
            rec.pending.put("loss_options", None, options)
        if positives is not None:  # read at the flush; the layer whose output the softmax is, named now
            if rec.coverage.softmax_bce is None:
                rec.coverage.softmax_bce = (
                    nodes.get(positives[1]) or nodes.get(positives[2], ""),
                    rec.pending.data.step,
                )
            rec.pending.put("softmax_positives", None, positives[0])
        found = graph.activated
        if found is not None:
            layer = nodes.get(found.node) or nodes.get(found.below, "")
            rec.coverage.activated_loss = (found.activation, found.loss, layer, rec.pending.data.step)
            self._loss_checks = 0
        if not self._loss_checks:
            rec.forward.nodes = None

    def _note_dropout(self, nodes: list[object]) -> None:
        """File the largest rate of a dropout the graph ``nodes`` (:func:`~.loss_graph.hold`'s) show (see
        :mod:`.dropout_graph`): a rate the graph holds as a number now, that of the masks multiplied in read at the
        flush."""
        known, masked = dropout_graph.heaviest(nodes)
        pending = self._rec.pending
        if known is not None:
            pending.data.graph_dropout = merge_max(pending.data.graph_dropout, known)
        if masked is not None:
            pending.put("graph_dropout", None, masked)

    def _file_targets(self, moments: tuple[str, Tensor, Tensor]) -> None:
        """Add one backward pass's target moments to the earlier passes' (the same loss, the same columns) and file
        the chance level they give so far (:func:`~neuraldbg.stats.tensors.target_baseline`)."""
        kind, found, outside = moments
        self._target_passes += 1
        so_far = self._targets
        same = so_far is not None and so_far[0] == kind and so_far[1].shape == found.shape
        if so_far is not None and same and so_far[1].device == found.device:
            found, outside = merge_moments(so_far[1], found), so_far[2] + outside
        self._targets = (kind, found, outside)
        if self._target_passes % FILE_TARGETS_EVERY and self._target_passes < TARGET_CHECKS:
            return  # the level is filed every few passes, and at the last: the moments add up on the device
        entries = [("target_baseline", None, float(i)) for i in range(5)]
        self._rec.pending.put_vector(entries, target_baseline(found, outside, kind == "bce"))
        self._rec.pending.data.baseline_kind = kind

    # --- optimizer steps ----------------------------------------------------------------------------------

    def before_step(self, optimizer: object, owned: frozenset[str]) -> None:
        """An owned optimizer's step is about to use the gradients: a carry-over left in the parameters it owns
        (``owned``) is filed, and its weight decay noted (:meth:`_note_decay`). A carry-over in parameters of another
        optimizer waits for that one's step: a GAN's generator loss, backpropagated through the discriminator after
        the discriminator stepped, adds to gradients the discriminator's optimizer resets before it steps again."""
        self._note_decay(optimizer)
        self._note_cleared(owned)
        if self._dropped:
            self._note_composed(owned)
        carry = self._carry
        if carry is None:
            return
        names = [n for n in carry[0] if n in owned]
        rest = [n for n in carry[0] if n not in owned]
        self._carry = (rest, carry[1]) if rest else None
        if not names:
            return
        check = carry[1]
        data = self._rec.pending.data
        data.carried = tuple(names)
        data.carried_by = type(optimizer).__name__
        if check is not None:
            self._rec.pending.put("carried", None, check)
        else:
            data.grad_carried = 1.0

    def _note_composed(self, owned: frozenset[str]) -> None:
        """Backward passes since the last step threw gradients away (see :meth:`_count_discarded`); unless the
        gradient this step applies is not the one the last backward pass left but a tensor assigned to ``.grad``
        since: the script put its passes' gradients together itself (a per-sample loop that clips each sample's
        gradient into a buffer, resets, and hands the optimizer the buffer, as DP-SGD written by hand does), and
        nothing was thrown away. Identity reads of one parameter's ``.grad``."""
        marks, tensors = self._marks, self._tensors
        for i in self._owned(owned):
            g, mark = tensors[i].grad, marks[i]
            if g is None or mark is None or mark[2]:
                continue
            if mark[0]() is not g:  # assigned after the last backward pass
                self._rec.coverage.discarded_backwards -= self._dropped
                self._dropped = 0
            return

    def _note_cleared(self, owned: frozenset[str]) -> None:
        """Whether the gradients this optimizer is about to apply are still there: a backward pass since its last
        step reached parameters it owns, and every one of them now has ``.grad`` None. Something reset them between
        ``backward()`` and ``step()``, and the step moves nothing. Which order made it is noted too: a forward pass
        of the model since that backward pass means the step comes between a forward pass and its loss's backward
        pass (``optimizer.step()`` before ``loss.backward()``, the reset at the top of the loop); none, that the reset
        came between the backward pass and the step (``optimizer.zero_grad()`` after ``loss.backward()``). Attribute
        reads only; the first gradient still present ends the look (a healthy step reads one)."""
        reached = self._reached
        if not reached:
            return
        waiting = [i for i in self._owned(owned) if i in reached]
        if not waiting:
            return
        coverage = self._rec.coverage
        coverage.handed_steps += 1
        # a forward pass of the model since that backward pass: this step comes before the new loss's backward pass
        coverage.forward_before_step += coverage.forwards > self._forwards_at
        tensors = self._tensors
        if all(tensors[i].grad is None for i in waiting):
            coverage.cleared_steps += 1
            if coverage.first_cleared < 0:
                coverage.first_cleared = self._rec.pending.data.step
            return
        left, self._left = self._left, None
        if left is None or not self._rec.pending.data.full:
            return
        coverage.left_readings += 1
        picked, grads, versions = left
        now = [tensors[i].grad for i in picked]
        if all(g is t and g._version == v for g, t, v in zip(now, grads, versions)):
            return  # untouched since the backward pass: nothing to measure
        # changed in place (clipping, a scaler's unscaling, a reset): were they zeroed? The norms the backward pass
        # left were read at its end (BackwardPath._on_backward_end); their largest, and these gradients' now
        raw = self._rec.backward.grads.raw
        kept = _largest_magnitude([g for g in now if g is not None])
        if isinstance(raw, Tensor) and raw.numel() and kept is not None:
            pending = self._rec.pending
            pending.put("grad_left", None, raw.detach().amax().float())
            pending.put("grad_kept", None, kept)

    def _note_left(self, reached: list[int]) -> None:
        """A fully observed step: a few gradients this backward pass left (the smallest tensors) and their version
        counters (host reads), to tell at the step whether something changed them in place since."""
        small = self._smallest(reached)
        grads = [self._tensors[i].grad for i in small]
        present = [g for g in grads if g is not None]
        self._left = (small, present, [g._version for g in present]) if present and len(present) == len(grads) else None

    def _owned(self, owned: frozenset[str]) -> list[int]:
        """The indices of the tracked parameters among ``owned`` (cached for the last owner)."""
        indices = self._owned_indices
        if indices[0] is not owned:  # a different optimizer, or its groups changed (see BackwardPath._owned_by)
            indices = (owned, [i for i in map(self._index.get, owned) if i is not None])
            self._owned_indices = indices
        return indices[1]

    def _note_decay(self, optimizer: object) -> None:
        """The optimizer's weight decay, noted in the coverage when it differs from the last noted (host reads of its
        param_groups, no device work): the largest ``weight_decay`` of its groups that hold parameters, times that
        group's learning rate over the largest learning rate (what the step's decay is against the learning rate a
        step is recorded with), and whether it is decoupled (``AdamW``, or ``decoupled_weight_decay``: the weights
        shrink by lr x weight_decay each step) or coupled (``SGD``, ``Adam``: weight_decay x W is added to the
        gradient). Several optimizers in one step: the largest. Read on fully observed steps only, the steps whose
        updates the finding weighs it against (a change of the decay between them is noted at the next)."""
        if not self._rec.pending.data.full:
            return
        groups = getattr(optimizer, "param_groups", None)
        if not isinstance(groups, list):
            return
        top = max((float(g.get("lr", 0.0)) for g in groups if g.get("params")), default=0.0)
        decay, decoupled = 0.0, isinstance(optimizer, torch.optim.AdamW)
        for g in groups:
            wd = g.get("weight_decay", 0.0)
            if not (g.get("params") and isinstance(wd, (int, float)) and wd > 0 and top > 0):
                continue
            lr = float(g.get("lr", 0.0))
            scaled = float(wd) if lr == top else float(wd) * lr / top
            if scaled > decay:
                decay, decoupled = scaled, decoupled or bool(g.get("decoupled_weight_decay", False))
        data = self._rec.pending.data
        names = self._decayed_names(optimizer, groups)
        if names is not None:
            data.decayed = names | data.decayed if data.decayed else names
        noted = self._rec.coverage.weight_decay
        step = data.step
        if noted and noted[-1][0] == step:  # another optimizer in the same step: the largest
            if decay > noted[-1][1]:
                noted[-1] = (step, decay, decoupled)
            return
        if noted and math.isclose(noted[-1][1], decay, rel_tol=1e-6) and noted[-1][2] == decoupled:
            return  # unchanged (group learning rates a schedule scales together keep their ratio)
        if not noted and not decay:
            return
        if len(noted) < DECAY_CHANGES:
            noted.append((step, decay, decoupled))

    def _decayed_names(self, optimizer: object, groups: list[Any]) -> frozenset[str] | None:
        """The watched parameters of ``optimizer``'s groups with a weight decay, when some of its groups holding
        parameters have none (the Trainer leaves biases and LayerNorm gains out); None when all or none decay.
        Cached until the groups' sizes or decays change (host reads only)."""
        shape = tuple(
            (len(g["params"]), _decays(g.get("weight_decay"))) for g in groups if isinstance(g.get("params"), list)
        )
        cached = self._decayed.get(id(optimizer))
        if cached is not None and cached[0] == shape:
            return cached[1]
        found: frozenset[str] | None = None
        if len({d for n, d in shape if n}) == 2:
            ours = self._rec.backward.tensor_names()
            found = frozenset(
                name
                for g in groups
                if _decays(g.get("weight_decay")) and isinstance(g.get("params"), list)
                for t in g["params"]
                for name in ours.get(id(t), ())
            )
        self._decayed[id(optimizer)] = (shape, found)
        return found

    def forget_decay(self) -> None:
        """The parameters followed changed: which of them each optimizer decays is asked again."""
        self._decayed = {}

    def after_step(self, owned: frozenset[str]) -> None:
        """An owned optimizer stepped: note the gradients it applied, as it left them; and whether a backward pass
        since the last step threw away an earlier one's gradient (counted once however many optimizers step)."""
        if self._open:
            coverage = self._rec.coverage
            coverage.step_intervals += 1
            coverage.discarding_intervals += self._dropped > 0
        self._open, self._dropped = False, 0
        self._sample = None
        tensors, marks, reached = self._tensors, self._marks, self._reached
        indices = self._owned(owned)
        for i in indices:
            g = tensors[i].grad
            if g is None:
                marks[i] = None
                continue
            marks[i] = _remark(marks[i], g, g._version, after_step=True)
        reached.difference_update(indices)


def _largest_magnitude(grads: list[Tensor]) -> Tensor | None:
    """The largest magnitude over ``grads``, a 0-d float tensor on the device; None when none can be read. Local
    values only (a DTensor's shard): an operation on a DTensor would be a collective of its own, out of step with
    the ranks' backward passes."""
    local = [dense(g) for g in grads]
    plain = [d for d in local if d is not None and d.layout is torch.strided and d.numel()]
    if not plain:
        return None
    with torch.no_grad():
        values = [largest_magnitude(g.detach()).float() for g in plain]
        largest: Tensor = torch.stack(values).amax() if len(values) > 1 else values[0]
        return largest


def _decays(value: object) -> bool:
    """Whether a group's ``weight_decay`` decays its weights."""
    return isinstance(value, (int, float)) and value > 0


def _remark(mark: _Mark | None, g: Tensor, version: int, after_step: bool) -> _Mark:
    """The mark of ``g`` at ``version`` that replaces ``mark``: a mark of this very tensor (a gradient accumulated
    into, or the backward pass's mark at the step) keeps its weak reference, no new one per parameter per pass."""
    return (mark[0] if mark is not None and mark[0]() is g else weakref.ref(g)), version, after_step


def _unchanged(mark: _Mark | None, state: _State) -> bool:
    """Whether a ``.grad`` (tensor, version) is still exactly as ``mark`` noted it."""
    return mark is not None and state is not None and mark[0]() is state[0] and mark[1] == state[1]


def _first_elements(t: Tensor) -> Tensor:
    """A few elements of ``t`` (a view of its first row, no copy; a DTensor's local shard), to tell whether it
    changed."""
    row = dense(t.detach())
    if row is None:
        return t.new_zeros(0)
    while row.dim() > 1:
        row = row[0]
    return row.reshape(-1)[:_SAMPLE] if row.dim() else row.reshape(1)
