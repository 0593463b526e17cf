"""Graph convolutional network (Kipf & Welling, as in the pygcn reference code) with a SPARSE adjacency.

Two GraphConvolution layers (``support = x @ W``; ``torch.sparse.mm(adj, support) + b``), ReLU, dropout 0.5,
``log_softmax`` and ``nll_loss`` on the training nodes only, full-batch Adam 0.01 with weight decay 5e-4. The
adjacency is the symmetrically normalised ``D^-1/2 (A + I) D^-1/2`` of a stochastic block model graph, held as a
``torch.sparse_coo_tensor``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .. import data
from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything


class GraphConvolution(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        stdv = 1.0 / math.sqrt(out_features)
        nn.init.uniform_(self.weight, -stdv, stdv)
        nn.init.uniform_(self.bias, -stdv, stdv)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        support = torch.mm(x, self.weight)
        output = torch.sparse.mm(adj, support) if adj.is_sparse else torch.mm(adj, support)
        return output + self.bias


class GCN(nn.Module):
    def __init__(self, nfeat: int, nhid: int, nclass: int, dropout: float) -> None:
        super().__init__()
        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.gc1(x, adj))
        x = F.dropout(x, self.dropout, training=self.training)
        x = self.gc2(x, adj)
        return F.log_softmax(x, dim=1)


def adjacency(edges: torch.Tensor, nodes: int, normalise: bool, sparse: bool) -> torch.Tensor:
    loops = torch.arange(nodes).repeat(2, 1)
    index = torch.cat([edges, loops], dim=1)
    values = torch.ones(index.size(1))
    if normalise:
        degree = torch.zeros(nodes).index_add_(0, index[0], values)
        inv_sqrt = degree.pow(-0.5)
        values = inv_sqrt[index[0]] * values * inv_sqrt[index[1]]
    adj = torch.sparse_coo_tensor(index, values, (nodes, nodes)).coalesce()
    return adj if sparse else adj.to_dense()


def train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    edges, features, labels = data.block_graph()
    nodes = len(labels)
    adj = adjacency(edges, nodes, hp.normalise, hp.sparse)
    if hp.sparse_features:  # bag-of-words node features are usually stored sparse as well
        features = features.to_sparse()
    idx_train, idx_test = torch.arange(0, 80), torch.arange(160, nodes)  # 80-159: validation
    if hp.train_split == "empty":  # a split selected by a condition no node meets (e.g. a mask from the wrong column)
        idx_train = idx_train[labels[idx_train] < 0]
    model = GCN(features.size(1), 16, int(labels.max()) + 1, dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    with session.watch(model):
        for _epoch in range(hp.epochs):
            model.train()
            optimizer.zero_grad()
            output = model(features, adj)
            if hp.masked_loss:  # the masked-mean form: per-node losses times a 0/1 mask, over the mask's size
                mask = torch.zeros(nodes)
                mask[idx_train] = 1.0
                per_node = F.nll_loss(output, labels, reduction="none")
                loss_train = (per_node * mask).sum() / mask.sum().clamp(min=1.0)
            else:
                loss_train = F.nll_loss(output[idx_train], labels[idx_train])
            loss_train.backward()
            optimizer.step()
            session.record(loss_train)
    model.eval()
    with torch.no_grad():
        output = model(features, adj)
        accuracy = float((output[idx_test].argmax(1) == labels[idx_test]).float().mean())
    return {"metric": accuracy}


PROGRAM = Program(
    family="graph",
    name="gcn",
    train=train,
    defaults=dict(
        lr=0.01,
        weight_decay=5e-4,
        epochs=100,
        sparse=True,
        normalise=True,
        train_split="first80",
        masked_loss=False,
        sparse_features=False,
    ),
    metric="held-out node accuracy",
    higher_is_better=True,
    floor=0.03,
    chance=0.25,
    functional_relu=("gc1",),
    variants=(
        healthy("2-layer GCN, torch.sparse.mm with the normalised adjacency, nll_loss on 80 nodes, Adam"),
        Variant(
            "empty_train_split",
            "masking",
            "the training index selects no node: nll_loss over an empty tensor (NaN)",
            {"train_split": "empty"},
            K.EMPTY_MASK_NAN,
        ),
        Variant(
            "empty_mask_masked_mean",
            "masking",
            "masked-mean loss over an all-zero mask: exactly zero gradient",
            {"train_split": "empty", "masked_loss": True},
            K.EMPTY_MASK_ZERO,
        ),
        Variant("dense_adjacency", "equivalent", "the same adjacency as a dense tensor", {"sparse": False}),
        Variant(
            "sparse_features", "equivalent", "the node features as a sparse COO tensor too", {"sparse_features": True}
        ),
        Variant(
            "unnormalised_adjacency",
            "data_normalisation",
            "A + I without the D^-1/2 normalisation",
            {"normalise": False},
            K.RAW_INPUTS,
        ),
        Variant("weight_decay_1", "regularisation", "Adam weight_decay 1.0", {"weight_decay": 1.0}, K.HUGE_DECAY),
    ),
)

PROGRAMS = (PROGRAM,)
