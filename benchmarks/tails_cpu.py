"""Each rank's CPU and I/O-loop work per round in saved runs of ``benchmarks/dlcp_tails.py``.

    python benchmarks/tails_cpu.py RUN [RUN ...]

For every scenario and method of each run, one row per rank: its process's CPU time per timed round
(``cpu_s`` over the timed rounds: every thread, the transport's included), how much of it was user space and
how much kernel, and its threads' voluntary context switches per round (each a wait for a socket, a timer or a
lock; runs saved before these were recorded leave the three blank); and for a DLCP link its counters per round
over the whole run (warm-up included, as the link counts them): turns of the I/O loop, those that found no
socket ready, turns that found this host's queue full, send and receive system calls, datagrams sent and
received. A run's folder is what ``--out`` named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

COUNTERS = (
    ("turns", "turns"),
    ("idle", "idle_turns"),
    ("queue full", "host_queue_full"),
    ("send calls", "send_calls"),
    ("recv calls", "recv_calls"),
    ("sent", "sent"),
    ("received", "received"),
)


def rank_rows(method_dir: Path) -> list[dict[str, Any]]:
    """Per rank of one method's launch: its rank, whether it served, CPU ms per timed round, counters per round."""
    job = json.loads((method_dir / "job.json").read_text())
    rows = []
    for path in sorted(method_dir.glob("rank*.json"), key=lambda p: int(p.stem[4:])):
        data = json.loads(path.read_text())
        rounds = len(data["starts_s"])
        row: dict[str, Any] = {
            "rank": data["rank"],
            "server": bool(data.get("server")),
            "cpu_ms": 1e3 * data["cpu_s"] / job["rounds"],
        }
        for label, key, scale in (("user_ms", "user_s", 1e3), ("system_ms", "system_s", 1e3), ("waits", "waits", 1)):
            row[label] = scale * data[key] / job["rounds"] if key in data else None
        dlcp = data.get("dlcp")
        for label, key in COUNTERS:
            row[label] = dlcp[key] / rounds if dlcp is not None else None
        rows.append(row)
    return rows


def table(run: Path) -> list[str]:
    """Markdown rows for one run: scenario, method, rank, CPU ms per timed round, DLCP's counters per round."""
    if not (run / "tails.json").is_file():
        raise click.BadParameter(f"{run} holds no tails.json: not a run of benchmarks/dlcp_tails.py", param_hint="RUN")
    scenarios = json.loads((run / "tails.json").read_text())["scenarios"]
    out = []
    for scenario, result in scenarios.items():
        for method in result["methods"]:
            for row in rank_rows(run / scenario / method):
                rank = f"{row['rank']}" + (" (server)" if row["server"] else "")
                split = [_cell(row[k], ".1f") for k in ("user_ms", "system_ms")] + [_cell(row["waits"], ".0f")]
                counts = [_cell(row[label], ".0f") for label, _ in COUNTERS]
                cells = [run.name, scenario, method, rank, f"{row['cpu_ms']:.1f}", *split, *counts]
                out.append("| " + " | ".join(cells) + " |")
    return out


def _cell(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


@click.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True, path_type=Path))
def main(runs: tuple[Path, ...]) -> None:
    labels = " | ".join(label for label, _ in COUNTERS)
    print(f"| run | scenario | method | rank | CPU ms per round | user ms | kernel ms | waits | {labels} |")
    print("|---|---|---|---|---:|---:|---:|---:|" + "---:|" * len(COUNTERS))
    for run in runs:
        for line in table(run):
            print(line)


if __name__ == "__main__":
    main()
