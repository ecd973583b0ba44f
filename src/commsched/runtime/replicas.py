"""Replica consistency for plans whose delivered results may differ between ranks.

A lossless plan leaves every rank with the same averaged gradients, so the
replicas (parameters and optimizer state) stay identical. A plan with a
*delivering* task that may lose (a ``pull``, ``all_gather`` or
``all_reduce`` with ``loss_bound > 0``) does not: each rank fills the
elements it lost itself (a pulled sum keeps the previous iteration's value
there), different ranks lose different elements, and the replicas drift
apart — only at the elements some rank lost, by the difference between a
sum and its stale value, compounded by the optimizer's state.

Every ``every`` iterations such a plan is checked: after the optimizer step
(pending deferred updates applied first, so every rank compares the same
iteration) each rank hashes its trainable parameters and its optimizer's
state for them (BLAKE2b over the bytes, in parameter order; non-tensor
state by value), the ranks compare the digests on a gloo group of the
check's own (created at the first check, with the run's ``timeout_s``), and
on any difference rank 0 (of the run's group) broadcasts both its
parameters and its optimizer state to every rank. Right after a check the
replicas are bit-identical; between checks the difference is bounded by what
was lost since the last one (``tests/runtime/test_dlcp_runtime.py``).

Cost: nothing for plans without such a task (lossless plans, and a
bounded-loss plan whose pulls are reliable: each shard is summed by one
owner and delivered whole). Otherwise, every ``every`` iterations: the
deferred updates' overlap with the next forward is given up once, each rank
hashes its parameters and optimizer state (BLAKE2b, about 0.3-1 GB/s on
one core), one all-gather of 32 bytes per rank, and on a mismatch one
broadcast of the parameters and optimizer state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from commsched.runtime import startup
from commsched.schedule import CommPlan

if TYPE_CHECKING:
    from commsched.runtime.engine import Engine

#: Iterations between two checks unless ``parallelize(..., replica_check_every=...)`` says otherwise.
DEFAULT_EVERY = 50
_DELIVERING = ("pull", "all_gather", "all_reduce")


def may_diverge(plan: CommPlan) -> bool:
    """Whether ``plan`` has a delivering task that may lose part of its result (so ranks may differ)."""
    return any(t.loss_bound > 0 and t.kind in _DELIVERING for t in plan.tasks)


def check_every(value: object) -> int:
    """``replica_check_every`` as a whole number >= 0 (0: never check), or ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"replica_check_every: must be a whole number >= 0 (0: never), got {value!r}")
    return value


class ReplicaCheck:
    """The periodic check of one parallelized model (module docstring); ``after_step`` runs it when due."""

    __slots__ = ("_group", "checks", "every", "mismatches", "repaired_at")

    def __init__(self, every: int) -> None:
        self.every = check_every(every)
        self._group: dist.ProcessGroup | None = None
        #: checks made, and those that found the replicas different
        self.checks = 0
        self.mismatches = 0
        #: the iterations (steps taken) at which a mismatch was repaired
        self.repaired_at: list[int] = []

    def take_group(self) -> dist.ProcessGroup | None:
        """The check's group, if it made one, handed over for release (the check keeps no reference)."""
        group, self._group = self._group, None
        return group

    def after_step(self, engine: Engine) -> bool:
        """At ``optimizer.step()``: check when due; True if the replicas differed and were made equal."""
        iteration = engine._iteration
        if not self.every or engine.world == 1 or iteration % self.every or not may_diverge(engine.plan):
            return False
        engine.flush()  # every rank compares the parameters after this iteration's update
        if self._group is None:
            ranks = engine.groups.ranks
            with startup.peers("creating the replica check's group"):
                self._group = dist.new_group(ranks=ranks, timeout=timedelta(seconds=engine.timeout_s), backend="gloo")
        params = engine._params
        mine = digests(params, engine.optimizer)
        everyone: list[Any] = [None] * engine.world
        with startup.peers(f"comparing the replicas at iteration {iteration}"):
            dist.all_gather_object(everyone, mine, group=self._group)
        self.checks += 1
        if all(d == everyone[0] for d in everyone):
            return False
        self.mismatches += 1
        self.repaired_at.append(iteration)
        same_layout = all(d[0] == everyone[0][0] for d in everyone)
        _rebroadcast(params, engine.optimizer, engine.groups.leader(), engine.groups.sync, self._group, same_layout)
        return True


def _state_of(params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer) -> list[tuple[int, str, Any]]:
    """The optimizer's state for ``params``, as ``(parameter index, key, value)`` in a fixed order."""
    out = []
    for i, p in enumerate(params):
        state = optimizer.state.get(p, {})
        for key in sorted(state):
            out.append((i, str(key), state[key]))
    return out


def digests(params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer) -> tuple[str, str]:
    """``(layout, values)``: a digest of the optimizer state's keys, shapes and dtypes, and one of every value.

    BLAKE2b (16 bytes) over the raw bytes of each parameter and state tensor, in order, and the ``repr`` of
    non-tensor state: two ranks agree on ``values`` only if their replicas are bit-identical.
    """
    layout = hashlib.blake2b(digest_size=16)
    values = hashlib.blake2b(digest_size=16)
    for i, key, value in [*((i, "param", p) for i, p in enumerate(params)), *_state_of(params, optimizer)]:
        if torch.is_tensor(value):
            layout.update(f"{i}/{key}/{tuple(value.shape)}/{value.dtype};".encode())
            values.update(value.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().data)
        else:
            layout.update(f"{i}/{key}/{type(value).__name__};".encode())
            values.update(repr(value).encode())
    return layout.hexdigest(), values.hexdigest()


def _rebroadcast(
    params: Sequence[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    src: int,
    sync: dist.ProcessGroup,
    objects: dist.ProcessGroup,
    same_layout: bool,
) -> None:
    """Rank ``src``'s parameters and optimizer state on every rank (CPU tensors over the gloo group
    ``objects``, others over ``sync``: an optimizer may keep CPU state, e.g. Adam's step, beside CUDA ones)."""
    state = _state_of(params, optimizer)
    tensors = list(params)
    if same_layout:
        tensors += [v for _, _, v in state if torch.is_tensor(v)]
        others: list[Any] = [[(i, k, v) for i, k, v in state if not torch.is_tensor(v)]]
    else:  # the ranks' states differ in shape: rank src's whole state, as objects
        others = [[(i, k, v.detach().cpu() if torch.is_tensor(v) else v) for i, k, v in state]]
        for p in params:
            optimizer.state.pop(p, None)
    on_cpu = [t for t in tensors if t.device.type == "cpu"]
    elsewhere = [t for t in tensors if t.device.type != "cpu"]
    startup.broadcast_tensors(on_cpu, src, objects, "re-broadcasting the replicas")
    startup.broadcast_tensors(elsewhere, src, sync, "re-broadcasting the replicas")
    with startup.peers("re-broadcasting the optimizer state"):
        dist.broadcast_object_list(others, src=src, group=objects)
    for i, key, value in others[0]:
        p = params[i]
        optimizer.state.setdefault(p, {})[key] = value.to(p.device) if torch.is_tensor(value) else value
