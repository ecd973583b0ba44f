"""Train a small CNN or transformer data-parallel on synthetic data under a commsched policy.

    torchrun --nproc-per-node 4 examples/train.py --policy dear --model cnn --iters 20

Prints, on rank 0, the median iteration time and throughput after warm-up, and
(with --check) the largest parameter difference from a PyTorch DDP run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

import commsched
from commsched.runtime import RUNTIME_POLICIES


def small_cnn(num_classes: int = 10) -> nn.Module:
    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    return nn.Sequential(
        block(3, 32), block(32, 64), nn.MaxPool2d(2), block(64, 128), block(128, 128), nn.MaxPool2d(2),
        block(128, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, num_classes),
    )  # fmt: skip


class SmallTransformer(nn.Module):
    """A GPT-style language model; the output projection is tied to the embedding."""

    def __init__(self, vocab: int = 2000, dim: int = 128, layers: int = 2, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.out(self.norm(self.blocks(h)))


def make(model: str, batch: int, rank: int, step: int) -> tuple[nn.Module | None, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * step + rank)
    if model == "cnn":
        return None, torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
    tokens = torch.randint(0, 2000, (batch, 64), generator=g)
    return None, tokens, torch.roll(tokens, -1, dims=1)


def run(policy: str, model_name: str, iters: int, batch: int, options: dict) -> tuple[list[float], nn.Module]:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = small_cnn() if model_name == "cnn" else SmallTransformer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = commsched.parallelize(model, optimizer, policy=policy, **options)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for step in range(iters):
        _, x, y = make(model_name, batch, rank, step)
        start = time.perf_counter()
        out = model(x)
        loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    if hasattr(model, "flush"):
        model.flush()
    return times, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="dear", choices=RUNTIME_POLICIES)
    parser.add_argument("--model", default="cnn", choices=["cnn", "transformer"])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5, help="iterations left out of the timing")
    parser.add_argument("--batch", type=int, default=16, help="per-rank batch size")
    parser.add_argument("--check", action="store_true", help="also train with torch_ddp and compare parameters")
    parser.add_argument("--json", help="write rank 0's result here")
    parser.add_argument("-o", "--option", action="append", default=[], help="policy knob key=value")
    args = parser.parse_args()
    if args.iters <= args.warmup:
        parser.error(f"--iters ({args.iters}) must be larger than --warmup ({args.warmup})")
    options = {k: float(v) for k, v in (o.split("=", 1) for o in args.option)}
    dist.init_process_group("gloo")
    times, model = run(args.policy, args.model, args.iters, args.batch, options)
    iter_s = statistics.median(times[args.warmup :])
    result = {
        "policy": args.policy,
        "model": args.model,
        "world_size": dist.get_world_size(),
        "iteration_ms": iter_s * 1e3,
        "samples_per_s": args.batch * dist.get_world_size() / iter_s,
    }
    if args.check and args.policy != "torch_ddp":
        _, ref = run("torch_ddp", args.model, args.iters, args.batch, {})
        mine = dict(getattr(model, "module", model).named_parameters())
        result["max_param_diff_vs_torch_ddp"] = max(
            (p - mine[n]).abs().max().item() for n, p in ref.module.named_parameters()
        )
    if hasattr(model, "close"):
        model.close()
    if dist.get_rank() == 0:
        print(json.dumps(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
