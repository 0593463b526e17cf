"""Normalisation-heavy vision models built from ``transformers`` configs, trained from scratch with a plain loop.

ViT (LayerNorm, patch 4), ConvNeXt (LayerNorm, depthwise convs, layer scale) and ResNet (BatchNorm) on 16x16
RGB images with 10 classes; ``model(pixel_values=..., labels=...)`` computes the loss; AdamW 1e-3, batch 64.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import image_split, loader, to_input


def build(arch: str):  # type: ignore[no-untyped-def]
    import transformers as tf

    if arch == "vit":
        config = tf.ViTConfig(
            image_size=16,
            patch_size=4,
            num_channels=3,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            num_labels=10,
        )
        return tf.ViTForImageClassification(config)
    if arch == "convnext":
        config = tf.ConvNextConfig(
            num_channels=3, patch_size=2, hidden_sizes=[32, 64], depths=[1, 1], num_stages=2, num_labels=10
        )
        return tf.ConvNextForImageClassification(config)
    config = tf.ResNetConfig(
        num_channels=3,
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="basic",
        downsample_in_first_stage=False,
        num_labels=10,
    )
    return tf.ResNetForImageClassification(config)


def train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    x_train, y_train, x_test, y_test = image_split(2048, 1024, channels=3)
    x_train, x_test = to_input(x_train, hp.raw_pixels), to_input(x_test, hp.raw_pixels)
    model = build(hp.arch)
    params = [p for n, p in model.named_parameters() if not (hp.left_out and n.startswith(hp.left_out))]
    optimizer = torch.optim.AdamW(params, lr=hp.lr, weight_decay=hp.weight_decay)
    batches = loader(x_train, y_train, 64)
    with session.watch(model):
        for _epoch in range(hp.epochs):
            if hp.eval_mode:
                model.eval()
            else:
                model.train()
            for pixel_values, labels in batches:
                optimizer.zero_grad()
                loss = model(pixel_values=pixel_values, labels=labels).loss
                loss.backward()
                optimizer.step()
                session.record(loss)
    model.eval()
    with torch.no_grad():
        pred = model(pixel_values=x_test).logits.argmax(-1)
    return {"metric": float((pred == y_test).float().mean())}


DEFAULTS = dict(lr=1e-3, epochs=3, weight_decay=0.01, raw_pixels=False, left_out=None, eval_mode=False)


def program(arch: str, name: str, description: str, *variants: Variant) -> Program:
    return Program(
        family="hf_vision",
        name=name,
        train=train,
        defaults={**DEFAULTS, "arch": arch},
        metric="held-out accuracy",
        higher_is_better=True,
        floor=0.03,
        chance=0.1,
        variants=(healthy(description), *variants),
    )


VIT = program(
    "vit",
    "tiny_vit",
    "ViTForImageClassification 2x64, patch 4, AdamW 1e-3",
    Variant("raw_pixels", "data_normalisation", "0-255 pixels, not normalised", {"raw_pixels": True}, K.RAW_INPUTS),
)
CONVNEXT = program(
    "convnext",
    "tiny_convnext",
    "ConvNextForImageClassification, 2 stages [32, 64], AdamW 1e-3",
    Variant(
        "classifier_not_in_optimizer",
        "optimizer_coverage",
        "the classifier head left out of the optimizer",
        {"left_out": "classifier"},
        K.LEFT_OUT,
        ("classifier",),
    ),
    Variant("lr_100x", "learning_rate", "AdamW lr 0.1", {"lr": 0.1}, K.LR_FAR_TOO_HIGH),
)
RESNET = program(
    "resnet",
    "tiny_resnet",
    "ResNetForImageClassification (basic blocks, BatchNorm), 2 stages [16, 32], AdamW 1e-3",
    Variant(
        "eval_mode",
        "mode",
        "trained in eval mode (BatchNorm on its running statistics)",
        {"eval_mode": True},
        K.EVAL_MODE,
    ),
)

PROGRAMS = (VIT, CONVNEXT, RESNET)
