"""The inverted padding mask's rule over its readings: a source is reported when its mask read inverted on at least
half of the passes that read it (a pass or two of an odd batch are not the program's mask); the model's
``attention_mask`` and attention layers' key-padding masks are told apart in the explanation."""

from __future__ import annotations

from neuraldbg.capture.coverage import Coverage, RunFacts
from neuraldbg.config import DebugConfig
from neuraldbg.kinds.inverted_padding_mask import InvertedPaddingMask

FACTS = RunFacts(1, 100, 100, DebugConfig())


def finding(masks: dict[str, list[int]]):
    coverage = Coverage()
    coverage.inverted_masks = masks
    coverage.last_step = 99
    return InvertedPaddingMask().run_finding(coverage, FACTS)


def test_half_the_passes_read_inverted_is_reported_fewer_is_not():
    assert finding({"": [4, 1, 3, 0]}) is None
    event = finding({"": [4, 2, 3, 0]})
    assert event is not None and event.step_start == 3
    assert finding({"enc.layers.0.self_attn": [4, 0, -1, 0]}) is None
    assert finding({}) is None


def test_the_explanation_names_the_source_it_read():  # its topology and series are not read
    room = InvertedPaddingMask()
    argument = finding({"": [4, 4, 0, 0]})
    what, fix = room.explain(argument, [], None, {})  # type: ignore[arg-type]
    assert "attention_mask given to the model" in what and "input_ids != pad_token_id" in fix
    assert "key_padding_mask" not in what
    layer = finding({"enc.layers.0.self_attn": [4, 4, 0, 0], "": [4, 0, -1, 0]})
    what, fix = room.explain(layer, [], None, {})  # type: ignore[arg-type]
    assert "'enc.layers.0.self_attn'" in what and "(tokens == pad_id)" in fix
    assert "attention_mask given to the model" not in what


def test_a_mask_that_hid_every_position_is_told_so_and_labels_on_padding_yields_to_it():
    from neuraldbg.kinds.inverted_padding_mask import hides_everything
    from neuraldbg.kinds.labels_on_padding import LabelsOnPadding

    room = InvertedPaddingMask()
    event = finding({"": [4, 4, 0, 4]})
    what, fix = room.explain(event, [], None, {})  # type: ignore[arg-type]
    assert "is 0 everywhere" in what and "not zeros_like where ones_like was meant" in fix
    mixed = finding({"": [4, 4, 0, 2]})  # inverted on some passes, hiding everything on others: told as inverted
    assert "0 on the real tokens and 1 on the padding" in room.explain(mixed, [], None, {})[0]  # type: ignore[arg-type]
    coverage = Coverage()
    coverage.scored_padding, coverage.last_step = 1.0, 99
    assert LabelsOnPadding().run_finding(coverage, FACTS) is not None
    coverage.inverted_masks = {"": [4, 4, 0, 4]}
    assert hides_everything(coverage) and LabelsOnPadding().run_finding(coverage, FACTS) is None
    coverage.inverted_masks = {"": [4, 1, 0, 1]}
    assert not hides_everything(coverage)
