"""A Hugging Face BERT classifier trained to convergence under the Trainer is healthy: its loss is its output (the
model is given its labels), so only the loss itself says the fit converged, and a cross-entropy has converged long
before it is a hundredth of where it began (see ``neuraldbg.detectors.base.FitProgress``). Ground truth by plain
torch: the Trainer's logged loss falls from chance (log 2) to under 3 % of it, and a held-out set is classified
right; at the end the gradient of a key projection is one the vanishing rule calls small next to the classifier's
(it shrank with the fit)."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from neuraldbg.integrations.huggingface import NeuralDbgTrainerCallback  # noqa: E402

VOCAB = 200


class Tokens(torch.utils.data.Dataset):
    """Sequences of 24 tokens whose class is read off the first token; half padded at the end."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(5, VOCAB, (n, 24), generator=g)
        self.labels = (ids[:, 0] > VOCAB // 2).long()
        self.mask = torch.ones_like(ids)
        self.mask[: n // 2, 18:] = 0
        self.ids = ids.masked_fill(self.mask == 0, 0)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def test_a_bert_classifier_trained_to_convergence_under_the_trainer_is_healthy(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=2,
    )
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=16,
        max_steps=200,
        learning_rate=5e-4,
        warmup_steps=20,
        weight_decay=0.01,
        logging_steps=10,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    callback = NeuralDbgTrainerCallback()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(4000, 1), callbacks=[callback])
    with callback:
        trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    model.eval()
    held = Tokens(512, 99)
    with torch.no_grad():
        logits = model(input_ids=held.ids, attention_mask=held.mask).logits
    # plain torch: from chance to a converged, correct fit
    assert abs(logged[0] - math.log(2)) < 0.05
    assert max(logged[-3:]) < 0.03 * math.log(2)
    assert float((logits.argmax(1) == held.labels).float().mean()) > 0.98
    # ... whose inner gradients shrank with it: one more backward pass on a training batch
    model.train()
    batch = Tokens(16, 7)
    model.zero_grad()
    model(input_ids=batch.ids, attention_mask=batch.mask, labels=batch.labels).loss.backward()
    key = model.bert.encoder.layer[1].attention.self.key.weight.grad.norm()
    head = model.classifier.weight.grad.norm()
    dbg = callback.debugger
    assert key < dbg.config.vanishing_norm and key < dbg.config.vanishing_ratio * head
    assert dbg.hypotheses() == []
