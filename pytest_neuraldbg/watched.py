"""The debugger the fixture hands out: a :class:`~neuraldbg.NeuralDbg` whose answers read well in pytest.

It behaves exactly like the engine's debugger; only the reprs change, so that pytest's assertion rewriting
prints a verdict: ``assert not ndbg.explain_failure()`` fails with
``assert not <unhealthy training: <kind> at '3' from step 0 (confidence 1.00)>``.
Imported lazily by the fixture (it imports the engine, hence torch).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from neuraldbg import NeuralDbg

from .verdict import Explanations, Hypotheses


class WatchedDbg(NeuralDbg):
    """A :class:`~neuraldbg.NeuralDbg` recorded by the ``neuraldbg`` fixture for the test's report.

    ``asserted`` holds the failures (kind, root layer, onset step) an assertion helper raised its
    ``AssertionError`` on. A test that passes although such an error was raised caught it on purpose
    (``with pytest.raises(AssertionError): assert_no_dead_neurons(ndbg)``): the gate does not fail it again.
    ``ignored`` holds the kinds ``assert_healthy(ignore=...)`` accepted: the gate accepts them too.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asserted: set[tuple[str, str, int]] = set()
        self.ignored: set[str] = set()

    def note_asserted(self, keys: Iterable[tuple[str, str, int]]) -> None:
        """Called by the assertion helpers just before they raise on these failures."""
        self.asserted.update(keys)

    def note_ignored(self, kinds: Iterable[str]) -> None:
        """Called by ``assert_healthy(ignore=...)``: the test accepts these kinds, so the gate and the reports do."""
        self.ignored.update(kinds)

    def hypotheses(self) -> Hypotheses:
        """Ranked causal hypotheses, most likely first; empty when training looks healthy."""
        return Hypotheses(super().hypotheses())

    def explain_failure(self) -> Explanations:
        """One explanation per hypothesis; empty when healthy. Its repr is a one-line verdict."""
        hypotheses = self.hypotheses()
        return Explanations((h.explanation for h in hypotheses), [h.summary() for h in hypotheses])

    def __repr__(self) -> str:
        base = super().__repr__()
        if self.attached:  # asking for the verdict mid-run would flush the step in progress
            return base
        hypotheses = self.hypotheses()
        state = "healthy" if not hypotheses else f"UNHEALTHY: {'; '.join(h.summary() for h in hypotheses[:2])}"
        return f"{base[:-1]}, {state}>"
