"""``commsched bench --plan``: the options of the heterogeneous testbed and the run (:mod:`commsched.bench.hetero`)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click
from rich.console import Console

from commsched.bench.hetero import DEFAULT_CPU, DEFAULT_LINKS, HeteroBenchConfig, run_hetero_bench
from commsched.bench.hetero_report import markdown, tables, targets
from commsched.cli.progress import progress
from commsched.errors import CommschedError
from commsched.schedule import CommPlan
from commsched.testbed import CpuShare, LinkShape, cgroups_unavailable_reason, netns_unavailable_reason, parse_rate

CPU_HELP = (
    "with --plan: per worker, CORES@PERCENT (cores 0 or 0+1; percent of one core per 10 ms period), comma list "
    "[default: the first core @100, the second @25 twice]"
)
LINKS_HELP = "with --plan: per worker, the link rate (tc units: 3gbit, 100mbit, none), comma list [3gbit,1gbit,1gbit]"


def parse_cpu(text: str) -> tuple[CpuShare, ...]:
    """``"0@100,1@25,1@25"`` -> one CpuShare per worker; ValueError naming the entry."""
    shares = []
    for i, item in enumerate(text.split(",")):
        cores, _, percent = item.strip().partition("@")
        try:
            cpus = tuple(int(c) for c in cores.split("+")) if cores not in ("", "any") else None
            quota = float(percent) / 100 if percent else None
            shares.append(CpuShare(cpus=cpus, quota=quota))
        except ValueError as exc:
            raise ValueError(f"entry {i} ({item.strip()!r}): expected CORES@PERCENT such as 1@25 ({exc})") from None
    return tuple(shares)


def default_cpu() -> tuple[CpuShare, ...]:
    """:data:`DEFAULT_CPU` on this machine's first two usable cores."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return DEFAULT_CPU
    first, second = cores[0], cores[1]
    return tuple(CpuShare(cpus=(first if s.cpus == (0,) else second,), quota=s.quota) for s in DEFAULT_CPU)


def run(
    *,
    plan: str,
    model: str,
    worker_cpu: str | None,
    worker_links: str | None,
    global_batch: int | None,
    budget_s: float,
    iters: int,
    warmup: int,
    repeats: int,
    threads: int,
    seed: int,
    comm_timeout: float,
    out_dir: Path,
) -> None:
    """Parse, check and run ``commsched bench --plan``; print the tables."""
    if plan != "auto" and not Path(plan).is_file():
        raise click.BadParameter(f"no such plan file: {plan} (or 'auto')", param_hint="'--plan'")
    try:
        cpu = parse_cpu(worker_cpu) if worker_cpu else default_cpu()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--worker-cpu'") from None
    try:
        links = tuple(LinkShape(rate_bps=parse_rate(b)) for b in worker_links.split(",")) if worker_links else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--worker-links'") from None
    links = links or (DEFAULT_LINKS if len(cpu) == len(DEFAULT_LINKS) else tuple(LinkShape() for _ in cpu))
    if plan != "auto":
        try:
            sizes = CommPlan.load(plan).batch_sizes
        except CommschedError as exc:
            raise click.BadParameter(str(exc), param_hint="'--plan'") from None
        if sizes is not None and len(sizes) != len(cpu):
            raise click.BadParameter(
                f"the plan has batches for {len(sizes)} ranks, the testbed {len(cpu)} workers (--worker-cpu)",
                param_hint="'--plan'",
            )
    for reason in (netns_unavailable_reason(), cgroups_unavailable_reason()):
        if reason is not None:
            raise click.UsageError(f"--plan needs the heterogeneous testbed: {reason}")
    try:
        config = HeteroBenchConfig(
            plan=plan,
            model=model,
            cpu=cpu,
            links=links,
            global_batch=global_batch or 16 * len(cpu),
            iters=iters,
            warmup=warmup,
            repeats=repeats,
            threads=threads,
            seed=seed,
            comm_timeout_s=comm_timeout,
            budget_s=budget_s,
        )
    except ValueError as exc:
        raise click.UsageError(f"--plan: {exc}") from None
    console = Console(width=None if sys.stdout.isatty() else 150)
    with progress(console) as bar:
        task = bar.add_task("bench --plan", total=None)
        report = run_hetero_bench(
            config,
            out_dir,
            command_line=shlex.join(["commsched", *sys.argv[1:]]),
            log=lambda message: console.print(message, markup=False, highlight=False),
            tick=lambda: bar.update(task),
        )
    for table in tables(report):
        console.print(table)
    for text, met in targets(report):
        console.print(f"{'met' if met else 'NOT met'}: {text}", markup=False, highlight=False)
    if "command" in report["plan"]:
        console.print(f"the plan, made again: (cd {out_dir} && {report['plan']['command']})", markup=False)
    (out_dir / "hetero.md").write_text(markdown(report) + "\n")
    console.print(f"wrote {out_dir / 'hetero.json'}, {out_dir / 'hetero.md'} and {out_dir / 'plan.json'}")
