"""The Trace (:mod:`commsched.trace.core`) and two traces compared task by task (:mod:`commsched.trace.compare`)."""

from commsched.trace.core import COMM_KINDS, COMPUTE_KINDS, Trace, TraceEvent

__all__ = ["COMM_KINDS", "COMPUTE_KINDS", "Trace", "TraceEvent"]
