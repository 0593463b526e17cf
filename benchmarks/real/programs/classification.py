"""Image classification: an MLP and a CNN on 16x16 digit-like images (the shape of pytorch/examples' mnist).

The MLP is an ``nn.Sequential`` trained with Adam and cross-entropy; the CNN is the examples' two-conv net with
BatchNorm and Dropout, ``F.relu`` in ``forward``, ``log_softmax`` + ``nll_loss``, Adadelta and a StepLR.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from .. import kinds as K
from ..core import Program, Session, Variant, healthy, seed_everything
from ._common import accuracy, image_split, loader, to_input

FAMILY = "image_classification"

#: The data-order fault of both programs: the training set as stored, one class after another, and the DataLoader's
#: shuffle left False.
SORTED_UNSHUFFLED = Variant(
    "sorted_unshuffled",
    "data_order",
    "the training set sorted by class and DataLoader(shuffle=False)",
    {"order": "sorted"},
    K.UNSHUFFLED,
)


def training_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, order: str) -> DataLoader:
    """The training loader: shuffled (``order`` "shuffled"), or the set sorted by class and read in that order."""
    if order == "sorted":
        by_class = torch.argsort(y, stable=True)
        return loader(x[by_class], y[by_class], batch_size, shuffle=False)
    return loader(x, y, batch_size)


# --- the MLP ---------------------------------------------------------------------------------------------


def mlp_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    x_train, y_train, x_test, y_test = image_split(2048, 1024)
    if hp.labels == "shuffled":  # labels taken apart from their images (a wrong index into the label array)
        y_train = y_train[torch.randperm(len(y_train), generator=torch.Generator().manual_seed(7))]
    x_train, x_test = to_input(x_train, hp.raw_pixels), to_input(x_test, hp.raw_pixels)
    activation = {"relu": nn.ReLU, "identity": nn.Identity, "tanh": nn.Tanh}[hp.activation]
    outputs = 1 if hp.loss == "mse_index" else 10
    layers: list[nn.Module] = [
        nn.Flatten(),
        nn.Linear(256, 128),
        activation(),
        nn.Dropout(hp.dropout),
        nn.Linear(128, 64),
        activation(),
        nn.Linear(64, outputs),
    ]
    if hp.relu_on_logits:
        layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    if hp.first_bias is not None:
        with torch.no_grad():
            model[1].bias.fill_(hp.first_bias)
    if hp.init_value is not None:  # nn.init.constant_ on every weight matrix (the biases keep their random start)
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.constant_(module.weight, hp.init_value)
    optimizer = torch.optim.Adam(model.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    batches = training_batches(x_train, y_train, hp.batch_size, hp.order)

    def criterion(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if hp.loss == "softmax_ce":  # softmax in the model's head, then CrossEntropyLoss (which softmaxes again)
            return F.cross_entropy(torch.softmax(out, dim=1), y)
        if hp.loss == "mse_index":  # regress the class index
            return F.mse_loss(out.squeeze(1), y.float())
        return F.cross_entropy(out, y)

    with session.watch(model):
        for _epoch in range(hp.epochs):
            for x, y in batches:
                if hp.zero_grad:
                    optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                if hp.clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), hp.clip)
                optimizer.step()
                session.record(loss)

    def predict(out: torch.Tensor) -> torch.Tensor:
        if hp.loss == "mse_index":
            return out.squeeze(1).round().clamp(0, 9).long()
        return out.argmax(dim=1)

    return {"metric": accuracy(model, x_test, y_test, predict)}


MLP_DEFAULTS = dict(
    lr=1e-3,
    batch_size=64,
    epochs=3,
    weight_decay=0.0,
    zero_grad=True,
    labels="true",
    loss="ce",
    raw_pixels=False,
    activation="relu",
    dropout=0.2,
    relu_on_logits=False,
    first_bias=None,
    clip=None,
    init_value=None,
    order="shuffled",
)

MLP = Program(
    family=FAMILY,
    name="mlp",
    train=mlp_train,
    defaults=MLP_DEFAULTS,
    metric="accuracy",
    higher_is_better=True,
    floor=0.03,
    chance=0.1,
    variants=(
        healthy("Flatten-Linear-ReLU-Dropout-Linear-ReLU-Linear, Adam 1e-3, batch 64, 3 epochs"),
        Variant("lr_100x", "learning_rate", "Adam lr 0.1", {"lr": 0.1}, K.LR_FAR_TOO_HIGH),
        Variant("batch_8", "batch_size", "batch size 8 instead of 64", {"batch_size": 8}, K.CAPACITY),
        Variant(
            "no_batching", "batch_size", "the whole set as one batch (3 steps)", {"batch_size": 2048}, K.LR_TOO_LOW
        ),
        Variant("no_zero_grad", "zero_grad", "optimizer.zero_grad() missing", {"zero_grad": False}, K.NO_ZERO_GRAD),
        Variant(
            "labels_shuffled", "labels", "labels permuted apart from the images", {"labels": "shuffled"}, K.WRONG_LABELS
        ),
        Variant(
            "softmax_before_ce",
            "loss_function",
            "softmax on the logits before CrossEntropyLoss",
            {"loss": "softmax_ce"},
            K.SOFTMAX_BEFORE_CE,
        ),
        Variant(
            "mse_on_class_index",
            "loss_function",
            "one output regressed on the class index with MSE",
            {"loss": "mse_index"},
            K.MSE_ON_CLASS_INDEX,
        ),
        Variant(
            "raw_pixels",
            "data_normalisation",
            "0-255 pixels fed without ToTensor/Normalize",
            {"raw_pixels": True},
            K.RAW_INPUTS,
        ),
        Variant("weight_decay_1", "regularisation", "Adam weight_decay=1.0", {"weight_decay": 1.0}, K.HUGE_DECAY),
        SORTED_UNSHUFFLED,
        Variant(
            "activation_removed", "activation", "ReLU replaced by Identity", {"activation": "identity"}, K.LINEAR_MODEL
        ),
        Variant(
            "relu_on_logits",
            "activation",
            "a ReLU after the last Linear",
            {"relu_on_logits": True},
            K.RELU_ON_LOGITS,
            ("7", "6"),
        ),
        Variant(
            "dead_relu_bias",
            "weight_init",
            "first Linear's bias initialised to -10",
            {"first_bias": -10.0},
            K.DEAD_BIAS,
            ("2", "1"),
        ),
        Variant("clip_1e-4", "gradient_clipping", "clip_grad_norm_ to 1e-4 (Adam)", {"clip": 1e-4}, K.TINY_CLIPPING),
        Variant("dropout_0.9", "regularisation", "Dropout p=0.9 instead of 0.2", {"dropout": 0.9}, K.HEAVY_DROPOUT),
        Variant("dropout_0.5", "regularisation", "Dropout p=0.5 instead of 0.2", {"dropout": 0.5}, K.HEAVY_DROPOUT),
        Variant(
            "init_const_0.05",
            "weight_init",
            "nn.init.constant_(weight, 0.05) on every Linear",
            {"init_value": 0.05},
            K.SYMMETRIC,
        ),
    ),
)


# --- the CNN ---------------------------------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self, relu_on_logits: bool = False, detach_features: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.bn2 = nn.BatchNorm2d(32)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(32 * 6 * 6, 64)
        self.fc2 = nn.Linear(64, 10)
        self.relu_on_logits = relu_on_logits
        self.detach_features = detach_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        if self.detach_features:  # a .detach() left from debugging: the convolutions never get a gradient
            x = x.detach()
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.relu(x) if self.relu_on_logits else x


def cnn_train(hp: SimpleNamespace, session: Session) -> dict[str, float]:
    seed_everything(hp.seed)
    x_train, y_train, x_test, y_test = image_split(2048, 1024)
    x_train, x_test = to_input(x_train), to_input(x_test)
    model = Net(hp.relu_on_logits, hp.detach_features)
    if hp.init_std is not None:
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.normal_(module.weight, std=hp.init_std)
    if hp.init_value is not None:
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.constant_(module.weight, hp.init_value)
    if hp.zero_head:  # the classifier starts at zero (a common choice): its units part at the first update
        nn.init.zeros_(model.fc2.weight)
    params = model.parameters()
    if hp.left_out:
        params = [p for name, p in model.named_parameters() if not name.startswith(hp.left_out)]
    if hp.optimizer == "adadelta":
        optimizer = torch.optim.Adadelta(params, lr=hp.lr)
    else:
        optimizer = torch.optim.SGD(params, lr=hp.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    batches = training_batches(x_train, y_train, 64, hp.order)
    with session.watch(model):
        for _epoch in range(hp.epochs):
            if hp.eval_mode:
                model.eval()  # left in eval mode by the previous epoch's validation
            else:
                model.train()
            for x, y in batches:
                optimizer.zero_grad()
                output = model(x)
                if hp.log_softmax:
                    output = F.log_softmax(output, dim=1)
                loss = F.nll_loss(output, y)
                loss.backward()
                if hp.clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), hp.clip)
                optimizer.step()
                session.record(loss)
            scheduler.step()
    return {"metric": accuracy(model, x_test, y_test)}


CNN = Program(
    family=FAMILY,
    name="cnn",
    train=cnn_train,
    defaults=dict(
        lr=1.0,
        epochs=3,
        optimizer="adadelta",
        log_softmax=True,
        relu_on_logits=False,
        init_std=None,
        init_value=None,
        zero_head=False,
        left_out=None,
        clip=None,
        eval_mode=False,
        detach_features=False,
        order="shuffled",
    ),
    metric="accuracy",
    higher_is_better=True,
    floor=0.03,
    chance=0.1,
    functional_relu=("bn1", "bn2", "fc1", "fc2"),
    variants=(
        healthy("Conv-BN-ReLU x2, max-pool, Dropout, fc1, Dropout, fc2; log_softmax + nll_loss, Adadelta 1.0"),
        SORTED_UNSHUFFLED,
        Variant(
            "nll_on_raw_logits",
            "loss_function",
            "F.nll_loss on the logits (log_softmax forgotten)",
            {"log_softmax": False},
            K.NLL_ON_LOGITS | K.LR_TOO_HIGH,
        ),
        Variant(
            "relu_on_logits",
            "activation",
            "F.relu on fc2's output",
            {"relu_on_logits": True},
            K.RELU_ON_LOGITS,
            ("fc2",),
        ),
        Variant(
            "sgd_lr_1",
            "optimizer",
            "SGD instead of Adadelta, same lr 1.0",
            {"optimizer": "sgd"},
            K.LR_TOO_HIGH | K.LR_FAR_TOO_HIGH,
        ),
        Variant(
            "clip_1e-4", "gradient_clipping", "clip_grad_norm_ to 1e-4 (Adadelta)", {"clip": 1e-4}, K.TINY_CLIPPING
        ),
        Variant(
            "eval_mode", "mode", "the loop trains in eval mode (model.eval() left on)", {"eval_mode": True}, K.EVAL_MODE
        ),
        Variant(
            "fc2_not_in_optimizer",
            "optimizer_coverage",
            "fc2's parameters left out of the optimizer",
            {"left_out": "fc2"},
            K.LEFT_OUT,
            ("fc2",),
        ),
        Variant("init_normal_1", "weight_init", "conv and linear weights ~ N(0, 1)", {"init_std": 1.0}, K.BIG_INIT),
        Variant(
            "init_const_0.05",
            "weight_init",
            "nn.init.constant_(weight, 0.05) on every conv and linear layer",
            {"init_value": 0.05},
            K.SYMMETRIC,
        ),
        Variant("fc2_zero_init", "weight_init", "fc2's weight initialised to zeros", {"zero_head": True}, K.SYMMETRIC),
        Variant(
            "detach_features",
            "graph_cut",
            "the flattened conv features .detach()ed before fc1",
            {"detach_features": True},
            K.DETACHED,
        ),
    ),
)

PROGRAMS = (MLP, CNN)
