"""Check a compute profile against a whole iteration measured without hooks.

>>> iteration_check(workload).ratio  # sum of layer times / a separately measured iteration
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commsched.errors import SpecError
from commsched.workload import Workload

__all__ = ["IterationCheck", "iteration_check"]


@dataclass(frozen=True)
class IterationCheck:
    """The sum of a profile's layer times against a whole iteration measured without hooks.

    ``layer_sum_ms``: sum of every layer's forward and backward (medians).
    ``profiled_iteration_ms``: median forward + backward of the hooked iterations
    (the layer times partition each of them, so this differs from
    ``layer_sum_ms`` only by taking medians per layer). ``iteration_ms``: median
    of the plain iterations. ``ratio = layer_sum_ms / iteration_ms``: above 1 by
    the hooks' own cost (a few µs per layer and per tensor, which matters only
    for tiny layers) and by noise.
    """

    layer_sum_ms: float
    profiled_iteration_ms: float
    iteration_ms: float

    @property
    def ratio(self) -> float:
        return self.layer_sum_ms / self.iteration_ms if self.iteration_ms > 0 else math.inf

    def ok(self, tolerance: float = 0.2) -> bool:
        """``|ratio - 1| <= tolerance``."""
        return abs(self.ratio - 1.0) <= tolerance


def iteration_check(workload: Workload) -> IterationCheck:
    """The check of a profile written by :func:`profile_model` (SpecError if it has no ``iteration_ms``)."""
    extra = workload.extra
    plain = extra.get("iteration_ms")
    if not isinstance(plain, int | float):
        raise SpecError(workload.model, ["extra.iteration_ms: is required (written by commsched.profile)"])
    hooked = extra.get("profiled_iteration_ms")
    layer_sum = workload.forward_ms + workload.backward_ms
    return IterationCheck(
        layer_sum_ms=layer_sum,
        profiled_iteration_ms=float(hooked) if isinstance(hooked, int | float) else layer_sum,
        iteration_ms=float(plain),
    )
