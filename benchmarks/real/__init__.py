"""A benchmark of real training programs, written as users write them, with a plain-torch ground truth.

    python -m benchmarks.real                     # every case under NeuralDBG, scored against the ground truth
    python -m benchmarks.real --ground-truth      # recompute the ground truth with plain torch, check it
    python -m benchmarks.real --help

``FINDINGS.md`` beside this file has the method, the commands and what it measured; ``truth.py`` how the
ground truth is decided; ``programs/`` one module per family.
"""
