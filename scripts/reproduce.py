"""Simulate DeAR's and Prophet's experiments and print (or write) the tables of ``docs/reproduction.md``.

DeAR (Zhang et al., ICDCS 2023): its five models on 16 nodes x 4 GPUs, on 10 Gbit/s Ethernet and on
100 Gbit/s InfiniBand (presets ``64xV100-10GbE``, ``64xV100-100GbIB``), policies wfbp, mgwfbp,
bytescheduler, horovod, ddp and dear at their defaults, and bytescheduler, ddp and dear with knobs
searched by ``commsched.plan.tune``; ``commsched.sim.ideal``'s lower bound beside them.

Prophet (Zhang et al., ICPP 2021): its four models on the parameter-server preset ``ec2-ps-3gbps``
with the simulator's ``ps`` algorithm, policies wfbp (FIFO: each gradient pushed and pulled as soon
as it is ready, in generation order), bytescheduler and prophet at their defaults, and bytescheduler
with its knobs searched (ByteScheduler tunes its credit by default).

Run from the repository root::

    PYTHONPATH=src python scripts/reproduce.py                 # print every table
    PYTHONPATH=src python scripts/reproduce.py --write-doc     # and rewrite them in docs/reproduction.md
    PYTHONPATH=src python scripts/reproduce.py --section heterog   # HeteroG's setup (scripts/reproduce_heterog.py)
    PYTHONPATH=src python scripts/reproduce.py --section dear --models resnet50

Everything is deterministic (the knob search is seeded), so the document can be checked against
the code: ``tests/test_reproduction.py`` recomputes some rows.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commsched import zoo
from commsched.cluster import load_cluster
from commsched.plan.tune import tune
from commsched.sim import simulate
from commsched.sim.ideal import ideal

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the HeteroG section lives beside this script
import reproduce_heterog as heterog  # noqa: E402

DOC = ROOT / "docs" / "reproduction.md"

ITERATIONS = 10
WARMUP = 3
TRIALS = 20

DEAR_MODELS = ("resnet50", "densenet201", "inception_v4", "bert_base", "bert_large")
DEAR_CLUSTERS = ("64xV100-10GbE", "64xV100-100GbIB")
DEAR_POLICIES = ("wfbp", "mgwfbp", "bytescheduler", "horovod", "ddp", "dear")
DEAR_TUNED = ("bytescheduler", "ddp", "dear")
FP32_PARAMS_TO_MB = 4 / 2**20
#: The artifact's ByteScheduler settings (research/dear.md 3.2), given in parameters: 4,000,000 and 16,000,000.
DEAR_KNOBS: dict[str, dict[str, Any]] = {
    "bytescheduler": {"partition_mb": 4_000_000 * FP32_PARAMS_TO_MB, "credit_mb": 16_000_000 * FP32_PARAMS_TO_MB}
}

PROPHET_MODELS = ("resnet50", "resnet152", "inception_bn", "vgg19")
PROPHET_CLUSTER = "ec2-ps-3gbps"
PROPHET_OPTIONS: dict[str, Any] = {"algorithm": "ps"}
PROPHET_POLICIES = ("wfbp", "bytescheduler", "prophet")
PROPHET_TUNED = ("bytescheduler",)
#: ByteScheduler's parameter-server defaults (research/prophet.md 2.1), in parameters: 1,000,000 and 4,000,000.
PROPHET_KNOBS: dict[str, dict[str, Any]] = {
    "bytescheduler": {"partition_mb": 1_000_000 * FP32_PARAMS_TO_MB, "credit_mb": 4_000_000 * FP32_PARAMS_TO_MB}
}


@dataclass(frozen=True)
class Settings:
    iterations: int = ITERATIONS
    warmup: int = WARMUP
    trials: int = TRIALS


@dataclass
class Row:
    """One model on one cluster: iteration ms per policy (``NAME`` defaults, ``NAME*`` tuned), the bound."""

    model: str
    batch_size: int
    cluster: str
    ms: dict[str, float] = field(default_factory=dict)
    tuned_knobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    ideal_ms: float = 0.0
    compute_ms: float = 0.0
    transfer_ms: float = 0.0


def measure(
    model: str,
    cluster_name: str,
    policies: Sequence[str],
    tuned: Sequence[str],
    settings: Settings,
    options: Mapping[str, Any] | None = None,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
) -> Row:
    """Simulate ``policies`` (with ``knobs[policy]``) and search ``tuned`` (from their defaults)."""
    knobs = knobs or {}
    workload = zoo.load(model)
    cluster = load_cluster(cluster_name)
    row = Row(model, workload.batch_size, cluster_name)
    for policy in policies:
        result = simulate(
            workload,
            cluster,
            policy,
            settings.iterations,
            settings.warmup,
            options=options,
            trace=False,
            **knobs.get(policy, {}),
        )
        row.ms[policy] = result.iteration_ms
    for policy in tuned:
        found = tune(
            workload,
            cluster,
            policy,
            trials=settings.trials,
            iterations=settings.iterations,
            warmup=settings.warmup,
            options=options,
        )
        row.ms[f"{policy}*"] = found.best.iteration_ms
        row.tuned_knobs[policy] = found.best_knobs
    bound = ideal(workload, cluster, options)
    row.ideal_ms = bound.iteration_ms
    row.compute_ms = bound.compute_ms
    row.transfer_ms = bound.transfer_ms
    return row


def gain(baseline_ms: float, ms: float) -> str:
    """``+12.3 %``: how much faster ``ms`` is than ``baseline_ms`` (throughput ratio minus one)."""
    return f"{(baseline_ms / ms - 1) * 100:+.1f} %"


def knob_text(knobs: Mapping[str, Any]) -> str:
    if not knobs:
        return "defaults"
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(knobs.items()))


# ---- DeAR ----

DEAR_HEADER = (
    "| model (batch/GPU) | wfbp | mgwfbp | bytescheduler | horovod | ddp | dear | bytescheduler* | ddp* | dear* "
    "| bound | compute | transfer | dear vs best other | dear* vs best other* |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def dear_line(row: Row) -> str:
    cells = [f"{row.ms[p]:.1f}" for p in (*DEAR_POLICIES, *(f"{p}*" for p in DEAR_TUNED))]
    best_other = min(row.ms[p] for p in DEAR_POLICIES if p != "dear")
    best_other_tuned = min(v for p, v in row.ms.items() if not p.startswith("dear"))
    best_dear = min(row.ms["dear"], row.ms["dear*"])
    return (
        f"| {row.model} ({row.batch_size}) | "
        + " | ".join(cells)
        + f" | {row.ideal_ms:.1f} | {row.compute_ms:.1f} | {row.transfer_ms:.1f}"
        + f" | {gain(best_other, row.ms['dear'])} | {gain(best_other_tuned, best_dear)} |"
    )


def dear_tables(rows: Sequence[Row]) -> str:
    out = []
    for cluster in dict.fromkeys(r.cluster for r in rows):
        these = [r for r in rows if r.cluster == cluster]
        out.append(f"**{cluster}**, simulated iteration time in ms (lower is better):\n")
        out.append(DEAR_HEADER)
        out.extend(dear_line(r) for r in these)
        out.append("")
    out.append("Knobs the search found (`NAME*` columns):\n")
    out.append("| cluster | model | bytescheduler* | ddp* | dear* |\n|---|---|---|---|---|")
    for r in rows:
        knobs = " | ".join(knob_text(r.tuned_knobs[p]) for p in DEAR_TUNED)
        out.append(f"| {r.cluster} | {r.model} | {knobs} |")
    return "\n".join(out) + "\n"


# ---- Prophet ----

PROPHET_HEADER = (
    "| model (batch/GPU) | FIFO (wfbp) | bytescheduler | prophet | bytescheduler* | bound | compute "
    "| prophet vs bytescheduler | prophet vs bytescheduler* | bound vs FIFO |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def prophet_line(row: Row) -> str:
    ms = row.ms
    cells = [f"{ms[p]:.1f}" for p in ("wfbp", "bytescheduler", "prophet", "bytescheduler*")]
    return (
        f"| {row.model} ({row.batch_size}) | "
        + " | ".join(cells)
        + f" | {row.ideal_ms:.1f} | {row.compute_ms:.1f} | {gain(ms['bytescheduler'], ms['prophet'])} "
        f"| {gain(ms['bytescheduler*'], ms['prophet'])} | {gain(ms['wfbp'], row.ideal_ms)} |"
    )


def prophet_tables(rows: Sequence[Row]) -> str:
    out = [f"**{PROPHET_CLUSTER}**, `--sim algorithm=ps`, simulated iteration time in ms:\n", PROPHET_HEADER]
    out.extend(prophet_line(r) for r in rows)
    out.append("\nKnobs the search found (`bytescheduler*`):\n")
    out.append("| model | bytescheduler* |\n|---|---|")
    out.extend(f"| {r.model} | {knob_text(r.tuned_knobs['bytescheduler'])} |" for r in rows)
    return "\n".join(out) + "\n"


# ---- running ----


def dear_rows(models: Sequence[str], clusters: Sequence[str], settings: Settings) -> list[Row]:
    return [measure(m, c, DEAR_POLICIES, DEAR_TUNED, settings, knobs=DEAR_KNOBS) for c in clusters for m in models]


def prophet_rows(models: Sequence[str], settings: Settings) -> list[Row]:
    return [
        measure(m, PROPHET_CLUSTER, PROPHET_POLICIES, PROPHET_TUNED, settings, PROPHET_OPTIONS, PROPHET_KNOBS)
        for m in models
    ]


def replace_section(text: str, name: str, body: str) -> str:
    """Replace what lies between ``<!-- BEGIN reproduce.py NAME -->`` and its END marker."""
    begin, end = f"<!-- BEGIN reproduce.py {name} -->", f"<!-- END reproduce.py {name} -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: no section {begin} ... {end}")
    return pattern.sub(lambda _: f"{begin}\n{body}{end}", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--section", choices=("dear", "prophet", "heterog", "all"), default="all")
    parser.add_argument("--models", nargs="+", help="only these models (of the section's)")
    parser.add_argument("--iterations", type=int, default=ITERATIONS)
    parser.add_argument("--trials", type=int, default=TRIALS, help="knob-search trials per tuned policy")
    parser.add_argument("--write-doc", action="store_true", help=f"rewrite the tables in {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    settings = Settings(args.iterations, WARMUP, args.trials)
    if args.write_doc and (args.models or settings != Settings()):
        parser.error("--write-doc writes the full tables: leave --models, --iterations and --trials at their defaults")

    sections: dict[str, str] = {}
    if args.section in ("dear", "all"):
        models = [m for m in DEAR_MODELS if not args.models or m in args.models]
        sections["dear"] = dear_tables(dear_rows(models, DEAR_CLUSTERS, settings))
    if args.section in ("prophet", "all"):
        models = [m for m in PROPHET_MODELS if not args.models or m in args.models]
        sections["prophet"] = prophet_tables(prophet_rows(models, settings))
    if args.section in ("heterog", "all"):
        models = [m for m in heterog.MODELS if not args.models or m in args.models]
        trials = heterog.TRIALS if args.trials == TRIALS else args.trials
        sections["heterog"] = heterog.heterog_tables(*heterog.heterog_rows(models, trials))
    for body in sections.values():
        print(body)
    if args.write_doc:
        text = DOC.read_text()
        for name, body in sections.items():
            text = replace_section(text, name, body)
        DOC.write_text(text)
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
