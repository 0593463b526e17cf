"""A backbone kept frozen (``requires_grad=False``) for a warm-up and switched on later is followed from then on.
Built with an optimizer over the head alone, its unfrozen parameters get gradients and never move: frozen
parameters, missing from the optimizer. Built with an optimizer over every parameter, they move once unfrozen and
the run is healthy. Found silent by hunt 15 (the README's own demo fault, reached through a warm-up): the debugger
took its list of parameters when it was made, so a parameter switched on later was never read.

Ground truth by plain torch: the unfrozen backbone gets a non-zero gradient and stays bit for bit where it was when
left out; it moves when the optimizer holds it; and the fine-tuned model fits better than the one whose backbone
stayed put."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import FailureKind, NeuralDbg

STEPS = 200
UNFREEZE = 60
make = support.classification_batches((16,), 4, batch=64, seed=11)


def run(head_only: bool, watched: bool) -> tuple[list[float], float, float, NeuralDbg | None]:
    """The losses, the backbone's largest gradient norm after unfreezing, and how far its first weight moved."""
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    model = nn.Sequential(backbone, nn.Linear(64, 4))
    for p in backbone.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam(model[1].parameters() if head_only else model.parameters(), lr=3e-3)
    start = backbone[0].weight.detach().clone()
    losses: list[float] = []
    grad = 0.0

    def loop() -> None:
        nonlocal grad
        for step in range(STEPS):
            if step == UNFREEZE:
                for p in backbone.parameters():
                    p.requires_grad_(True)
            x, y = make(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            g = backbone[0].weight.grad
            if g is not None:
                grad = max(grad, float(g.norm()))

    dbg = support.watching(model, loop, watched)
    return losses, grad, float((backbone[0].weight.detach() - start).norm()), dbg


def frozen_layers(dbg: NeuralDbg | None) -> set[str]:
    assert dbg is not None
    return {h.layer for h in dbg.hypotheses() if h.kind is FailureKind.FROZEN_PARAMETERS}


def test_a_backbone_unfrozen_but_left_out_of_the_optimizer_is_frozen():
    losses, grad, moved, _ = run(head_only=True, watched=False)
    fine_tuned, _, moved_when_held, _ = run(head_only=False, watched=False)
    # plain torch: once unfrozen the backbone gets a gradient but never moves; held by the optimizer it moves, and
    # the run whose backbone learns ends lower
    assert grad > 1e-3 and moved == 0.0 and moved_when_held > 0.0
    assert sum(fine_tuned[-20:]) < sum(losses[-20:])
    watched, _, _, dbg = run(head_only=True, watched=True)
    assert watched == losses  # the debugger changes nothing
    assert frozen_layers(dbg) == {"0.0"}, dbg.explain_failure() if dbg else ""  # one fault: both layers, one cause
    assert dbg is not None and dbg.get_root_causes()[0].kind is FailureKind.FROZEN_PARAMETERS
    text = dbg.explain_failure()[0]
    assert "'0.0.weight'" in text and "'0.2.weight'" in text and "not in any optimizer" in text


def test_a_backbone_unfrozen_and_held_by_the_optimizer_is_healthy():
    losses, _, moved, _ = run(head_only=False, watched=False)
    assert moved > 0.0  # plain torch: it moves once unfrozen
    watched, _, _, dbg = run(head_only=False, watched=True)
    assert watched == losses
    assert dbg is not None and dbg.healthy, dbg.explain_failure()


def test_a_backbone_never_unfrozen_is_not_reported():
    """Frozen on purpose to the end: no gradient, nothing to report (the list of parameters grows only with the
    ones switched on)."""
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    model = nn.Sequential(backbone, nn.Linear(64, 4))
    for p in backbone.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam(model[1].parameters(), lr=3e-3)
    with NeuralDbg(model) as dbg:
        for step in range(STEPS):
            x, y = make(step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert backbone[0].weight.grad is None  # plain torch: never a gradient
    assert not frozen_layers(dbg) and dbg.healthy, dbg.explain_failure()


def test_the_optimizers_holdings_are_asked_again_once_a_parameter_is_unfrozen():
    """Which of the followed parameters an optimizer holds is cached; a parameter followed from its unfreezing on
    must be counted among those its optimizer holds (else the optimizer's own step is taken for another's)."""
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU())
    model = nn.Sequential(backbone, nn.Linear(64, 4))
    for p in backbone.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with NeuralDbg(model) as dbg:
        for step in range(40):
            if step == 10:
                for p in backbone.parameters():
                    p.requires_grad_(True)
            x, y = make(step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        owned = dbg._recorder.backward._owned_by(opt)
    assert {"0.0.weight", "0.0.bias", "1.weight", "1.bias"} <= owned
