"""The discrete-event simulator: driver #1 of the Scheduler contract.

``simulate(workload, cluster, policy)`` predicts iteration time, throughput,
utilisation and a :class:`~commsched.trace.Trace`; ``ideal(workload, cluster)``
is the lower bound no schedule can beat under the same cost model.
"""

from commsched.sim.compute import ClassCompute, ComputeModel, ProfileCompute, WorkerClass, worker_classes
from commsched.sim.costs import ALGORITHMS, TASK_COSTS, CommModel, Phase, TaskCost, register_cost
from commsched.sim.engine import EventLoop
from commsched.sim.network import NETWORK_MODELS, NetworkContext, NetworkFactory, NetworkModel
from commsched.sim.options import SimOptions
from commsched.sim.result import SimResult
from commsched.sim.simulation import Simulation
from commsched.sim.simulator import simulate

__all__ = [
    "ALGORITHMS",
    "NETWORK_MODELS",
    "TASK_COSTS",
    "ClassCompute",
    "CommModel",
    "ComputeModel",
    "EventLoop",
    "NetworkContext",
    "NetworkFactory",
    "NetworkModel",
    "Phase",
    "ProfileCompute",
    "SimOptions",
    "SimResult",
    "Simulation",
    "TaskCost",
    "WorkerClass",
    "register_cost",
    "simulate",
    "worker_classes",
]
