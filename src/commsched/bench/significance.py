"""Is ``policy="auto"`` slower than the best configuration measured beside it? Paired, with confidence.

Within one session every configuration runs once per repeat, one after the
other, so repeat ``k`` of ``auto`` and repeat ``k`` of another configuration
saw nearly the same machine. The comparison is therefore made on the
per-repeat log ratios ``d_k = ln(auto_k / best_k)``:

* the **best** is the configuration, other than auto, with the lowest median
  iteration time: every lossless commsched policy measured and every PyTorch
  DDP configuration (``torch_ddp`` and the DDP grid);
* the ratio is ``exp(mean d)`` with its two-sided 95 % confidence interval
  (Student's t on the ``d_k``);
* **significantly slower** means the one-sided paired t-test of
  ``mean d > 0`` rejects at 5 % (``p < 0.05``); the Wilcoxon signed-rank test
  (no normality assumed) is reported beside it.

Choosing the best by the same repeats favours it (the minimum of noisy
medians is biased low), so a "significantly slower" verdict is, if anything,
reached too easily: a pass is conservative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from commsched.bench.baselines import BY_NAME, TORCH_DDP
from commsched.schedule import AUTO, LOSSLESS

__all__ = ["AutoVsBest", "PairedRatio", "auto_vs_best", "paired_ratio"]

#: One-sided significance level of "auto is slower than the best".
ALPHA = 0.05


@dataclass(frozen=True)
class AutoVsBest:
    """``auto`` against the best other configuration of one session, paired per repeat."""

    best: str
    repeats: int
    ratio: float  # exp(mean log ratio): auto's time over best's, > 1 = auto slower
    ci_low: float  # two-sided 95 % confidence interval of ``ratio``
    ci_high: float
    p_slower: float  # one-sided paired t-test of "auto is slower"
    p_wilcoxon: float | None  # one-sided Wilcoxon signed-rank test of the same (None: too few repeats)

    @property
    def significantly_slower(self) -> bool:
        return self.p_slower < ALPHA

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "significantly_slower": self.significantly_slower}

    def describe(self) -> str:
        verdict = "significantly slower" if self.significantly_slower else "not significantly slower"
        wil = "" if self.p_wilcoxon is None else f", Wilcoxon p = {self.p_wilcoxon:.3f}"
        return (
            f"auto / best ({self.best}) = {self.ratio:.3f} (95 % CI {self.ci_low:.3f}–{self.ci_high:.3f}, "
            f"{self.repeats} paired repeats; t-test p = {self.p_slower:.3f}{wil}): {verdict}"
        )


def _contenders(summary: Mapping[str, Any]) -> list[str]:
    return [n for n in summary if n != AUTO and (n in LOSSLESS or n == TORCH_DDP or n in BY_NAME)]


@dataclass(frozen=True)
class PairedRatio:
    """``exp(mean d)`` of the per-repeat log ratios ``d_k = ln(a_k / b_k)``, its two-sided 95 % confidence
    interval and the one-sided paired t-test of ``mean d > 0`` (``a`` takes longer than ``b``)."""

    repeats: int
    ratio: float
    ci_low: float
    ci_high: float
    p_greater: float
    logs: tuple[float, ...]


def paired_ratio(a: Mapping[int, float], b: Mapping[int, float]) -> PairedRatio | None:
    """``a`` over ``b`` (iteration times by repeat), paired over the repeats both have; None under 3 of them."""
    d = np.array([math.log(a[k] / b[k]) for k in sorted(a) if k in b])
    n = len(d)
    if n < 3:
        return None
    from scipy import stats  # here, not at the top: scipy.stats adds ~0.4 s to every CLI start

    mean, se = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(n)
    if se == 0.0:  # identical ratios every repeat: no spread to test against
        p = 0.0 if mean > 0 else 1.0
        low = high = mean
    else:
        p = float(stats.t.sf(mean / se, n - 1))
        half = float(stats.t.ppf(0.975, n - 1)) * se
        low, high = mean - half, mean + half
    return PairedRatio(n, math.exp(mean), math.exp(low), math.exp(high), p, tuple(float(x) for x in d))


def auto_vs_best(session: Mapping[str, Any]) -> AutoVsBest | None:
    """The comparison of the module docstring for one session of a bench report; None without auto,
    without another configuration, or with fewer than 3 paired repeats."""
    summary, runs = session["summary"], session["runs"]
    contenders = _contenders(summary)
    if AUTO not in summary or not contenders:
        return None
    best = min(contenders, key=lambda n: (summary[n]["median_ms"], n))
    mine = {r["repeat"]: r["iteration_ms"] for r in runs[AUTO]}
    theirs = {r["repeat"]: r["iteration_ms"] for r in runs[best]}
    paired = paired_ratio(mine, theirs)
    if paired is None:
        return None
    d = np.array(paired.logs)
    p_wil = None
    if paired.repeats >= 6 and np.any(d != 0):
        from scipy import stats

        p_wil = float(stats.wilcoxon(d, alternative="greater").pvalue)
    return AutoVsBest(best, paired.repeats, paired.ratio, paired.ci_low, paired.ci_high, paired.p_greater, p_wil)
