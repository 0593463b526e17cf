"""No "healthy" without evidence: runs that were not (fully) observed, or could not learn, are findings.

Each fault is built as users write it, checked with plain torch in the test, and must give its own run-level
hypothesis; validation passes, partly frozen models and healthy loops must stay silent.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import support
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import EventType, FailureKind, NeuralDbg, NeuralDbgWarning


def mlp_with_dropout() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))


def kinds(dbg: NeuralDbg) -> list[FailureKind]:
    return [h.kind for h in dbg.hypotheses()]


def only(dbg: NeuralDbg, kind: FailureKind):
    (found,) = dbg.hypotheses()
    assert found.kind is kind
    assert found.root.event_type is EventType.RUN and found.root.layer == ""
    assert found.explanation  # every run-level kind is explained in words
    return found


def test_a_loop_over_an_empty_loader_observed_no_training():
    model = mlp_with_dropout()
    before = [p.detach().clone() for p in model.parameters()]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.empty(0, 16), torch.empty(0, 1)))
    with NeuralDbg(model) as dbg:
        for x, y in loader:  # no batch at all
            F.mse_loss(model(x), y).backward()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # plain torch: nothing trained
    found = only(dbg, FailureKind.NO_TRAINING_OBSERVED)
    assert dbg.steps == 0 and found.root.metrics["forwards"] == 0


def test_only_validation_passes_are_no_training():
    model = mlp_with_dropout()
    x = torch.randn(8, 16)
    with NeuralDbg(model) as dbg:
        with torch.no_grad():
            model(x)
        model.eval()
        model(x)  # eval mode, gradients on, but no backward: validation, not training
    found = only(dbg, FailureKind.NO_TRAINING_OBSERVED)
    assert found.root.metrics["no_grad_forwards"] == 1 and found.root.metrics["eval_forwards"] == 1


def test_a_loop_that_forgets_backward_reaches_no_parameter_with_a_gradient():
    model = mlp_with_dropout()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = support.regression_batches()
    grads_seen = []
    with NeuralDbg(model) as dbg:
        for step in range(10):
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(model(x), y)  # loss.backward() forgotten
            grads_seen.append(any(p.grad is not None for p in model.parameters()))
            opt.step()
    assert not any(grads_seen)  # plain torch: no parameter ever had a gradient
    found = only(dbg, FailureKind.NO_GRADIENT)
    assert found.root.metrics["steps"] == 10 and found.root.metrics["backward_passes"] == 0
    assert found.root.metrics["trainable_parameters"] == 4


def test_a_model_left_in_eval_mode_while_training_is_found_with_its_mode_dependent_layers():
    model = mlp_with_dropout()
    model.eval()  # forgotten model.train() after a validation pass
    dbg, _ = support.train(model, support.regression_batches(), steps=20)
    assert not model.training and not model[2].training  # plain torch: dropout was off while the optimizer stepped
    found = only(dbg, FailureKind.EVAL_MODE_TRAINING)
    assert found.root.metrics["steps"] == 20 and "'2' (Dropout)" in found.root.detail
    assert dbg.steps == 20  # every step is observed, not one


def test_eval_mode_training_without_mode_dependent_layers_is_observed_and_healthy():
    torch.manual_seed(0)
    model = support.mlp()  # no dropout, no batch norm: eval mode changes nothing
    model.eval()
    dbg, losses = support.train(model, support.regression_batches(), steps=30)
    assert losses[-1] < losses[0]
    assert dbg.steps == 30 and dbg.hypotheses() == []


def test_fine_tuning_in_eval_mode_with_batch_norm_statistics_already_learned_is_frozen_batch_norm_not_a_fault():
    """Plain torch: a conv net pretrained in train mode, then fine-tuned with model.eval() (the usual way to freeze
    batch norm): its running statistics stay what pretraining learned and the loss keeps falling. A fresh twin
    whose statistics were never learned is still called training in eval mode."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 1))
    fresh = copy.deepcopy(model)
    flat = support.regression_batches(64)

    def batches(step: int) -> support.Batch:
        x, y = flat(step)
        return x.reshape(-1, 1, 8, 8), y

    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(20):  # pretraining, unwatched
        x, y = batches(1000 + step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    learned = model[1].running_mean.clone()
    assert int(model[1].num_batches_tracked) == 20
    model.eval()
    dbg, losses = support.train(model, batches, steps=40)
    assert torch.equal(model[1].running_mean, learned)  # plain torch: frozen, as intended
    assert losses[-1] < losses[0]
    assert dbg.hypotheses() == [], dbg.explain_failure()

    fresh.eval()
    twin, _ = support.train(fresh, batches, steps=40)
    found = only(twin, FailureKind.EVAL_MODE_TRAINING)
    assert "'1' (BatchNorm2d)" in found.root.detail


def test_dropout_with_probability_zero_in_eval_mode_changes_nothing_and_is_silent():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.0), nn.Linear(32, 1))
    x = torch.randn(4, 16)
    assert torch.equal(model.eval()(x), model.train()(x))  # plain torch: p=0 behaves the same in both modes
    model.eval()
    dbg, _ = support.train(model, support.regression_batches(), steps=20)
    assert dbg.hypotheses() == [], dbg.explain_failure()


def test_a_validation_pass_in_eval_mode_between_steps_is_not_training():
    model = mlp_with_dropout()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = support.regression_batches()
    with NeuralDbg(model) as dbg:
        for step in range(30):
            model.train()
            x, y = batches(step)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            if step % 5 == 4:
                model.eval()
                F.mse_loss(model(x), y)  # validation without no_grad: a forward, no backward
    assert dbg.steps == 30 and dbg.hypotheses() == []
    assert dbg._recorder.coverage.eval_forwards == 6


def test_a_loss_with_exactly_zero_gradient_is_degenerate():
    torch.manual_seed(0)
    model = nn.Linear(8, 1)  # one output unit under cross_entropy: log_softmax of one logit is 0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, labels = torch.randn(32, 8), torch.zeros(32, dtype=torch.long)
    with NeuralDbg(model) as dbg:
        for _ in range(10):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), labels)
            dbg.observe_loss(loss)
            loss.backward()
            assert loss.item() == 0.0 and all(bool((p.grad == 0).all()) for p in model.parameters())
            opt.step()
    found = only(dbg, FailureKind.DEGENERATE_LOSS)
    assert found.root.metrics["steps"] == 10 and found.root.metrics["loss"] == 0.0


def test_a_converged_fit_is_not_a_degenerate_loss():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    dbg, losses = support.train(
        model, lambda step: (x, y), steps=300, optimizer=torch.optim.Adam(model.parameters(), 0.05)
    )
    assert losses[-1] < 1e-6 * losses[0]  # plain torch: a near-perfect fit, gradients tiny but not zero
    assert FailureKind.DEGENERATE_LOSS not in kinds(dbg)


def test_a_debugger_that_stopped_observing_is_never_healthy(monkeypatch: pytest.MonkeyPatch):
    from neuraldbg.capture import measure

    real = measure.gradients

    def fails_from_step_5(data, *args: object) -> None:
        if data.step >= 5:
            raise RuntimeError("cannot read gradients")
        real(data, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(measure, "gradients", fails_from_step_5)
    with pytest.warns(NeuralDbgWarning, match="cannot read gradients"):
        dbg, _ = support.train(support.mlp(), support.regression_batches(), steps=20)
    found = only(dbg, FailureKind.INCOMPLETE_OBSERVATION)
    assert found.root.step_start == 5 and "cannot read gradients" in found.root.detail
    assert dbg.steps == 5  # the steps before it were observed (and healthy)


def test_a_partly_frozen_model_and_a_healthy_loop_stay_silent():
    torch.manual_seed(0)
    model = support.mlp()
    for p in model[0].parameters():
        p.requires_grad_(False)  # a frozen backbone layer, on purpose
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    dbg, losses = support.train(model, support.regression_batches(), steps=40, optimizer=opt)
    assert losses[-1] < losses[0]
    assert dbg.hypotheses() == []


def test_run_level_findings_survive_a_saved_trace(tmp_path):
    model = mlp_with_dropout()
    model.eval()
    dbg, _ = support.train(model, support.regression_batches(), steps=5)
    import neuraldbg

    loaded = neuraldbg.load(dbg.save(tmp_path / "run.json"))
    assert [(h.kind, h.root.detail) for h in loaded.hypotheses()] == [(h.kind, h.root.detail) for h in dbg.hypotheses()]


def test_a_loss_detached_from_the_output_is_no_gradient_and_the_explanation_names_the_detach():
    model = mlp_with_dropout()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = support.regression_batches()
    with NeuralDbg(model) as dbg:
        for step in range(10):
            x, y = batches(step)
            opt.zero_grad()
            pred = model(x).detach().requires_grad_()  # a detach on the way from the output to the loss
            F.mse_loss(pred, y).backward()
            opt.step()
    assert all(p.grad is None for p in model.parameters())  # plain torch: backward ran, the model got nothing
    found = only(dbg, FailureKind.NO_GRADIENT)
    assert found.root.metrics["steps"] == 10
    assert ".detach()" in found.explanation and "loss.backward() was never called" in found.explanation


@pytest.mark.parametrize("logged", [False, True])
def test_per_sample_gradients_through_torch_func_keep_the_run_observed_and_say_what_was_not_measured(logged: bool):
    """DP-SGD's per-sample gradients: vmap(grad(cross-entropy of functional_call(model, ...))), averaged into each
    parameter's .grad by hand before optimizer.step(). The model's forward hooks run inside the transforms, on
    per-sample wrapped tensors that the measurements have no batching rule for (torch._foreach_norm raised inside
    vmap, and the recorder stopped at step 0 with a failure of its own). Those forwards are left alone: the
    recorder stays active, the training is unchanged, and the caveat names the transforms. ``logged``: the loop
    also runs the model under torch.no_grad each step to log its loss, as DP-SGD scripts do: the caveat must not
    say the model had no forward pass of its own (it had one, without gradients)."""
    from torch.func import functional_call, grad, vmap

    def run(watched: bool) -> tuple[dict[str, torch.Tensor], NeuralDbg | None]:
        torch.manual_seed(0)
        x, y = torch.randn(256, 20), torch.randint(0, 4, (256,))
        model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def one(params: dict[str, torch.Tensor], a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(functional_call(model, params, (a[None],)), b[None])

        def loop() -> None:
            for _ in range(3):
                for i in range(0, 256, 32):
                    params = {k: v.detach() for k, v in model.named_parameters()}
                    per_sample = vmap(grad(one), in_dims=(None, 0, 0))(params, x[i : i + 32], y[i : i + 32])
                    for k, p in model.named_parameters():
                        p.grad = per_sample[k].mean(0)
                    opt.step()
                    opt.zero_grad()
                    if logged:
                        with torch.no_grad():
                            F.cross_entropy(model(x[i : i + 32]), y[i : i + 32])

        dbg = support.watching(model, loop, watched)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}, dbg

    plain, _ = run(watched=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeuralDbgWarning)  # a recorder that stopped observing warns
        watched, dbg = run(watched=True)
    assert dbg is not None
    assert all(torch.equal(plain[k], watched[k]) for k in plain)  # the debugger changed nothing
    hypotheses = dbg.hypotheses()
    assert [h.kind.value for h in hypotheses] == ["incomplete_observation"], dbg.explain_failure()
    assert "torch.func transforms" in hypotheses[0].explanation
    assert "failed" not in hypotheses[0].explanation
    assert "without a forward pass of its own" not in hypotheses[0].explanation
    assert "torch.no_grad" in hypotheses[0].explanation


def test_a_model_sampled_under_no_grad_and_trained_through_another_method_is_told_so():
    """A restricted Boltzmann machine trained by contrastive divergence: its forward is one Gibbs step, run under
    torch.no_grad for the negative sample, and the loss is the difference of free energies, another method of the
    model that reads its parameters. Plain torch: the reconstruction error falls (it trains); no forward of the model
    ever carries a gradient. The caveat says so, not that the model was never called."""

    class RBM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.W = nn.Parameter(0.01 * torch.randn(16, 24))
            self.b, self.c = nn.Parameter(torch.zeros(24)), nn.Parameter(torch.zeros(16))

        def free_energy(self, v: torch.Tensor) -> torch.Tensor:
            return -(v @ self.b) - F.softplus(F.linear(v, self.W, self.c)).sum(1)

        def forward(self, v: torch.Tensor) -> torch.Tensor:
            h = torch.bernoulli(torch.sigmoid(F.linear(v, self.W, self.c)))
            return torch.bernoulli(torch.sigmoid(F.linear(h, self.W.t(), self.b)))

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    prototypes = (torch.rand(4, 24, generator=g) > 0.5).float()
    model = RBM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def error() -> float:
        with torch.no_grad():
            h = torch.sigmoid(F.linear(prototypes, model.W, model.c))
            return float(F.binary_cross_entropy(torch.sigmoid(F.linear(h, model.W.t(), model.b)), prototypes))

    before = error()

    def loop() -> None:
        for _ in range(60):
            v = prototypes[torch.randint(0, 4, (32,), generator=g)]
            with torch.no_grad():
                negative = model(v)
            loss = (model.free_energy(v) - model.free_energy(negative)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    dbg = support.watching(model, loop, True)
    assert error() < 0.5 * before  # plain torch: it trains
    assert dbg is not None and dbg._recorder.coverage.no_grad_forwards == 60
    found = only(dbg, FailureKind.INCOMPLETE_OBSERVATION)
    assert "forward ran 60 times, every one under torch.no_grad" in found.explanation
    assert "called through a copy" not in found.explanation
