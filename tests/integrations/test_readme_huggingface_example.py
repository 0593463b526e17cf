"""The README's Hugging Face Trainer example: a complete test file, run by the suite as it is printed there."""

import pytest
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from neuraldbg.integrations.huggingface import NeuralDbgTrainerCallback
from pytest_neuraldbg import assert_healthy, assert_parameters_update


class Counting(Dataset):
    """Token sequences that count up: next-token prediction a tiny model learns in tens of steps."""

    def __init__(self, n=640, vocab=64, length=12):
        start = torch.randint(0, vocab, (n, 1), generator=torch.Generator().manual_seed(0))
        self.ids = (start + torch.arange(length)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_model():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_embd=64, n_layer=2, n_head=2, n_positions=12, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)  # from a config: nothing is downloaded


def train(model, callback, tmp_path, optimizer=None, **options):
    options = {"max_steps": 40, "learning_rate": 1e-3, **options}
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=16,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        **options,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=Counting(), callbacks=[callback], optimizers=(optimizer, None)
    )
    trainer.train()
    return trainer


def test_the_language_model_trains_healthily(neuraldbg, tmp_path):
    model = make_model()
    ndbg = neuraldbg(model)  # the fixture's debugger: in the test's reports, gate and baseline
    train(model, NeuralDbgTrainerCallback(ndbg), tmp_path)
    assert_healthy(ndbg)


def test_accumulation_and_clipping_keep_it_healthy(neuraldbg, tmp_path):
    model = make_model()
    ndbg = neuraldbg(model)
    options = {"max_steps": 10, "gradient_accumulation_steps": 4, "max_grad_norm": 0.5}
    trainer = train(model, NeuralDbgTrainerCallback(ndbg), tmp_path, **options)
    assert ndbg.steps == trainer.state.global_step == 10  # optimizer steps, as the Trainer counts them
    assert_healthy(ndbg)


def test_a_layer_left_out_of_the_optimizer_is_caught(neuraldbg, tmp_path):
    model = make_model()
    ndbg = neuraldbg(model)
    params = [p for name, p in model.named_parameters() if not name.startswith("transformer.ln_f")]
    train(model, NeuralDbgTrainerCallback(ndbg), tmp_path, optimizer=torch.optim.AdamW(params, lr=1e-3))
    with pytest.raises(AssertionError, match=r"frozen_parameters at 'transformer\.ln_f' from step 0"):
        assert_parameters_update(ndbg)
