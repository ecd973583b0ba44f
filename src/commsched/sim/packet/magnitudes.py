"""Per-packet gradient magnitudes for DLCP in the packet network, drawn from the profile's histograms.

The simulator has no gradients. A layer's :class:`~commsched.workload.NormHistogram`
(recorded by :func:`commsched.profile.record_grad_norms`) says how its chunk
norms are spread; :func:`norms_for` draws one norm per packet from the
histogram of the layer the packet's first element belongs to: a bin with
probability ``count / total``, then a point uniform within it, scaled by
``sqrt(stride / chunk_numel)`` when packets hold another number of elements
than the recorded chunks (the norm of ``k`` independent entries grows as
``sqrt(k)``). DLCP's :func:`~commsched.transport.dlcp.protocol.classify`
then marks the packets as the real link would. A task with a layer that has
no histogram gets ``None``: the transport's default (i.i.d. magnitudes, so
the quantile picks a random share of the packets).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commsched.schedule.base import CommTask
from commsched.workload import NormHistogram, Workload


def _draw(hist: NormHistogram, count: int, scale: float, rng: np.random.Generator) -> np.ndarray:
    counts = np.asarray(hist.counts, dtype=np.float64)
    edges = np.asarray(hist.edges, dtype=np.float64)
    bins = rng.choice(counts.size, size=count, p=counts / counts.sum())
    return (edges[bins] + rng.random(count) * (edges[bins + 1] - edges[bins])) * scale


def norms_for(
    workload: Workload, task: CommTask, start: int, rng: np.random.Generator
) -> Callable[[int, int], np.ndarray] | None:
    """``norms(stride, numel)`` for the slice of ``task``'s elements from ``start`` (module docstring), or None."""
    hists: list[NormHistogram] = []
    bounds = []
    offset = 0
    for seg in task.segments:
        hist = workload.layers[workload.tensor_layer[seg.tensor]].grad_norms
        if hist is None:
            return None
        hists.append(hist)
        bounds.append(offset)
        offset += seg.numel
    first = np.asarray(bounds, dtype=np.int64)

    def norms(stride: int, numel: int) -> np.ndarray:
        packets = -(-numel // stride)
        which = np.searchsorted(first, start + np.arange(packets, dtype=np.int64) * stride, side="right") - 1
        out = np.empty(packets, dtype=np.float64)
        for i, hist in enumerate(hists):
            mask = which == i
            if mask.any():
                out[mask] = _draw(hist, int(mask.sum()), float(np.sqrt(stride / hist.chunk_numel)), rng)
        return out

    return norms
