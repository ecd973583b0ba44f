"""``commsched profile network``: time gloo's collectives across local processes, fit α-β, and its tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from commsched.cli.inputs import OutputFile
from commsched.cli.progress import progress


@click.command(name="network", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--world", "-n", type=click.IntRange(2), default=2, show_default=True, help="Local processes.")
@click.option("--repeats", "-r", type=click.IntRange(1), default=10, show_default=True, help="Samples per size.")
@click.option("--warmup", type=click.IntRange(0), default=2, show_default=True)
@click.option("--min-kib", type=click.IntRange(1), default=4, show_default=True, help="Smallest message, KiB.")
@click.option("--max-kib", type=click.IntRange(1), default=16384, show_default=True, help="Largest message, KiB.")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True, help="Intra-op threads per process.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=600, show_default=True, help="Seconds.")
@click.option("--cluster-out", type=OutputFile(), help="Write the fitted cluster YAML.")
@click.option("--json", "as_json", is_flag=True, help="Print the samples and fits as JSON.")
def network_command(
    world: int,
    repeats: int,
    warmup: int,
    min_kib: int,
    max_kib: int,
    threads: int,
    timeout_s: float,
    cluster_out: Path | None,
    as_json: bool,
) -> None:
    """Time all-reduce, ring reduce-scatter and all-gather across WORLD local gloo processes; fit alpha-beta.

    Sizes go from --min-kib to --max-kib by factors of 4. alpha is the cost of
    one ring step and beta seconds per byte on a link, read through the ring
    formulas (all-reduce: 2(p-1)·alpha + 2(p-1)/p·n·beta); --cluster-out writes
    a cluster whose simulated all-reduce reproduces the fit (see
    docs/profiling.md). For an emulated network with shaped links, run
    probe_network inside that testbed instead.

    \b
    Example:
      commsched profile network --world 2 --cluster-out measured.yaml
      commsched compare -m resnet5m.cpu.json -c measured.yaml --sim max_concurrent=2
    """
    from commsched.profile import OPS, probe_local

    if max_kib < min_kib:
        raise click.UsageError(f"--max-kib ({max_kib}) must be >= --min-kib ({min_kib})")
    sizes = []
    kib = min_kib
    while kib <= max_kib:
        sizes.append(kib * 1024)
        kib *= 4
    if len(sizes) < 2:
        sizes.append(max_kib * 1024 if max_kib > min_kib else min_kib * 4 * 1024)
    with progress(Console(stderr=True)) as bar:
        task = bar.add_task(f"starting {world} gloo processes on 127.0.0.1", total=None)
        probe = probe_local(
            world,
            sizes,
            repeats,
            warmup=warmup,
            threads=threads,
            timeout_s=timeout_s,
            progress=lambda line: bar.update(task, description=line, advance=1),
        )
    fits = {op: probe.fit(op) for op in OPS}
    if as_json:
        data = {
            "world_size": world,
            "alpha_s": probe.alpha_s,
            "beta_s_per_byte": probe.beta_s_per_byte,
            "bandwidth_gbps": probe.bandwidth_gbps,
            "fits": {
                op: {k: v for k, v in vars(f).items() if k != "points"} | {"bandwidth_gbps": f.bandwidth_gbps}
                for op, f in fits.items()
            },
            "samples": [
                {"op": s.op, "nbytes": s.nbytes, "median_s": s.median_s, "seconds": list(s.seconds)}
                for s in probe.samples
            ],
        }
        click.echo(json.dumps(data, indent=1))
    else:
        out = Console()
        out.print(samples_table(probe, fits))
        out.print(fits_table(fits, world))
        ar = fits["all_reduce"]
        out.print(
            f"alpha = {ar.alpha_s * 1e6:.1f} µs per ring step, beta = {ar.beta_s_per_byte:.3g} s/byte "
            f"= {ar.bandwidth_gbps:.2f} Gbit/s (all-reduce fit, {world} processes, gloo over 127.0.0.1)"
        )
    if cluster_out is not None:
        probe.cluster().save(cluster_out)
        Console(stderr=True).print(f"cluster written to {cluster_out}")


def samples_table(probe: Any, fits: dict[str, Any]) -> Table:
    table = Table(title=f"median ms of the slowest of {probe.world_size} ranks", box=box.SIMPLE_HEAD)
    table.add_column("size", justify="right")
    for op in fits:
        table.add_column(op, justify="right")
        table.add_column("fit", justify="right", style="dim")
    by_size: dict[int, dict[str, float]] = {}
    for s in probe.samples:
        by_size.setdefault(s.nbytes, {})[s.op] = s.median_s
    for nbytes, row in sorted(by_size.items()):
        cells = [_kib(nbytes)]
        for op, fit in fits.items():
            cells += [f"{row[op] * 1e3:.3f}" if op in row else "-", f"{fit.predict_s(nbytes) * 1e3:.3f}"]
        table.add_row(*cells)
    return table


def fits_table(fits: dict[str, Any], world: int) -> Table:
    table = Table(title=f"alpha-beta fits, ring formulas, p = {world}", box=box.SIMPLE_HEAD)
    for column in ("op", "alpha µs/step", "beta s/byte", "Gbit/s", "intercept ms", "rel. residual"):
        table.add_column(column, justify="left" if column == "op" else "right", no_wrap=True)
    for op, f in fits.items():
        table.add_row(
            op,
            f"{f.alpha_s * 1e6:.1f}",
            f"{f.beta_s_per_byte:.3g}",
            f"{f.bandwidth_gbps:.2f}",
            f"{f.intercept_s * 1e3:.3f}",
            f"{f.relative_residual:.1%}",
        )
    return table


def _kib(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:g} KiB"
