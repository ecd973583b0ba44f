"""``commsched compare-trace`` (also ``commsched profile compare-trace``): predicted vs measured, task by task.

Its table and summary line serve ``commsched compare --measured`` too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich import box
from rich.console import Console
from rich.table import Table

from commsched.errors import SpecError
from commsched.trace import Trace

if TYPE_CHECKING:
    from commsched.trace.compare import TaskComparison


@click.command(name="compare-trace", context_settings={"help_option_names": ["-h", "--help"]})
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
