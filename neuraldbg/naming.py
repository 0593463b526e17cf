"""The names NeuralDBG shows: the user's qualified module and parameter names.

Every place that walks a model (layer descriptions, the forward hook's module map, the parameter list) goes
through :func:`named_modules` and :func:`named_parameters`, so a name means the same module everywhere: in
events, explanations, Mermaid graphs, traces and baselines.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn


def user_name(name: str) -> str:
    """The name a user knows a module or parameter by."""
    return name


def named_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``model.named_modules()`` under user names (the model itself is ``""``)."""
    for name, module in model.named_modules():
        yield user_name(name), module


def named_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """``model.named_parameters()`` under user names (a shared parameter once, under its first name)."""
    for name, param in model.named_parameters():
        yield user_name(name), param
