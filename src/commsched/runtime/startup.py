"""Start-up: the runtime's own process groups, the ranks' agreement, identical replicas.

Every collective the runtime issues runs on a group created here with the
user's ``timeout_s`` — never on the user's default group, whose timeout is
30 minutes — so a hung peer ends every rank within ``timeout_s``:

* ``control`` (gloo): the start-up agreement, the plan sent after warm-up, the
  gradient norm for clipping — the training thread's small messages — and the
  exchange of addresses that opens the deciding leader's channel to its
  followers (:mod:`commsched.runtime.decisions`, TCP connections of the
  runtime's own);
* ``sync`` (the user's backend): the initial parameter broadcast and the
  buffer broadcasts before forwards — the training thread's tensors; where the
  user's backend is gloo, ``control`` itself;
* ``data`` (the user's backend): the transports' tasks, issued by the agent.

Every gloo group costs its process an event-loop thread that wakes 100
times a second while idle (a 10 ms ``epoll_wait``; ``python
benchmarks/runtime_cost.py`` counts them): groups used by the same thread,
one op after the other, are therefore one group.

Before any tensor moves, the ranks exchange a :class:`Fingerprint` (policy,
knobs or plan, parameter names and shapes, world size, warm-up length, per-rank batches); a
difference ends every rank with one error naming what differs.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from commsched.errors import RuntimeCommError
from commsched.transport import Collectives
from commsched.transport.groups import release_groups


@dataclass(frozen=True)
class Groups:
    control: dist.ProcessGroup
    sync: dist.ProcessGroup
    data: dist.ProcessGroup
    ranks: list[int] | None

    def leader(self) -> int:
        """Global rank of the group's rank 0."""
        return dist.get_global_rank(self.control, 0)

    def release(self, *others: dist.ProcessGroup | None) -> bool:
        """Destroy these groups and ``others`` where that is safe (:func:`release_groups`); True if done."""
        return release_groups([self.control, self.sync, self.data, *others])  # sync may be control: destroyed once


def control_group(process_group: dist.ProcessGroup | None, timeout_s: float) -> dist.ProcessGroup:
    ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
    return dist.new_group(ranks=ranks, timeout=timedelta(seconds=timeout_s), backend="gloo")


def other_groups(process_group: dist.ProcessGroup | None, control: dist.ProcessGroup, timeout_s: float) -> Groups:
    ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
    timeout = timedelta(seconds=timeout_s)
    gloo = str(dist.get_backend(process_group)) == "gloo"
    sync = control if gloo else dist.new_group(ranks=ranks, timeout=timeout)
    data = dist.new_group(ranks=ranks, timeout=timeout)
    return Groups(control, sync, data, ranks)


@dataclass(frozen=True)
class Fingerprint:
    """What every rank must agree on before training starts."""

    policy: str
    knobs: str
    plan: str
    parameters: tuple[tuple[str, tuple[int, ...], str], ...]
    world_size: int
    warmup_iters: int
    batch_sizes: tuple[int, ...] | None = None


def fingerprint(
    model: nn.Module,
    policy: str,
    knobs: dict[str, Any],
    plan_json: str | None,
    world: int,
    warmup_iters: int,
    batch_sizes: tuple[int, ...] | None = None,
) -> Fingerprint:
    params = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters() if p.requires_grad)
    digest = plan_digest(plan_json) if plan_json is not None else "none"
    return Fingerprint(policy, repr(sorted(knobs.items())), digest, params, world, warmup_iters, batch_sizes)


def plan_digest(plan_json: str) -> str:
    return hashlib.sha256(plan_json.encode()).hexdigest()[:16]


def agree(mine: Fingerprint, group: dist.ProcessGroup) -> None:
    """Exchange fingerprints over ``group``; raise on every rank the same error if any rank differs."""
    world = dist.get_world_size(group)
    everyone: list[Any] = [None] * world
    with peers("exchanging the start-up fingerprint"):
        dist.all_gather_object(everyone, mine, group=group)
    problem = first_difference(everyone)
    if problem is not None:
        raise RuntimeCommError(f"parallelize: the ranks disagree on {problem}")


def first_difference(prints: Sequence[Fingerprint]) -> str | None:
    """The first field on which some rank differs from rank 0, in words (None: all agree)."""
    ref = prints[0]
    for r, other in enumerate(prints[1:], start=1):
        for f in fields(Fingerprint):
            a, b = getattr(ref, f.name), getattr(other, f.name)
            if a == b:
                continue
            if f.name == "parameters":
                return f"the model's parameters: {_parameter_difference(a, b, r)}"
            return f"{f.name.replace('_', ' ')}: rank 0 has {a}, rank {r} has {b}"
    return None


def _parameter_difference(a: Sequence[Any], b: Sequence[Any], r: int) -> str:
    for x, y in itertools.zip_longest(a, b):
        if x != y:
            show = lambda v: "nothing" if v is None else f"{v[0]} {list(v[1])} {v[2]}"  # noqa: E731
            return f"rank 0 has {show(x)}, rank {r} has {show(y)}"
    return "they differ"


@contextmanager
def peers(what: str) -> Iterator[None]:
    """A collective of the training thread: a failing or silent peer becomes a RuntimeCommError."""
    try:
        yield
    except RuntimeCommError:
        raise
    except RuntimeError as exc:
        raise RuntimeCommError(f"{what} failed, a peer may have crashed or hung: {exc}") from exc


def tiny_allreduces(coll: Collectives, repeats: int, device: torch.device) -> list[tuple[float, float]]:
    """``(seconds, CPU seconds)`` of ``repeats`` all-reduces of one element on ``coll``, the collectives the
    plan's tasks run on (on gloo with CPU tensors, over the direct connections of
    :mod:`commsched.transport.direct`); collective: every rank calls it with nothing else in flight. CPU time is
    this process's, every thread (``time.process_time``)."""
    one = torch.zeros(1, device=device)
    out = []
    with peers("timing a one-element all-reduce"):
        coll.all_reduce(one).wait()  # connections warm
        for _ in range(repeats):
            start, cpu = time.perf_counter(), time.process_time()
            coll.all_reduce(one).wait()
            if one.is_cuda:
                torch.cuda.synchronize(device)
            out.append((time.perf_counter() - start, time.process_time() - cpu))
    return out


def broadcast_tensors(tensors: Sequence[torch.Tensor], src: int, group: dist.ProcessGroup, what: str) -> None:
    """Rank ``src``'s values of ``tensors`` on every rank: one flat broadcast per dtype and device, all of them
    in flight together (as DDP's coalesced broadcast: one round trip, not one per dtype; before every forward
    BatchNorm's float statistics and long counters are two), each read back in one foreach copy."""
    by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad(), peers(what):
        flats = [torch.cat([t.detach().reshape(-1) for t in ts]) for ts in by_kind.values()]
        works = [dist.broadcast(flat, src=src, group=group, async_op=True) for flat in flats]
        for ts, flat, work in zip(by_kind.values(), flats, works, strict=True):
            assert work is not None  # async_op=True
            work.wait()
            views = [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in ts]), ts, strict=True)]
            torch._foreach_copy_(ts, views)
