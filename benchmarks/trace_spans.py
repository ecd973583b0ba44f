"""Where a policy's iteration goes beyond compute, per rank, from the traces ``commsched bench`` writes.

    python benchmarks/trace_spans.py RUN/trace-none-ddp.json RUN/trace-none-wfbp.json ...

Each trace (``trace-SHAPING-POLICY.json``, Chrome format, or a gzipped copy)
holds every rank's forward and backward per layer and every communication
task, per iteration. Per trace and rank, medians over the iterations after
``--skip`` (the warm-up's):

* ``fwd+bwd``: from the iteration's first forward to its backward's end on
  that rank. It holds the compute and whatever the training thread did or
  waited for meanwhile: the runtime's hooks (filling buffers, starting
  tasks), and the time other threads and the kernel's network path took
  from its core;
* ``forward`` and ``backward``: the sums of the layers' intervals (a
  backward interval ends at a layer's last gradient, so the hook work before
  it falls inside it);
* ``tail``: from the backward's end to the last task's end on that rank;
* ``to next``: from that to the next iteration's first forward (the
  optimizer step and ``zero_grad``, and any wait for the other ranks).

Each rank's times count from its own start, so the ranks are not compared
moment by moment.

Set two policies' rows side by side: the growth of ``fwd+bwd`` under the
policy of more messages, against the same model's under ``ddp``, is what its
messages cost compute.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from pathlib import Path

from commsched.trace import COMM_KINDS, Trace, TraceEvent

COLUMNS = ("fwd+bwd", "forward", "backward", "tail", "to next")


def spans(trace: Trace, skip: int) -> dict[int, dict[str, float]]:
    """Per rank, the medians of the module docstring over the iterations after ``skip`` that have a next."""
    per: dict[tuple[int, int], list[TraceEvent]] = {}
    for e in trace.events:
        per.setdefault((e.worker, e.iteration), []).append(e)
    ranks = sorted({w for w, _ in per})
    iterations = sorted({i for _, i in per if i >= skip and all((w, i) in per for w in ranks)})
    for w in ranks:
        for i in iterations:
            if not {"forward", "backward"} <= {e.kind for e in per[(w, i)]}:
                raise SystemExit(f"rank {w}, iteration {i}: the trace has no forward or no backward there")
    rows: dict[int, dict[str, list[float]]] = {w: {c: [] for c in COLUMNS} for w in ranks}
    for i, nxt in itertools.pairwise(iterations):
        for w in ranks:
            events = per[(w, i)]
            backward = [e for e in events if e.kind == "backward"]
            forward = [e for e in events if e.kind == "forward"]
            start = min(e.start_s for e in forward)
            end = max(e.end_s for e in backward)
            last = max((e.end_s for e in events if e.kind in COMM_KINDS), default=end)
            following = min(e.start_s for e in per[(w, nxt)] if e.kind == "forward")
            cells = rows[w]
            cells["fwd+bwd"].append(end - start)
            cells["forward"].append(sum(e.duration_s for e in forward))
            cells["backward"].append(sum(e.duration_s for e in backward))
            cells["tail"].append(max(last - end, 0.0))
            cells["to next"].append(following - max(last, end))
    return {
        w: {c: statistics.median(v) * 1e3 if v else float("nan") for c, v in cols.items()} for w, cols in rows.items()
    }


def table(paths: list[Path], skip: int) -> str:
    header = "| trace | rank | " + " | ".join(f"{c} ms" for c in COLUMNS) + " |"
    lines = [header, "|---|---:" + "|---:" * len(COLUMNS) + "|"]
    for path in paths:
        trace = Trace.load(path)
        label = str(trace.meta.get("policy") or path.name)
        for rank, cells in spans(trace, skip).items():
            lines.append(f"| {label} | {rank} | " + " | ".join(f"{cells[c]:.1f}" for c in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", type=Path, help="trace files written by commsched bench")
    parser.add_argument("--skip", type=int, default=4, help="leading iterations left out (default: %(default)s)")
    args = parser.parse_args()
    if args.skip < 0:
        parser.error(f"--skip: must be >= 0, got {args.skip}")
    for path in args.traces:
        if not path.is_file():
            parser.error(f"{path}: no such file")
    print(table(args.traces, args.skip))


if __name__ == "__main__":
    main()
