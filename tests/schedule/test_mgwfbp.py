"""MG-WFBP's merge rule, checked on cases small enough to compute by hand."""

from __future__ import annotations

import pytest

from commsched.schedule import Launch, NetworkEstimate, build_scheduler
from commsched.schedule.mgwfbp import MGWFBPKnobs, allreduce_line, merge_groups
from commsched.workload import Workload

# 4 workers at 1 Gbit/s, no latency: b = 2(p-1)/p / B = 1.5 / 1.25e8 s/byte = 12 ns/byte.
NET = NetworkEstimate(4, 1.25e8, 0.0)
QUARTER_MB = 62_500  # fp32 elements: 250,000 bytes, 3 ms at 12 ns/byte


def three_layers(ready_ms: list[float]) -> Workload:
    """Layers 0, 1, 2, one 250,000-byte tensor each, gradients ready at ``ready_ms`` (forward order)."""
    return Workload.from_dict(
        {
            "model": "three",
            "batch_size": 1,
            "device": "x",
            "provenance": {"kind": "estimated", "source": "hand-made"},
            "layers": [
                {
                    "name": f"l{i}",
                    "forward_ms": 1.0,
                    "backward_ms": 1.0,
                    "tensors": [{"name": f"w{i}", "numel": QUARTER_MB}],
                    "grad_ready_ms": [ready_ms[i]],
                }
                for i in range(3)
            ],
        }
    )


def groups(ready_ms: list[float], alpha_ms: float) -> list[tuple[int, ...]]:
    s = build_scheduler("mgwfbp", three_layers(ready_ms), NET, alpha_ms=alpha_ms)
    return [t.tensors for t in s.plan.tasks]


def test_a_gradient_is_merged_when_its_wait_is_shorter_than_one_startup() -> None:
    # Ready order w2 (1 ms), w1 (1.5 ms), w0 (6 ms); a = 1 ms.
    # {w2} would start at 1 and end at 1 + 1 + 3 = 5; w1 is ready at 1.5 < 5 and waiting for it
    # costs 0.5 ms < a = 1 ms: merged. {w2, w1} starts at 1.5 and ends at 1.5 + 1 + 6 = 8.5;
    # w0 is ready at 6 < 8.5, but the all-reduce would have run for 4.5 ms > a: not merged.
    assert groups([6.0, 1.5, 1.0], alpha_ms=1.0) == [(2, 1), (0,)]


def test_a_gradient_is_not_merged_when_the_wait_exceeds_the_startup() -> None:
    # a = 0.25 ms: waiting 0.5 ms for w1 costs more than the startup it saves.
    # {w2}: 1 -> 1 + 0.25 + 3 = 4.25. {w1}: starts when the link frees, 4.25 -> 7.5.
    # w0 at 6 ms: {w1} started at 4.25, 1.75 ms > a ago: not merged.
    assert groups([6.0, 1.5, 1.0], alpha_ms=0.25) == [(2,), (1,), (0,)]


def test_a_gradient_is_merged_for_free_while_the_group_still_waits_for_the_link() -> None:
    # As above, but w0 is ready at 3 ms: {w1} cannot start before {w2} ends at 4.25,
    # so taking w0 along costs nothing.
    assert groups([3.0, 1.5, 1.0], alpha_ms=0.25) == [(2,), (1, 0)]


def test_a_gradient_ready_after_the_group_ends_starts_a_new_group() -> None:
    # a = 1 ms, w0 ready at 9 ms, after {w2, w1} ended at 8.5 ms.
    assert groups([9.0, 1.5, 1.0], alpha_ms=1.0) == [(2, 1), (0,)]
    assert merge_groups([0.0, 0.0], [100, 100], 0.0, 1e-9) == [[0], [1]]  # no startup to save: no merging


def test_without_an_override_the_startup_is_the_ring_all_reduce_latency() -> None:
    net = NetworkEstimate(64, 1.25e9, 55e-6)
    a, b = allreduce_line(net, MGWFBPKnobs())
    assert a == pytest.approx(2 * 63 * 55e-6)
    assert b == pytest.approx(2 * 63 / 64 / 1.25e9)
    a, b = allreduce_line(net, MGWFBPKnobs(alpha_ms=7.04, bandwidth_gbps=80))
    assert (a, b) == (pytest.approx(7.04e-3), pytest.approx(2 * 63 / 64 / 1e10))


def test_a_huge_startup_merges_everything_and_launches_once_backward_is_done() -> None:
    s = build_scheduler("mgwfbp", three_layers([6.0, 1.5, 1.0]), NET, alpha_ms=1000.0)
    assert [t.tensors for t in s.plan.tasks] == [(2, 1, 0)]
    assert s.plan.update == "step"
    assert s.on_grad_ready(2) == [] and s.on_grad_ready(1) == []
    assert list(s.on_grad_ready(0)) == [Launch(0)]
    assert s.on_backward_done() == () and s.on_step() == ()
