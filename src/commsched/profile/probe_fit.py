"""Fit the α-β model the simulator uses to network probe samples, and the CPU work of each op.

>>> fit = fit_alpha_beta(samples, "all_reduce")     # samples from probe_network or probe_local
>>> cluster = measured_cluster(fit.alpha_s, fit.beta_s_per_byte, fit.world_size)

The model (``research/ecosystem.md`` §5, :mod:`commsched.sim.costs`), with ``p``
ranks, ``n`` bytes per rank, ``α`` the cost of one ring step and ``β`` seconds
per byte on one link (1 / bandwidth)::

    ring all-reduce          T(n) = 2(p-1)·α + 2(p-1)/p · n·β
    ring reduce-scatter      T(n) =  (p-1)·α +  (p-1)/p · n·β     (all-gather: the same)

Every probed op is a ring (:mod:`commsched.profile.network` says why). For
each op, a straight line ``T(n) = a + b·n`` is fitted by least squares to the
median times (slowest rank) over the sweep and read back through the formula:
``α = a / steps``, ``β = b / volume``, where ``steps`` is ``2(p-1)``
(all-reduce) or ``p-1``, and ``volume`` is ``2(p-1)/p`` or ``(p-1)/p``. The fit
weights each point by ``1/σ`` (weighted least squares), with a two-part noise
model measured on the sweep itself: ``σ² = J² + (0.01·T)²``, ``J`` the jitter
common to all sizes (the median over sizes of each one's robust standard
deviation, 1.4826 × the median absolute deviation of its repeats) and 1 % of
the point's time. Timing noise does not scale with the time: on shared cores a
16 KiB all-reduce jitters by milliseconds (thread wake-ups) while a 16 MiB one
repeats within 1 %, so weighting by ``1/T`` (the relative error; what this
module did first) let the noisiest small messages decide the slope: on the
300 Mbit/s testbed it fitted 319 Mbit/s and undershot its own largest point by
11 %. The jitter is pooled because a size's own spread over a few repeats is
unreliable (three repeats can agree by chance and would then decide the fit).
A negative intercept is refitted as zero.

How α and β map onto a cluster spec (the inverse of ``sim/costs.py``, which
takes a ring step's ``α = (latency_us + per_message_overhead_us)·1e-6`` from the
slowest link the ring crosses and ``B = bandwidth_gbps·1e9/8`` bytes/s from the
narrowest): :func:`measured_cluster` gives every node one device and a NIC with
``latency_us = α·1e6``, ``per_message_overhead_us = 0`` and
``bandwidth_gbps = 8 / β / 1e9``. The simulator's ring all-reduce of ``n`` bytes
on it is then exactly the fitted ``a + b·n``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from commsched.cluster import Cluster
from commsched.errors import SpecError
from commsched.formulas import ring_factors

__all__ = [
    "GLOO_OP",
    "AlphaBetaFit",
    "CpuFit",
    "ProbeSample",
    "fit_alpha_beta",
    "fit_cpu",
    "measured_cluster",
]


@dataclass(frozen=True)
class ProbeSample:
    """One op at one size: per repeat, the slowest rank's seconds (after a barrier).

    ``cpu_seconds``: per repeat, the largest over ranks of the CPU time the
    rank's process spent on the op (every thread, user and system:
    ``time.process_time``): the CPU work communication takes from compute
    when both share a core. Empty in probes saved before it was recorded.
    """

    op: str
    nbytes: int
    world_size: int
    seconds: tuple[float, ...]
    cpu_seconds: tuple[float, ...] = ()

    @property
    def median_s(self) -> float:
        return float(statistics.median(self.seconds))


@dataclass(frozen=True)
class AlphaBetaFit:
    """``T(n) = intercept_s + slope_s_per_byte · n``, read as a ring's per-step α and per-byte β.

    ``residual_rms_s``: root mean square of (measured − fitted) seconds;
    ``relative_residual``: the same relative to each measured time (0.05 = the
    line is off by 5 % on a typical point).
    """

    op: str
    world_size: int
    alpha_s: float
    beta_s_per_byte: float
    intercept_s: float
    slope_s_per_byte: float
    residual_rms_s: float
    relative_residual: float
    points: tuple[tuple[int, float], ...]

    @property
    def bandwidth_gbps(self) -> float:
        """``8 / β / 1e9``: the link rate the fit implies."""
        return 8.0 / self.beta_s_per_byte / 1e9

    def predict_s(self, nbytes: float) -> float:
        return self.intercept_s + self.slope_s_per_byte * nbytes


def _robust_sd_s(sample: ProbeSample) -> float:
    """1.4826 × the median absolute deviation of a point's repeats: a standard deviation robust to outliers."""
    median = sample.median_s
    return 1.4826 * statistics.median(abs(x - median) for x in sample.seconds)


def _noise_s(samples: Sequence[ProbeSample]) -> np.ndarray:
    """Each point's σ for the fit: a jitter common to the sweep plus 1 % of the point's time.

    The jitter (thread wake-ups, scheduling) does not depend on the message
    size, so it is pooled: the median over the sizes of each one's robust
    standard deviation. A few repeats give a poor spread per point (three
    repeats can agree by chance), and an unpooled σ would hand that point
    the fit; the 1 % term is the timing noise that grows with the time.
    """
    jitter = statistics.median(_robust_sd_s(s) for s in samples)
    t = np.array([s.median_s for s in samples], dtype=np.float64)
    return np.sqrt(jitter**2 + (0.01 * t) ** 2)


GLOO_OP = "gloo_all_reduce"
"""A probe op (:func:`commsched.profile.network.measure_ops`): the backend's own all-reduce on the group
(``dist.all_reduce``), as PyTorch's DDP runs it, a ring all-reduce; its fits price PyTorch DDP's tasks where
the simulator stands for it beside the runtime."""


def fit_alpha_beta(samples: Sequence[ProbeSample], op: str = "all_reduce") -> AlphaBetaFit:
    """Least-squares α-β fit of ``op``'s median times (see the module docstring).

    Raises SpecError with fewer than two sizes, a world size below 2, or a fit
    whose time does not grow with size.
    """
    mine = sorted((s for s in samples if s.op == op), key=lambda s: s.nbytes)
    sizes = sorted({s.nbytes for s in mine})
    if len(sizes) < 2:
        raise SpecError("network probe", [f"{op}: need at least two message sizes to fit, got {sizes}"])
    worlds = {s.world_size for s in mine}
    if len(worlds) != 1 or min(worlds) < 2:
        raise SpecError("network probe", [f"{op}: need one world size >= 2, got {sorted(worlds)}"])
    p = worlds.pop()
    n = np.array([s.nbytes for s in mine], dtype=np.float64)
    t = np.array([s.median_s for s in mine], dtype=np.float64)
    if np.any(t <= 0):
        raise SpecError("network probe", [f"{op}: every median time must be > 0, got {t.tolist()}"])
    w = 1.0 / _noise_s(mine)
    design = np.column_stack([np.ones_like(n), n]) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if a < 0:  # through the origin: minimise sum((w·(t - b·n))^2)
        a, b = 0.0, float(np.sum(w * w * n * t) / np.sum(w * w * n * n))
    if not b > 0:
        raise SpecError(
            "network probe", [f"{op}: time does not grow with message size (slope {b:.3g} s/byte); widen the sizes"]
        )
    fitted = a + b * n
    steps, volume = ring_factors("all_reduce" if op == GLOO_OP else op, p)
    return AlphaBetaFit(
        op=op,
        world_size=p,
        alpha_s=float(a) / steps,
        beta_s_per_byte=float(b) / volume,
        intercept_s=float(a),
        slope_s_per_byte=float(b),
        residual_rms_s=float(np.sqrt(np.mean((t - fitted) ** 2))),
        relative_residual=float(np.sqrt(np.mean(((t - fitted) / t) ** 2))),
        points=tuple((int(x), float(y)) for x, y in zip(n, t, strict=True)),
    )


@dataclass(frozen=True)
class CpuFit:
    """``cpu(n) = per_op_s + per_byte_s · n``: the CPU work of one ``op`` of ``n`` bytes on one rank."""

    op: str
    per_op_s: float
    per_byte_s: float

    @property
    def per_op_ms(self) -> float:
        return self.per_op_s * 1e3

    @property
    def ms_per_mb(self) -> float:
        """Milliseconds of CPU per MiB."""
        return self.per_byte_s * 2**20 * 1e3


def fit_cpu(samples: Sequence[ProbeSample], op: str = "all_reduce") -> CpuFit | None:
    """Least-squares line through ``op``'s median CPU seconds per size (both terms kept >= 0).

    None when the samples carry no CPU times (probes saved before they were
    recorded) or fewer than two sizes do.
    """
    mine = sorted((s for s in samples if s.op == op and s.cpu_seconds), key=lambda s: s.nbytes)
    if len({s.nbytes for s in mine}) < 2:
        return None
    n = np.array([s.nbytes for s in mine], dtype=np.float64)
    c = np.array([statistics.median(s.cpu_seconds) for s in mine], dtype=np.float64)
    (a, b), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(n), n]), c, rcond=None)
    if b < 0:  # CPU work that does not grow with size: a constant
        a, b = float(np.mean(c)), 0.0
    if a < 0:  # through the origin
        a, b = 0.0, max(0.0, float(np.sum(n * c) / np.sum(n * n)))
    return CpuFit(op, float(a), float(b))


def measured_cluster(
    alpha_s: float,
    beta_s_per_byte: float,
    world_size: int,
    *,
    name: str | None = None,
    device: str = "cpu",
    memory_gib: float = 1.0,
    device_fields: Mapping[str, float] | None = None,
) -> Cluster:
    """A cluster of ``world_size`` one-device nodes whose ring all-reduce costs what was measured.

    Every node: one ``device`` of speed 1.0 (a profile measured on the same
    machines applies unscaled) and a NIC with ``latency_us = alpha_s·1e6``,
    ``per_message_overhead_us = 0``, ``bandwidth_gbps = 8 / beta_s_per_byte / 1e9``
    (the inverse of ``sim/costs.py``; see the module docstring). ``memory_gib``
    only fills a required field; ``device_fields`` adds measured fields to every
    device (e.g. ``overlap_ms_per_mb``). Raises SpecError for values a Link rejects.
    """
    if not (beta_s_per_byte > 0 and math.isfinite(beta_s_per_byte)):
        raise SpecError("measured cluster", [f"beta_s_per_byte: must be > 0, got {beta_s_per_byte!r}"])
    if world_size < 1:
        raise SpecError("measured cluster", [f"world_size: must be >= 1, got {world_size!r}"])
    nic = {"bandwidth_gbps": 8.0 / beta_s_per_byte / 1e9, "latency_us": alpha_s * 1e6}
    gbps = nic["bandwidth_gbps"]
    return Cluster.from_dict(
        {
            "name": name or f"measured-{world_size}x{device}",
            "description": (
                f"Fitted by commsched.profile.probe_network: ring step alpha = {alpha_s * 1e6:.1f} us, "
                f"beta = {beta_s_per_byte:.3g} s/byte ({gbps:.3g} Gbit/s), {world_size} workers, one per node"
            ),
            "nodes": [
                {
                    "name": f"node{r}",
                    "count": 1,
                    "device": {"name": device, "memory_gib": memory_gib, **(device_fields or {})},
                    "nic": nic,
                }
                for r in range(world_size)
            ],
        },
        source="measured cluster",
    )
