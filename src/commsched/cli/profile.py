"""``commsched profile``: measure a model layer by layer, the network's α-β, and compare traces."""

from __future__ import annotations

import importlib
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from commsched.cli.inputs import OutputFile
from commsched.cli.progress import progress
from commsched.errors import SpecError
from commsched.trace import Trace

if TYPE_CHECKING:
    from commsched.trace.compare import TaskComparison

_SETTINGS = {"help_option_names": ["-h", "--help"]}

#: Zoo models that torchvision builds (``weights=None``), with their input side.
TORCHVISION_MODELS = {
    "resnet18": 224,
    "resnet50": 224,
    "resnet152": 224,
    "vgg16": 224,
    "vgg19": 224,
    "densenet201": 224,
    "inception_v3": 299,
}


def _small_models() -> Any:
    try:
        return importlib.import_module("commsched.models")
    except ImportError:
        return None


def model_names() -> list[str]:
    """Models ``commsched profile --model`` can build here."""
    models = _small_models()
    names = list(models.MODELS) if models is not None else []
    if importlib.util.find_spec("torchvision") is not None:
        names += list(TORCHVISION_MODELS)
    return names


def build(name: str, batch_size: int, seed: int) -> tuple[Any, Callable[[], Any], Callable[[Any, Any], Any]]:
    """``(model, make_batch, loss_fn)`` for a model of ``commsched.models`` or, with torchvision, a zoo CNN."""
    import torch
    import torch.nn.functional as F

    models = _small_models()
    if models is not None and name in models.MODELS:
        model = models.build_model(name, seed=seed)
        return model, lambda: models.synthetic_batch(name, batch_size, seed, 0, 0), models.model_loss
    if name in TORCHVISION_MODELS:
        try:
            tv = importlib.import_module("torchvision.models")
        except ImportError:
            raise SpecError("model", [f"{name!r} needs torchvision, which is not installed"]) from None
        side = TORCHVISION_MODELS[name]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            extra = {"aux_logits": True, "init_weights": False} if name == "inception_v3" else {}
            model = tv.get_model(name, weights=None, **extra)
        g = torch.Generator().manual_seed(seed)

        def make_batch() -> tuple[Any, Any]:
            images = torch.randn(batch_size, 3, side, side, generator=g)
            return images, torch.randint(0, 1000, (batch_size,), generator=g)

        def loss_fn(output: Any, target: Any) -> Any:
            if hasattr(output, "aux_logits") and output.aux_logits is not None:  # inception_v3 in train mode
                return F.cross_entropy(output.logits, target) + 0.4 * F.cross_entropy(output.aux_logits, target)
            return F.cross_entropy(output, target)

        return model, make_batch, loss_fn
    known = ", ".join(model_names()) or "none"
    hint = "" if "resnet50" in known else " (zoo CNNs need torchvision)"
    raise SpecError("model", [f"no model {name!r} to build; known: {known}{hint}"])


@click.group(name="profile", invoke_without_command=True, context_settings=_SETTINGS)
@click.option("--model", "-m", "model_name", metavar="NAME", help="Model to build and profile (see --list).")
@click.option("--batch", "-b", "batch_size", type=click.IntRange(1), help="Batch size (per worker).")
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True, help="bf16: autocast.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--repeats", "-r", type=click.IntRange(1), default=10, show_default=True, help="Timed iterations.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True, help="Untimed iterations first.")
@click.option("--threads", type=click.IntRange(1), help="torch.set_num_threads (default: torch's choice).")
@click.option("--seed", type=int, default=0, show_default=True, help="Weights and synthetic batch.")
@click.option("--out", "-o", type=OutputFile(), help="Write the Workload JSON here.")
@click.option("--list", "list_models", is_flag=True, help="List the models that can be profiled here.")
@click.pass_context
def command(
    ctx: click.Context,
    model_name: str | None,
    batch_size: int | None,
    dtype: str,
    device: str,
    repeats: int,
    warmup: int,
    threads: int | None,
    seed: int,
    out: Path | None,
    list_models: bool,
) -> None:
    """Measure per-layer forward/backward and gradient-ready times of a model (a Workload JSON).

    \b
    Examples:
      commsched profile --model resnet5m --batch 8 --out resnet5m.cpu.json
      commsched profile --model cnn --batch 32 --dtype bf16 --repeats 20
      commsched profile network --world 2          # the network's alpha-beta
      commsched profile compare-trace --predicted sim.json --measured run.json

    The table lists each layer's median forward and backward time, when its
    last gradient is ready (ms from the start of backward) and its parameters;
    the last line compares the sum of layer times with a whole iteration
    measured without hooks. See docs/profiling.md.
    """
    if ctx.invoked_subcommand is not None:
        if model_name is not None or batch_size is not None:
            raise click.UsageError("--model/--batch profile a model; leave them out with a subcommand")
        return
    console = Console()
    if list_models:
        for name in model_names():
            console.print(name)
        return
    if model_name is None or batch_size is None:
        raise click.UsageError("give --model NAME and --batch B (or a subcommand: network, compare-trace)")

    import torch

    from commsched.profile import iteration_check, profile_model, zoo_filename

    if threads is not None:
        torch.set_num_threads(threads)
    model, make_batch, loss_fn = build(model_name, batch_size, seed)
    model.to(device)
    model.train()
    with progress(Console(stderr=True)) as bar:
        task = bar.add_task(f"profiling {model_name} (batch {batch_size}, {dtype}, {device})", total=1)

        def step(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        workload = profile_model(
            model,
            make_batch,
            loss_fn,
            batch_size=batch_size,
            model_name=model_name,
            device=device,
            dtype=dtype,
            warmup=warmup,
            repeats=repeats,
            command=shlex.join(["commsched", *sys.argv[1:]]),
            progress=step,
        )
    console.print(workload_table(workload))
    check = iteration_check(workload)
    console.print(
        f"sum of layers {check.layer_sum_ms:.2f} ms; whole iteration without hooks {check.iteration_ms:.2f} ms "
        f"(ratio {check.ratio:.3f}, {'ok' if check.ok() else 'off by more than 20 %'}); "
        f"with hooks {check.profiled_iteration_ms:.2f} ms"
    )
    console.print(f"[dim]{workload.provenance.source}; {workload.provenance.method}[/dim]")
    if out is not None:
        workload.save(out)
        console.print(f"workload written to {out}")
    else:
        console.print(f"[dim]not written; --out {zoo_filename(workload)} would keep it[/dim]")


def workload_table(workload: Any) -> Table:
    table = Table(
        title=f"{workload.model}, batch {workload.batch_size}, {workload.dtype} on {workload.device}",
        box=box.SIMPLE_HEAD,
    )
    for column in ("#", "layer", "fwd ms", "bwd ms", "ready ms", "params"):
        table.add_column(column, justify="left" if column == "layer" else "right", no_wrap=column != "layer")
    for i, layer in enumerate(workload.layers):
        ready = f"{max(layer.grad_ready_ms):.2f}" if layer.grad_ready_ms else "-"
        table.add_row(
            str(i), layer.name, f"{layer.forward_ms:.3f}", f"{layer.backward_ms:.3f}", ready, f"{layer.numel:,}"
        )
    total = (f"{workload.forward_ms:.2f}", f"{workload.backward_ms:.2f}", "", f"{workload.num_params:,}")
    table.add_row("", "[bold]total[/bold]", *total)
    table.caption = "ready: when the layer's last gradient is final, from the start of backward"
    return table


# ---------------------------------------------------------------- network


@command.command(name="network", context_settings=_SETTINGS)
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


# ---------------------------------------------------------------- compare traces


@command.command(name="compare-trace", context_settings=_SETTINGS)
@click.option("--predicted", "-p", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--measured", "-m", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--skip-predicted", type=click.IntRange(0), default=0, show_default=True, help="Leading iterations.")
@click.option("--skip-measured", type=click.IntRange(0), default=0, show_default=True, help="Leading iterations.")
@click.option("--kind", "kinds", multiple=True, help="Only these event kinds (repeatable), e.g. all_reduce.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows and summary as JSON.")
def compare_trace_command(
    predicted: Path, measured: Path, skip_predicted: int, skip_measured: int, kinds: tuple[str, ...], as_json: bool
) -> None:
    """Predicted vs measured, task by task: median duration of each (kind, task) and the error.

    PREDICTED is a trace from `commsched simulate --trace`, MEASURED one from
    the runtime (`parallelize(..., trace=True)`, `model.trace.save(...)`);
    both native or Chrome JSON. error % = (predicted - measured) / measured.

    \b
    Example:
      commsched profile compare-trace -p sim.json -m run.json --skip-measured 3
    """
    from commsched.trace.compare import compare_traces, summarize, trace_iteration_ms

    pred_trace, meas_trace = _load_trace(predicted), _load_trace(measured)
    rows = compare_traces(
        pred_trace,
        meas_trace,
        skip_predicted=skip_predicted,
        skip_measured=skip_measured,
        kinds=kinds or None,
    )
    require_common_tasks(rows, skip_measured)
    iter_pred = trace_iteration_ms(pred_trace, skip_predicted)
    iter_meas = trace_iteration_ms(meas_trace, skip_measured)
    if as_json:
        data = {
            "rows": [{**vars(r), "error_pct": r.error_pct} for r in rows],
            "summary": vars(summarize(rows)),
            "iteration_ms": {"predicted": iter_pred, "measured": iter_meas},
        }
        click.echo(json.dumps(data, indent=1))
        return
    console = Console()
    console.print(comparison_table(rows, f"{predicted.name} (predicted) vs {measured.name} (measured)"))
    console.print(comparison_summary(rows, iter_pred, iter_meas))


def require_common_tasks(rows: Sequence[TaskComparison], skip_measured: int) -> None:
    """Refuse a comparison in which no task is in both traces: name a few tasks of each side instead."""
    if any(r.predicted_ms is not None and r.measured_ms is not None for r in rows):
        return

    def some(side: list[TaskComparison]) -> str:
        names = [f"{r.kind} {r.task}" for r in side[:4]]
        return ", ".join(names) + (f" and {len(side) - 4} more" if len(side) > 4 else "") if names else "none"

    predicted = [r for r in rows if r.predicted_ms is not None]
    measured = [r for r in rows if r.measured_ms is not None]
    raise click.ClickException(
        "no task of the measured trace matches a predicted one (tasks are matched on kind and name).\n"
        f"  predicted: {some(predicted)}\n"
        f"  measured (after --skip-measured {skip_measured}): {some(measured)}\n"
        "Was the trace recorded with the same policy, knobs and model?"
    )


def comparison_table(rows: Sequence[TaskComparison], title: str) -> Table:
    """One row per task: predicted and measured median ms, error %, event counts."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for column in ("kind", "task", "predicted ms", "measured ms", "error %", "n pred", "n meas"):
        table.add_column(column, justify="left" if column in ("kind", "task") else "right")
    for r in rows:
        err = r.error_pct
        table.add_row(
            r.kind,
            r.task,
            "-" if r.predicted_ms is None else f"{r.predicted_ms:.3f}",
            "-" if r.measured_ms is None else f"{r.measured_ms:.3f}",
            "-" if err is None else f"{err:+.1f}",
            str(r.predicted_count),
            str(r.measured_count),
        )
    return table


def comparison_summary(
    rows: Sequence[TaskComparison], iteration_predicted_ms: float | None, iteration_measured_ms: float | None
) -> str:
    """One line: tasks matched, median and time-weighted |error|, and the iteration times when known."""
    from commsched.trace.compare import summarize

    summary = summarize(rows)
    parts = [f"{summary.matched} task(s) in both"]
    if summary.only_predicted or summary.only_measured:
        parts.append(f"{summary.only_predicted} only predicted, {summary.only_measured} only measured")
    if summary.median_abs_error_pct is not None:
        parts.append(f"median |error| {summary.median_abs_error_pct:.1f} %")
    if summary.weighted_error_pct is not None:
        parts.append(f"time-weighted |error| {summary.weighted_error_pct:.1f} %")
    line = "; ".join(parts)
    if iteration_predicted_ms is not None and iteration_measured_ms is not None:
        error = (iteration_predicted_ms - iteration_measured_ms) / iteration_measured_ms * 100
        line += (
            f"\niteration: predicted {iteration_predicted_ms:.2f} ms, measured {iteration_measured_ms:.2f} ms "
            f"({error:+.1f} %)"
        )
    return line


def _load_trace(path: Path) -> Trace:
    try:
        return Trace.load(path)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SpecError(str(path), [f"<file>: not a commsched trace ({exc})"]) from None
