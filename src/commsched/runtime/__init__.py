"""Driver #2: the scheduling policies inside real PyTorch training."""

from commsched.runtime.api import ParallelModule, parallelize
from commsched.schedule import RUNTIME_POLICIES

__all__ = ["RUNTIME_POLICIES", "ParallelModule", "parallelize"]
