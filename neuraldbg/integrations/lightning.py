"""NeuralDBG for ``lightning.pytorch.Trainer`` (``import lightning``)::

    from neuraldbg.integrations.lightning import NeuralDbgCallback

    callback = NeuralDbgCallback()
    trainer = lightning.Trainer(max_steps=100, callbacks=[callback])
    trainer.fit(model, loader)
    print(callback.debugger.report())

``NeuralDbgCallback`` is built on first use (this module imports no Lightning) and raises
:class:`~neuraldbg.integrations.MissingExtraError` when ``lightning`` is not installed. For the older
``pytorch_lightning`` import name use :mod:`neuraldbg.integrations.pytorch_lightning`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["NeuralDbgCallback"]

if TYPE_CHECKING:  # built on first use, by __getattr__ below
    NeuralDbgCallback: Any


def __getattr__(name: str) -> Any:
    if name != "NeuralDbgCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ._lightning import callback_class

    cls = callback_class("lightning.pytorch", "pytest-neuraldbg[lightning]")
    cls.__module__ = __name__
    globals()[name] = cls  # built once; pickle finds it here
    return cls
