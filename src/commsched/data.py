"""Data loading for per-rank batches: every rank its share of each global batch, optionally in micro-batches.

With per-rank batches ``b_0 .. b_{N-1}`` (a plan's ``batch_sizes``, or
``parallelize(..., batch_sizes=...)``), one iteration consumes one *global
batch* of ``B = Σ b`` samples: rank ``r`` takes ``b_r`` consecutive samples of
it, after ranks ``0 .. r-1``. Concatenated in rank order, the ranks' batches
are exactly the global batch one process would take, so with the runtime's
``b_r / B`` gradient weights training equals one process on batches of ``B``::

    model, opt = commsched.parallelize(model, opt, plan="plan.json")
    sampler = SplitBatchSampler(len(dataset), model.batch_sizes, rank=dist.get_rank(), seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            ...  # the loop of plain data-parallel training, unchanged
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

from commsched.errors import SpecError
from commsched.schedule.plan import batch_sizes_problems


class SplitBatchSampler(Sampler[list[int]]):
    """Rank ``rank``'s indices of each global batch, for ``DataLoader(dataset, batch_sampler=...)``.

    Guarantees, for the same ``dataset_len``, ``batch_sizes``, ``seed`` and epoch on every rank:

    * every rank yields the same number of batches (``len(sampler)``), rank ``r``
      exactly ``batch_sizes[r]`` indices each;
    * the ranks' batches of one step are disjoint and, in rank order, form one
      global batch: the epoch's order (a permutation seeded by ``seed + epoch``
      when ``shuffle``, else ``0 .. dataset_len - 1``) cut into runs of ``B``;
    * ``drop_last=True`` drops a last incomplete global batch; otherwise it is
      completed with samples from the start of the epoch's order (as
      ``DistributedSampler`` pads), so the gradient weights stay ``b_r / B``.
    """

    def __init__(
        self,
        dataset_len: int,
        batch_sizes: Sequence[int],
        rank: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        problems = batch_sizes_problems(batch_sizes, None)
        if isinstance(dataset_len, bool) or not isinstance(dataset_len, int) or dataset_len < 1:
            problems.append(f"dataset_len: must be a whole number >= 1, got {dataset_len!r}")
        if not problems and not (isinstance(rank, int) and 0 <= rank < len(batch_sizes)):
            problems.append(f"rank: must be in [0, {len(batch_sizes)}) (one per batch size), got {rank!r}")
        if not problems and drop_last and dataset_len < sum(batch_sizes):
            problems.append(
                f"dataset_len: {dataset_len} samples make no whole global batch of {sum(batch_sizes)} (drop_last)"
            )
        if problems:
            raise SpecError("SplitBatchSampler", problems)
        self.dataset_len = dataset_len
        self.batch_sizes = tuple(batch_sizes)
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0

    @property
    def global_batch(self) -> int:
        return sum(self.batch_sizes)

    @property
    def batch_size(self) -> int:
        """This rank's samples per step."""
        return self.batch_sizes[self.rank]

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (call with the same epoch on every rank before iterating)."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Steps per epoch, the same on every rank."""
        if self.drop_last:
            return self.dataset_len // self.global_batch
        return -(-self.dataset_len // self.global_batch)

    def order(self) -> list[int]:
        """The epoch's order of all samples, before it is cut into global batches."""
        if not self.shuffle:
            return list(range(self.dataset_len))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_len, generator=g).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order()
        steps, total = len(self), len(self) * self.global_batch
        while len(order) < total:  # pad the last global batch from the start of the order
            order += order[: total - len(order)]
        start = sum(self.batch_sizes[: self.rank])
        for step in range(steps):
            first = step * self.global_batch + start
            yield order[first : first + self.batch_size]


def micro_batches(model: Any, *tensors: torch.Tensor, size: int | None = None) -> Iterator[tuple[Any, ...]]:
    """This rank's batch cut into equal micro-batches of ``size`` samples (default: ``model.micro_batch``, the
    plan's), each yielded as ``(*chunks, weight)``; every one but the last inside ``model.no_sync()``.

    ``weight = len(chunk) / len(batch)`` scales a mean-reduced loss, so the
    accumulated gradient is the mean over the rank's samples, which the runtime
    then weights by ``b_r / B``. Ranks with more samples accumulate more
    micro-batches: equal micro-batches keep per-micro-batch statistics
    (BatchNorm) alike on every rank, where uneven batches in one pass do not::

        for x, y in loader:
            for xs, ys, weight in micro_batches(model, x, y):
                (loss_fn(model(xs), ys) * weight).backward()
            optimizer.step(); optimizer.zero_grad()
    """
    size = size if size is not None else getattr(model, "micro_batch", None)
    n = len(tensors[0]) if tensors else 0
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or n % size or n == 0:
        raise SpecError("micro_batches", [f"size: must be a whole number >= 1 dividing the batch of {n}, got {size!r}"])
    if any(len(t) != n for t in tensors):
        raise SpecError("micro_batches", [f"tensors: every one must have {n} samples, got {[len(t) for t in tensors]}"])
    count = n // size
    for i in range(count):
        chunk = tuple(t[i * size : (i + 1) * size] for t in tensors)
        context = model.no_sync() if i < count - 1 else contextlib.nullcontext()
        with context:
            yield (*chunk, size / n)
