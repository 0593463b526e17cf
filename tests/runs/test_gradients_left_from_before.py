"""Gradients a parameter already held when the debugger attached (a teacher trained earlier in the same script, a
backbone pretrained before a probe) are not this run's until a backward pass writes them. Ground truth is plain
torch in each test: the stale ``.grad`` is the very tensor it was at attach, unmodified, at the end of the run."""

from __future__ import annotations

import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

CLASSES = 5


def pretrained(model: nn.Module, steps: int = 30) -> None:
    """Train ``model`` unwatched, leaving its last gradients in ``.grad`` (no zero_grad after the last step)."""
    make = support.classification_batches((20,), CLASSES, batch=64, seed=3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        x, y = make(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


class Distillation(nn.Module):
    def __init__(self, teacher: nn.Module) -> None:
        super().__init__()
        self.teacher = teacher
        self.student = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def distil(model: Distillation, params: object, steps: int = 40) -> NeuralDbg:
    make = support.classification_batches((20,), CLASSES, batch=64, seed=3)
    opt = torch.optim.Adam(params, lr=2e-3)  # type: ignore[arg-type]
    with NeuralDbg(model) as dbg:
        for step in range(steps):
            x, y = make(100 + step)
            with torch.no_grad():
                soft = F.softmax(model.teacher(x) / 4.0, dim=1)
            logits = model.student(x)
            loss = F.kl_div(F.log_softmax(logits / 4.0, dim=1), soft, reduction="batchmean") * 16.0
            loss = 0.5 * loss + 0.5 * F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return dbg


def test_a_teacher_trained_earlier_in_the_script_keeps_its_last_gradient_and_is_not_frozen():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    pretrained(teacher)
    model = Distillation(teacher)
    left = {name: (p.grad, p.grad._version, p.detach().clone()) for name, p in teacher.named_parameters()}
    dbg = distil(model, model.student.parameters())
    for name, p in teacher.named_parameters():  # plain torch: never written, never moved
        grad, version, weight = left[name]
        assert p.grad is grad and p.grad._version == version and torch.equal(p.detach(), weight)
    assert dbg.hypotheses() == [], dbg.explain_failure()


def test_a_student_layer_left_out_of_the_optimizer_is_still_found_beside_the_stale_teacher():
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    pretrained(teacher)
    model = Distillation(teacher)
    dbg = distil(model, model.student[0].parameters())  # the student's head left out
    frozen = [h for h in dbg.hypotheses() if h.kind.value == "frozen_parameters"]
    assert frozen and frozen[0].root.layer == "student.2", dbg.explain_failure()
    assert not any(h.root.layer.startswith("teacher") for h in dbg.hypotheses())


def test_a_pretrained_layer_whose_gradient_the_run_writes_again_counts_again():
    """Fine-tuning a pretrained model whose head was left out of the new optimizer: its stale gradient is written
    by the first backward pass, and from then on it is the run's: the head is frozen."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, CLASSES))
    pretrained(model)
    stale = model[2].weight.grad
    make = support.classification_batches((20,), CLASSES, batch=64, seed=3)
    opt = torch.optim.Adam(model[0].parameters(), lr=1e-3)
    with NeuralDbg(model) as dbg:
        for step in range(30):
            x, y = make(200 + step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert model[2].weight.grad is not stale or model[2].weight.grad._version > 0  # plain torch: written again
    frozen = [h for h in dbg.hypotheses() if h.kind.value == "frozen_parameters"]
    assert frozen and frozen[0].root.layer == "2", dbg.explain_failure()
