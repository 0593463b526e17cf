"""The analyzer's events list is one object while nothing in it changed: questions asked of it (a hypothesis, the
trace's index of events by identity) rely on getting the same event objects at every call."""

from __future__ import annotations

import math

from neuraldbg import DebugConfig
from neuraldbg.analysis.analyzer import Analyzer
from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.events import EventType, FailureKind, SemanticEvent
from neuraldbg.kinds.unstable_loss import UnstableLoss


class _Judged(UnstableLoss):
    """A run-level kind whose judgement of the run is ``value`` (a plugin's could read NaN: a spread of no losses)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def run_finding(self, coverage: Coverage, facts: RunFacts) -> SemanticEvent | None:
        kind = FailureKind.UNSTABLE_LOSS
        spread = self.value + 0.0  # worked out anew at every call, as a kind does: a new float (a new NaN) each time
        return SemanticEvent(EventType.RUN, kind, "", None, 0, 5, None, kind, {"spread": spread})


def _analyzer(kind: _Judged) -> Analyzer:
    return Analyzer(DebugConfig(), {}, [], [], kinds=[kind])


def test_a_run_level_finding_with_a_nan_metric_is_the_same_event_at_every_call():
    analyzer = _analyzer(_Judged(math.nan))
    first = analyzer.events()
    assert len(first) == 1 and math.isnan(first[0].metrics["spread"])
    assert analyzer.events() is first
    assert analyzer.events()[0] is first[0]


def test_a_run_level_finding_that_changed_is_a_new_event():
    judged = _Judged(1.0)
    analyzer = _analyzer(judged)
    first = analyzer.events()
    assert analyzer.events() is first
    judged.value = 2.0
    second = analyzer.events()
    assert second is not first and second[0].metrics["spread"] == 2.0
    judged.value = math.nan
    third = analyzer.events()
    assert third is not second and math.isnan(third[0].metrics["spread"])
