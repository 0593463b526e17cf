"""The capture path: what each hook records.

Hooks (registered by :mod:`neuraldbg.capture.hooks`): one global module forward hook, called for every module call in
the process (the watched model's modules are recognised by identity, so nothing is stored on the modules and a model can
be pickled, saved or deep-copied mid-run), the global optimizer step pre- and post-hooks, a tensor hook on the model's
output (the loss gradient; it also marks the start of the backward pass) and an end-of-backward callback.

Which forwards count. Records come only from the thread that attached the debugger and from forwards with
gradients enabled: a ``no_grad`` / ``inference_mode`` forward, or another thread serving predictions, never enters
a step's statistics. A forward pass *opens* at the first call of a watched module and closes when the model's own
forward returns (or when the backward pass or the optimizer step begins, for code that calls submodules directly).
A forward with the model in eval mode is training only if a backward pass follows: its records are staged and
kept when its output's gradient arrives, and dropped otherwise (a validation pass without ``no_grad``).

Cheap and full steps. On a cheap step a layer's output is only kept (a list append) and looked at if the step
turns out non-finite. On a fully observed step (see :mod:`neuraldbg.capture.schedule`) the statistics of
:mod:`neuraldbg.capture.measure` are computed in the layer's hook, before anything downstream can modify the output in
place.

torch.compile. Inside a compiled graph the hooks do tensor work only: each layer's statistics are packed into a
slot of a dictionary whose keys are fixed when the debugger attaches, so Dynamo traces them without a graph break
and without recompiling; the slots are read at the optimizer step, outside the graph.
"""
