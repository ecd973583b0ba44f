"""The simulator's validation with and without the measured overlap costs, over every saved ``--validate`` report.

    python benchmarks/overlap_charge.py [benchmarks/results]

Every ``commsched bench`` report under the folder (a ``*.json`` file with
sessions and their raw calibration) is re-validated twice with today's
simulator and fit (:func:`commsched.bench.calibrate.revalidate`): once
charging the devices' measured overlap costs (``overlap_ms_per_mb``,
``overlap_ms_per_task``, ``overlap_comm_rate``; what the validation does),
once charging the probe's CPU work per task and per MiB instead. Prints one
row per session that measured the overlap costs (the median |error| over the
policies either way) and, below, how many sessions each pricing predicted
better and the median |error| over all their policy predictions pooled:
for every such session, and for those of the runtime's own all-reduce
connections (where the probe also timed the backend's all-reduce apart, the
runtime since its all-reduces stopped going through gloo). Sessions that did
not measure the overlap costs predict the same either way and are left out.

Last, whether the overlap costs would make the simulator *choose* better,
which is what ``policy="auto"`` and ``commsched advise`` ask of it (neither
charges them: the warm-up runs no overlap rounds): over the sessions that
measured at least :data:`MIN_RANKED` lossless policies, the policy each
pricing ranks first and its measured time over the fastest measured
(the regret; 1 where the simulator's first is the measured first), and
Kendall's tau between the predicted and the measured order. The policies
are ranked as they ran, with their knobs; ``auto``'s search of knobs and its
measured trials are not replayed.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commsched.bench.calibrate import Calibration, revalidate

#: A change of a session's median |error| smaller than this (points) counts as neither better nor worse.
TIE_POINTS = 0.05
#: Sessions with fewer lossless policies measured than this take no part in the ranking comparison.
MIN_RANKED = 4
#: Left out of the ranking: not a choice of the search (``auto``, PyTorch's own DDP) or not lossless (``dlcp``).
UNRANKED = frozenset({"auto", "torch_ddp", "dlcp"})


@dataclass(frozen=True)
class Ranking:
    """How one pricing ranks a session's lossless policies against their measured times."""

    first: str  # the policy it predicts fastest
    regret: float  # that policy's measured time over the fastest measured
    tau: float  # Kendall's tau between the predicted and the measured times

    @staticmethod
    def of(session: dict[str, Any], policies: set[str]) -> Ranking | None:
        from scipy.stats import kendalltau  # here: the rest of the script needs no scipy

        rows = session["validation"]["rows"]
        ranked = {p: r for p, r in rows.items() if p in policies - UNRANKED and "error_pct" in r}
        if len(ranked) < MIN_RANKED:
            return None
        measured = {p: r["measured_ms"] for p, r in ranked.items()}
        predicted = {p: r["predicted_ms"] for p, r in ranked.items()}
        first = min(predicted, key=predicted.__getitem__)
        tau = kendalltau([measured[p] for p in ranked], [predicted[p] for p in ranked]).statistic
        return Ranking(first, measured[first] / min(measured.values()), float(tau))


@dataclass(frozen=True)
class Session:
    report: str
    label: str
    own_connections: bool  # the runtime's all-reduces over its own connections (the probe timed gloo's apart)
    overlap: dict[str, float]
    without: list[float]  # |error| % of each policy, probe's CPU work charged
    charged: list[float]  # the same, the overlap costs charged
    ranked: tuple[Ranking, Ranking] | None  # without, charged; None with too few lossless policies


def sessions(root: Path) -> list[Session]:
    out = []
    for path in sorted(root.rglob("*.json")):
        try:
            report = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        if not isinstance(report, dict) or "meta" not in report or "sessions" not in report:
            continue
        policies = set(report["meta"].get("config", {}).get("policies", ()))
        charged = revalidate(copy.deepcopy(report), overlap=True)["sessions"]
        without = revalidate(copy.deepcopy(report), overlap=False)["sessions"]
        for raw, a, b in zip(report["sessions"], without, charged, strict=True):
            if "calibration" not in raw:
                continue
            calibration = Calibration(raw["calibration"], f"{path}: {raw['label']}")
            if not calibration.overlap:
                continue
            name = str(path.relative_to(root).with_suffix(""))
            first, second = Ranking.of(a, policies), Ranking.of(b, policies)
            ranked = (first, second) if first is not None and second is not None else None
            out.append(Session(name, raw["label"], calibration.gloo_cpu is not None, calibration.overlap,
                               _errors(a, policies), _errors(b, policies), ranked))  # fmt: skip
    return out


def _errors(session: dict[str, Any], policies: set[str]) -> list[float]:
    rows = session["validation"]["rows"]
    return [abs(row["error_pct"]) for name, row in rows.items() if name in policies and "error_pct" in row]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary_line(label: str, chosen: list[Session]) -> str:
    better = sum(_median(s.charged) < _median(s.without) - TIE_POINTS for s in chosen)
    worse = sum(_median(s.charged) > _median(s.without) + TIE_POINTS for s in chosen)
    without = [e for s in chosen for e in s.without]
    charged = [e for s in chosen for e in s.charged]
    return (f"| {label} | {len(chosen)} | {better} | {worse} | {len(charged)} | "
            f"{_median(without):.2f} % | {_median(charged):.2f} % |")  # fmt: skip


def ranking_line(label: str, chosen: list[Session]) -> str:
    """Over the sessions with a ranking: how often each pricing's first is the measured first, the median and
    the mean regret, and the median tau, without the overlap costs and with them."""
    pairs = [s.ranked for s in chosen if s.ranked is not None]
    cells = [str(len(pairs))]
    for side in (0, 1):
        rankings = [pair[side] for pair in pairs]
        regrets = [r.regret for r in rankings]
        cells.append(
            f"{sum(x == 1.0 for x in regrets)} | {_median(regrets):.3f} | {statistics.fmean(regrets):.3f} | "
            f"{_median([r.tau for r in rankings]):.2f}"
        )
    return f"| {label} | {' | '.join(cells)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, nargs="?", default=Path(__file__).parent / "results")
    args = parser.parse_args()
    found = sessions(args.root)
    print("| report | session | own connections | ms per MiB | ms per task | comm rate | without | charged |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for s in found:
        o = s.overlap
        cells = [
            f"{o[k]:.2f}" if k in o else "—" for k in ("overlap_ms_per_mb", "overlap_ms_per_task", "overlap_comm_rate")
        ]
        print(f"| {s.report} | {s.label} | {'yes' if s.own_connections else 'no'} | {' | '.join(cells)} | "
              f"{_median(s.without):.1f} % | {_median(s.charged):.1f} % |")  # fmt: skip
    print()
    print("| sessions | count | better charged | worse charged | predictions | median \\|error\\| without | charged |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    own = [s for s in found if s.own_connections]
    print(summary_line("every one that measured the overlap costs", found))
    print(summary_line("the runtime's own all-reduce connections", own))
    print()
    print(f"Ranking the lossless policies (sessions with at least {MIN_RANKED}); without the overlap costs, then with:")
    print()
    print("| sessions | count | first is fastest | median regret | mean regret | median tau "
          "| first is fastest | median regret | mean regret | median tau |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(ranking_line("every one that measured the overlap costs", found))
    print(ranking_line("the runtime's own all-reduce connections", own))
    print()
    print("Where the two pricings rank a different policy first (its measured time over the fastest):")
    print()
    print("| report | session | without | charged |")
    print("|---|---|---|---|")
    for s in found:
        if s.ranked is not None and s.ranked[0].first != s.ranked[1].first:
            cells = [f"{r.first} ({r.regret:.3f})" for r in s.ranked]
            print(f"| {s.report} | {s.label} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
