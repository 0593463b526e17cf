"""NeuralDBG for ``pytorch_lightning.Trainer`` (``import pytorch_lightning``)::

    from neuraldbg.integrations.pytorch_lightning import NeuralDbgCallback

    trainer = pytorch_lightning.Trainer(max_steps=100, callbacks=[NeuralDbgCallback()])

The same callback as :mod:`neuraldbg.integrations.lightning`, over ``pytorch_lightning.Callback`` (a Trainer of one
package expects callbacks of that package). Built on first use; raises
:class:`~neuraldbg.integrations.MissingExtraError` when ``pytorch_lightning`` is not installed.
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

    cls = callback_class("pytorch_lightning", "pytorch-lightning")
    cls.__module__ = __name__
    globals()[name] = cls
    return cls
