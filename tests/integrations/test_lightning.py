"""NeuralDbgCallback under ``lightning.Trainer.fit``: the real Trainer, a tiny MLP classifier, tens of steps.

Each fault is confirmed with plain torch in the test (:mod:`lightning_support`): weights that really move or never
move, a ReLU that really is dead on every batch, a batch that really holds a NaN, clipping that really clips.
"""

from __future__ import annotations

import csv
import logging
import pickle
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from framework_support import records_of, summaries
from lightning_support import ReluWatch, kill_relu, kit, make_loader, quiet_trainer
from torch.optim.optimizer import _global_optimizer_pre_hooks, register_optimizer_step_post_hook
from torch.utils.data import DataLoader, TensorDataset

from neuraldbg import ConfigError, NeuralDbgError

pytest.importorskip("lightning.pytorch")
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.precision import MixedPrecision

from neuraldbg.integrations.lightning import NeuralDbgCallback

L = kit("lightning.pytorch")
pytestmark = [  # Lightning's own notices, not about the code under test
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`"),
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated"),  # with torch 2.13
    pytest.mark.filterwarnings("ignore:The number of training batches .* is smaller than the logging interval"),
]
HEALTHY: list[tuple[str, str, int]] = []
DEAD = [("dead_neurons", "net.3", 0)]
FROZEN_HEAD = [("frozen_parameters", "head", 0)]
CONSOLE = "lightning.pytorch.callbacks.neuraldbg"  # where the callback writes its verdict line


def fit(model: Any, tmp_path: Any, *, batches: int = 60, val: Any = None, nan_at: int | None = None, **options: Any):
    """Train ``model`` with the callback and a plain-torch Truth; returns (debugger, trainer, truth)."""
    callback, truth = NeuralDbgCallback(), L.Truth()
    options.setdefault("max_steps", batches)
    trainer = quiet_trainer(L.pl, tmp_path, callbacks=[truth, callback], **options)
    trainer.fit(model, make_loader(batches, nan_at=nan_at), val)
    return callback.debugger, trainer, truth


def model(**options: Any) -> Any:
    torch.manual_seed(0)
    return L.Classifier(**options)


def dead_model(**options: Any) -> Any:
    m = model(**options)
    kill_relu(m)
    return m


@pytest.fixture
def hooks_before() -> Iterator[int]:
    yield len(_global_optimizer_pre_hooks)


def forward_hooks(module: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


# --- the table ----------------------------------------------------------------------------------------------


def test_a_healthy_classifier_trained_by_fit_is_reported_healthy(tmp_path: Any) -> None:
    m = model()
    dbg, trainer, truth = fit(m, tmp_path)
    assert len(truth.steps) == 60 and truth.every_parameter_moved_at_every_step(m)  # plain torch: it trains
    assert dbg.steps == trainer.global_step == 60
    assert summaries(dbg) == HEALTHY


def test_a_head_left_out_of_configure_optimizers_is_diagnosed_as_frozen(tmp_path: Any) -> None:
    m = model(head_in_optimizer=False)
    dbg, _, truth = fit(m, tmp_path)
    assert truth.parameters_that_never_moved(m) == {"head.weight", "head.bias"}
    assert all(step.moved == {n for n, _ in m.net.named_parameters(prefix="net")} for step in truth.steps)
    assert summaries(dbg) == FROZEN_HEAD


@pytest.mark.parametrize(
    ("make", "expected"),
    [(model, HEALTHY), (dead_model, DEAD), (lambda: model(head_in_optimizer=False), FROZEN_HEAD)],
    ids=["healthy", "dead layer", "head left out"],
)
def test_a_with_block_around_fit_gives_the_callbacks_diagnosis(make: Any, expected: Any, neuraldbg: Any, tmp_path):
    with_callback, _, _ = fit(make(), tmp_path)
    m = make()
    trainer = quiet_trainer(L.pl, tmp_path, max_steps=60)
    with neuraldbg(m) as ndbg:
        trainer.fit(m, make_loader(60))
    assert summaries(ndbg) == summaries(with_callback) == expected
    assert ndbg.steps == with_callback.steps == 60


# --- faults ---------------------------------------------------------------------------------------------------------


def test_a_dead_relu_is_diagnosed_at_its_own_layer_name_from_step_0(tmp_path: Any) -> None:
    m = dead_model()
    watch = ReluWatch(m.net[3])
    dbg, _, _ = fit(m, tmp_path)
    watch.remove()
    assert len(watch.dead_fractions) == 60 and set(watch.dead_fractions) == {1.0}  # plain torch: dead throughout
    assert summaries(dbg) == DEAD
    assert dbg.layers[:4] == ["net.0", "net.1", "net.2", "net.3"]  # the LightningModule's own names


def test_a_learning_rate_far_too_high_is_diagnosed_from_the_step_its_updates_kill_the_relus(tmp_path: Any) -> None:
    m = model(optimizer="sgd", lr=5.0)
    watch = ReluWatch(m.net[3])
    dbg, _, truth = fit(m, tmp_path)
    watch.remove()
    # plain torch: an update larger than the weights, then most units of 'net.3' dead on every batch from `died` on
    died = next(i for i, fraction in enumerate(watch.dead_fractions) if fraction >= 0.5)
    assert 0 < died < 10 and min(watch.dead_fractions[died:]) >= 0.5 and max(watch.dead_fractions[:died]) < 0.1
    assert max(step.update_ratio["net.2.weight"] for step in truth.steps[:died]) > 1.0
    assert summaries(dbg) == [("dead_neurons", "net.3", died)]
    assert "lower the learning rate" in dbg.explain_failure()[0]


def test_a_nan_batch_is_diagnosed_as_a_data_problem_at_lightnings_step_number(tmp_path: Any) -> None:
    dbg, _, truth = fit(model(), tmp_path, nan_at=25)
    assert truth.nan_at_global_step == [25]  # plain torch: the batch Lightning trained at global_step 25
    assert summaries(dbg) == [("non_finite", "", 25)]
    assert "data problem" in dbg.explain_failure()[0]


def test_a_training_step_that_calls_its_submodules_directly_is_observed_step_by_step(tmp_path: Any) -> None:
    m = dead_model(manual=True, direct=True)  # manual: no closure, so only the direct calls are in question
    watch = ReluWatch(m.net[3])
    dbg, trainer, _ = fit(m, tmp_path)
    watch.remove()
    assert len(watch.dead_fractions) == 60 and set(watch.dead_fractions) == {1.0}
    assert dbg.steps == trainer.global_step == 60
    assert summaries(dbg) == DEAD


# --- how Lightning trains -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("make", "expected"), [(model, HEALTHY), (dead_model, DEAD)], ids=["healthy", "dead layer"])
def test_gradient_accumulation_and_clipping_do_not_change_the_diagnosis(make: Any, expected: Any, tmp_path) -> None:
    plain, _, _ = fit(make(), tmp_path, batches=15)
    dbg, trainer, truth = fit(
        make(), tmp_path, batches=60, max_steps=15, accumulate_grad_batches=4, gradient_clip_val=0.1
    )
    assert truth.batches == 60 and len(truth.steps) == 15
    assert max(step.grad_norm for step in truth.steps) > 0.1  # plain torch: the clipping really clipped
    assert dbg.steps == trainer.global_step == 15
    assert summaries(dbg) == summaries(plain) == expected


def test_validation_and_the_sanity_check_are_neither_counted_nor_observed(tmp_path: Any) -> None:
    m = model()
    # NaN in every validation sample: a validation batch the engine observed would read non_finite
    val = DataLoader(
        TensorDataset(torch.full((96, 16), float("nan")), torch.zeros(96, dtype=torch.long)), batch_size=32
    )
    dbg, trainer, _ = fit(m, tmp_path, val=val, val_check_interval=20, num_sanity_val_steps=2, limit_val_batches=3)
    assert m.validation_batches == 2 + 3 * 3 and m.validation_nan  # plain torch: they ran, and were NaN
    assert dbg.steps == trainer.global_step == 60
    assert "non_finite" not in {kind for kind, _, _ in summaries(dbg)}


@pytest.mark.parametrize(("make", "expected"), [(model, HEALTHY), (dead_model, DEAD)], ids=["healthy", "dead layer"])
def test_manual_optimisation_is_counted_step_for_step(make: Any, expected: Any, tmp_path: Any) -> None:
    m = make(manual=True)
    dbg, trainer, _ = fit(m, tmp_path)
    assert dbg.steps == trainer.global_step == 60
    assert summaries(dbg) == expected


def test_two_optimizers_stepping_on_one_batch_are_one_engine_step_and_two_lightning_steps(tmp_path: Any) -> None:
    torch.manual_seed(0)
    m = L.TwoOptimizers()
    dbg, trainer, truth = fit(m, tmp_path, batches=20, max_steps=40)
    assert truth.batches == 20
    assert trainer.global_step == 40  # Lightning counts each optimizer's step
    assert dbg.steps == 20  # the engine counts iterations: one step however many optimizers step in it
    assert summaries(dbg) == HEALTHY


@pytest.mark.parametrize(("make", "expected"), [(model, HEALTHY), (dead_model, DEAD)], ids=["healthy", "dead layer"])
def test_bf16_mixed_precision_gets_the_full_precision_diagnosis(make: Any, expected: Any, tmp_path: Any) -> None:
    m = make()
    dbg, trainer, _ = fit(m, tmp_path, precision="bf16-mixed")
    assert set(m.output_dtypes) == {torch.bfloat16}  # plain torch: the forward really ran under bf16 autocast
    assert dbg.steps == trainer.global_step == 60
    assert summaries(dbg) == expected


@pytest.mark.parametrize(("make", "expected"), [(model, HEALTHY), (dead_model, DEAD)], ids=["healthy", "dead layer"])
def test_fp16_mixed_precision_with_a_grad_scaler_gets_the_full_precision_diagnosis(make, expected, tmp_path) -> None:
    # Trainer(precision="16-mixed") on a CPU falls back to bf16-mixed; the plugin keeps fp16 and its GradScaler
    m = make()
    scaler = torch.amp.GradScaler("cpu")
    dbg, trainer, _ = fit(m, tmp_path, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    assert set(m.output_dtypes) == {torch.float16} and scaler.get_scale() >= 2.0**16  # the loss really was scaled
    assert dbg.steps == trainer.global_step == 60
    assert summaries(dbg) == expected


def test_steps_the_grad_scaler_skips_are_counted_and_not_reported_as_non_finite(tmp_path: Any) -> None:
    stepped: list[int] = []
    handle = register_optimizer_step_post_hook(lambda *_: stepped.append(1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)  # far too large: the first steps overflow
    try:
        dbg, trainer, _ = fit(model(), tmp_path, batches=40, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    finally:
        handle.remove()
    assert 0 < len(stepped) < 40 == trainer.global_step  # plain torch: the scaler skipped some optimizer steps
    assert dbg.steps == trainer.global_step
    assert summaries(dbg) == HEALTHY


# --- every exit -----------------------------------------------------------------------------------------------------


def test_an_exception_in_training_step_removes_every_hook_and_logs_the_verdict(tmp_path, hooks_before) -> None:
    m = model(fail_at=10)
    callback = NeuralDbgCallback()
    trainer = quiet_trainer(L.pl, tmp_path, max_steps=60, callbacks=[callback])
    with records_of(CONSOLE) as records, pytest.raises(RuntimeError, match="a bug in training_step"):
        trainer.fit(m, make_loader(60))
    assert forward_hooks(m) == 0 and len(_global_optimizer_pre_hooks) == hooks_before
    assert not callback.debugger.attached and callback.debugger.steps >= 10
    assert [r.getMessage().splitlines()[0] for r in records] == [callback.debugger.report().splitlines()[0]]


def test_a_keyboard_interrupt_removes_every_hook(tmp_path: Any, hooks_before: int) -> None:
    m = model(interrupt_at=10)
    callback = NeuralDbgCallback()
    trainer = quiet_trainer(L.pl, tmp_path, max_steps=60, callbacks=[callback])
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning shuts down gracefully, then exits
            trainer.fit(m, make_loader(60))
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores Ctrl+C from then on
    assert trainer.interrupted
    assert forward_hooks(m) == 0 and len(_global_optimizer_pre_hooks) == hooks_before
    assert not callback.debugger.attached


def test_after_fit_the_model_has_no_hooks_left(tmp_path: Any, hooks_before: int) -> None:
    m = model(manual=True)
    dbg, _, _ = fit(m, tmp_path, batches=5)
    assert forward_hooks(m) == 0 and len(_global_optimizer_pre_hooks) == hooks_before
    assert not dbg.attached and dbg.steps == 5


# --- the verdict in Lightning's logs --------------------------------------------------------------------------------


def test_the_verdict_goes_to_every_logger_of_the_trainer_and_to_the_console(tmp_path: Any) -> None:
    callback = NeuralDbgCallback()
    csv_logger = CSVLogger(tmp_path, name="run", version=0)
    trainer = quiet_trainer(L.pl, tmp_path, max_steps=30, callbacks=[callback], logger=csv_logger)
    with records_of(CONSOLE) as records:
        trainer.fit(dead_model(manual=True), make_loader(30))
    with open(tmp_path / "run" / "version_0" / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("neuraldbg/healthy")]
    assert rows == [{"neuraldbg/failures": "1.0", "neuraldbg/healthy": "0.0", "neuraldbg/steps": "30.0", "step": "30"}]
    assert [r.levelname for r in records] == ["WARNING"]
    assert records[0].getMessage() == callback.debugger.report()  # the full report: verdict line and explanation
    assert "dead_neurons at 'net.3' from step 0" in records[0].getMessage()


def test_a_healthy_verdict_is_one_info_line_and_log_false_logs_nothing(tmp_path: Any) -> None:
    with records_of(CONSOLE, logging.INFO) as records:
        for log in (True, False):
            callback = NeuralDbgCallback(log=log)
            trainer = quiet_trainer(L.pl, tmp_path, max_steps=10, callbacks=[callback])
            trainer.fit(model(manual=True), make_loader(10))
    assert [(r.levelname, r.getMessage()) for r in records] == [
        (
            "INFO",
            "NeuralDBG: healthy - no training failure in 10 observed steps of Classifier. Its loss was not judged: "
            "10 losses recorded, 64 needed to tell one that does not fall from one that has not started to.",
        )
    ]


# --- the pytorch_lightning import name ------------------------------------------------------------------------------


def test_the_callback_works_under_the_pytorch_lightning_import_name(tmp_path: Any) -> None:
    from neuraldbg.integrations.pytorch_lightning import NeuralDbgCallback as OldNameCallback

    old = kit("pytorch_lightning")
    assert issubclass(OldNameCallback, old.pl.Callback) and not issubclass(OldNameCallback, L.pl.Callback)
    torch.manual_seed(0)
    m = old.Classifier(manual=True)
    kill_relu(m)
    callback = OldNameCallback()
    trainer = quiet_trainer(old.pl, tmp_path, max_steps=30, callbacks=[callback])
    trainer.fit(m, make_loader(30))
    assert callback.debugger.steps == trainer.global_step == 30
    assert summaries(callback.debugger) == DEAD


# --- how the callback is made ---------------------------------------------------------------------------------------


def test_the_callback_is_a_lightning_callback_that_pickles_by_name() -> None:
    callback = NeuralDbgCallback(persistence=5)
    assert isinstance(callback, L.pl.Callback)
    copy = pickle.loads(pickle.dumps(callback))
    assert type(copy) is NeuralDbgCallback and copy.debugger is None


def test_engine_options_reach_the_debugger_it_creates(tmp_path: Any) -> None:
    dbg, _, _ = fit(model(manual=True), tmp_path, batches=5)
    assert dbg.config.persistence == 3
    callback = NeuralDbgCallback(preset="full", persistence=5)
    quiet_trainer(L.pl, tmp_path, max_steps=5, callbacks=[callback]).fit(model(manual=True), make_loader(5))
    assert (callback.debugger.config.persistence, callback.debugger.config.full_every) == (5, 1)


def test_a_misspelt_engine_option_fails_when_the_callback_is_made() -> None:
    with pytest.raises(
        ConfigError, match=r"NeuralDbgCallback\(\): unknown option 'persistance' \(did you mean 'persistence'\?\)"
    ):
        NeuralDbgCallback(persistance=5)


def test_a_debugger_and_engine_options_together_are_refused(neuraldbg: Any) -> None:
    with pytest.raises(ConfigError, match=r"got a debugger and engine options \(preset, persistence\)"):
        NeuralDbgCallback(neuraldbg(model()), preset="full", persistence=5)


def test_something_other_than_a_debugger_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"debugger must be a neuraldbg.NeuralDbg .*, got Classifier"):
        NeuralDbgCallback(model())


def test_a_debugger_for_another_model_fails_fit_naming_both(tmp_path: Any, neuraldbg: Any) -> None:
    other = torch.nn.Linear(2, 2)
    callback = NeuralDbgCallback(neuraldbg(other))
    trainer = quiet_trainer(L.pl, tmp_path, max_steps=5, callbacks=[callback])
    with pytest.raises(NeuralDbgError, match="the debugger watches a Linear, but the trainer trains a Classifier"):
        trainer.fit(model(), make_loader(5))


def test_a_debugger_already_attached_is_refused_with_the_way_out(tmp_path: Any, neuraldbg: Any) -> None:
    m = model()
    with neuraldbg(m) as ndbg:
        trainer = quiet_trainer(L.pl, tmp_path, max_steps=5, callbacks=[NeuralDbgCallback(ndbg)])
        with pytest.raises(NeuralDbgError, match=r"already attached \(inside a `with` block\?\)"):
            trainer.fit(m, make_loader(5))
