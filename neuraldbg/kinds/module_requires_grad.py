"""A ``requires_grad`` attribute set on a module instead of on its parameters: ``net.blocks[2].requires_grad = True``
(a gradual unfreezing) or ``model.encoder.requires_grad = False`` (a frozen backbone) stores a plain attribute on
the ``nn.Module``, which has no such switch, and its parameters keep the flag they had: the block meant to be
unfrozen stays frozen, the backbone meant to be frozen trains. ``module.requires_grad_(...)`` (with the underscore)
sets its parameters' flags. Plain torch, a ULMFiT-style unfreezing of one block every 60 steps written so: the
backbone never moved, held-out accuracy 0.51 against 0.62-0.65 with ``requires_grad_(True)``.

Exact, from what the fully observed forward passes read (see :mod:`neuraldbg.capture.switches`): a module whose own
``requires_grad`` attribute disagrees with its parameters at the last pass that read it (set to True while none of
them requires a gradient, or to False while some of them trained: a gradient on a fully observed step, and an
optimizer's step). One that agrees (the parameters were set too) did no harm and is not reported, nor one set to
False whose parameters never get a gradient (a mean teacher's copy run under ``no_grad``, kept out of the
optimizer; a layer Hugging Face's UniSpeechSat builds, marks so and never calls).
"""

from __future__ import annotations

from ..capture.coverage import Coverage, RunFacts
from ..events import FailureKind, SemanticEvent
from ..reasoning.topology import Topology
from ..text import count, quoted
from .base import Kind, RootLane, Series, run_event

KIND = FailureKind.MODULE_REQUIRES_GRAD


def _disagree(coverage: Coverage) -> list[tuple[str, bool, int, int, int]]:
    """The modules whose ``requires_grad`` attribute disagrees with their parameters: (name, value, parameters that
    require a gradient, parameters, first step seen). Set to True: none of them requires a gradient. Set to False:
    some of them trained, a gradient on a fully observed step and an optimizer's step with it; one whose parameters
    require a gradient but never get one (a teacher run under ``no_grad``, a layer a library builds and never calls)
    is as frozen as the attribute says."""
    trained = coverage.graded & coverage.optimized
    return [
        (name, value, len(trainable), total, first)
        for name, (value, trainable, total, first) in coverage.switches.items()
        if total and (not trainable if value else any(p in trained for p in trainable))
    ]


class ModuleRequiresGrad(Kind):
    name = KIND.value
    title = "requires_grad set on a module"
    run_level = True

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        found = _disagree(coverage)
        if not found:
            return None
        _, value, trainable, total, first = found[0]
        return run_event(
            KIND,
            first,
            max(first, coverage.last_step),
            ", ".join(f[0] for f in found),
            value=float(value),
            trainable=trainable,
            params=total,
        )

    def lane(self, event: SemanticEvent) -> RootLane | None:
        # a program's structure, exact: before the findings it explains (a backbone frozen, or trained, unmeant)
        return RootLane(0, order=6) if event.kind is self.kind else None

    def set_off_by_surge(self, root: SemanticEvent) -> bool:
        return False

    def place(self, event: SemanticEvent) -> str:
        return quoted(event.detail.split(", ")) if event.detail else "a module"

    def explain(
        self, root: SemanticEvent, rest: list[SemanticEvent], topo: Topology, series: Series
    ) -> tuple[str, str]:
        m = root.metrics
        modules = root.detail.split(", ") if root.detail else []
        value = bool(m.get("value", 0.0))
        first = quoted(modules[:1])
        what = (
            f"requires_grad set on a module, not on its parameters: {first}.requires_grad = {value} (seen from step "
            f"{root.step_start}) is a plain attribute of the nn.Module, which has no such switch, and its "
            f"{count(m.get('params', 0.0))} parameters keep the flag they had: "
            + (
                "none of them requires a gradient, so nothing was unfrozen and the block stays as it was."
                if value
                else f"{count(m.get('trainable', 0.0))} of them still require a gradient, so nothing was frozen and "
                "the block keeps training."
            )
        )
        if len(modules) > 1:
            what += f" The same for {quoted(modules[1:])}."
        fix = (
            f"call module.requires_grad_({value}) (with the underscore: it sets every parameter's flag), or set "
            "p.requires_grad on each of module.parameters(); an optimizer made before an unfreezing must hold those "
            "parameters too (add a param group)."
        )
        return what, fix

    def describe(self, event: SemanticEvent) -> str:
        return f"requires_grad set on {self.place(event)}, not on its parameters"

    def label(self, event: SemanticEvent) -> str:
        return "requires_grad set on a module"

    def effect(self, event: SemanticEvent) -> str:
        return "layers frozen or trained against the script's intent"
