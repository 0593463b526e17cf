"""From hook callbacks to per-step records: the step in progress, committed steps, and the flush to the host.

Three parts do the work, each small enough to hold in one's head:

* :mod:`neuraldbg.capture.clock` - what a step is (optimizer steps, closures, accumulation, manual steps);
* :mod:`neuraldbg.capture` - what each hook records (which forwards count, cheap and full steps, compiled graphs);
* :mod:`neuraldbg.capture.measure` - what a fully observed step computes (per-layer, gradient and update statistics).

The :class:`Recorder` owns the step in progress (a :class:`~neuraldbg.stats.step.Pending`), commits it when the
clock says it is complete, and hands batches of host-side :class:`~neuraldbg.stats.step.StepData` records to a sink
(the analysis) in one device-to-host transfer per flush (on a CPU, where a read costs no sync, each step is read when
it is committed and only its record waits for the flush). It keeps no raw tensors beyond the current step. Its own
failures become warnings and stop the recording; training goes on untouched, and the verdict says what was not
observed (see :mod:`neuraldbg.capture.coverage`).

Cost. Every step: one Python call per module call (a dictionary lookup for the model's modules), on a CPU the
norm of the model's output at the end of the forward pass (every layer's output only when it is non-finite) and
one element of the head layer's gradient and the largest element of every parameter gradient (one batched
reduction, read at the flush) at the optimizer step; on a GPU every layer output's norm, batched, read
at the flush; the learning rates. Fully observed steps (see :mod:`neuraldbg.capture.schedule`) add the statistics of
:mod:`neuraldbg.capture.measure`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from torch import Tensor, nn

from ..config import HEAVY_DROPOUT, DebugConfig
from ..errors import NeuralDbgWarning
from ..model import naming
from ..model.info import LayerInfo
from ..model.layers import heavy_dropout_layers, mode_dependent_layers
from ..stats import tensors as stats
from ..stats.step import SlotKey, StepData
from . import collector, hooks, measure
from .backward import BackwardPath
from .clock import StepClock, StepMode
from .coverage import Coverage, RunFacts
from .forward import ForwardPath
from .ledger import GradLedger
from .pending import Pending
from .scaler import ScalerWatch
from .schedule import Schedule
from .symmetry import SymmetryWatch

#: Committed steps held before a flush even when no fully observed step comes.
_BUFFER_LIMIT = 64

#: The recorders attached now. Their parts (forward and backward paths, ledger, gradient reader, compiled slots) refer
#: back to them weakly, so that a debugger dropped after ``close()`` is freed, with what it holds of the model, as
#: soon as the last reference to it goes, not at the garbage collector's next full pass (a smoke test's model, its
#: gradients and its GPU memory with it). Torch's hook tables hold those parts, not the recorder: this set holds an
#: attached one for them, so that one attached and dropped without ``close()`` keeps observing, as it always did.
_attached: set[Recorder] = set()


class Recorder:
    """Collects statistics of one model's training steps. See the module docstring."""

    def __init__(
        self,
        model: nn.Module,
        infos: dict[str, LayerInfo],
        config: DebugConfig,
        sink: Callable[[list[StepData]], bool | None],
        order: list[SlotKey] | None = None,
        grad_scaler: Any = None,
    ) -> None:
        self.config = config
        self.infos = infos
        self._sink = sink
        self.clock = StepClock()
        self.schedule = Schedule(config, modules=len(infos))
        self.pending = Pending(0, self.schedule.is_full(0))
        self.buffer: list[Pending] = []
        self.coverage = Coverage(
            mode_dependent=mode_dependent_layers(naming.named_modules(model)),
            heavy_dropout=heavy_dropout_layers(naming.named_modules(model), HEAVY_DROPOUT),
        )
        self.active = False
        self.loss: Tensor | None = None
        self._last_head_grad: tuple[int, float] | None = None  # (step, head-layer gradient norm) of a full step
        self._warned: set[str] = set()
        self.scaler = ScalerWatch(grad_scaler)
        if self.scaler.active:
            self.clock.skip_probe = self.scaler.at_forward
        self.forward = ForwardPath(self, model, infos, order if order is not None else [])
        self.backward = BackwardPath(self, model, self.forward)
        self.ledger = GradLedger(self)
        self.symmetry = SymmetryWatch()
        self._handle: hooks.HookHandle | None = None
        # one callable and one table key for every attachment: torch.compile guards on both
        self._on_output = self.forward.on_module_output
        self._hook_key: int | None = None
        self._compiled_at_detach: frozenset[str] = frozenset()  # torch.compile's graphs when the hooks were removed
        # parameters whose last measured update showed them frozen (unchanged, with a gradient, not stepped with a
        # learning rate), and a checksum of their values at the last detach() after a training forward pass (see
        # _note_moved_unseen)
        self._still: set[str] = set()
        self._sums: dict[str, int] = {}
        # ... and of those frozen at the last measured update, read at its flush, with the attachment it was read in
        # (see _moved_between_updates); attachments so far
        self._update_sums: tuple[int, dict[str, int]] = (0, {})
        self._attachments = 0
        # forward passes of the model in training mode with gradients on (ForwardPath._begin; for a model trained in
        # eval mode, its eval-mode ones that a backward pass followed), and their count at attach(): an attachment
        # that ran one trained, one that did not (a validation pass, a step alone) did not
        self.training_forwards = 0
        # a forward pass in training mode seen: from then on an eval-mode one that a backward pass follows is a
        # validation pass with gradients (an adversarial or saliency evaluation), not training in eval mode
        self.trained_in_train_mode = False
        self._forwards_at_attach = 0

    # --- lifecycle ------------------------------------------------------------------------------------

    def attach(self) -> None:
        compiled = hooks.compiled_graphs()
        if compiled and compiled - self._compiled_at_detach:
            # graphs compiled while this debugger's hook was absent would never call it: compile them again
            hooks.forget_compiled_code()
        self._forwards_at_attach = self.training_forwards
        self._attachments += 1
        self.forward.attach()
        self.ledger.attach()
        self.backward.grads.attach()
        self.symmetry.attach(self.infos, self.backward.grads.params)
        self.coverage.zero_started |= self.symmetry.zero_started
        self.active = True
        self._handle = hooks.attach(
            self._on_output,
            self.backward.on_optimizer_step,
            self.backward.on_optimizer_stepped,
            key=self._hook_key,
            on_backward=self.ledger.before,
            model_calls=self.forward.model_calls(),
        )
        self._hook_key = self._handle.key
        _attached.add(self)

    def _parameter_sums(self, names: set[str]) -> dict[str, int]:
        """A checksum of the values of each trainable parameter named (the part this process holds: see
        :func:`~neuraldbg.stats.tensors.bit_sums`), read now in one transfer per device. A parameter that cannot be
        read is left out, the others are kept."""
        held: list[tuple[str, Tensor]] = []
        for p in self.backward.params:
            if p.name in names:
                try:
                    t = p.local(p.tensor.detach())
                except Exception:  # a tensor subclass that cannot be read here
                    continue
                if t is not None and t.numel():
                    held.append((p.name, t))
        try:
            return dict(zip((name for name, _ in held), stats.bit_sums([t for _, t in held])))
        except Exception:  # one of them cannot be read so: each on its own, the one that fails left out
            found: dict[str, int] = {}
            for name, t in held:
                try:
                    found[name] = stats.bit_sums([t])[0]
                except Exception:
                    continue
            return found

    def _note_moved_unseen(self) -> None:
        """At ``detach()``, after an attachment that ran a training forward pass: a parameter whose last measured
        update showed it frozen (see :meth:`flush`) and whose values changed since the last such detachment was
        updated out of sight: by an ``optimizer.step()`` after the ``with dbg:`` block, or in a block of its own
        (where no backward pass precedes the step and no update is measured). Its zero updates (``close()`` commits
        a step before its update) say nothing of whether it trains. The step it was last seen changed at is kept, with
        the longest wait between two of its changes, and the last step anything was seen changed at (see
        :meth:`~neuraldbg.kinds.frozen_parameters.FrozenParameters.undone`).
        Attachments without a training forward pass are not compared across: a validation pass on swapped-in
        weights (an EMA copy) changes the parameters and puts them back. Only such parameters are read: a run whose
        measured updates all moved something reads nothing."""
        if self.training_forwards == self._forwards_at_attach:
            return
        before = self._sums
        self._sums = self._parameter_sums(self._still) if self._still else {}
        self._record_moved(before, self._sums)

    def _moved_between_updates(self) -> None:
        """At the flush of a measured update: a parameter frozen at this measured update and at the one before it
        (unchanged with a gradient, no optimizer seen stepping it with a learning rate) whose values changed in
        between was updated out of sight, inside the attachment: by an optimizer of its own that steps on other
        steps than the measured ones (every 50th iteration, on the gradient accumulated since its last step). Kept
        as :meth:`_note_moved_unseen` keeps it. A parameter stepped at a measured update in between left the frozen
        ones there: the comparison starts again from the next one that finds it frozen, so a layer added to the
        optimizer mid-run is not taken for one that was always updated. Two readings of one attachment only: across
        attachments :meth:`_note_moved_unseen` compares, at each ``detach()``. Only such parameters are read."""
        attachment, before = self._update_sums
        now = self._parameter_sums(self._still) if self._still else {}
        self._update_sums = (self._attachments, now)
        if attachment == self._attachments:
            self._record_moved(before, now)

    def _record_moved(self, before: dict[str, int], now: dict[str, int]) -> None:
        """Note each parameter whose checksum differs between ``before`` and ``now`` as changed out of sight at
        this step, with the longest wait between two of its changes."""
        step, moved = self.clock.step, self.coverage.moved_unseen
        for name, value in now.items():
            if name in before and before[name] != value:
                last, gap = moved.get(name, (step, 0))
                moved[name] = (step, max(gap, step - last))
                self.coverage.last_unseen_move = step

    @property
    def attached(self) -> bool:
        return self._handle is not None

    def detach(self) -> None:
        """Finish the step in progress, flush, and remove every hook (whatever happens on the way)."""
        try:
            self.finish()
        finally:
            if self._handle is not None:
                self._handle.remove()
                self._handle = None
                self._compiled_at_detach = hooks.compiled_graphs() or frozenset()
                self._note_moved_unseen()
            self.active = False
            self.forward.detach()
            self.backward.detach()
            self.ledger.detach()
            _attached.discard(self)

    @property
    def mode(self) -> StepMode:
        return self.clock.mode

    @property
    def step(self) -> int:
        return self.clock.step

    @property
    def host_reads_are_free(self) -> bool:
        """Reading a CPU tensor's value costs no device sync, so cheap CPU steps check values at once. False makes
        CPU steps take the device path (every layer measured, values read at the flush); tests use it to exercise
        that path without a GPU."""
        return self.forward.host_reads_are_free

    @host_reads_are_free.setter
    def host_reads_are_free(self, value: bool) -> None:
        self.forward.host_reads_are_free = value

    # --- failures of the recorder itself become warnings; recording stops, training goes on untouched ----

    def fail(self, where: str, exc: BaseException) -> None:
        self.active = False
        self.forward.release()
        self.backward.grads.drop()
        what = short_error(exc)
        self.coverage.failed(self.clock.step, f"{where} failed with {what}")
        self.warn_once(
            where,
            f"NeuralDBG stopped observing this run at step {self.clock.step}: {where} failed with {what}. "
            "Training is not affected; the verdict reports the run as incompletely observed.",
        )

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, NeuralDbgWarning, stacklevel=4)

    # --- steps ------------------------------------------------------------------------------------------

    def observe_loss(self, loss: Tensor) -> None:
        if self.active:
            self.loss = loss.detach()

    @collector.paused
    def manual_step(self) -> None:
        """``dbg.step()``: close the current step now; from here on only ``step()`` closes steps."""
        if not self.active:
            return
        try:
            if self.clock.manual():
                self.fold()
            self.backward.grads.once(self.scale_in_gradients())
            self.commit()
        except Exception as exc:
            self.fail("dbg.step()", exc)

    @collector.paused
    def commit(self) -> None:
        """The step in progress is complete: file its updates and loss, queue it, start the next one."""
        if self.clock.fold_first:  # a skipped step whose micro-batches were provisional steps
            self.fold()
        if self.clock.skipped:
            self.backward.grads.snapshot = None  # the scaler skipped the optimizer: nothing was updated
            self.pending.skip()
        else:
            self.backward.grads.file_updates()
            if self.pending.data.full and self.symmetry.watching:
                self.symmetry.check(self.pending)
        if self.scaler.active:
            scale = self.scaler.scale_of_finished_step()
            if scale is not None:
                self.pending.put("loss_scale", None, scale)
        if self.loss is not None:  # given to observe_loss: it wins over the loss recorded from the backward pass
            loss, self.loss = self.loss, None
            self.pending.put("loss", None, loss if loss.dim() == 0 else loss.float().mean())
        elif self.pending.captured is not None and not self.pending.lost:
            self.pending.put("captured_loss", None, self.pending.captured)
            self.pending.data.loss_terms = self.pending.terms
        finished = self.pending
        self.buffer.append(finished)
        self.clock.committed()
        self.pending = Pending(self.clock.step, self.schedule.is_full(self.clock.step))
        self.backward.grads.next_step()
        self.forward.next_step()
        if self.clock.mode is StepMode.UNKNOWN:
            return  # held until we know whether these are steps or micro-batches
        if finished.data.full or len(self.buffer) >= _BUFFER_LIMIT:
            self.flush()
        elif self.host_reads_are_free and _on_cpu(finished):
            # a CPU read costs no sync: held to the flush, a step's few small tensors would pin the allocator's heap
            # between the training's own large allocations, which it then gives back to the system and faults in
            # again every step (an 8x512 MLP: hundreds of page faults a step, ~4 % of its time); its record waits
            finished.read_now()

    def adopt_scaler(self) -> None:
        """A GradScaler was found at the first optimizer step (see :mod:`neuraldbg.capture.scaler`). Provisional
        steps held so far are the iterations it skipped when the scale says it backed off once for each of them;
        otherwise they are micro-batches, folded as usual. What was read of the backward passes before the scaler
        was known is divided by the scale each pass used: a skipped iteration's is the one before its back-off
        (the held iteration ``i`` of ``n`` used ``scale / backoff ** (n - i)``), a micro-batch's the current one."""
        self.clock.skip_probe = self.scaler.at_forward
        held = self.clock.provisional
        skips = False
        if held and self.clock.mode is StepMode.UNKNOWN:
            first = next((p.data.loss_scale for p in self.buffer if p.data.loss_scale is not None), None)
            skips = self.scaler.skips_before(first) == held
        scale = self.scaler.tensor()
        if scale is not None:  # this step's backward pass was read before the scaler was known
            if self.clock.mode is StepMode.UNKNOWN:
                backoff = float(self.scaler.scaler.get_backoff_factor()) if skips else 1.0
                n = len(self.buffer)
                for i, part in enumerate(self.buffer):
                    part.unscale(scale / backoff ** (n - i) if skips else scale)
            self.pending.unscale(scale)
            raw = self.backward.grads.raw
            if isinstance(raw, Tensor):
                self.backward.grads.raw = raw / scale
            elif raw:
                self.backward.grads.raw = [n / scale for n in raw]
        if not skips:
            return
        for part in self.buffer:
            part.skip()
        self.clock.adopt_skips()

    def fold(self) -> None:
        """An optimizer (or ``step()``) appeared: earlier backward passes were micro-batches of one step."""
        if not self.clock.provisional:
            return
        parts = [*self.buffer, self.pending]
        merged = Pending(parts[0].data.step, parts[0].data.full)
        for part in parts:
            merged.absorb(part)
        last = self.pending.data  # host-side gradient readings of the latest micro-batch
        for attr in (
            "grad",
            "grad_numel",
            "grad_exact_zero",
            "grad_nonfinite",
            "grad_before_clip",
            "stepped",
            "head_finite",
        ):
            setattr(merged.data, attr, getattr(last, attr))
        self.buffer.clear()
        self.pending = merged
        self.clock.folded(merged.data.step)

    @collector.paused
    def flush(self) -> None:
        """Move every committed step to the host in one transfer and hand them to the sink."""
        if not self.buffer:
            return
        buffer, self.buffer = self.buffer, []
        scalars = [t for p in buffer for t in p.tensors]
        vectors = [v for p in buffer for v in p.vectors]
        values = stats.to_host_parts(scalars, vectors)
        i, j = 0, len(scalars)
        measured = False
        for part in buffer:
            if part.tensors or part.vectors:  # not read at its commit (see commit)
                n = sum(len(entries) for entries in part.vtargets)
                part.file(values[i : i + len(part.tensors)], values[j : j + n])
                i += len(part.tensors)
                j += n
            grads, stepped = part.data.grad, part.data.stepped
            measured = measured or bool(part.data.update)
            for name, (delta, _) in part.data.update.items():
                # unchanged with a gradient and no optimizer seen stepping it with a learning rate: frozen, or out of
                # sight (one that stepped it too little to move it is a stall)
                if delta == 0.0 and grads.get(name, 0.0) > 0.0 and not stepped.get(name):
                    self._still.add(name)
                else:
                    self._still.discard(name)
        if measured and (self._still or self._update_sums[1]):
            self._moved_between_updates()
        records = [p.data for p in buffer]
        suspicious = False
        for record in records:
            # a head gradient compares with the step just before it only: across a gap it may have grown with the
            # fit (the cheap steps' probe watches for outlier batches in between)
            last = self._last_head_grad
            previous = last[1] if last is not None and last[0] == record.step - 1 else None
            suspicious |= measure.suspicious(record, self.config, previous)
            if record.head_grad is not None and math.isfinite(record.head_grad):
                self._last_head_grad = (record.step, record.head_grad)
        if self._sink(records) or suspicious:  # the sink says a new abnormal state began
            self.schedule.trigger(self.clock.step)

    @collector.paused
    def finish(self) -> None:
        """Close the step in progress (if it is a step) and flush everything."""
        if self.active:
            try:
                self.forward.discard_tentative()
                self.forward.close()  # a forward still open: what waited for its end is measured now
                if self.clock.finish(self.pending.recorded):
                    self.backward.grads.once(self.scale_in_gradients())
                    self.commit()
                self.flush()
            except Exception as exc:
                self.fail("the final flush", exc)
        self.forward.release()
        self.backward.grads.drop()
        self.loss = None

    def run_facts(self) -> RunFacts:
        """Counts the run-level findings need: trainable parameters, backward passes, optimizer steps."""
        return RunFacts(len(self.backward.params), self.clock.backward_passes, self.clock.optimizer_steps, self.config)

    def scale_in_gradients(self) -> float:
        """A GradScaler's scale still in the parameter gradients outside the optimizer step: until an optimizer
        stepped (inside ``scaler.step``, which unscales first), they are as the scaled backward pass left them."""
        return self.scaler.value() if self.scaler.active and not self.clock.stepped else 1.0


def _on_cpu(part: Pending) -> bool:
    """Whether every device tensor ``part`` holds is a CPU tensor."""
    return all(map(_is_cpu, part.tensors)) and all(map(_is_cpu, part.vectors))


_is_cpu = attrgetter("is_cpu")


#: How much of an exception's message an explanation quotes (PyTorch's dispatcher errors run to thousands of
#: characters; their first sentence says what failed).
_ERROR_CHARS = 200


def short_error(exc: BaseException) -> str:
    """``Type('first line of the message')``, cut to a readable length."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(text) > _ERROR_CHARS:
        text = text[: _ERROR_CHARS - 3].rstrip() + "..."
    return f"{type(exc).__name__}({text!r})"
