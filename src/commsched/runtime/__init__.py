"""Driver #2: the scheduling policies inside real PyTorch training."""

from commsched.runtime.api import RUNTIME_POLICIES, ParallelModule, parallelize

__all__ = ["RUNTIME_POLICIES", "ParallelModule", "parallelize"]
