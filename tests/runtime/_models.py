"""Models and a training loop shared by the runtime's multi-process tests."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: Where the tests' models and batches live: ``COMMSCHED_TEST_DEVICE=cuda`` runs the multi-process tests on a
#: GPU (every rank on the current device, gloo moving CUDA tensors through host memory).
DEVICE = torch.device(os.environ.get("COMMSCHED_TEST_DEVICE", "cpu"))


class TrickyNet(nn.Module):
    """Everything that breaks naive schedulers at once.

    * registration order differs from forward order (``head`` is registered first, runs last);
    * ``out.weight`` is tied to ``emb.weight`` (one tensor, two uses);
    * ``body`` is called twice in one forward;
    * ``branch`` is used only when ``use_branch`` is true (unused in some iterations);
    * BatchNorm running statistics are buffers that DDP keeps in sync.
    """

    def __init__(self, vocab: int = 12, dim: int = 16) -> None:
        super().__init__()
        self.head = nn.Linear(dim, vocab)
        self.emb = nn.Embedding(vocab, dim)
        self.body = nn.Linear(dim, dim)
        self.bn = nn.BatchNorm1d(dim)
        self.branch = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = self.emb(tokens).mean(dim=1)
        h = torch.relu(self.bn(self.body(h)))
        h = self.body(h)
        if use_branch:
            h = h + torch.tanh(self.branch(h))
        return self.head(h) + self.out(h)


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    params = list(model.parameters())
    if name == "sgd":
        # Two groups with different hyper-parameters.
        first, rest = params[:2], params[2:]
        return torch.optim.SGD(
            [{"params": first, "lr": 0.05}, {"params": rest}],
            lr=0.1,
            momentum=0.9,
            nesterov=True,
            weight_decay=1e-3,
        )
    if name == "adamw":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)
    if name == "adam":
        return torch.optim.Adam(params, lr=0.01)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=0.01, momentum=0.5)
    raise ValueError(name)


def batch(rank: int, step: int, n: int = 8, seq: int = 5, vocab: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randint(0, vocab, (n, seq), generator=g), torch.randint(0, vocab, (n,), generator=g)
    return x.to(DEVICE), y.to(DEVICE)


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    rank: int,
    steps: int,
    *,
    scheduler: Any = None,
    branch: Callable[[int], bool] = lambda step: step % 3 != 1,
    evaluate_every: int = 0,
    start: int = 0,
) -> None:
    loss_fn = nn.CrossEntropyLoss()
    for step in range(start, start + steps):
        x, y = batch(rank, step)
        loss = loss_fn(model(x, use_branch=branch(step)), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        if evaluate_every and step % evaluate_every == 0:
            model.eval()
            with torch.no_grad():
                model(x)
            model.train()


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    inner = getattr(model, "module", model)
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


def fresh(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TrickyNet().to(DEVICE)


def clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)
