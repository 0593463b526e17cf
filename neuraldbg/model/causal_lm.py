"""Whether the watched model is a Hugging Face causal language model, which shifts its labels by one position
itself when it computes its loss (``labels=input_ids`` is the documented call: position t is scored against
token t + 1 inside the model).

Read from the class name against ``transformers``' own registry of causal-LM classes, and only when
``transformers`` is already imported (a model of its classes cannot exist otherwise): NeuralDBG never imports it.
"""

from __future__ import annotations

import sys

from torch import nn


def shifts_labels(model: nn.Module) -> bool:
    """True when ``model`` is one of ``transformers``' causal-LM classes (``GPT2LMHeadModel``,
    ``LlamaForCausalLM``, ...) and not an encoder-decoder."""
    if "transformers" not in sys.modules:
        return False
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except Exception:  # an install without the auto classes: nothing can be said
        return False
    names = {n for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() for n in ((v,) if isinstance(v, str) else v)}
    config = getattr(model, "config", None)
    return type(model).__name__ in names and not getattr(config, "is_encoder_decoder", False)
