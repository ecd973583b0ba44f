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

from commsched.profile.compute import IterationCheck, device_names, iteration_check, profile_model, zoo_filename
from commsched.profile.magnitudes import record_grad_norms
from commsched.profile.network import (
    DEFAULT_SIZES_BYTES,
    OPS,
    AlphaBetaFit,
    NetworkProbe,
    ProbeSample,
    fit_alpha_beta,
    measured_cluster,
    probe_local,
    probe_network,
)

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
