"""NeuralDbgTrainerCallback under ``transformers.Trainer.train``: tiny BERT and GPT-2 from configs, tens of steps.

Each fault is confirmed with plain torch in the test (:mod:`hf_support`): weights that really move or never move,
labels that really hold a NaN, clipping that really clips, micro-batches that really accumulate.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from framework_support import records_of, summaries
from torch.optim.optimizer import _global_optimizer_pre_hooks

from neuraldbg import ConfigError, NeuralDbgError

pytest.importorskip("transformers")
from hf_support import Tokens, Truth, bert_classifier, gpt2_lm, gpt2_regressor, logged, train
from transformers import TrainerCallback

from neuraldbg.integrations.huggingface import NeuralDbgTrainerCallback

CONSOLE = "transformers.integrations.neuraldbg"  # where the callback writes its verdict line
HEALTHY: list[tuple[str, str, int]] = []


def run(model: Any, data: Any, tmp_path: Any, *, optimizer: Any = None, **options: Any) -> tuple[Any, Any, Truth]:
    """Train with the callback and a plain-torch Truth; returns (debugger, trainer, truth)."""
    callback, truth = NeuralDbgTrainerCallback(), Truth()
    with callback:
        trainer = train(model, data, tmp_path, truth, callback, optimizer=optimizer, **options)
    return callback.debugger, trainer, truth


def without_ln_f(model: Any) -> Any:
    """A user-supplied AdamW that leaves out the final LayerNorm."""
    return torch.optim.AdamW([p for n, p in model.named_parameters() if not n.startswith("transformer.ln_f")], lr=1e-3)


@pytest.fixture
def hooks_before() -> Iterator[int]:
    yield len(_global_optimizer_pre_hooks)


def forward_hooks(module: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


# --- healthy models -------------------------------------------------------------------------------------------------


def test_a_tiny_bert_classifier_trains_healthily(tmp_path: Any) -> None:
    model = bert_classifier()
    dbg, trainer, truth = run(model, Tokens("class"), tmp_path)
    # plain torch: every weight moves at every step, the attention's query and key too, and the loss falls
    assert truth.every_parameter_moved_at_every_step(model)
    losses = logged(trainer, "loss")
    assert losses[-1] < 0.8 * losses[0]
    assert dbg.steps == trainer.state.global_step == 40
    assert summaries(dbg) == HEALTHY


def test_a_tiny_gpt2_language_model_trains_healthily(tmp_path: Any) -> None:
    model = gpt2_lm()
    dbg, trainer, truth = run(model, Tokens("lm"), tmp_path)
    assert truth.every_parameter_moved_at_every_step(model)
    losses = logged(trainer, "loss")
    assert losses[-1] < 0.8 * losses[0]
    assert dbg.steps == trainer.state.global_step == 40
    assert summaries(dbg) == HEALTHY
    assert dbg.layers[:3] == ["transformer.wte", "transformer.wpe", "transformer.drop"]  # the model's own names


# --- faults ---------------------------------------------------------------------------------------------------------


def test_a_classifier_left_out_of_a_user_supplied_optimizer_is_diagnosed_as_frozen(tmp_path: Any) -> None:
    model = bert_classifier()
    optimizer = torch.optim.AdamW(model.bert.parameters(), lr=1e-3)
    dbg, _, truth = run(model, Tokens("class"), tmp_path, optimizer=optimizer)
    assert truth.parameters_that_never_moved(model) == {"classifier.weight", "classifier.bias"}
    assert summaries(dbg)[0] == ("frozen_parameters", "classifier", 0)
    assert [kind for kind, _, _ in summaries(dbg)].count("frozen_parameters") == 1


def test_a_nan_label_is_diagnosed_as_a_data_problem_at_the_trainers_step_number(tmp_path: Any) -> None:
    dbg, trainer, truth = run(gpt2_regressor(), Tokens("regression", nan_at=300), tmp_path)
    step = truth.nan_at_global_step[0]  # plain torch: the Trainer's shuffled batch that carried sample 300
    assert truth.nan_at_global_step == [step] and 0 < step < 40
    assert summaries(dbg) == [("non_finite", "", step)]
    assert "data problem" in dbg.explain_failure()[0]
    assert dbg.steps == trainer.state.global_step == 40


# --- how the Trainer trains -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("optimizer", "expected"),
    [(None, HEALTHY), (without_ln_f, [("frozen_parameters", "transformer.ln_f", 0)])],
    ids=["healthy", "ln_f left out"],
)
def test_gradient_accumulation_and_max_grad_norm_do_not_change_the_diagnosis(optimizer, expected, tmp_path) -> None:
    def model_and_optimizer() -> tuple[Any, Any]:
        model = gpt2_lm()
        return model, optimizer(model) if optimizer else None

    model, opt = model_and_optimizer()
    plain, _, _ = run(model, Tokens("lm"), tmp_path, optimizer=opt, max_steps=10)
    model, opt = model_and_optimizer()
    dbg, trainer, truth = run(
        model, Tokens("lm"), tmp_path, optimizer=opt, max_steps=10, gradient_accumulation_steps=4, max_grad_norm=0.05
    )
    # plain torch: four forwards per optimizer step; clip_grad_norm_ found norms above 0.05 and cut them to 0.05
    assert truth.forwards == 40 and len(truth.steps) == 10
    assert min(logged(trainer, "grad_norm")) > 0.05 and max(s.grad_norm for s in truth.steps) <= 0.05 * 1.001
    assert dbg.steps == trainer.state.global_step == plain.steps == 10
    assert summaries(dbg) == summaries(plain) == expected


def test_bf16_mixed_precision_gets_the_full_precision_diagnosis(tmp_path: Any) -> None:
    model = gpt2_lm()
    dbg, trainer, truth = run(model, Tokens("lm"), tmp_path, bf16=True)
    assert truth.autocast == {torch.bfloat16}  # plain torch: the forward really ran under bf16 autocast
    assert truth.every_parameter_moved_at_every_step(model)
    assert dbg.steps == trainer.state.global_step == 40
    assert summaries(dbg) == HEALTHY


def test_a_with_block_around_train_gives_the_callbacks_diagnosis(tmp_path: Any, neuraldbg: Any) -> None:
    data = Tokens("regression", nan_at=300)
    with_callback, _, _ = run(gpt2_regressor(), data, tmp_path)
    model = gpt2_regressor()
    with neuraldbg(model) as ndbg:
        train(model, data, tmp_path)
    assert summaries(ndbg) == summaries(with_callback)
    assert summaries(ndbg)[0][0] == "non_finite" and ndbg.steps == with_callback.steps == 40


# --- every exit -----------------------------------------------------------------------------------------------------


class FailAt(TrainerCallback):
    """Raises from inside the training loop when the Trainer reaches ``step``."""

    def __init__(self, step: int, error: BaseException) -> None:
        self.step, self.error = step, error

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise self.error


@pytest.mark.parametrize("error", [RuntimeError("a bug in the loop"), KeyboardInterrupt()], ids=repr)
def test_the_with_block_removes_every_hook_when_train_raises(error: BaseException, tmp_path, hooks_before) -> None:
    model = gpt2_lm()
    callback = NeuralDbgTrainerCallback()
    with pytest.raises(type(error)), callback:
        train(model, Tokens("lm"), tmp_path, callback, FailAt(5, error))
    assert forward_hooks(model) == 0 and len(_global_optimizer_pre_hooks) == hooks_before
    assert not callback.debugger.attached and callback.debugger.steps == 5


def test_without_the_with_block_close_removes_the_hooks_and_a_new_train_continues(tmp_path, hooks_before) -> None:
    model = gpt2_lm()
    callback = NeuralDbgTrainerCallback()
    with pytest.raises(RuntimeError):
        train(model, Tokens("lm"), tmp_path, callback, FailAt(5, RuntimeError("a bug in the loop")))
    assert callback.debugger.attached  # the Trainer calls no callback when train() raises
    train(model, Tokens("lm"), tmp_path, callback, max_steps=5)  # a retry with the same callback attaches again
    assert not callback.debugger.attached and callback.debugger.steps == 10
    callback.close()  # nothing left to close: safe
    assert forward_hooks(model) == 0 and len(_global_optimizer_pre_hooks) == hooks_before


# --- the verdict in the Trainer's logs ------------------------------------------------------------------------------


def test_the_verdict_goes_to_the_log_history_and_to_transformers_log(tmp_path: Any) -> None:
    callback = NeuralDbgTrainerCallback()
    with records_of(CONSOLE) as records:
        trainer = train(gpt2_regressor(), Tokens("regression", nan_at=300), tmp_path, callback)
    assert trainer.state.log_history[-1] == {
        "neuraldbg/healthy": 0.0,
        "neuraldbg/failures": 1.0,
        "neuraldbg/steps": 40.0,
        "step": 40,
    }
    assert [r.levelname for r in records] == ["WARNING"]
    assert records[0].getMessage() == callback.debugger.report()
    assert "non_finite at the input batch from step" in records[0].getMessage()


def test_a_healthy_verdict_is_one_info_line_and_log_false_logs_nothing(tmp_path: Any) -> None:
    histories = []
    with records_of(CONSOLE, logging.INFO) as records:
        for log in (True, False):
            trainer = train(gpt2_lm(), Tokens("lm"), tmp_path, NeuralDbgTrainerCallback(log=log), max_steps=5)
            histories.append(trainer.state.log_history[-1])
    assert [(r.levelname, r.getMessage()) for r in records] == [
        (
            "INFO",
            "NeuralDBG: healthy - no training failure in 5 observed steps of GPT2LMHeadModel. Its loss was not judged: "
            "5 losses recorded, 64 needed to tell one that does not fall from one that has not started to.",
        )
    ]
    assert histories[0] == {"neuraldbg/healthy": 1.0, "neuraldbg/failures": 0.0, "neuraldbg/steps": 5.0, "step": 5}
    assert "neuraldbg/healthy" not in histories[1]


# --- how the callback is made ---------------------------------------------------------------------------------------


def test_the_callback_is_a_trainer_callback_that_pickles_by_name() -> None:
    callback = NeuralDbgTrainerCallback(persistence=5)
    assert isinstance(callback, TrainerCallback)
    copy = pickle.loads(pickle.dumps(callback))
    assert type(copy) is NeuralDbgTrainerCallback and copy.debugger is None


def test_a_misspelt_engine_option_fails_when_the_callback_is_made() -> None:
    with pytest.raises(
        ConfigError,
        match=r"NeuralDbgTrainerCallback\(\): unknown option 'persistance' \(did you mean 'persistence'\?\)",
    ):
        NeuralDbgTrainerCallback(persistance=5)


def test_a_debugger_for_another_model_fails_train_naming_both(tmp_path: Any, neuraldbg: Any) -> None:
    other = gpt2_lm()
    callback = NeuralDbgTrainerCallback(neuraldbg(other))
    with pytest.raises(NeuralDbgError, match="the debugger watches a GPT2LMHeadModel, but the trainer trains a Bert"):
        train(bert_classifier(), Tokens("class"), tmp_path, callback, max_steps=2)
