"""Callbacks that watch training run by a framework's trainer, each a thin adapter over :class:`~neuraldbg.NeuralDbg`.

* :mod:`neuraldbg.integrations.lightning`: ``NeuralDbgCallback`` for ``lightning.pytorch.Trainer``
  (:mod:`neuraldbg.integrations.pytorch_lightning` for the ``pytorch_lightning`` import name);
* :mod:`neuraldbg.integrations.huggingface`: ``NeuralDbgTrainerCallback`` for ``transformers.Trainer``.

Importing ``neuraldbg`` or this package imports neither library; each callback imports its library when it is
first used and raises :class:`MissingExtraError` (an ``ImportError``) naming the extra to install when it is
absent.
"""

from __future__ import annotations

from .callback import MissingExtraError

__all__ = ["MissingExtraError"]
