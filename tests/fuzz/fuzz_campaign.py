"""What the fuzz properties saw, model by model, for the figures printed at the end of the session."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from fuzz_models import RunSpec


@dataclass
class Campaign:
    """Outcomes keyed by run spec, so a model hypothesis draws twice (or replays while shrinking) counts once."""

    verdicts: dict[RunSpec, str] = field(default_factory=dict)  # oracle label: healthy, faulty or neither
    alarms: dict[RunSpec, list[str]] = field(default_factory=dict)  # hypotheses raised on confirmed-healthy runs
    detected: dict[RunSpec, bool] = field(default_factory=dict)  # confirmed-faulty runs: was the fault named?
    faults: dict[RunSpec, set[str]] = field(default_factory=dict)  # confirmed-faulty runs: the oracle's kinds
    interference: dict[RunSpec, dict[str, bool]] = field(default_factory=dict)  # non-interference checks

    def judged(self, spec: RunSpec, label: str, alarms: list[str], kinds: set[str], detected: bool | None) -> None:
        self.verdicts[spec] = label
        if label == "healthy":
            self.alarms[spec] = alarms
        elif detected is not None:
            self.detected[spec] = detected
            self.faults[spec] = kinds

    def watched(self, spec: RunSpec, **checks: bool) -> None:
        self.interference[spec] = checks

    def summary(self) -> list[str]:
        lines = []
        if self.interference:
            n = len(self.interference)
            failed = Counter(name for checks in self.interference.values() for name, ok in checks.items() if not ok)
            lines.append(
                f"non-interference: {n} models; engine warnings {failed['no_warning']}/{n}, crashes "
                f"{failed['no_crash']}/{n}, not bit-identical {failed['bit_identical']}/{n}, hooks left "
                f"{failed['hooks_removed']}/{n}, model kept alive {failed['collected']}/{n}"
            )
        if self.verdicts:
            n = len(self.verdicts)
            labels = Counter(self.verdicts.values())
            alarms = sum(bool(a) for a in self.alarms.values())
            found = sum(self.detected.values())
            lines.append(
                f"diagnosis: {n} models; confirmed healthy {labels['healthy']}, confirmed faulty {labels['faulty']}, "
                f"neither (discarded) {labels['neither']} ({labels['neither'] / n:.0%}); alarms on healthy models "
                f"{alarms}/{labels['healthy']}; faulty models diagnosed {found}/{len(self.detected)}"
            )
        for spec, kinds in self.faults.items():  # worth keeping as explicit examples (test_fuzzed_training.py)
            lines.append(f"confirmed faulty {sorted(kinds)}, named: {self.detected[spec]}: {spec!r}")
        return lines


CAMPAIGN = Campaign()
