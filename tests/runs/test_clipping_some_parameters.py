"""Gradient clipping over some of the parameters (``clip_grad_norm_`` over an encoder alone; Lightning's
``self.clip_gradients`` on one of two optimizers) to a tiny norm. The gradients that reach the optimizer are tiny
against the rest, and the debugger took them for vanishing gradients (hunt 18: "add residual connections or
normalisation layers"), although the backward pass left them healthy. Under Adam, which rescales the gradient,
nothing is harmed and the run is silent; under SGD the clipped layers are held still while the decoder trains, and
that is ``stalled_updates`` at those layers, with the clipping named.

Ground truth by plain torch: the clipped gradients are tiny while the backward pass left them healthy; under Adam
the held-out reconstruction error is the unclipped twin's; under SGD it is several times worse, and the encoder's
weights barely move."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 250
CLIP = 1e-5


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """Points near a 5-dimensional manifold in 32 dimensions, to be reconstructed through a bottleneck of 6."""
    g = torch.Generator().manual_seed(6000)
    z, mix = torch.randn(2400, 5, generator=g), torch.randn(5, 32, generator=g) / 2
    x = torch.tanh(z @ mix) + 0.02 * torch.randn(2400, 32, generator=g)
    return x[:2000], x[2000:]


def run(clip: float, sgd: bool, watched: bool, clip_until: int = STEPS, left_out: bool = False) -> dict:
    """``clip_until``: the step from which the encoder is no longer clipped; ``left_out``: its first layer is in no
    optimizer."""
    torch.manual_seed(0)
    train, held_out = data()
    enc = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 6))
    dec = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 32))
    model = nn.Sequential(enc, dec)
    params = [p for p in model.parameters() if not (left_out and any(p is q for q in enc[0].parameters()))]
    opt = torch.optim.SGD(params, 0.1, momentum=0.9) if sgd else torch.optim.Adam(params, 2e-3)
    start = enc[0].weight.detach().clone()
    out: dict = {"losses": [], "raw": [], "clipped": []}
    order = torch.Generator().manual_seed(1)

    def loop() -> None:
        for step in range(STEPS):
            x = train[torch.randint(0, len(train), (32,), generator=order)]
            opt.zero_grad()
            loss = F.mse_loss(model(x), x)
            loss.backward()
            if clip and step < clip_until:
                out["raw"].append(float(enc[0].weight.grad.norm()))
                torch.nn.utils.clip_grad_norm_(enc.parameters(), clip)
                out["clipped"].append(float(enc[0].weight.grad.norm()))
            opt.step()
            out["losses"].append(loss.item())

    out["dbg"] = support.watching(model, loop, watched)
    with torch.no_grad():
        out["held_out"] = float(F.mse_loss(model(held_out), held_out))
    out["moved"] = float((enc[0].weight.detach() - start).norm() / start.norm())
    return out


def kinds(dbg: NeuralDbg | None) -> list[FailureKind]:
    assert dbg is not None
    return [h.kind for h in dbg.hypotheses()]


def test_an_encoder_clipped_to_a_tiny_norm_under_adam_is_not_vanishing():
    clipped, twin = run(CLIP, sgd=False, watched=False), run(0.0, sgd=False, watched=False)
    # plain torch: what reaches Adam is tiny against what the backward pass left, and Adam rescales it: the
    # reconstruction is as good as the unclipped twin's
    assert max(clipped["clipped"]) < 1e-4 < 1e-3 < min(clipped["raw"])
    assert clipped["held_out"] < 1.1 * twin["held_out"]
    watched = run(CLIP, sgd=False, watched=True)
    assert watched["losses"] == clipped["losses"]  # the debugger changes nothing
    assert kinds(watched["dbg"]) == [], watched["dbg"].explain_failure()


def test_an_encoder_clipped_to_a_tiny_norm_under_sgd_is_held_still():
    clipped, twin = run(CLIP, sgd=True, watched=False), run(0.0, sgd=True, watched=False)
    # plain torch: under SGD the clipped encoder barely moves while the unclipped one learns, and the decoder alone
    # reconstructs far worse
    assert clipped["moved"] < 1e-3 < 1e-2 < twin["moved"]
    assert clipped["held_out"] > 3 * twin["held_out"]
    watched = run(CLIP, sgd=True, watched=True)
    dbg = watched["dbg"]
    assert watched["losses"] == clipped["losses"]
    assert kinds(dbg) == [FailureKind.STALLED_UPDATES], dbg.explain_failure()
    (hypothesis,) = dbg.hypotheses()
    assert hypothesis.layer == "0.0"  # the encoder's first layer, with its second in the same hypothesis
    text = dbg.explain_failure()[0]
    assert "'0.0', '0.2'" in text and "clip_grad_norm_" in text
    assert "'1." not in text  # the decoder trains


def test_the_same_programs_unclipped_are_silent():
    for sgd in (False, True):
        watched = run(0.0, sgd=sgd, watched=True)
        assert kinds(watched["dbg"]) == [], watched["dbg"].explain_failure()


def test_clipping_that_stops_holds_the_layers_still_only_while_it_lasts():
    clipped = run(CLIP, sgd=True, watched=False, clip_until=100)
    assert max(clipped["clipped"]) < 1e-4 < 1e-3 < min(clipped["raw"])  # plain torch: clipped for 100 steps
    watched = run(CLIP, sgd=True, watched=True, clip_until=100)
    dbg = watched["dbg"]
    assert watched["losses"] == clipped["losses"]
    (hypothesis,) = dbg.hypotheses()
    assert hypothesis.kind is FailureKind.STALLED_UPDATES
    assert hypothesis.root.step_end < 100 <= STEPS - 1  # it ended with the clipping, it did not last the run
    assert "until the run ended" not in dbg.explain_failure()[0]


def test_a_clipped_layer_left_out_of_the_optimizer_is_frozen_not_held_still_by_clipping():
    watched = run(CLIP, sgd=True, watched=True, left_out=True)
    dbg = watched["dbg"]
    # plain torch: '0.0' never moves (no optimizer holds it); '0.2' is clipped and barely moves
    found = {(h.kind, h.layer) for h in dbg.hypotheses()}
    assert (FailureKind.FROZEN_PARAMETERS, "0.0") in found, dbg.explain_failure()
    stalled = [h for h in dbg.hypotheses() if h.kind is FailureKind.STALLED_UPDATES]
    assert [h.layer for h in stalled] == ["0.2"], dbg.explain_failure()
    assert "'0.0'" not in dbg.explain_failure()[[h.kind for h in dbg.hypotheses()].index(stalled[0].kind)]
