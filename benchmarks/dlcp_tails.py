"""Round-time tails, communication only: ps over TCP vs DLCP (PS mode), gloo all-reduce vs DLCP (collective mode).

Senders in network namespaces sleep for the model's profiled forward +
backward, then exchange its gradient, round after round, through the
emulated switch; scenarios lossless, 1 % random loss and incast into one
server with a shallow ECN/drop threshold (``commsched.bench.tails_run``).
Writes tails.json (every round time) under --out and a plot, and prints
p50/p99 per method and the ratios against the DLCP targets. Needs root.

    sudo .venv/bin/python benchmarks/dlcp_tails.py                        # 4 senders, 1000 rounds (hours)
    sudo .venv/bin/python benchmarks/dlcp_tails.py --senders 2 --rounds 20 --warmup 3 --grad-mib 0.25 \\
        --out /tmp/tails --plot /tmp/tails/tails.png                      # a quick check
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from commsched.bench.tails import METHODS
from commsched.bench.tails_report import plot
from commsched.bench.tails_run import TailsConfig, run_tails
from commsched.testbed import netns_unavailable_reason, parse_rate
from commsched.testbed.switch import SwitchShape, switch_unavailable_reason

ROOT = Path(__file__).resolve().parents[1]


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@click.command()
@click.option("--senders", type=click.IntRange(2, 64), default=4, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=1000, show_default=True, help="timed rounds per method")
@click.option("--warmup", type=click.IntRange(1), default=20, show_default=True, help="untimed rounds first")
@click.option("--model", default="cnn", show_default=True, help="commsched.models model: its gradient, its compute")
@click.option("--compute-ms", type=click.FloatRange(0), default=None, help="sleep per round [default: profiled]")
@click.option("--grad-mib", type=click.FloatRange(0, min_open=True), default=None, help="[default: the model's]")
@click.option("--partition-mib", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True)
@click.option(
    "--split-tensors/--whole-tensors",
    default=False,
    show_default=True,
    help="cut a tensor larger than --partition-mib into pieces, as the ps and dlcp policies do",
)
@click.option("--loss-bound", type=click.FloatRange(0, 1, max_open=True), default=0.01, show_default=True)
@click.option("--rate", default="300mbit", show_default=True, help="link and switch port rate")
@click.option("--loss", type=click.FloatRange(0, 100, max_open=True), default=1.0, show_default=True, help="%")
@click.option("--queue-pkts", type=click.IntRange(1), default=20, show_default=True, help="incast: threshold K")
@click.option("--buffer-pkts", type=click.IntRange(2), default=80, show_default=True, help="incast: port buffer")
@click.option("--scenarios", default="lossless,loss,incast", show_default=True)
@click.option("--methods", default=",".join(METHODS), show_default=True)
@click.option("--timeout", type=click.FloatRange(1), default=60.0, show_default=True, help="s, per exchange")
@click.option("--mtu", type=click.IntRange(576, 65535), default=1500, show_default=True, help="9000: jumbo frames")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=ROOT / "benchmarks" / "results" / "dlcp-tails",
    show_default=True,
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="[default: OUT/tails.png]",
)
def main(
    senders: int, rounds: int, warmup: int, model: str, compute_ms: float | None, grad_mib: float | None,
    partition_mib: float, split_tensors: bool, loss_bound: float, rate: str, loss: float, queue_pkts: int,
    buffer_pkts: int, scenarios: str, methods: str, timeout: float, mtu: int, out: Path, plot_path: Path | None,
) -> None:  # fmt: skip
    """Round-time tails of ps, DLCP and gloo on the emulated testbed (see the module docstring)."""
    reason = netns_unavailable_reason()
    if reason is not None:
        raise click.UsageError(f"the testbed cannot run here: {reason}")
    try:
        rate_bps = parse_rate(rate)
        if rate_bps is None:
            raise ValueError(f"rate: the scenarios shape the links, give a rate, got {rate!r}")
        config = TailsConfig(
            senders=senders, rounds=rounds, warmup=warmup, model=model, compute_ms=compute_ms, grad_mib=grad_mib,
            partition_mib=partition_mib, split_tensors=split_tensors, loss_bound=loss_bound, rate_bps=rate_bps,
            loss_pct=loss, queue_pkts=queue_pkts, buffer_pkts=buffer_pkts, scenarios=_csv(scenarios),
            methods=_csv(methods), timeout_s=timeout, mtu_bytes=mtu,
        )  # fmt: skip
        port = SwitchShape(rate_bps=rate_bps, queue_pkts=queue_pkts, buffer_pkts=buffer_pkts, loss_pct=loss)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    reason = switch_unavailable_reason(port)  # the switch ports and the loss rules: nftables
    if reason is not None:
        raise click.UsageError(reason)
    report = run_tails(config, out, command_line=shlex.join(["python", *sys.argv]))
    plot_path = plot_path or out / "tails.png"
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    plot(report, plot_path)
    print(f"{'scenario':10} {'method':8} {'p50 ms':>8} {'p99 ms':>8} {'comm p99':>9} {'CPU ms/round':>13}  "
          "datagrams/CPU-s")  # fmt: skip
    for name, entry in report["scenarios"].items():
        for method, m in entry["methods"].items():
            rate_cell = f"{m['datapath']['datagrams_per_cpu_s_median']:,.0f}" if "datapath" in m else ""
            cpu = m.get("cpu_ms_per_round")  # the busiest rank's process (benchmarks/tails_cpu.py: every rank)
            cpu_cell = f"{cpu['max']:.1f}" if cpu is not None else ""
            r, c = m["round"], m["comm"]
            print(f"{name:10} {method:8} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {c['p99_ms']:9.1f} {cpu_cell:>13}  "
                  f"{rate_cell}")  # fmt: skip
    print("\n".join(report["ratios"]))
    print(f"wrote {out / 'tails.json'} and {plot_path}")


if __name__ == "__main__":
    main()
