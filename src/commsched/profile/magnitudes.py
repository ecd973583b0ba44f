"""Record how large a model's gradients are, per layer, for DLCP's importance in the packet simulator.

>>> loss_fn(model(x), y).backward()
>>> workload = record_grad_norms(workload, model)   # every layer gets a NormHistogram

DLCP marks a packet important when its chunk's L2 norm is at least a
quantile of its tensor's chunk norms (:func:`commsched.transport.dlcp.protocol.classify`);
the packet-level simulator has no gradients, so it draws each packet's norm
from the histogram of its layer recorded here. What is recorded: each
tensor's ``.grad`` (as it is now: call after a backward, before
``zero_grad``) cut into chunks of ``chunk_numel`` elements, the L2 norm of
each chunk, histogrammed per layer over ``bins`` log-spaced bins between the
smallest non-zero and the largest norm (a first bin from 0 holds the zero
chunks). Record from gradients that look like training's: after some steps
of the real task, not at initialisation.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from commsched.errors import SpecError
from commsched.transport.dlcp.wire import IPV4_UDP_BYTES, packet_numel
from commsched.workload import NormHistogram, Workload

#: One jumbo (9000-byte) DLCP datagram of fp32: the packet-level simulator's default packet.
DEFAULT_CHUNK_NUMEL = packet_numel(9000, 4, IPV4_UDP_BYTES)


def chunk_norms(grad: torch.Tensor, chunk_numel: int) -> np.ndarray:
    """The L2 norm of each ``chunk_numel``-element chunk of ``grad`` flattened (the last one may be shorter)."""
    flat = grad.detach().reshape(-1).float()
    pad = -flat.numel() % chunk_numel
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    return torch.linalg.vector_norm(flat.view(-1, chunk_numel), dim=1).numpy().astype(np.float64)


def norm_histogram(norms: np.ndarray, chunk_numel: int, bins: int = 32) -> NormHistogram:
    """A :class:`NormHistogram` of ``norms`` (module docstring: log-spaced bins, zeros in a first bin)."""
    norms = np.asarray(norms, dtype=np.float64)
    positive = norms[norms > 0]
    if positive.size == 0:
        return NormHistogram(chunk_numel=chunk_numel, edges=(0.0, 1.0), counts=(int(norms.size),))
    lo, hi = float(positive.min()), float(positive.max())
    if hi <= lo:
        hi = lo * (1 + 1e-9) + 1e-30
    edges = np.geomspace(lo, hi, bins + 1)
    counts, _ = np.histogram(positive, bins=edges)
    zeros = int(norms.size - positive.size)
    return NormHistogram(
        chunk_numel=chunk_numel,
        edges=(0.0, *(float(e) for e in edges)),
        counts=(zeros, *(int(c) for c in counts)),
    )


def record_grad_norms(
    workload: Workload, model: nn.Module, chunk_numel: int = DEFAULT_CHUNK_NUMEL, bins: int = 32
) -> Workload:
    """``workload`` with each layer's :class:`NormHistogram` from ``model``'s current gradients.

    Tensors are matched by name (``named_parameters()``, as :func:`profile_model` names them).
    Raises SpecError naming the tensors the model lacks or that have no gradient.
    """
    params = dict(model.named_parameters())
    missing = [t.name for t in workload.tensors if t.name not in params or params[t.name].grad is None]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise SpecError("record_grad_norms", [f"no gradient for tensor(s) {shown} (call after a backward)"])
    if chunk_numel < 1 or bins < 1 or not math.isfinite(chunk_numel):
        raise SpecError("record_grad_norms", [f"chunk_numel and bins must be >= 1, got {chunk_numel}, {bins}"])
    layers = []
    for layer in workload.layers:
        if not layer.tensors:
            layers.append(layer)
            continue
        grads = [params[t.name].grad for t in layer.tensors]
        norms = np.concatenate([chunk_norms(g, chunk_numel) for g in grads if g is not None])
        layers.append(layer.model_copy(update={"grad_norms": norm_histogram(norms, chunk_numel, bins)}))
    return workload.model_copy(update={"layers": tuple(layers)})
