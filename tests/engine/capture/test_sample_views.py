"""Which views mix samples (``capture/sample_views.py``): shapes only, one guard per case."""

from __future__ import annotations

import pytest

from neuraldbg.capture.sample_views import _mixes


@pytest.mark.parametrize(
    ("given", "made", "samples", "mixes"),
    [
        ((12, 64, 32), (64, 384), 64, True),  # a sequence-first LSTM's output flattened with view
        ((2, 32, 16), (32, 32), 32, True),  # a two-layer h_n viewed as one row per sample
        ((1, 32, 16), (32, 16), 32, False),  # a one-layer h_n: one value before the batch, nothing mixed
        ((32, 32, 8, 8), (32, 2048), 32, False),  # batch first, as many channels as samples
        ((12, 32, 64), (12, 128, 16), 32, False),  # an attention's heads split beside its batch: not to the batch
        ((384, 32), (32, 12, 32), 32, False),  # a Linear's (N * T, H) output given back (N, T, H), H = N by chance
        ((5, 4, 20), (20, 20), 20, False),  # (T, B, H) merged to (T * B, H), scored per position, H = T * B
        ((12, 64, 32), (64, 384), 1, False),  # one sample: nothing to mix
    ],
)
def test_a_view_mixes_samples_only_when_its_batch_axis_is_not_its_first(given, made, samples, mixes):
    assert _mixes(given, made, samples) is mixes
