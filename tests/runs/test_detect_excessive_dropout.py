"""Dropout far too strong (p=0.9 where 0.1-0.5 is usual): found from the model's dropout layers when it trained in
training mode and its loss did not converge. Ground truth is plain torch in each test: the same program at the
usual probability reaches a clearly better held-out accuracy; the twins at 0.5 and 0.6, and the p=0.9 model
trained in eval mode (dropout off: the eval-mode finding), stay silent on this kind."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

KIND = "excessive_dropout"
CLASSES = 4
STEPS = 150
make = support.classification_batches((16,), CLASSES, batch=64, seed=4)


def mlp(p: float) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Dropout(p), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(p), nn.Linear(64, CLASSES)
    )


def train(model: nn.Module, watched: bool, eval_mode: bool = False) -> tuple[list[float], float, NeuralDbg | None]:
    """A user's loop under Adam 1e-3: its losses and the held-out accuracy (evaluated in eval mode)."""
    model.train(not eval_mode)
    dbg: NeuralDbg | None = None
    if watched:
        dbg, losses = support.train(model, make, F.cross_entropy, steps=STEPS)
    else:
        losses = support.plain_train(model, make, F.cross_entropy, steps=STEPS)
    model.eval()
    with torch.no_grad():
        held = [make(10_000 + i) for i in range(4)]
        accuracy = sum(float((model(x).argmax(1) == y).float().mean()) for x, y in held) / len(held)
    return losses, accuracy, dbg


def run(build, p: float, watched: bool, eval_mode: bool = False):
    torch.manual_seed(0)
    return train(build(p), watched, eval_mode)


def kinds(dbg: NeuralDbg | None) -> list[str]:
    assert dbg is not None
    return [h.kind.value for h in dbg.hypotheses()]


def test_dropout_of_nine_tenths_in_an_mlp_is_found_and_its_twins_are_silent():
    losses, accuracy, _ = run(mlp, 0.9, watched=False)
    _, usual, _ = run(mlp, 0.5, watched=False)
    # plain torch: at 0.9 the held-out accuracy is far below the usual setting's
    assert accuracy < usual - 0.1

    watched, _, dbg = run(mlp, 0.9, watched=True)
    assert watched == losses  # the debugger changes nothing
    assert kinds(dbg)[:1] == [KIND], dbg and dbg.explain_failure()
    found = dbg.hypotheses()[0]
    assert found.root.metrics["p"] == 0.9 and found.root.metrics["layers"] == 2
    assert "'2' (Dropout) p=0.9" in found.explanation and "lower the dropout probability" in found.suggestion

    for p in (0.5, 0.6):
        _, _, twin = run(mlp, p, watched=True)
        assert twin is not None and twin.healthy, twin.explain_failure()


def test_the_dropout_inside_library_layers_is_read():
    from neuraldbg.config import HEAVY_DROPOUT
    from neuraldbg.model.layers import heavy_dropout_layers

    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.9, batch_first=True)
    model = nn.ModuleDict({"enc": layer, "gru": nn.GRU(8, 8, num_layers=2, dropout=0.85), "ok": nn.Dropout(0.5)})
    found = dict(heavy_dropout_layers(model.named_modules(), HEAVY_DROPOUT))
    assert found == {
        "'enc.self_attn' (MultiheadAttention)": 0.9,
        "'enc.dropout' (Dropout)": 0.9,
        "'enc.dropout1' (Dropout)": 0.9,
        "'enc.dropout2' (Dropout)": 0.9,
        "'gru' (GRU)": 0.85,
    }


def test_dropout_never_active_is_not_this_finding():
    # trained in eval mode: the dropout layers never dropped anything (the eval-mode finding says what happened)
    _, _, dbg = run(mlp, 0.9, watched=True, eval_mode=True)
    assert KIND not in kinds(dbg) and "eval_mode_training" in kinds(dbg)


def test_a_smoke_run_too_short_to_judge_its_loss_is_not_judged():
    torch.manual_seed(0)
    dbg, _ = support.train(mlp(0.9), make, F.cross_entropy, steps=40)
    assert KIND not in kinds(dbg) and "Its loss was not judged" in dbg.report()


def test_gradients_that_fell_with_the_loss_at_chance_are_no_converged_fit() -> None:
    """Hunt 20's CNN with dropout 0.9 lost its last BatchNorm's channels: its gradients fell a hundredfold, which
    read as a converged fit and hid the dropout, while its loss ended at log 5. A loss at its chance level is no
    converged fit, whatever its gradients did (a regression's at its targets' variance too: hunt 23); below it, the
    gradients' fall says the fit converged."""
    from types import SimpleNamespace

    from neuraldbg.kinds import loss_evidence

    falling = SimpleNamespace(median=lambda name, a, b: 1.0 if a == 0.0 else 0.001)  # gradients fell 1000-fold
    coverage = SimpleNamespace(training=falling)
    curve = SimpleNamespace(start=SimpleNamespace(mean=5.2), end=SimpleNamespace(mean=1.61), at_chance=True)
    assert not loss_evidence.converged(coverage, curve)  # type: ignore[arg-type]
    curve.at_chance = False  # below chance: the gradients' fall says the fit converged
    assert loss_evidence.converged(coverage, curve)  # type: ignore[arg-type]
    curve.end.mean = 0.04  # a hundredfold fall converged, at any level
    curve.at_chance = True
    assert loss_evidence.converged(coverage, curve)  # type: ignore[arg-type]
