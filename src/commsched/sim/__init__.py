"""The discrete-event simulator: driver #1 of the Scheduler contract.

``simulate(workload, cluster, policy)`` predicts iteration time, throughput,
utilisation and a :class:`~commsched.trace.Trace`; ``ideal(workload, cluster)``
is the lower bound no schedule can beat under the same cost model.
"""

from commsched.sim.costs import ALGORITHMS, CommModel, Phase
from commsched.sim.engine import EventLoop
from commsched.sim.simulator import SimOptions, SimResult, Simulation, WorkerClass, simulate, worker_classes

__all__ = [
    "ALGORITHMS",
    "CommModel",
    "EventLoop",
    "Phase",
    "SimOptions",
    "SimResult",
    "Simulation",
    "WorkerClass",
    "simulate",
    "worker_classes",
]
