"""The version of NeuralDBG (in a module of its own, so no module imports the package root for it)."""

__version__ = "0.1.0"
