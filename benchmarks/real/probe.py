"""Plain-torch evidence for the ground truth, recorded with torch's own hooks (no NeuralDBG code).

What it records over a run, for the models a program trains:

* the gradient norm of every layer (its parameters' ``.grad`` as accumulated by each backward pass, before any
  clipping: a post-accumulate-grad hook), summarised as first / median / max / last and the median of the last
  quarter of the run (``tail``), and whether any gradient held a NaN or an infinity;
* for every ReLU-family module, and every module whose output the program passes to ``F.relu`` (the program
  names them), the fraction of its units (channels of a 4-d output, else the last dimension) that were
  positive on no sample of any training forward pass, over the whole run and over its last quarter (units that
  died on the way);
* for every hidden tanh / sigmoid / hardtanh module (not the one whose output is the model's), the fraction of
  its outputs where its derivative is below 1% of its maximum, median over the last quarter of the run;
* the parameters with ``requires_grad`` whose value never changed between the start and the end of the run, and
  the largest gradient norm each parameter got.

The hooks read tensors under ``no_grad``, change nothing and consume no random numbers, so a probed run is the
same run as a plain one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

RELU_FAMILY = (nn.ReLU, nn.ReLU6, nn.LeakyReLU)
BOUNDED = (nn.Tanh, nn.Sigmoid, nn.Hardtanh)


def _layer_of(param_name: str) -> str:
    return param_name.rpartition(".")[0]


class Probe:
    def __init__(self, models: Sequence[nn.Module], relu_inputs: Sequence[str] = ()) -> None:
        self._handles: list[Any] = []
        self._start: dict[str, torch.Tensor] = {}
        self._params: dict[str, nn.Parameter] = {}
        self._norms: dict[str, list[float]] = defaultdict(list)  # parameter -> its norm after each backward
        self.nonfinite_grad = False
        self._positive: dict[str, list[torch.Tensor]] = defaultdict(list)  # module -> per call: units positive
        self._saturated: dict[str, list[float]] = defaultdict(list)  # bounded module -> per call: fraction saturated
        self._last_called: dict[int, str] = {}  # model index -> the module that returned last in its forward
        self._final: set[str] = set()  # modules that produced a model's output (not hidden)
        for index, model in enumerate(models):
            prefix = f"{index}:" if len(models) > 1 else ""
            for name, param in model.named_parameters():
                if param.requires_grad:
                    full = prefix + name
                    self._params[full] = param
                    self._start[full] = param.detach().clone()
                    self._handles.append(param.register_post_accumulate_grad_hook(self._grad_hook(full)))
            for name, module in model.named_modules():
                if isinstance(module, RELU_FAMILY) or name in relu_inputs:
                    self._handles.append(module.register_forward_hook(self._relu_hook(prefix + name)))
                if isinstance(module, BOUNDED):
                    self._handles.append(module.register_forward_hook(self._bounded_hook(prefix + name)))
                self._handles.append(module.register_forward_hook(self._order_hook(index, prefix + name)))

    def _grad_hook(self, name: str) -> Any:
        def hook(param: torch.Tensor) -> None:
            with torch.no_grad():
                grad = param.grad
                if grad is None:
                    return
                if grad.is_sparse:
                    grad = grad.coalesce().values()
                norm = float(grad.float().norm())
            if norm != norm or norm in (float("inf"), float("-inf")):
                self.nonfinite_grad = True
            self._norms[name].append(norm)

        return hook

    def _relu_hook(self, name: str) -> Any:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not torch.is_grad_enabled() or not isinstance(output, torch.Tensor) or output.dim() < 2:
                return
            with torch.no_grad():
                dims = [d for d in range(output.dim()) if d != (1 if output.dim() == 4 else output.dim() - 1)]
                positive = (output > 0).any(dim=dims[0]) if len(dims) == 1 else (output > 0).amax(dim=dims) > 0
                self._positive[name].append(positive.reshape(-1).clone())

        return hook

    def _bounded_hook(self, name: str) -> Any:
        """The fraction of a tanh/sigmoid/hardtanh output where its derivative is below 1% of its maximum."""

        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not torch.is_grad_enabled() or not isinstance(output, torch.Tensor) or output.numel() == 0:
                return
            with torch.no_grad():
                y = output.float()
                if isinstance(module, nn.Sigmoid):
                    flat = y * (1 - y) < 0.01 * 0.25
                elif isinstance(module, nn.Tanh):
                    flat = 1 - y * y < 0.01
                else:
                    flat = (y <= module.min_val) | (y >= module.max_val)
                self._saturated[name].append(float(flat.float().mean()))

        return hook

    def _order_hook(self, index: int, name: str) -> Any:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if name.endswith(":") or name == "":  # the model itself returned: its last module made the output
                if index in self._last_called:
                    self._final.add(self._last_called.pop(index))
            else:
                self._last_called[index] = name

        return hook

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def summary(self) -> dict[str, Any]:
        layers: dict[str, list[list[float]]] = defaultdict(list)
        for name, series in self._norms.items():
            layers[_layer_of(name)].append(series)
        grads = {}
        for layer, series_list in sorted(layers.items()):
            # the layer's norm per backward pass: the root of the sum of its parameters' squared norms
            length = min(len(s) for s in series_list)
            per_pass = [sum(s[i] ** 2 for s in series_list) ** 0.5 for i in range(length)]
            if per_pass:
                grads[layer or "(root)"] = {
                    "first": per_pass[0],
                    "median": statistics.median(per_pass),
                    "max": max(per_pass),
                    "last": per_pass[-1],
                    "tail": statistics.median(per_pass[-_tail(len(per_pass)) :]),
                }
        frozen = sorted(name for name, param in self._params.items() if torch.equal(param.detach(), self._start[name]))
        never_positive, dead_at_end = {}, {}
        for name, calls in sorted(self._positive.items()):
            calls = [c for c in calls if c.shape == calls[-1].shape]
            never_positive[name] = _silent(calls)
            dead_at_end[name] = _silent(calls[-_tail(len(calls)) :])
        saturated = {
            name: statistics.median(fractions[-_tail(len(fractions)) :])
            for name, fractions in sorted(self._saturated.items())
            if name not in self._final
        }
        param_grad_max = {name: max(series) if series else 0.0 for name, series in self._norms.items()}
        for name in self._params:
            param_grad_max.setdefault(name, 0.0)  # never got a gradient
        nonfinite_param = any(not torch.isfinite(p.detach()).all() for p in self._params.values())
        return {
            "grad_norms": grads,
            "nonfinite_grad": self.nonfinite_grad,
            "nonfinite_param": bool(nonfinite_param),
            "frozen": frozen,
            "param_grad_max": param_grad_max,
            "never_positive": never_positive,
            "dead_at_end": dead_at_end,
            "saturated": saturated,
        }


def _tail(n: int) -> int:
    """The last quarter of a run's readings (at least one)."""
    return max(1, n // 4)


def _silent(calls: list[torch.Tensor]) -> float:
    """The fraction of units positive on no sample of any of these forward calls."""
    alive = torch.stack(calls).any(dim=0)
    return float(1.0 - alive.float().mean())
