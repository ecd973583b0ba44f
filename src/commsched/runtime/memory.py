"""What a training step holds in memory, measured, and a per-worker cap on it.

:class:`MemoryCap` measures one training step of one rank and refuses it when
the step held more than the cap (say a cluster spec's device memory, to run a
plan made for small devices on a machine with plenty)::

    cap = MemoryCap(limit_bytes=int(0.5 * 2**30), rank=rank, device="T4")
    for x, y in loader:
        with cap.step(model, optimizer):
            loss_fn(model(x), y).backward(); optimizer.step()
        optimizer.zero_grad()

What it counts, after the step (each storage once, ``meta`` tensors never):
the module's parameters and buffers, their gradients, the optimizer's state
tensors and any ``extra`` tensors (communication buffers, for instance); plus
the peak, during the step, of the tensors autograd saved for backward (the
activations), counted through :func:`torch.autograd.graph.saved_tensors_hooks`
from when they are saved until they are freed, parameters excluded. It does
not see temporaries that live inside one operation, the allocator's cache,
tensors a library keeps outside autograd (e.g. receive buffers a pipeline
schedule allocates), or the interpreter: it enforces the memory model the
planner plans with (:mod:`commsched.plan.memory`), not the process's
resident size. A step over the cap raises :class:`MemoryCapError` naming the
rank, the device, what was held and the shortfall; nothing is allocated or
freed differently because of the cap.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from commsched.errors import CommschedError
from commsched.units import MiB


class MemoryCapError(CommschedError, RuntimeError):
    """A training step held more memory than its rank's cap."""


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    if t.device.type == "meta":
        return None
    storage = t.untyped_storage()
    return (storage.data_ptr(), storage.nbytes())


def held_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages of ``tensors`` (``meta`` tensors count 0)."""
    seen: dict[int, int] = {}
    for t in tensors:
        key = _storage_key(t)
        if key is not None and key[1] > 0:
            seen[key[0]] = max(seen.get(key[0], 0), key[1])
    return sum(seen.values())


def state_tensors(module: nn.Module, optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """Parameters, buffers, gradients and optimizer state of ``module``."""
    out: list[torch.Tensor] = [*module.parameters(), *module.buffers()]
    out += [p.grad for p in module.parameters() if p.grad is not None]
    if optimizer is not None:
        for state in optimizer.state.values():
            out += [v for v in state.values() if torch.is_tensor(v)]
    return out


class ActivationMeter:
    """Live and peak bytes of the tensors autograd saves for backward while active (module docstring)."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._exclude = {k[0] for k in map(_storage_key, exclude) if k is not None}
        self._count: dict[int, list[int]] = {}  # storage -> [bytes, references]
        self._lock = threading.Lock()
        self.live_bytes = 0
        self.peak_bytes = 0

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key is None or key[0] in self._exclude or key[1] == 0:
            return t
        with self._lock:
            entry = self._count.setdefault(key[0], [key[1], 0])
            if entry[1] == 0:
                self.live_bytes += entry[0]
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            entry[1] += 1
        weakref.finalize(t, self._release, key[0])
        return t

    def _release(self, ptr: int) -> None:
        with self._lock:
            entry = self._count.get(ptr)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                self.live_bytes -= entry[0]
                del self._count[ptr]

    @contextmanager
    def active(self) -> Iterator[ActivationMeter]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self


@dataclass(frozen=True)
class StepMemory:
    """One step's measurement: persistent state after it, peak activations during it."""

    state_bytes: int
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes


class MemoryCap:
    """Refuses a step that held more than ``limit_bytes`` (module docstring); ``last`` is the latest step's
    measurement, ``peak`` the largest so far."""

    def __init__(self, limit_bytes: float, *, rank: int = 0, device: str = "device") -> None:
        if not limit_bytes > 0:
            raise ValueError(f"limit_bytes: must be > 0, got {limit_bytes!r}")
        self.limit_bytes = float(limit_bytes)
        self.rank = rank
        self.device = device
        self.last: StepMemory | None = None
        self.peak: StepMemory | None = None

    @contextmanager
    def step(
        self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None, extra: Iterable[torch.Tensor] = ()
    ) -> Iterator[StepMemory | None]:
        extra = list(extra)
        meter = ActivationMeter(exclude=[*module.parameters(), *module.buffers()])
        with meter.active():
            yield self.last
        state = held_bytes([*state_tensors(module, optimizer), *extra])
        self.last = StepMemory(state, meter.peak_bytes)
        if self.peak is None or self.last.total_bytes > self.peak.total_bytes:
            self.peak = self.last
        if self.last.total_bytes > self.limit_bytes:
            raise MemoryCapError(
                f"rank {self.rank} ({self.device}): the step held {self.last.total_bytes / MiB:.3f} MiB "
                f"(parameters, gradients, optimizer state and buffers {state / MiB:.3f} MiB, activations "
                f"{meter.peak_bytes / MiB:.3f} MiB), over its cap of {self.limit_bytes / MiB:.3f} MiB "
                f"by {(self.last.total_bytes - self.limit_bytes) / MiB:.3f} MiB"
            )


def activation_bytes_per_sample(module: nn.Module, batch_size: int, run: Callable[[], object]) -> float:
    """Peak bytes saved for backward while ``run()`` trains ``module`` on ``batch_size`` samples, per sample
    (what :class:`~commsched.plan.memory.MemoryModel` calls ``a``)."""
    meter = ActivationMeter(exclude=[*module.parameters(), *module.buffers()])
    with meter.active():
        run()
    return meter.peak_bytes / batch_size
