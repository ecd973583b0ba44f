"""Convergence under bounded loss: lossless ``ps`` against ``dlcp`` at several bounds and loss rates.

Two gloo ranks on 127.0.0.1 train an MLP (64-512-512-10, 0.30 M
parameters; the 512x512 weight spans 362 datagrams per rank's shard, so
even a 0.5 % bound can give up whole datagrams) on the handwritten digits that scikit-learn ships (1,797 8x8
images; a fixed split of 1,437 to train, 360 to test), SGD with momentum,
global batch 64 (32 per rank), through ``commsched.parallelize``:

* ``ps``: the lossless parameter server (the baseline);
* ``dlcp`` at ``loss_bound`` 0.5 %, 1 %, 5 %, 10 % with twice that loss
  injected, so the bound is reached;
* ``dlcp`` at the default bound (1 %) with 0.1 %, 1 %, 5 % injected loss;
* ``dlcp`` at 1 % with a lossy pull (``pull_loss_bound`` 0.5 %, 5 % injected),
  kept consistent by the replica check every 50 steps.

Loss is the link's emulated random loss (``TransportOptions(inject_loss=...)``:
each data datagram dropped with that probability before it is sent), not a
network's. Each configuration runs for ``--seeds`` seeds (model, data order
and loss injection seeded by it) and records per epoch the mean training loss
and the test accuracy, and over the run the lost fraction of every push and
every pull (the largest must stay within its bound: the script fails
otherwise), the datagrams dropped, and the replica checks.

    pip install -e ".[bench]"      # scikit-learn, for the data
    nice -n 10 python benchmarks/convergence.py --out benchmarks/results/convergence/digits.json \\
        --plot docs/img/convergence.png              # about 17 minutes on 2 busy cores
    python benchmarks/convergence.py --epochs 1 --seeds 0 --configs ps dlcp-1%  # a smoke test
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from commsched._sockets import free_port


@dataclass(frozen=True)
class Config:
    name: str
    policy: str
    loss_bound: float = 0.0
    pull_loss_bound: float = 0.0
    inject_loss: float = 0.0


CONFIGS = [
    Config("ps", "ps"),
    *(Config(f"dlcp-{b:g}%", "dlcp", b / 100, inject_loss=2 * b / 100) for b in (0.5, 1, 5, 10)),
    *(Config(f"dlcp-1%-inject-{p:g}%", "dlcp", 0.01, inject_loss=p / 100) for p in (0.1, 1, 5)),
    Config("dlcp-1%-pull-0.5%", "dlcp", 0.01, 0.005, inject_loss=0.05),
]
BATCH, LR, MOMENTUM = 64, 0.05, 0.9
CHECK_EVERY = 50


def digits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's digits, pixels scaled to [0, 1], split 1,437 / 360 by a fixed permutation."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    xs = torch.tensor(x, dtype=torch.float32)[order] / 16.0
    ys = torch.tensor(y, dtype=torch.long)[order]
    return xs[:1437], ys[:1437], xs[1437:], ys[1437:]


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def train(cfg: Config, seed: int, epochs: int, rank: int, world: int) -> dict[str, Any]:
    import commsched
    from commsched.transport import TransportOptions

    x_train, y_train, x_test, y_test = digits()
    model = mlp(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    knobs: dict[str, Any] = {}
    if cfg.policy == "dlcp":
        knobs = {"loss_bound": cfg.loss_bound, "pull_loss_bound": cfg.pull_loss_bound}
    options = TransportOptions(bind="127.0.0.1", inject_loss=cfg.inject_loss, inject_seed=seed)
    wrapped, opt = commsched.parallelize(
        model, opt, policy=cfg.policy, transport_options=options, replica_check_every=CHECK_EVERY, **knobs
    )
    local = BATCH // world
    curve = []
    start = time.perf_counter()
    for epoch in range(epochs):
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(1000 * seed + epoch))
        losses = []
        for b in range(len(order) // BATCH):
            idx = order[b * BATCH + rank * local : b * BATCH + (rank + 1) * local]
            loss = nn.functional.cross_entropy(wrapped(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        wrapped.eval()
        with torch.no_grad():
            accuracy = (wrapped(x_test).argmax(dim=1) == y_test).float().mean().item()
        wrapped.train()
        mean_loss = torch.tensor(statistics.fmean(losses))
        dist.all_reduce(mean_loss)  # the mean over both ranks' batches
        curve.append({"epoch": epoch + 1, "train_loss": mean_loss.item() / world, "test_accuracy": accuracy})
    seconds = time.perf_counter() - start
    out = {"config": asdict(cfg), "seed": seed, "rank": rank, "curve": curve, "seconds": seconds}
    out.update(losses_of(wrapped, cfg) if cfg.policy == "dlcp" else {})
    wrapped.close()
    return out


def losses_of(wrapped: Any, cfg: Config) -> dict[str, Any]:
    """This rank's loss records summed up; fails if any push or pull lost more than its bound."""
    records = wrapped.loss_records()
    stats: dict[str, Any] = {}
    for phase, bound in (("push", cfg.loss_bound), ("pull", cfg.pull_loss_bound)):
        transfers = [t for r in records for t in r.transfers if t.phase == phase and t.received_numel]
        worst = max((t.fraction for t in transfers), default=0.0)
        over = [t for t in transfers if t.lost_numel > math.floor(bound * t.received_numel)]
        if over:
            raise AssertionError(f"{cfg.name}: {len(over)} {phase}(es) above the bound {bound}, e.g. {over[0]}")
        lost, received = sum(t.lost_numel for t in transfers), sum(t.received_numel for t in transfers)
        stats[phase] = {
            "transfers": len(transfers),
            "max_lost_fraction": worst,
            "lost_fraction": lost / received if received else 0.0,
            "transfers_with_loss": sum(1 for t in transfers if t.lost_numel),
        }
    stats["datagrams_injected"] = sum(r.drops.injected for r in records)
    stats["datagrams_late"] = sum(r.drops.late for r in records)
    stats["socket_drops"] = sum(r.drops.socket or 0 for r in records)
    checks = wrapped.replica_checks
    stats["replica_checks"] = {"checks": checks.checks, "mismatches": checks.mismatches}
    return stats


def worker(rank: int, world: int, port: int, jobs: list[tuple[Config, int]], epochs: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    for cfg, seed in jobs:
        results.append(train(cfg, seed, epochs, rank, world))
        if rank == 0:
            last = results[-1]
            print(f"{cfg.name:>22} seed {seed}: accuracy {last['curve'][-1]['test_accuracy']:.4f} "
                  f"({last['seconds']:.0f} s)", flush=True)  # fmt: skip
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration (rank 0's runs; both ranks evaluate the same replica): final accuracy (mean, min, max
    over seeds) and its gap to ``ps``, the largest gap to ``ps`` at any epoch of the same seed, the final
    training loss, and the loss stats of both ranks."""
    names = list(dict.fromkeys(r["config"]["name"] for r in runs))
    ps = {r["seed"]: r for r in runs if r["config"]["name"] == "ps" and r["rank"] == 0}
    base = statistics.fmean(r["curve"][-1]["test_accuracy"] for r in ps.values())
    rows = []
    for name in names:
        mine = [r for r in runs if r["config"]["name"] == name]
        first = [r for r in mine if r["rank"] == 0]
        acc = [r["curve"][-1]["test_accuracy"] for r in first]
        gaps = [
            100 * abs(a["test_accuracy"] - b["test_accuracy"])
            for r in first
            if r["seed"] in ps
            for a, b in zip(r["curve"], ps[r["seed"]]["curve"], strict=True)
        ]
        row: dict[str, Any] = {
            "name": name,
            "config": mine[0]["config"],
            "final_accuracy_mean": statistics.fmean(acc),
            "final_accuracy_min": min(acc),
            "final_accuracy_max": max(acc),
            "gap_to_ps_points": 100 * (statistics.fmean(acc) - base),
            "largest_epoch_gap_points": max(gaps, default=0.0),
            "final_train_loss": statistics.fmean(r["curve"][-1]["train_loss"] for r in first),
        }
        for phase in ("push", "pull"):
            got = [r[phase] for r in mine if phase in r]
            if got:
                row[phase] = {
                    "max_lost_fraction": max(g["max_lost_fraction"] for g in got),
                    "lost_fraction": statistics.fmean(g["lost_fraction"] for g in got),
                }
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table BENCHMARKS.md shows, from :func:`summarize`'s rows."""
    lines = [
        "| configuration | push bound | pull bound | injected loss | final accuracy (min-max) | vs ps, points "
        "| largest gap to ps in any epoch, points | final training loss | push lost (largest one) "
        "| pull lost (largest one) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cfg, push, pull = row["config"], row.get("push", {}), row.get("pull", {})
        lost = lambda x: f"{x.get('lost_fraction', 0):.3%} ({x.get('max_lost_fraction', 0):.3%})"  # noqa: E731
        lines.append(
            f"| {row['name']} | {cfg['loss_bound']:.1%} | {cfg['pull_loss_bound']:.1%} | {cfg['inject_loss']:.1%} "
            f"| {row['final_accuracy_mean']:.2%} ({row['final_accuracy_min']:.2%}-{row['final_accuracy_max']:.2%}) "
            f"| {row['gap_to_ps_points']:+.2f} | {row['largest_epoch_gap_points']:.2f} | {row['final_train_loss']:.4f} "
            f"| {lost(push) if push else '-'} | {lost(pull) if pull else '-'} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["config"]["name"] for r in runs))
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, name in enumerate(names):
        mine = [r for r in runs if r["config"]["name"] == name and r["rank"] == 0]
        epochs = [p["epoch"] for p in mine[0]["curve"]]
        loss = [statistics.fmean(r["curve"][e]["train_loss"] for r in mine) for e in range(len(epochs))]
        acc = [statistics.fmean(r["curve"][e]["test_accuracy"] for r in mine) for e in range(len(epochs))]
        style: dict[str, Any] = {"color": plt.cm.tab10(i % 10), "linewidth": 1.2}
        if name == "ps":  # drawn last, dashed, so it shows through the lines on top of it
            style = {"color": "black", "linewidth": 1.6, "linestyle": "--", "zorder": 10}
        ax_loss.plot(epochs, loss, label=name, **style)
        ax_acc.plot(epochs, acc, label=name, **style)
    ax_loss.set(xlabel="epoch", ylabel="training loss", yscale="log", title="training loss (mean over seeds)")
    ax_acc.set(xlabel="epoch", ylabel="test accuracy", title="test accuracy (mean over seeds)")
    ax_acc.set_ylim(0.85, 1.0)
    ax_acc.legend(fontsize=7, loc="lower right")
    fig.suptitle("digits MLP, 2 ranks: lossless ps vs dlcp (emulated random loss)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--configs", nargs="+", default=[c.name for c in CONFIGS], choices=[c.name for c in CONFIGS])
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: print only)")
    parser.add_argument("--plot", type=Path, default=None, help="loss and accuracy curves (PNG)")
    parser.add_argument("--from-results", type=Path, default=None, help="table and plot of saved results, no runs")
    args = parser.parse_args()
    if args.from_results is not None:
        runs = json.loads(args.from_results.read_text())["runs"]
        print(markdown(summarize(runs)))
        if args.plot is not None:
            plot(runs, args.plot)
        return
    jobs = [(c, s) for s in args.seeds for c in CONFIGS if c.name in args.configs]
    import tempfile

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, 2, port, jobs, args.epochs, tmp)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise SystemExit(f"a rank failed (exit codes {[p.exitcode for p in procs]})")
        runs = [run for r in range(2) for run in json.loads(Path(tmp, f"rank{r}.json").read_text())]
    rows = summarize(runs)
    print(markdown(rows))
    for row in rows:
        push, pull = row.get("push", {}), row.get("pull", {})
        print(f"{row['name']:>22}  accuracy {row['final_accuracy_mean']:.4f} ({row['gap_to_ps_points']:+.2f})  "
              f"push lost {push.get('lost_fraction', 0):.4%} (max {push.get('max_lost_fraction', 0):.3%})  "
              f"pull lost {pull.get('lost_fraction', 0):.4%} (max {pull.get('max_lost_fraction', 0):.3%})")  # fmt: skip
    if args.out is not None:
        meta = {"epochs": args.epochs, "seeds": args.seeds, "batch": BATCH, "lr": LR, "momentum": MOMENTUM,
                "replica_check_every": CHECK_EVERY, "world": 2, "seconds": time.perf_counter() - start,
                "loss": "emulated at the DLCP link (TransportOptions.inject_loss), not by a network",
                "torch": torch.__version__}  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "summary": rows, "runs": runs}, indent=1) + "\n")
    if args.plot is not None:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
