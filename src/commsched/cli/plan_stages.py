"""``commsched plan``'s output for a plan with pipeline stages."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from commsched.cli.simulate import format_bytes
from commsched.plan.staged import StagedPlan


def stages_table(plan: StagedPlan) -> Table:
    layers = plan.plan.workload.layers
    table = Table(title=f"stages · {plan.model} · {plan.cluster} · global batch {plan.global_batch}")
    for column in ("stage", "first layer", "last layer", "layers", "held by ranks"):
        table.add_column(column)
    for s in range(plan.layout.num_stages):
        span = plan.layout.layers_of(s, len(layers))
        holders = " ".join(str(r) for r in plan.layout.holders(s))
        table.add_row(str(s), layers[span.start].name, layers[span.stop - 1].name, str(len(span)), holders)
    return table


def pipelines_table(plan: StagedPlan) -> Table:
    table = Table(title=f"pipelines · schedule {plan.layout.schedule}")
    for column in ("pipeline", "ranks", "stages per rank", "batch", "micro-batches", "predicted ms"):
        table.add_column(column, justify="right" if column in ("batch", "micro-batches", "predicted ms") else "left")
    for i, (pipe, ms) in enumerate(zip(plan.layout.pipelines, plan.pipeline_ms, strict=True)):
        stages = " | ".join(",".join(map(str, pipe.stages_of(k, plan.layout.num_stages))) for k in range(pipe.depth))
        ranks = " ".join(map(str, pipe.ranks))
        table.add_row(str(i), ranks, stages, str(pipe.batch_size), str(pipe.micro_batches), f"{ms:.2f}")
    return table


def memory_table(plan: StagedPlan) -> Table:
    table = Table(title="memory per rank")
    for column in ("rank", "used / usable"):
        table.add_column(column)
    for r, (used, usable) in enumerate(zip(plan.used_bytes, plan.usable_bytes, strict=True)):
        table.add_row(str(r), f"{format_bytes(used)} / {format_bytes(usable)}")
    return table


def print_staged(console: Console, plan: StagedPlan, written: Path | None) -> None:
    console.print(f"data parallelism refused: {plan.dp_refusal}", markup=False)
    console.print(stages_table(plan))
    console.print(pipelines_table(plan))
    console.print(memory_table(plan))
    console.print(
        f"predicted {plan.iteration_ms:.2f} ms per iteration ({plan.samples_per_s:,.0f} samples/s): slowest "
        f"pipeline {max(plan.pipeline_ms):.2f} ms + stage all-reduces {plan.sync_ms:.2f} ms; "
        f"{plan.candidates} layouts tried in {plan.search_s:.2f} s"
    )
    for note in plan.notes:
        console.print(f"note: {note}", markup=False)
    if written:
        console.print(
            f"plan written to {written} (stages included): parallelize(sequential_model, opt, plan=...), "
            "then model.train_step(x, y, loss_fn)"
        )
