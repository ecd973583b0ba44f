"""PyTorch DDP's gradient copies: timed as DDP makes them, charged to the workload and the update."""

from __future__ import annotations

import pytest
import torch

from commsched import zoo
from commsched.bench.copies import COPY_ROUNDS, BucketCopies, time_bucket_copies, with_bucket_copies
from commsched.models import build_model, synthetic_batch
from commsched.profile.probe_fit import measured_cluster
from commsched.sim import simulate


def test_the_rates_are_the_median_rounds_over_the_mib() -> None:
    copies = BucketCopies(2 * 2**20, (1.0, 3.0, 2.0), (4.0, 6.0, 5.0))
    assert copies.in_ms_per_mb == pytest.approx(1.0)
    assert copies.out_ms_per_mb == pytest.approx(2.5)
    assert BucketCopies.from_dict({"nbytes": 2 * 2**20, "in_ms": [1, 3, 2], "out_ms": [4, 6, 5]}, "r") == copies


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"nbytes": 0, "in_ms": [1.0], "out_ms": [1.0]}, "bucket_copies.nbytes"),
        ({"nbytes": 8, "in_ms": [], "out_ms": [1.0]}, "bucket_copies.in_ms"),
        ({"nbytes": 8, "in_ms": [1.0], "out_ms": [-1.0]}, "bucket_copies.out_ms"),
        ({"nbytes": 8, "in_ms": [1.0]}, "out_ms"),
    ],
)
def test_a_malformed_record_names_its_source_and_field(data: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=rf"report 7: bucket_copies: .*{named}"):
        BucketCopies.from_dict(data, "report 7")


def test_every_gradient_is_copied_in_and_out_per_round_and_the_gradients_are_left_cleared() -> None:
    torch.manual_seed(0)
    model = build_model("cnn", 0)
    copies = time_bucket_copies(model, synthetic_batch("cnn", 4, 0, 0, 0), world=2)
    assert copies.nbytes == 4 * sum(p.numel() for p in model.parameters())
    assert len(copies.in_ms) == len(copies.out_ms) == COPY_ROUNDS
    assert min(copies.in_ms) > 0 and min(copies.out_ms) > 0
    assert all(p.grad is None for p in model.parameters())


def test_the_copies_in_lengthen_the_backward_as_gradients_become_ready_and_the_copies_out_the_update() -> None:
    workload = zoo.load("resnet18")
    mib = workload.total_bytes / 2**20
    copies = BucketCopies(2**20, (0.5,), (0.25,))  # 0.5 ms per MiB in, 0.25 out
    charged, update_ms = with_bucket_copies(workload, 7.0, copies)
    assert update_ms == pytest.approx(7.0 + 0.25 * mib)
    assert charged.backward_ms == pytest.approx(workload.backward_ms + 0.5 * mib)
    assert charged.forward_ms == workload.forward_ms
    for layer, before in zip(charged.layers, workload.layers, strict=True):
        assert layer.backward_ms == pytest.approx(before.backward_ms + 0.5 * before.bytes / 2**20)
    # each gradient is ready later by the copies of itself and of every gradient ready before it
    ready, was = charged.grad_ready_ms, workload.grad_ready_ms
    order = sorted(range(len(was)), key=lambda k: (was[k], -k))
    sizes = [t.bytes / 2**20 for t in workload.tensors]
    done = 0.0
    for k in order:
        done += 0.5 * sizes[k]
        assert ready[k] == pytest.approx(was[k] + done)
    assert max(ready) == pytest.approx(charged.backward_ms)  # the last gradient is ready as the backward ends


def test_a_simulated_ddp_iteration_grows_by_the_copies_where_the_network_is_not_the_bound() -> None:
    workload = zoo.load("resnet18")
    cluster = measured_cluster(1e-6, 8 / 1e12, 2, name="fast network")  # 1 µs, 1 Tbit/s
    mib = workload.total_bytes / 2**20
    charged, update_ms = with_bucket_copies(workload, 0.0, BucketCopies(2**20, (0.2,), (0.1,)))
    base = simulate(workload, cluster, "ddp", 10, 2, trace=False).iteration_ms
    grown = simulate(charged, cluster, "ddp", 10, 2, options={"update_ms": update_ms}, trace=False).iteration_ms
    assert grown - base == pytest.approx(0.3 * mib, rel=0.1)
