"""Whether the whole model is one affine map: every node of its forward pass's autograd graph, from its output back
to its parameters and inputs, is linear in the data (a layer's matrix product or convolution with its own weight,
a sum, a reshape, a mean, batch norm, dropout's mask), so its layers compose into a single affine map however many
there are. An activation forgotten (``nn.Identity()`` where ``nn.ReLU()`` was meant, a ``forward`` that never calls
it) makes a model of this kind.

Read from the graph's node types and structure alone (no tensor value), on the first fully observed forward
passes, by :func:`affine_layers`: a walk of at most :data:`BUDGET` nodes that stops at the first node that is not
known to be linear in the data (an activation, a normalisation by a sample's own statistics, a product of two
data-dependent tensors as in attention or gating, a max-pool, any node it does not know). Unknown is never affine:
a compiled graph, a custom autograd function or a parametrised weight end the walk with no finding.
"""

from __future__ import annotations

from .loss_graph import SHAPE_ONLY

#: Graph nodes looked at, at most (a model of many layers needs more; the walk then says nothing).
BUDGET = 2048
#: Products: linear in the data when one operand holds it and the others are parameters or constants.
_PRODUCTS = frozenset(
    {
        "AddmmBackward0",
        "MmBackward0",
        "MvBackward0",
        "BmmBackward0",
        "ConvolutionBackward0",
        "MulBackward0",
        "DivBackward0",
    }
)
#: Products that are a layer applying its weight (counted as the affine map's layers).
_LAYERS = frozenset({"AddmmBackward0", "MmBackward0", "MvBackward0", "BmmBackward0", "ConvolutionBackward0"})
#: Nodes linear in each of their inputs: sums, reductions by averaging or summing, pooling by averaging, batch norm
#: (a per-feature affine map of each sample, given its batch), dropout's mask, concatenation and slicing.
_LINEAR = frozenset(
    {
        "AddBackward0",
        "AddBackward1",
        "SubBackward0",
        "SubBackward1",
        "NegBackward0",
        "MulBackward1",
        "DivBackward1",
        "SumBackward0",
        "SumBackward1",
        "MeanBackward0",
        "MeanBackward1",
        "AvgPool1DBackward0",
        "AvgPool2DBackward0",
        "AvgPool3DBackward0",
        "AdaptiveAvgPool2DBackward0",
        "AdaptiveAvgPool3DBackward0",
        "NativeBatchNormBackward0",
        "CudnnBatchNormBackward0",
        "NativeDropoutBackward0",
        "CatBackward0",
        "StackBackward0",
        "SplitBackward0",
        "SplitWithSizesBackward0",
        "UnbindBackward0",
        "ConstantPadNdBackward0",
        "IndexBackward0",
        "GatherBackward0",
        "EmbeddingBackward0",
    }
)
_PARAMETER = "AccumulateGrad"
#: Nodes whose output is their input rearranged.
_RESHAPING = SHAPE_ONLY | {"TBackward0", "UnsafeSplitBackward0", "FlipBackward0", "RollBackward0", "RepeatBackward0"}


def _holds_data(branch: object) -> bool:
    """Whether a product's operand depends on the data: not a constant (no node), not a parameter (its
    ``AccumulateGrad``, seen through nodes that only reshape it, as a Linear's weight through its transpose)."""
    node = branch
    for _ in range(8):
        if node is None or type(node).__name__ == _PARAMETER:
            return False
        if type(node).__name__ not in _RESHAPING:
            return True
        inputs = getattr(node, "next_functions", ())
        node = inputs[0][0] if inputs else None
    return True


def affine_layers(root: object) -> int | None:
    """How many layers (matrix products and convolutions with their own weight) compose the model's output whose
    graph node is ``root``, when every node between it and the parameters and inputs is linear in the data (see the
    module docstring); None when some node is not, or is unknown, or the graph is larger than :data:`BUDGET`."""
    if root is None:
        return None
    queue = [root]
    seen = {id(root)}
    layers = 0
    looked = 0
    while queue:
        node = queue.pop()
        looked += 1
        if looked > BUDGET:
            return None
        name = type(node).__name__
        if name == _PARAMETER:
            continue
        inputs = [n for n, _ in getattr(node, "next_functions", ())]
        if name in _PRODUCTS:
            holding = [n for n in inputs if _holds_data(n)]
            if len(holding) > 1:
                return None  # a product of two data-dependent tensors (attention, gating): not linear
            if name in _LAYERS and any(n is not None and n not in holding for n in inputs):
                layers += 1  # a weight applied to the data (or to the model's input, which holds no gradient)
        elif name not in _LINEAR and name not in _RESHAPING:
            return None
        for n in inputs:
            if n is not None and id(n) not in seen:
                seen.add(id(n))
                queue.append(n)
    return layers
