"""Small healthy training programs of families the real-program benchmark does not cover, written the way users
write them, and a plain-torch observer that measures their health.

Each program builds its model(s) and data (fixed seeds, a learnable rule), then runs its own loop inside
``observe(model)``: the plain observer (:class:`PlainHealth`) or ``NeuralDbg``. The loop never changes with the
observer. A program returns its loss per optimiser step.

Plain-torch health, measured by :class:`PlainHealth` with hooks of its own: the loss falls clearly, every gradient
is finite, every parameter the optimiser holds moves, and no layer's output is exactly zero on every element of the
run.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

Observe = Callable[[nn.Module], contextlib.AbstractContextManager[Any]]


class PlainHealth:
    """Plain-torch health figures of one run: gradient finiteness, parameter movement, layers never non-zero."""

    def __init__(self) -> None:
        self.grads_finite = True
        self.grad_count = 0
        self.moved: dict[str, bool] = {}
        self.always_zero: dict[str, bool] = {}
        self.models = 0  # models observed (a GAN's two); the names of the second on are prefixed with its number

    @contextlib.contextmanager
    def observe(self, model: nn.Module) -> Iterator[PlainHealth]:
        prefix = f"{self.models}/" if self.models else ""
        self.models += 1
        before = {prefix + n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        handles: list[Any] = []

        def on_grad(g: torch.Tensor) -> None:
            self.grad_count += 1
            dense = g.coalesce().values() if g.is_sparse else g
            self.grads_finite = self.grads_finite and bool(torch.isfinite(dense.float()).all())

        def on_output(name: str) -> Callable[..., None]:
            def hook(_m: nn.Module, _i: Any, out: Any) -> None:
                if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() > 0:
                    zero = bool((out.detach() == 0).all())
                    self.always_zero[name] = self.always_zero.get(name, True) and zero

            return hook

        for p in model.parameters():
            if p.requires_grad:
                handles.append(p.register_hook(on_grad))
        for name, m in model.named_modules():
            if not list(m.children()):  # the leaves (the model itself when it is one layer)
                handles.append(m.register_forward_hook(on_output(prefix + name)))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            for n, p in model.named_parameters():
                if prefix + n in before:
                    self.moved[prefix + n] = not torch.equal(before[prefix + n], p.detach())

    def dead_layers(self) -> list[str]:
        return [n for n, z in self.always_zero.items() if z]

    def still_parameters(self) -> list[str]:
        return [n for n, moved in self.moved.items() if not moved]


def fell(losses: list[float], window: int = 10) -> float:
    """Mean of the last ``window`` losses over the mean of the first ``window`` (< 1 when the loss falls)."""
    window = min(window, len(losses) // 3)
    first = sum(losses[:window]) / window
    last = sum(losses[-window:]) / window
    return last / first


# --------------------------------------------------------------------------------------------- programs


def lstm_lbfgs(observe: Observe) -> list[float]:
    """pytorch/examples time_sequence_prediction: two LSTMCells predicting sine waves, LBFGS with a closure."""

    class Sequence(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm1 = nn.LSTMCell(1, 24)
            self.lstm2 = nn.LSTMCell(24, 24)
            self.linear = nn.Linear(24, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h1 = c1 = torch.zeros(x.size(0), 24, dtype=x.dtype)
            h2 = c2 = torch.zeros(x.size(0), 24, dtype=x.dtype)
            outputs = []
            for x_t in x.split(1, dim=1):
                h1, c1 = self.lstm1(x_t, (h1, c1))
                h2, c2 = self.lstm2(h1, (h2, c2))
                outputs.append(self.linear(h2))
            return torch.cat(outputs, dim=1)

    torch.manual_seed(0)
    t = torch.arange(40, dtype=torch.float32) / 4.0
    phase = torch.randint(-8, 8, (16, 1)).float()
    data = torch.sin(t + phase)
    inputs, targets = data[:, :-1], data[:, 1:]
    model = Sequence()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=8)
    losses: list[float] = []
    with observe(model):
        for _ in range(8):

            def closure() -> torch.Tensor:
                optimizer.zero_grad()
                loss = criterion(model(inputs), targets)
                loss.backward()
                return loss

            losses.append(optimizer.step(closure).item())  # type: ignore[union-attr]
    return losses


def row_rnn_classifier(observe: Observe) -> list[float]:
    """An MNIST-style classifier reading a 12x12 image row by row with a tanh RNN, the last hidden state to a head."""

    class RowRNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.RNN(12, 48, batch_first=True)
            self.fc = nn.Linear(48, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.rnn(x)
            return self.fc(out[:, -1])

    torch.manual_seed(0)
    prototypes = torch.randn(4, 12, 12)
    model = RowRNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(120):
            labels = torch.randint(0, 4, (32,))
            images = prototypes[labels] + 0.8 * torch.randn(32, 12, 12)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def dqn_chain(observe: Observe) -> list[float]:
    """DQN on a 6-state chain: epsilon-greedy policy, replay buffer, target network synced every 25 steps, Huber."""
    torch.manual_seed(0)
    n_states, gamma = 6, 0.9

    def env_step(s: int, a: int) -> tuple[int, float, bool]:
        nxt = min(s + 1, n_states - 1) if a == 1 else max(s - 1, 0)
        done = nxt == n_states - 1
        return nxt, (1.0 if done else -0.05), done

    def one_hot(s: int) -> torch.Tensor:
        return F.one_hot(torch.tensor(s), n_states).float()

    policy = nn.Sequential(nn.Linear(n_states, 32), nn.ReLU(), nn.Linear(32, 2))
    target = copy.deepcopy(policy)
    optimizer = torch.optim.Adam(policy.parameters(), lr=5e-3)
    buffer: list[tuple[torch.Tensor, int, float, torch.Tensor, bool]] = []
    gen = torch.Generator().manual_seed(1)
    losses: list[float] = []
    state = 0
    with observe(policy):
        for step in range(300):
            eps = max(0.1, 1.0 - step / 150)
            if float(torch.rand(1, generator=gen)) < eps:
                action = int(torch.randint(0, 2, (1,), generator=gen))
            else:
                with torch.no_grad():
                    action = int(policy(one_hot(state)).argmax())
            nxt, reward, done = env_step(state, action)
            buffer.append((one_hot(state), action, reward, one_hot(nxt), done))
            buffer = buffer[-500:]
            state = 0 if done else nxt
            if len(buffer) < 32:
                continue
            idx = torch.randint(0, len(buffer), (32,), generator=gen).tolist()
            s, a, r, s2, d = zip(*(buffer[i] for i in idx), strict=True)
            s_b, s2_b = torch.stack(s), torch.stack(s2)
            a_b, r_b = torch.tensor(a), torch.tensor(r)
            d_b = torch.tensor(d, dtype=torch.float32)
            q = policy(s_b).gather(1, a_b.unsqueeze(1)).squeeze(1)
            with torch.no_grad():
                q_next = target(s2_b).max(dim=1).values
            expected = r_b + gamma * q_next * (1 - d_b)
            loss = F.smooth_l1_loss(q, expected)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_value_(policy.parameters(), 100)
            optimizer.step()
            losses.append(loss.item())
            if step % 25 == 0:
                target.load_state_dict(policy.state_dict())
    return losses


def simclr(observe: Observe) -> list[float]:
    """SimCLR-style contrastive learning: two noisy views per sample, encoder + projection head, NT-Xent (tau 0.2)."""

    def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.2) -> torch.Tensor:
        z = F.normalize(torch.cat([z1, z2]), dim=1)
        sim = z @ z.t() / temperature
        n = z1.size(0)
        sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
        targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
        return F.cross_entropy(sim, targets)

    torch.manual_seed(0)
    centres = torch.randn(256, 20) * 2
    model = nn.Sequential(
        nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x = centres[torch.randint(0, 256, (64,))] + 0.3 * torch.randn(64, 20)
            v1 = x + 0.3 * torch.randn_like(x)
            v2 = x * (1 + 0.1 * torch.randn_like(x))
            loss = nt_xent(model(v1), model(v2))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def distillation(observe: Observe) -> list[float]:
    """Knowledge distillation: a trained teacher, a small student on KL(T=4) * T^2 of softened logits plus CE."""
    torch.manual_seed(0)
    w = torch.randn(24, 5)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(64, 24)
        return x, (x @ w + 0.3 * torch.randn(64, 5)).argmax(dim=1)

    teacher = nn.Sequential(nn.Linear(24, 128), nn.ReLU(), nn.Linear(128, 5))
    t_opt = torch.optim.Adam(teacher.parameters(), lr=3e-3)
    for _ in range(150):
        x, y = batch()
        t_opt.zero_grad()
        F.cross_entropy(teacher(x), y).backward()
        t_opt.step()
    teacher.eval()
    student = nn.Sequential(nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 5))
    optimizer = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9)
    temperature, alpha = 4.0, 0.7
    losses: list[float] = []
    with observe(student):
        for _ in range(150):
            x, y = batch()
            with torch.no_grad():
                soft_targets = F.softmax(teacher(x) / temperature, dim=1)
            logits = student(x)
            kd = F.kl_div(F.log_softmax(logits / temperature, dim=1), soft_targets, reduction="batchmean")
            loss = alpha * kd * temperature**2 + (1 - alpha) * F.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def unet_segmentation(observe: Observe) -> list[float]:
    """A two-level U-Net (skip connection by concatenation) segmenting small bright squares (~6% of pixels),
    BCE-with-logits with pos_weight for the imbalance."""

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down1 = block(1, 8)
            self.down2 = block(8, 16)
            self.pool = nn.MaxPool2d(2)
            self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
            self.dec = block(16, 8)
            self.head = nn.Conv2d(8, 1, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            d1 = self.down1(x)
            d2 = self.down2(self.pool(d1))
            return self.head(self.dec(torch.cat([self.up(d2), d1], dim=1)))

    torch.manual_seed(0)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.zeros(8, 1, 16, 16)
        for i in range(8):
            r, c = torch.randint(0, 12, (2,)).tolist()
            mask[i, 0, r : r + 4, c : c + 4] = 1.0
        return mask + 0.5 * torch.randn_like(mask), mask

    model = UNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    criterion = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([15.0]))
    losses: list[float] = []
    with observe(model):
        for _ in range(60):
            x, mask = batch()
            optimizer.zero_grad()
            loss = criterion(model(x), mask)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def sparse_matrix_factorisation(observe: Observe) -> list[float]:
    """Recommendation by matrix factorisation: sparse EmbeddingBag user and item factors (sparse=True) with
    SparseAdam, dense biases with Adam, MSE on ratings of a low-rank truth."""

    class MF(nn.Module):
        def __init__(self, users: int, items: int, rank: int) -> None:
            super().__init__()
            self.user = nn.EmbeddingBag(users, rank, mode="sum", sparse=True)
            self.item = nn.EmbeddingBag(items, rank, mode="sum", sparse=True)
            self.bias = nn.Parameter(torch.zeros(1))
            nn.init.normal_(self.user.weight, std=0.1)
            nn.init.normal_(self.item.weight, std=0.1)

        def forward(self, u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
            return (self.user(u.unsqueeze(1)) * self.item(i.unsqueeze(1))).sum(dim=1) + self.bias

    torch.manual_seed(0)
    users, items = 100, 80
    true_u, true_i = torch.randn(users, 4), torch.randn(items, 4)
    model = MF(users, items, 8)
    sparse_opt = torch.optim.SparseAdam([model.user.weight, model.item.weight], lr=0.03)
    dense_opt = torch.optim.Adam([model.bias], lr=0.03)
    losses: list[float] = []
    with observe(model):
        for _ in range(200):
            u, i = torch.randint(0, users, (128,)), torch.randint(0, items, (128,))
            rating = (true_u[u] * true_i[i]).sum(dim=1)
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss = F.mse_loss(model(u, i), rating)
            loss.backward()
            sparse_opt.step()
            dense_opt.step()
            losses.append(loss.item())
    return losses


def bf16_autocast(observe: Observe) -> list[float]:
    """Mixed precision on the CPU: the forward under torch.autocast(bfloat16), float32 master weights, AdamW."""
    torch.manual_seed(0)
    w = torch.randn(32, 6)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 64), nn.GELU(), nn.Linear(64, 6))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    losses: list[float] = []
    with observe(model):
        for _ in range(120):
            x = torch.randn(64, 32)
            y = (x @ w).argmax(dim=1)
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def gradient_accumulation(observe: Observe) -> list[float]:
    """Gradient accumulation over 4 micro-batches of 8: the loss divided by 4, one step and zero_grad per 4."""
    torch.manual_seed(0)
    w = torch.randn(16, 1)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    accumulation = 4
    losses: list[float] = []
    with observe(model):
        optimizer.zero_grad()
        running = 0.0
        for micro in range(400):
            x = torch.randn(8, 16)
            loss = F.mse_loss(model(x), x @ w) / accumulation
            loss.backward()
            running += loss.item()
            if (micro + 1) % accumulation == 0:
                optimizer.step()
                optimizer.zero_grad()
                losses.append(running)
                running = 0.0
    return losses


def tied_language_model(observe: Observe) -> list[float]:
    """A word-level LM whose decoder shares its weight with the encoder embedding (weight tying), GRU, Adam."""

    class TiedLM(nn.Module):
        def __init__(self, vocab: int, dim: int) -> None:
            super().__init__()
            self.encoder = nn.Embedding(vocab, dim)
            self.rnn = nn.GRU(dim, dim, batch_first=True)
            self.drop = nn.Dropout(0.1)
            self.decoder = nn.Linear(dim, vocab)
            self.decoder.weight = self.encoder.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            out, _ = self.rnn(self.drop(self.encoder(tokens)))
            return self.decoder(self.drop(out))

    torch.manual_seed(0)
    vocab = 30
    successor = torch.randperm(vocab)
    model = TiedLM(vocab, 32)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(120):
            start = torch.randint(0, vocab, (16,))
            seq = [start]
            for _ in range(12):
                seq.append(successor[seq[-1]])
            tokens = torch.stack(seq, dim=1)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            losses.append(loss.item())
    return losses


def mixture_of_experts(observe: Observe) -> list[float]:
    """A mixture-of-experts layer with top-1 routing (output scaled by the gate's probability), plus a
    load-balancing auxiliary loss; the target is piecewise by input region, so experts can specialise."""

    class MoE(nn.Module):
        def __init__(self, dim: int, experts: int) -> None:
            super().__init__()
            self.gate = nn.Linear(dim, experts)
            self.experts = nn.ModuleList(
                nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 1)) for _ in range(experts)
            )
            self.aux = torch.zeros(())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            probs = F.softmax(self.gate(x), dim=1)
            top_p, top_i = probs.max(dim=1)
            out = torch.zeros(x.size(0), 1)
            for e, expert in enumerate(self.experts):
                chosen = top_i == e
                if chosen.any():
                    out[chosen] = expert(x[chosen]) * top_p[chosen].unsqueeze(1)
            load = F.one_hot(top_i, len(self.experts)).float().mean(dim=0)
            self.aux = len(self.experts) * (load * probs.mean(dim=0)).sum()
            return out

    torch.manual_seed(0)
    model = MoE(8, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(200):
            x = torch.randn(64, 8)
            y = torch.where(x[:, :1] > 0, x[:, 1:2] * 2, -x[:, 2:3]) + torch.sin(x[:, 3:4])
            pred = model(x)
            loss = F.mse_loss(pred, y)
            optimizer.zero_grad()
            (loss + 0.01 * model.aux).backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def polynomial_regression(observe: Observe) -> list[float]:
    """pytorch/examples regression: a Linear(4, 1) on polynomial features fitted by hand-written SGD
    (``param.add_(-lr * param.grad)``, ``fc.zero_grad()``)."""
    torch.manual_seed(0)
    w_target = torch.randn(4, 1) * 5
    b_target = torch.randn(1) * 5

    def features(x: torch.Tensor) -> torch.Tensor:
        x = x.unsqueeze(1)
        return torch.cat([x**i for i in range(1, 5)], 1)

    fc = nn.Linear(4, 1)
    losses: list[float] = []
    with observe(fc):
        for _ in range(300):
            x = features(torch.randn(32))
            y = x.mm(w_target) + b_target.item()
            fc.zero_grad()
            loss = F.smooth_l1_loss(fc(x), y)
            loss.backward()
            with torch.no_grad():
                for param in fc.parameters():
                    param.add_(-0.1 * param.grad)  # type: ignore[operator]
            losses.append(loss.item())
    return losses


def tied_denoising_autoencoder(observe: Observe) -> list[float]:
    """A denoising autoencoder with tied weights (the decoder is the encoder's transpose via F.linear), sigmoid
    code, inputs corrupted by masking noise, MSE to the clean input."""

    class TiedAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Linear(40, 12)
            self.decoder_bias = nn.Parameter(torch.zeros(40))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            code = torch.sigmoid(self.encoder(x))
            return F.linear(code, self.encoder.weight.t(), self.decoder_bias)

    torch.manual_seed(0)
    basis = torch.randn(6, 40)
    model = TiedAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(200):
            clean = torch.rand(32, 6) @ basis
            noisy = clean * (torch.rand_like(clean) > 0.2)
            loss = F.mse_loss(model(noisy), clean)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def gradient_checkpointing(observe: Observe) -> list[float]:
    """Four residual blocks run through torch.utils.checkpoint (non-reentrant): each block's forward runs again
    during the backward pass to recompute its activations."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.LayerNorm(32)) for _ in range(4))
            self.head = nn.Linear(32, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = x + checkpoint(block, x, use_reentrant=False)
            return self.head(x)

    torch.manual_seed(0)
    w = torch.randn(32, 1)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x = torch.randn(32, 32)
            loss = F.mse_loss(model(x), torch.tanh(x @ w))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def weight_norm_classifier(observe: Observe) -> list[float]:
    """An MLP whose Linear layers are reparametrised by weight_norm (parametrizations: the weight computed from
    ``original0`` and ``original1`` at each forward), SGD with momentum."""
    from torch.nn.utils.parametrizations import weight_norm

    torch.manual_seed(0)
    w = torch.randn(16, 4)
    model = nn.Sequential(weight_norm(nn.Linear(16, 64)), nn.ReLU(), weight_norm(nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            x = torch.randn(32, 16)
            loss = F.cross_entropy(model(x), (x @ w).argmax(dim=1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def training_with_validation(observe: Observe) -> list[float]:
    """A BatchNorm-Dropout classifier validated every 25 steps in eval mode under no_grad, then back to train."""
    torch.manual_seed(0)
    w = torch.randn(20, 5)
    model = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x_val = torch.randn(256, 20)
    y_val = (x_val @ w).argmax(dim=1)
    losses: list[float] = []
    with observe(model):
        for step in range(200):
            model.train()
            x = torch.randn(32, 20)
            loss = F.cross_entropy(model(x), (x @ w).argmax(dim=1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if step % 25 == 0:
                model.eval()
                with torch.no_grad():
                    F.cross_entropy(model(x_val), y_val)
    return losses


def ctc_sequence_labelling(observe: Observe) -> list[float]:
    """Speech-style sequence labelling: Conv1d, a bidirectional GRU and a Linear over 6 symbols (0 the blank),
    log_softmax and CTC loss on 20 frames holding 5 labels, 4 frames each."""

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(8, 32, 3, padding=1)
            self.rnn = nn.GRU(32, 32, batch_first=True, bidirectional=True)
            self.fc = nn.Linear(64, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = F.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
            h, _ = self.rnn(h)
            return self.fc(h)

    torch.manual_seed(0)
    prototypes = torch.randn(6, 8)
    model = Tagger()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []
    with observe(model):
        for _ in range(150):
            labels = torch.randint(1, 6, (16, 5))
            frames = prototypes[labels].repeat_interleave(4, dim=1) + 0.3 * torch.randn(16, 20, 8)
            log_probs = model(frames).log_softmax(-1).transpose(0, 1)
            loss = F.ctc_loss(log_probs, labels, torch.full((16,), 20), torch.full((16,), 5))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


def lightning_manual_optimisation(observe: Observe) -> list[float]:
    """A LightningModule with manual optimisation (``automatic_optimization = False``): manual_backward,
    clip_gradients, the optimizer and a StepLR stepped by hand, under lightning.Trainer for 3 epochs."""
    import lightning

    class Net(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
            self.losses: list[float] = []

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
            x, y = batch
            opt = self.optimizers()
            scheduler = self.lr_schedulers()
            loss = F.cross_entropy(self.net(x), y)
            opt.zero_grad()  # type: ignore[union-attr]
            self.manual_backward(loss)
            self.clip_gradients(opt, gradient_clip_val=1.0, gradient_clip_algorithm="norm")  # type: ignore[arg-type]
            opt.step()  # type: ignore[union-attr]
            scheduler.step()  # type: ignore[union-attr]
            self.losses.append(loss.item())

        def configure_optimizers(self) -> Any:
            opt = torch.optim.Adam(self.parameters(), lr=3e-3)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.5)]

    torch.manual_seed(0)
    w = torch.randn(10, 3)
    x = torch.randn(2048, 10)
    data = torch.utils.data.TensorDataset(x, (x @ w).argmax(dim=1))
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
    model = Net()
    trainer = lightning.Trainer(
        max_epochs=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with observe(model):
        trainer.fit(model, loader)
    return model.losses


PROGRAMS: dict[str, Callable[[Observe], list[float]]] = {
    "lstm_lbfgs": lstm_lbfgs,
    "row_rnn_classifier": row_rnn_classifier,
    "dqn_chain": dqn_chain,
    "simclr": simclr,
    "distillation": distillation,
    "unet_segmentation": unet_segmentation,
    "sparse_matrix_factorisation": sparse_matrix_factorisation,
    "bf16_autocast": bf16_autocast,
    "gradient_accumulation": gradient_accumulation,
    "tied_language_model": tied_language_model,
    "mixture_of_experts": mixture_of_experts,
    "polynomial_regression": polynomial_regression,
    "tied_denoising_autoencoder": tied_denoising_autoencoder,
    "gradient_checkpointing": gradient_checkpointing,
    "weight_norm_classifier": weight_norm_classifier,
    "training_with_validation": training_with_validation,
    "ctc_sequence_labelling": ctc_sequence_labelling,
    "lightning_manual_optimisation": lightning_manual_optimisation,
}
