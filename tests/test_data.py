"""SplitBatchSampler: each rank its consecutive share of every global batch, the same steps on every rank."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from commsched.data import SplitBatchSampler
from commsched.errors import SpecError


def _epoch(n: int, sizes: tuple[int, ...], epoch: int = 0, **kw: object) -> list[list[list[int]]]:
    """Per rank, its batches of one epoch."""
    out = []
    for r in range(len(sizes)):
        s = SplitBatchSampler(n, sizes, r, **kw)  # type: ignore[arg-type]
        s.set_epoch(epoch)
        out.append(list(s))
    return out


def test_ranks_in_order_form_the_global_batches_of_one_process() -> None:
    sizes = (1, 2, 3)
    per_rank = _epoch(30, sizes, seed=7)
    whole = _epoch(30, (6,), seed=7)[0]
    assert [len(b) for b in per_rank[0]] == [1] * 5 and [len(b) for b in per_rank[2]] == [3] * 5
    for step, global_batch in enumerate(whole):
        assert per_rank[0][step] + per_rank[1][step] + per_rank[2][step] == global_batch
    assert sorted(i for batch in whole for i in batch) == list(range(30))


def test_order_is_deterministic_per_epoch_and_changes_between_epochs() -> None:
    assert _epoch(20, (2, 3), epoch=1, seed=3) == _epoch(20, (2, 3), epoch=1, seed=3)
    assert _epoch(20, (2, 3), epoch=1, seed=3) != _epoch(20, (2, 3), epoch=2, seed=3)
    assert _epoch(10, (2, 3), shuffle=False)[1] == [[2, 3, 4], [7, 8, 9]]


def test_last_incomplete_global_batch_is_padded_or_dropped_and_every_rank_runs_the_same_steps() -> None:
    padded = _epoch(11, (1, 2), shuffle=False)
    assert [len(rank) for rank in padded] == [4, 4]
    assert padded[0][-1] + padded[1][-1] == [9, 10, 0]  # completed from the start of the order
    dropped = _epoch(11, (1, 2), shuffle=False, drop_last=True)
    assert [len(rank) for rank in dropped] == [3, 3] and dropped[1][-1] == [7, 8]
    tiny = _epoch(2, (2, 3), shuffle=False)
    assert tiny == [[[0, 1]], [[0, 1, 0]]]
    assert len(SplitBatchSampler(11, (1, 2), 0)) == 4 and len(SplitBatchSampler(11, (1, 2), 0, drop_last=True)) == 3


def test_works_as_a_dataloader_batch_sampler() -> None:
    data = TensorDataset(torch.arange(12.0))
    sampler = SplitBatchSampler(12, [1, 3], rank=1, shuffle=False)
    batches = [x.tolist() for (x,) in DataLoader(data, batch_sampler=sampler)]
    assert batches == [[1.0, 2.0, 3.0], [5.0, 6.0, 7.0], [9.0, 10.0, 11.0]]
    assert sampler.batch_size == 3 and sampler.global_batch == 4


@pytest.mark.parametrize(
    ("args", "kw", "message"),
    [
        ((10, (1, 0), 0), {}, r"batch_sizes\[1\]: must be a whole number >= 1, got 0"),
        ((10, None, 0), {}, r"batch_sizes: expected a list of whole numbers, one per rank, got None"),
        ((0, (1, 2), 0), {}, r"dataset_len: must be a whole number >= 1, got 0"),
        ((10, (1, 2), 2), {}, r"rank: must be in \[0, 2\) \(one per batch size\), got 2"),
        ((2, (1, 2), 0), {"drop_last": True}, r"dataset_len: 2 samples make no whole global batch of 3"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field_and_value(args: tuple, kw: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        SplitBatchSampler(*args, **kw)
