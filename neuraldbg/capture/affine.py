"""Whether the whole model is one affine map: every node of its forward pass's autograd graph, from its output back
to its parameters and inputs, is linear in the data (a layer's matrix product or convolution with its own weight,
a sum, a reshape, a mean, batch norm, dropout's mask), so its layers compose into a single affine map however many
there are. An activation forgotten (``nn.Identity()`` where ``nn.ReLU()`` was meant, a ``forward`` that never calls
it) makes a model of this kind.

Read from the graph's node types and structure alone (no tensor value), on the first fully observed forward
passes, by :func:`affine_layers`: a walk of at most :data:`BUDGET` nodes that stops at the first node that is not
known to be linear in the data (an activation, a normalisation by a sample's own statistics, a product of two
data-dependent tensors as in attention or gating, a max-pool, any node it does not know). Unknown is never affine:
a compiled graph, a custom autograd function or a parametrised weight end the walk with no finding. What it counts
is the layers in series, the most met along one data path from the output down (the depth of the composition), not
the layers in the graph: layers that sit side by side, each reading the data, their outputs summed (DLinear's trend
and seasonal heads), compose nothing and are one linear model, as a single layer is.
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
#: Products that scale the data by a constant or a parameter (dropout's mask, a learnt scale).
_SCALING = frozenset({"MulBackward0", "DivBackward0"})
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
#: Reshaping nodes looked through from a product's operand to its parameter, at most.
_HOPS = 8
#: Nodes whose output is their input rearranged.
_RESHAPING = SHAPE_ONLY | {"TBackward0", "UnsafeSplitBackward0", "FlipBackward0", "RollBackward0", "RepeatBackward0"}


def _holds_data(branch: object) -> bool:
    """Whether a product's operand depends on the data: not a constant (no node), not a parameter (its
    ``AccumulateGrad``, seen through nodes that only reshape it, as a Linear's weight through its transpose)."""
    node = branch
    for _ in range(_HOPS):
        if node is None or type(node).__name__ == _PARAMETER:
            return False
        if type(node).__name__ not in _RESHAPING:
            return True
        inputs = getattr(node, "next_functions", ())
        node = inputs[0][0] if inputs else None
    return True


def affine_layers(root: object) -> int | None:
    """How many layers (matrix products and convolutions with their own weight) compose, one after the other, into
    the model's output whose graph node is ``root``: the most met along one data path, not how many the graph holds
    (layers side by side, each reading the data and summed, as DLinear's trend and seasonal heads, are one linear
    model: depth one). None when some node between the output and the parameters and inputs is not linear in the
    data (see the module docstring), or is unknown, or the graph is larger than :data:`BUDGET`."""
    if root is None:
        return None
    queue = [root]
    seen = {id(root): root}  # by id, each node held while the walk runs (see loss_graph.hold)
    below: dict[int, list[int]] = {}  # node -> the nodes it reads
    own: dict[int, int] = {}  # node -> 1 where it is a layer applying its weight
    while queue:
        node = queue.pop()
        if len(below) >= BUDGET:
            return None
        name = type(node).__name__
        own[id(node)], below[id(node)] = 0, []
        if name == _PARAMETER:
            continue
        inputs = [n for n, _ in getattr(node, "next_functions", ())]
        if name in _PRODUCTS:
            holding = [n for n in inputs if _holds_data(n)]
            if len(holding) > 1:
                return None  # a product of two data-dependent tensors (attention, gating): not linear
            # a weight applied to the data (or to the model's input, which holds no gradient)
            own[id(node)] = int(name in _LAYERS and any(n is not None and n not in holding for n in inputs))
        elif name not in _LINEAR and name not in _RESHAPING:
            return None
        below[id(node)] = [id(n) for n in inputs if n is not None]
        for n in inputs:
            if n is not None and id(n) not in seen:
                seen[id(n)] = n
                queue.append(n)
    return _depth(id(root), below, own)


def _depth(root: int, below: dict[int, list[int]], own: dict[int, int]) -> int:
    """The most layers (``own``) met along one path down the graph (``below``) from ``root``: a longest path, each
    node settled once the nodes it reads are (the graph is acyclic)."""
    depth: dict[int, int] = {}
    stack = [root]
    while stack:
        node = stack[-1]
        pending = [n for n in below[node] if n not in depth]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        depth[node] = own[node] + max((depth[n] for n in below[node]), default=0)
    return depth[root]


#: Nodes looked through from a layer's input down to the layer that produced it, at most.
_DESCENT = 64


def _data_inputs(node: object) -> list[object]:
    """The inputs of ``node`` that hold data (not a parameter, not a constant)."""
    return [n for n, _ in getattr(node, "next_functions", ()) if _holds_data(n)]


def _layer_node(output: object) -> object | None:
    """From the graph node of a layer's output, below the reshapes of its output, the product that applies its
    weight (None when another node comes first)."""
    node = output
    for _ in range(_DESCENT):
        name = type(node).__name__
        if name in _LAYERS:
            return node
        if name not in _RESHAPING and name not in _LINEAR:
            return None
        inputs = getattr(node, "next_functions", ())
        node = inputs[0][0] if inputs else None
        if node is None:
            return None
    return None


def _layer_input(output: object) -> object | None:
    """From the graph node of a layer's output, the node of the data its weight was applied to: its product's one
    data input (None when there is not exactly one)."""
    node = _layer_node(output)
    found = _data_inputs(node) if node is not None else []
    return found[0] if len(found) == 1 else None


def _spreads(output: object) -> bool:
    """Whether the layer whose output's graph node is ``output`` is a convolution whose kernel spans more than one
    position (a 3x3, not a 1x1): its weight's shape, read from the parameter below its product. A Linear, a 1x1
    convolution and a layer whose weight is not found read each position alone."""
    node = _layer_node(output)
    if node is None or type(node).__name__ != "ConvolutionBackward0":
        return False
    for branch, _ in getattr(node, "next_functions", ())[1:2]:  # (input, weight, bias)
        for _ in range(_HOPS):
            if branch is None or type(branch).__name__ == _PARAMETER:
                break
            inputs = getattr(branch, "next_functions", ())
            branch = inputs[0][0] if inputs and type(branch).__name__ in _RESHAPING else None
        weight = getattr(branch, "variable", None)
        return weight is not None and any(k > 1 for k in weight.shape[2:])
    return False


def composed_pairs(
    root: object, layer_of: dict[int, str], widths: dict[str, tuple[int, int, int]]
) -> list[tuple[str, str]]:
    """Pairs ``(lower, upper)`` of layers that apply a weight (``widths``: layer -> (inputs, outputs, groups), the
    Linear and convolution layers) where the output of ``lower`` reaches the input of ``upper`` alone, through
    nodes linear in the data along one data path (reshapes, dropout's mask, batch norm, a parameter added), so that
    the two compose into one linear map: an activation left out between them. ``layer_of``: graph node -> the layer
    whose output it is. Not a pair: a lower layer that narrows its input (a low-rank factorisation: a LoRA adapter,
    a linear bottleneck), or keeps its width for an upper layer that widens it (an inverted residual block's
    projection that keeps its channels, then the next block's expansion: MobileNetV3-small's first block, 16 -> 16
    -> 72), or that is grouped (a depthwise convolution before its pointwise one), two convolutions whose kernels
    both span positions (:func:`_spreads`: two 3x3 compose into a 5x5 neither computes alone, a factorisation, as a
    stem convolution feeding a convolution block directly), and a path whose values go elsewhere too (a stem's
    output into a residual stream, an input projection shared by experts): those are designs. Nothing when the
    graph holds more than :data:`BUDGET` nodes."""
    consumers: dict[int, int] = {}
    nodes, seen = [root], {id(root)}
    i = 0
    while i < len(nodes):
        if len(nodes) > BUDGET:
            return []
        for n, _ in getattr(nodes[i], "next_functions", ()):
            if n is not None:
                consumers[id(n)] = consumers.get(id(n), 0) + 1
                if id(n) not in seen:
                    seen.add(id(n))
                    nodes.append(n)
        i += 1
    pairs: list[tuple[str, str]] = []
    for node in nodes:
        upper = layer_of.get(id(node))
        if upper not in widths:
            continue
        lower, below = _producing_layer(_layer_input(node), layer_of, widths, consumers)
        if lower is not None and lower != upper:
            inputs, outputs, groups = widths[lower]
            _, widened, upper_groups = widths[upper]
            bottleneck = outputs < inputs or (outputs == inputs and widened > outputs)
            # two kernels that span positions compose into a wider one (two 3x3 into a 5x5): a factorisation
            factored = _spreads(below) and _spreads(node)
            if not bottleneck and not factored and groups == 1 and upper_groups == 1 and outputs > 1:
                pairs.append((lower, upper))
    return pairs


def _producing_layer(
    node: object | None, layer_of: dict[int, str], widths: dict[str, tuple[int, int, int]], consumers: dict[int, int]
) -> tuple[str | None, object | None]:
    """The weight layer whose output ``node`` is, or reaches through nodes linear in the data with one data input
    each and no other use, with its output's node; None when a node on the way is not linear, joins two data
    paths, is used elsewhere too, or no weight layer is met."""
    for _ in range(_DESCENT):
        if node is None or consumers.get(id(node), 0) > 1:
            return None, None
        name = layer_of.get(id(node))
        if name in widths:
            return name, node
        kind = type(node).__name__
        if kind not in _RESHAPING and kind not in _LINEAR and kind not in _SCALING:
            return None, None
        found = _data_inputs(node)
        if len(found) != 1:
            return None, None  # a residual sum or a concatenation of two data paths, or a leaf
        node = found[0]
    return None, None
