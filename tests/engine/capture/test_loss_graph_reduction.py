"""The loss graph reader tells a mean-reduced classifier loss from a summed one (the first loss of a mean is one
sample's, comparable with log(classes)), and reads the token id the loss ignores; checked against torch's own
reduction and ignore_index arguments."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from neuraldbg.capture import loss_graph


def logits() -> torch.Tensor:
    return torch.randn(8, 5, generator=torch.Generator().manual_seed(0)).requires_grad_()


def test_cross_entropy_mean_and_sum():
    z, y = logits(), torch.arange(8) % 5
    mean = loss_graph.read([F.cross_entropy(z, y)])
    summed = loss_graph.read([F.cross_entropy(z, y, reduction="sum")])
    assert mean.loss and mean.mean
    assert summed.loss and not summed.mean


def test_nll_loss_over_selected_rows_of_a_log_softmax_is_a_mean():
    """A graph network's loss: log_softmax in the model, nll_loss over the training nodes' rows."""
    z, y = logits(), torch.arange(8) % 5
    graph = loss_graph.read([F.nll_loss(F.log_softmax(z, 1)[:4], y[:4])])
    assert graph.loss and graph.mean


def test_binary_cross_entropy_with_logits_reduction():
    z, t = logits(), torch.rand(8, 5, generator=torch.Generator().manual_seed(1))
    assert loss_graph.read([F.binary_cross_entropy_with_logits(z, t)]).mean
    assert not loss_graph.read([F.binary_cross_entropy_with_logits(z, t, reduction="sum")]).mean


def test_a_loss_built_by_hand_from_a_log_softmax_is_not_taken_for_a_mean():
    """No reducing loss node between the root and the log_softmax: the reduction is unknown."""
    z, y = logits(), torch.arange(8) % 5
    graph = loss_graph.read([-F.log_softmax(z, 1)[torch.arange(8), y].sum()])
    assert graph.loss and not graph.mean


def test_the_ignored_token_is_read_and_the_default_names_none():
    z, y = logits(), torch.arange(8) % 5
    assert loss_graph.read([F.cross_entropy(z, y, ignore_index=3)]).ignored == 3
    assert loss_graph.read([F.cross_entropy(z, y, ignore_index=0, reduction="sum")]).ignored == 0
    assert loss_graph.read([F.cross_entropy(z, y)]).ignored is None  # -100: torch's default, no token


def test_a_loss_of_several_terms_is_not_taken_for_the_mean_cross_entropy():
    """Knowledge distillation: T**2 * KL(student/T, teacher/T) + CE. Its value is not one sample's cross-entropy
    (plain torch: the sum is several times the CE at the first step), so its first value is not comparable with
    log(classes); nor is a weighted CE, nor the sum of two roots."""
    z, y = logits(), torch.arange(8) % 5
    teacher = torch.randn(8, 5, generator=torch.Generator().manual_seed(2)) * 3
    t = 4.0
    kd = F.kl_div(F.log_softmax(z / t, 1), F.softmax(teacher / t, 1), reduction="batchmean") * t * t
    ce = F.cross_entropy(z, y)
    total = kd + ce
    assert float(total) > 1.5 * float(ce)  # plain torch: the other term dominates the value
    assert loss_graph.read([total]).loss and not loss_graph.read([total]).mean
    assert not loss_graph.read([0.5 * F.cross_entropy(z, y)]).mean
    assert not loss_graph.read([F.cross_entropy(z, y), F.cross_entropy(z, y)]).mean
    assert loss_graph.read([F.cross_entropy(z, y)]).mean  # the CE alone still is


def test_cosine_similarities_times_a_scale_are_told_from_a_layer_on_normalised_features():
    """ArcFace (a margin on the labels' class, s = 30), CosFace and CLIP (a learnable exp scale, clamped) compute
    their logits from two normalised operands: bounded by the scale. A Linear on normalised features, even times
    30, and cosines times a layer's output are not."""
    g = torch.Generator().manual_seed(0)
    a = F.normalize(torch.randn(6, 4, generator=g).requires_grad_(), dim=1)
    b = F.normalize(torch.randn(6, 4, generator=g).requires_grad_(), dim=1)
    centres = torch.randn(3, 4, generator=g).requires_grad_()
    scale = torch.tensor(2.66).requires_grad_()
    gate = torch.nn.Linear(4, 1)
    y = torch.arange(6) % 3
    cosine = F.linear(a, F.normalize(centres)).clamp(-1 + 1e-7, 1 - 1e-7)
    arcface = 30 * torch.where(F.one_hot(y, 3).bool(), torch.cos(torch.acos(cosine) + 0.5), cosine)
    cosface = 30 * (cosine - 0.35 * F.one_hot(y, 3))
    clip = scale.clamp(max=4.6052).exp() * a @ b.T

    for logits, labels in ((arcface, y), (cosface, y), (clip, torch.arange(6))):
        assert loss_graph.read([F.cross_entropy(logits, labels)]).cosine
    for logits in (torch.nn.Linear(4, 3)(a), 30 * torch.nn.Linear(4, 3, bias=False)(a), (a @ b.T) * gate(a)):
        assert not loss_graph.read([F.cross_entropy(logits, torch.arange(6) % logits.size(1))]).cosine


def test_a_weighted_binary_cross_entropy_is_not_one_sample_at_chance_before_or_after_backward():
    # pos_weight and weight scale the terms of the mean (not normalised by them, unlike cross_entropy's weight):
    # at zero logits the loss is log 2 times the weights. The reader runs after the backward pass, when a saved
    # weight is freed: it must still tell
    z, t = logits(), (torch.rand(8, 5, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    zero = torch.zeros(8, 5)
    assert float(F.binary_cross_entropy_with_logits(zero, t, pos_weight=torch.full((5,), 10.0))) > 3 * 0.6931
    for kwargs in ({"pos_weight": torch.full((5,), 10.0)}, {"weight": torch.full((5,), 3.0)}):
        loss = F.binary_cross_entropy_with_logits(z, t, **kwargs)
        assert not loss_graph.read([loss]).mean
        loss = F.binary_cross_entropy_with_logits(z, t, **kwargs)
        loss.backward()
        graph = loss_graph.read([loss])
        assert graph.loss and not graph.mean
    plain = F.binary_cross_entropy_with_logits(z, t)
    plain.backward()
    assert loss_graph.read([plain]).mean  # no weights: still a mean at chance


def test_the_targets_are_read_through_a_scale_of_exactly_one_and_no_other():
    """``loss / accumulation_steps`` (or ``* 1``) at a default of 1 is the loss itself: its targets are read; a
    loss divided by 4 micro-batches is not (its level is not the targets'), nor one with a term added."""
    prediction = torch.randn(8, 3).requires_grad_()
    target = torch.randn(8, 3)
    plain = loss_graph.loss_targets([F.mse_loss(prediction, target)])
    assert plain is not None and plain.kind == "mse" and plain.target is target
    for scaled in (F.mse_loss(prediction, target) / 1, 1 * F.mse_loss(prediction, target)):
        found = loss_graph.loss_targets([scaled])
        assert found is not None and found.target is target
    assert loss_graph.loss_targets([F.mse_loss(prediction, target) / 4]) is None
    assert loss_graph.loss_targets([F.mse_loss(prediction, target) / 1 + prediction.sum()]) is None


def test_hold_keeps_every_node_below_the_losses_once_and_stops_at_its_limit():
    """The nodes a reading compares by identity are held while it runs (torch 2.11 drops a node's Python object as
    soon as nothing holds it, and another object may take its id): every node reachable from the losses, each once,
    the shared ones included."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    out = model(x)
    losses = [out.pow(2).mean(), out.abs().sum()]  # two roots over one graph
    held = loss_graph.hold(losses)
    expected: set[int] = set()
    stack = [t.grad_fn for t in losses]
    keep = list(stack)
    while stack:
        node = stack.pop()
        if id(node) in expected:
            continue
        expected.add(id(node))
        for nxt, _ in node.next_functions:
            if nxt is not None:
                keep.append(nxt)
                stack.append(nxt)
    assert len(held) == len({id(n) for n in held}) == len(expected)
    assert {id(n) for n in held} == expected
    assert len(loss_graph.hold(losses, most=3)) == 3
