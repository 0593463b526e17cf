"""Saturated tanh/sigmoid activations from a too-large initialisation or from un-normalised inputs."""

from __future__ import annotations

import torch
from torch import nn

from . import _common as c
from .base import Run, Scenario

# A saturated tanh/sigmoid passes almost no gradient upstream.
_SAT_SIDE_EFFECTS = ("vanishing_gradients",)


def _tanh_normal_init() -> Run:
    torch.manual_seed(40)
    model = c.mlp([64, 128, 128, 1], act=nn.Tanh)
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight)  # default std=1, i.e. ~8x the gain tanh tolerates at fan-in 64
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return Run(model, [opt], nn.MSELoss(), c.regression(64, 1, 32, seed=400), steps=60)


def _sigmoid_raw_pixels() -> Run:
    torch.manual_seed(43)
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(192, 64), nn.Sigmoid(), nn.Linear(64, 32), nn.Sigmoid(), nn.Linear(32, 4)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images = c.images(3, 8, 4, 32, seed=403)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = images(step)
        return (x * 40.0 + 128.0).clamp(0.0, 255.0).round(), y  # 8-bit intensities, never divided by 255

    return Run(model, [opt], nn.CrossEntropyLoss(), batch, steps=40)


class _RawInputGRU(nn.Module):
    """A tanh input embedding in front of a GRU."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.embed_act = nn.Tanh()
        self.rnn = nn.GRU(32, 32, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed_act(self.embed(x)))
        return self.head(out[:, -1])


def _raw_inputs_gru() -> Run:
    torch.manual_seed(41)
    model = _RawInputGRU()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    raw = c.sequences(8, 12, 3, 32, seed=401)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = raw(step)
        return 100.0 * x + 500.0, y  # raw sensor readings, never standardised

    return Run(model, [opt], nn.CrossEntropyLoss(), batch, steps=50)


class _PooledTransformer(nn.Module):
    """A transformer encoder with a BERT-style pooler (Linear + Tanh on the first token) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 64)
        layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.pooler = nn.Linear(64, 64)
        self.pooler_act = nn.Tanh()
        self.head = nn.Linear(64, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x))
        return self.head(self.pooler_act(self.pooler(h[:, 0])))


def _transformer_pooler() -> Run:
    torch.manual_seed(42)
    model = _PooledTransformer()
    nn.init.normal_(model.pooler.weight, std=1.0)  # meant std=0.02 as in BERT
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Run(model, [opt], nn.CrossEntropyLoss(), c.sequences(8, 10, 3, 32, seed=402), steps=40)


SCENARIOS = [
    Scenario(
        name="saturated_tanh_normal_init",
        arch="mlp",
        description="A tanh MLP whose Linear weights were initialised with nn.init.normal_ (std 1): "
        "pre-activations have std ~8 and most tanh outputs sit at +-1 from step 0.",
        truth=c.truth(
            ["saturated_activations"],
            may_also=_SAT_SIDE_EFFECTS,
            roots=["0", "1"],
            onset=(0, 0),
            evidence="the first tanh ('1') has >50% of its outputs beyond |0.995| at step 0, and so does '3'",
        ),
        build=_tanh_normal_init,
    ),
    Scenario(
        name="saturated_tanh_raw_inputs_gru",
        arch="rnn",
        description="A GRU model fed raw, un-standardised readings (scale ~100) through a tanh input "
        "embedding: the embedding's tanh is saturated from step 0.",
        truth=c.truth(
            ["saturated_activations"],
            may_also=_SAT_SIDE_EFFECTS,
            roots=["embed", "embed_act"],
            onset=(0, 0),
            evidence="'embed_act' has nearly all outputs beyond |0.995| at every step",
        ),
        build=_raw_inputs_gru,
    ),
    Scenario(
        name="saturated_pooler_transformer",
        arch="transformer",
        description="A transformer classifier whose BERT-style tanh pooler was initialised with std 1 "
        "instead of 0.02: the pooler's tanh is saturated from step 0.",
        truth=c.truth(
            ["saturated_activations"],
            may_also=_SAT_SIDE_EFFECTS,
            roots=["pooler", "pooler_act"],
            onset=(0, 0),
            evidence="'pooler_act' has >50% of its outputs beyond |0.995| from step 0",
        ),
        build=_transformer_pooler,
    ),
    Scenario(
        name="saturated_sigmoid_raw_pixels",
        arch="mlp",
        description="An old-style sigmoid MLP fed raw 0-255 pixel intensities that were never divided by "
        "255: the first sigmoid layer is pinned at 0 or 1 from step 0.",
        truth=c.truth(
            ["saturated_activations"],
            may_also=_SAT_SIDE_EFFECTS,
            roots=["1", "2"],
            onset=(0, 0),
            evidence="sigmoid '2' has nearly all outputs outside [0.0025, 0.9975] at every step",
        ),
        build=_sigmoid_raw_pixels,
    ),
]
