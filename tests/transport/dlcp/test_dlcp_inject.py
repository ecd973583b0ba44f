"""The bound as an allowance (nothing given up on a loss-free path) and the link's emulated random loss."""

from __future__ import annotations

import pytest
import torch
from test_dlcp_link import check_written, data, eventually, pair

from commsched.transport import TransportOptions
from commsched.transport.dlcp.inject import RandomDrop
from commsched.transport.dlcp.wire import packet_numel
from commsched.transport.links import TransferKey


def transfer(bound: float, numel: int = 200_000, **knobs: object) -> tuple[int, str, int]:
    """One transfer from rank 0 to rank 1: (elements lost, how the receive ended, datagrams dropped by the hook)."""
    a, b = pair(timeout_s=20.0, **knobs)  # type: ignore[arg-type]
    try:
        sent = data(numel)
        out = torch.full_like(sent, float("nan"))
        recv = b.recv(0, TransferKey(3, 1, 0), out, loss_bound=bound)
        send = a.send(1, TransferKey(3, 1, 0), sent)
        send.wait(20.0)  # the receiver said STOP: its receive has ended (well before the 20 s deadline)
        assert eventually(recv.is_completed, 10.0)
        got = recv.wait(0.0)
        check_written(out, sent, got)
        assert got.lost <= int(bound * numel)
        return got.lost, b.stats.records[-1].ended, a.stats.dropped_by_hook
    finally:
        a.close()
        b.close()


def test_a_loss_free_path_gives_up_nothing_whatever_the_bound() -> None:
    assert transfer(0.05)[:2] == (0, "complete")


def test_with_stop_at_count_the_receiver_gives_up_the_last_packets_even_without_loss() -> None:
    lost, ended, _ = transfer(0.05, stop_at_count=True)
    assert ended == "bound" and 0 < lost <= 0.05 * 200_000


def test_injected_random_loss_is_given_up_within_the_bound_and_counted() -> None:
    lost, ended, dropped = transfer(0.05, drop=RandomDrop(0.2, seed=3))
    assert ended == "bound" and lost > 0 and dropped > 0


def test_random_drop_is_seeded_per_rank_and_drops_about_its_fraction() -> None:
    draws = [RandomDrop(0.1, seed=7, rank=r) for r in (0, 0, 1)]
    seqs = [[d(1, 0) for _ in range(20_000)] for d in draws]
    assert seqs[0] == seqs[1] and seqs[0] != seqs[2]
    assert 0.09 < sum(seqs[0]) / 20_000 < 0.11


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan"), "0.1", True])
def test_transport_options_refuse_an_injected_loss_outside_0_to_1(bad: object) -> None:
    with pytest.raises(ValueError, match=r"TransportOptions\.inject_loss: must be a number in \[0, 1\), got"):
        TransportOptions(inject_loss=bad)  # type: ignore[arg-type]


def test_holes_within_the_bound_end_the_receive_on_the_senders_probe_without_a_resend() -> None:
    stride = packet_numel(1500, 4)
    lost_offsets = {0, 10 * stride}
    first_time: set[int] = set()

    def drop_two_once(_peer: int, offset: int) -> bool:
        if offset in lost_offsets and offset not in first_time:
            first_time.add(offset)
            return True
        return False

    lost, ended, dropped = transfer(0.05, numel=20_000, drop=drop_two_once)
    assert (lost, ended, dropped) == (2 * stride, "bound", 2)
