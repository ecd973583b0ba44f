"""Background flows from a published flow-size distribution, Poisson arrivals at a chosen load.

Two empirical distributions of data-centre flow sizes, as the CDF points
that simulations since pFabric (Alizadeh et al., SIGCOMM 2013) use, sizes in
bytes, linear between points:

* ``web_search``: the web-search cluster of DCTCP (Alizadeh et al., SIGCOMM
  2010, Fig. 4); mean about 1.7 MB, half the flows under 70 kB.
* ``data_mining``: the data-mining cluster of VL2 (Greenberg et al., SIGCOMM
  2009, Fig. 2); mean about 12.7 MB, half the flows under 1.1 kB, the largest 1 GB.

:func:`background_flows` draws flows for ``duration_s``: arrivals are a
Poisson process of rate ``λ = load · hosts · link_bytes_per_s / mean_bytes``
(so the hosts' links carry ``load`` of their capacity on average), each flow
from a host chosen uniformly to another chosen uniformly, its size from the
distribution; all from one seeded generator, so a seed gives the same flows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from commsched.errors import ScheduleError
from commsched.sim.packet.scenario import Flow

#: ``(bytes, cumulative probability)`` of each distribution.
DISTRIBUTIONS: dict[str, tuple[tuple[float, float], ...]] = {
    "web_search": (
        (0, 0.0), (10_000, 0.15), (20_000, 0.2), (30_000, 0.3), (50_000, 0.4), (80_000, 0.53), (200_000, 0.6),
        (1_000_000, 0.7), (2_000_000, 0.8), (5_000_000, 0.9), (10_000_000, 0.97), (30_000_000, 1.0),
    ),
    "data_mining": (
        (0, 0.0), (180, 0.1), (216, 0.2), (560, 0.3), (900, 0.4), (1_100, 0.5), (1_870, 0.6), (3_160, 0.7),
        (10_000, 0.8), (400_000, 0.9), (3_160_000, 0.95), (100_000_000, 0.98), (1_000_000_000, 1.0),
    ),
}  # fmt: skip


def _cdf(distribution: str) -> tuple[np.ndarray, np.ndarray]:
    if distribution not in DISTRIBUTIONS:
        raise ScheduleError(
            f"packet: unknown flow-size distribution {distribution!r}; known: {', '.join(DISTRIBUTIONS)}"
        )
    points = np.asarray(DISTRIBUTIONS[distribution], dtype=np.float64)
    return points[:, 0], points[:, 1]


def mean_bytes(distribution: str) -> float:
    """The mean flow size of ``distribution`` (linear between its CDF points)."""
    sizes, probs = _cdf(distribution)
    return float(np.sum(np.diff(probs) * (sizes[1:] + sizes[:-1]) / 2))


def sample_sizes(distribution: str, rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` flow sizes in bytes (at least 1), by inverting the CDF."""
    sizes, probs = _cdf(distribution)
    return np.maximum(1, np.ceil(np.interp(rng.random(count), probs, sizes))).astype(np.int64)


def background_flows(
    hosts: Sequence[int],
    load: float,
    link_gbps: float,
    distribution: str,
    duration_s: float,
    seed: int = 0,
    cls: int = 0,
) -> list[Flow]:
    """Flows arriving over ``[0, duration_s)`` between ``hosts`` at ``load`` of each host's link (module doc)."""
    if not 0 <= load <= 1:
        raise ScheduleError(f"packet: background load must be in [0, 1], got {load}")
    if len(hosts) < 2 or load == 0 or duration_s <= 0:
        return []
    rate_per_s = load * len(hosts) * link_gbps * 1e9 / 8 / mean_bytes(distribution)
    rng = np.random.default_rng(seed)
    count = int(rng.poisson(rate_per_s * duration_s))
    starts = np.sort(rng.random(count) * duration_s)  # a Poisson process: uniform arrival times given the count
    sizes = sample_sizes(distribution, rng, count)
    src = rng.integers(0, len(hosts), count)
    dst = (src + rng.integers(1, len(hosts), count)) % len(hosts)  # uniform over the other hosts
    return [
        Flow(hosts[int(s)], hosts[int(d)], int(n), float(t), cls)
        for s, d, n, t in zip(src, dst, sizes, starts, strict=True)
    ]
