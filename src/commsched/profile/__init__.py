"""Measure what the simulator needs: per-layer compute profiles of a model, and the network's α-β.

* :func:`profile_model` runs a model's forward and backward with hooks and
  returns a :class:`~commsched.workload.Workload` (kind ``measured``): per-layer
  forward and backward times and the gradient-ready time of every parameter
  tensor. :func:`iteration_check` compares the layer times with a whole
  iteration measured without hooks.
* :func:`probe_network` times all-reduce, reduce-scatter and all-gather over a
  size sweep on a process group and fits ``T = steps·α + volume·n·β``;
  :func:`measured_cluster` turns the fit into a Cluster the simulator
  reproduces it with; :func:`probe_local` runs the probe across local
  processes.
* :func:`record_grad_norms` adds each layer's gradient-norm histogram to a
  Workload (DLCP's importance in the packet-level simulator).

``docs/profiling.md`` explains the conventions and how to check a prediction
against a measurement (:mod:`commsched.trace.compare`).
"""

from commsched.profile.check import IterationCheck, iteration_check
from commsched.profile.compute import profile_model
from commsched.profile.local_probe import probe_local
from commsched.profile.magnitudes import record_grad_norms
from commsched.profile.names import device_names, zoo_filename
from commsched.profile.network import DEFAULT_SIZES_BYTES, OPS, NetworkProbe, probe_network
from commsched.profile.probe_fit import AlphaBetaFit, ProbeSample, fit_alpha_beta, measured_cluster

__all__ = [
    "DEFAULT_SIZES_BYTES",
    "OPS",
    "AlphaBetaFit",
    "IterationCheck",
    "NetworkProbe",
    "ProbeSample",
    "device_names",
    "fit_alpha_beta",
    "iteration_check",
    "measured_cluster",
    "probe_local",
    "probe_network",
    "profile_model",
    "record_grad_norms",
    "zoo_filename",
]
