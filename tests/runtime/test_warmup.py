"""What the warm-up's measurements make of the network: bandwidth, per-message latency and CPU cost."""

from __future__ import annotations

import pytest

from commsched.profile.network import PS_OP
from commsched.profile.probe_fit import ProbeSample
from commsched.runtime.switching import AutoPlanner
from commsched.runtime.warmup import Recorder, measured_network


def _recorder(latency: list[tuple[float, float]], allreduce: list[tuple[float, float]], messages: int) -> Recorder:
    rec = Recorder()
    rec.latency_s = [w for w, _ in latency]
    rec.latency_cpu_s = [c for _, c in latency]
    rec.allreduce_s = [w for w, _ in allreduce]
    rec.allreduce_cpu_s = [c for _, c in allreduce]
    rec.allreduce_messages = messages
    return rec


def test_cpu_per_message_is_the_median_of_the_tiny_all_reduces_and_per_byte_the_rest_of_the_big_one() -> None:
    rec = _recorder([(4e-4, 1e-4), (6e-4, 3e-4), (5e-4, 2e-4)], [(0.2, 0.0104), (0.1, 0.0204)], messages=2)
    net = measured_network(2, 10**7, rec)
    assert net is not None
    assert net.cpu_per_message_s == pytest.approx(2e-4)
    # the least CPU time of the big all-reduces, less two messages' worth, over the bytes
    assert net.cpu_s_per_byte == pytest.approx((0.0104 - 2 * 2e-4) / 1e7)
    # α from the fastest tiny all-reduce over the ring's 2(p-1) steps; β from the fastest big one
    assert net.latency_s == pytest.approx(4e-4 / 2)
    assert net.bandwidth_bytes_per_s == pytest.approx(1.0 * 10**7 / (0.1 - 2 * 2e-4))


def test_cpu_cost_is_never_negative_and_is_zero_when_nothing_was_measured() -> None:
    rec = _recorder([(4e-4, 5e-3)], [(0.1, 1e-3)], messages=1)  # the big one took less CPU than a message
    net = measured_network(2, 10**6, rec)
    assert net is not None and net.cpu_s_per_byte == 0.0 and net.cpu_per_message_s == 5e-3
    bare = measured_network(2, 10**6, _recorder([], [(0.1, 0.0)], messages=1))
    assert bare is not None and bare.cpu_per_message_s == 0.0 and bare.cpu_s_per_byte == 0.0 and bare.latency_s == 0.0
    assert measured_network(1, 10**6, rec) is None


def test_the_ps_transport_timed_apart_is_priced_half_a_push_and_pull_pair_per_task() -> None:
    rec = _recorder([(4e-4, 1e-4)], [(0.1, 0.01)], messages=1)
    # pairs of 1 MB and 3 MB: 0.5 ms + 1 ms per MB of CPU (medians of the samples)
    rec.transport_samples = (
        ProbeSample(PS_OP, 10**6, 2, (0.01,) * 3, (1.4e-3, 1.5e-3, 1.6e-3)),
        ProbeSample(PS_OP, 3 * 10**6, 2, (0.03,) * 3, (3.5e-3, 3.4e-3, 3.9e-3)),
    )
    net = measured_network(2, 10**7, rec)
    assert net is not None
    ((name, per_task_s, per_byte_s),) = net.transport_cpu
    assert name == "ps"
    assert per_task_s == pytest.approx(0.5e-3 / 2) and per_byte_s == pytest.approx(1e-9 / 2)
    assert measured_network(2, 10**7, _recorder([(4e-4, 1e-4)], [(0.1, 0.01)], 1)).transport_cpu == ()  # type: ignore[union-attr]


def test_auto_times_the_ps_transport_apart_only_where_it_may_choose_it_on_gloo_with_cpu_tensors() -> None:
    assert AutoPlanner(1.0, None, gloo=True).timed_apart() == {"ps"}
    assert AutoPlanner(1.0, ("ps", "dear"), gloo=True).timed_apart() == {"ps"}
    assert AutoPlanner(1.0, ("ddp", "dear"), gloo=True).timed_apart() == frozenset()  # not a candidate
    assert AutoPlanner(1.0, None, gloo=False).timed_apart() == frozenset()  # priced without gloo's CPU work
    assert AutoPlanner(1.0, None, gloo=True, host_memory=False).timed_apart() == frozenset()  # cannot run there


def test_a_named_ps_times_its_transport_apart_only_where_it_sizes_its_fusion_from_the_network() -> None:
    from commsched.runtime.named import NamedPlanner
    from commsched.schedule import make_knobs

    def named(policy: str, gloo: bool = True, host_memory: bool = True, **knobs: object) -> NamedPlanner:
        return NamedPlanner(policy, make_knobs(policy, knobs).to_dict(), gloo=gloo, host_memory=host_memory)

    assert named("ps").timed_apart() == {"ps"}
    assert named("ps", fuse_kb=64).timed_apart() == frozenset()  # the size given: nothing to price
    assert named("ps", gloo=False).timed_apart() == frozenset()
    assert named("ps", host_memory=False).timed_apart() == frozenset()
    assert named("dlcp").timed_apart() == frozenset()  # fuses at its own 64 KiB, over its own transport
    assert named("ddp").timed_apart() == frozenset()


def test_a_near_tie_is_the_best_unmeasured_policy_within_the_margin_of_the_best_prediction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from commsched import zoo
    from commsched.schedule import NetworkEstimate

    workload, network = zoo.load("resnet18"), NetworkEstimate(2, 1.25e9, 20e-6)
    planner = AutoPlanner(1.0, None)
    ranking = [("bytescheduler", {}, 100.0), ("dear", {}, 103.0), ("ps", {}, 104.9), ("ddp", {}, 105.1)]
    monkeypatch.setattr(AutoPlanner, "_search", lambda self, w, n: ranking)
    assert planner(workload, network, frozenset()).policy == "bytescheduler"
    tie = planner.near_tie(workload, network, frozenset({"bytescheduler"}))
    assert tie is not None and tie.policy == "dear"
    tie = planner.near_tie(workload, network, frozenset({"bytescheduler", "dear"}))
    assert tie is not None and tie.policy == "ps"  # 4.9 % behind the best (the measured one): within 5 %
    assert planner.near_tie(workload, network, frozenset({"bytescheduler", "dear", "ps"})) is None  # ddp: 5.1 %
    # the ranking's order decides: the best not yet measured first
    assert planner.near_tie(workload, network, frozenset({"dear", "ps"})).policy == "bytescheduler"  # type: ignore[union-attr]


def test_auto_asks_its_search_for_the_knob_margin_before_it_replaces_a_policys_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import commsched.plan
    from commsched import zoo
    from commsched.runtime.switching import KNOB_MARGIN
    from commsched.schedule import NetworkEstimate

    asked: dict[str, object] = {}
    real = commsched.plan.advise

    def spy(*args: object, **kwargs: object) -> object:
        asked.update(kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(commsched.plan, "advise", spy)
    plan = AutoPlanner(30.0, ("ddp", "dear"))(zoo.load("resnet18"), NetworkEstimate(2, 1.25e9, 20e-6), frozenset())
    assert plan.policy in ("ddp", "dear")
    assert asked["defaults_margin"] == KNOB_MARGIN > 0.02  # more than advise's own default


@pytest.mark.parametrize("forward_end", [True, False], ids=["forward's end recorded", "not recorded"])
def test_the_warm_ups_workload_counts_gradients_from_the_end_of_the_forward(forward_end: bool) -> None:
    """The loss and the backward before the first gradient are compute the plan must see: gradient-ready
    times count from the end of the wrapper's forward, and the last layer's forward runs to there. Without
    that end, from the first gradient (the last layer's forward then unmeasured)."""
    from torch import nn

    from commsched.runtime.warmup import measured_workload

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    first, last = model[0], model[1]
    rec = Recorder()
    rec.called = {id(first): 0, id(last): 1}
    rec.forward_s = {id(first): 10.000, id(last): 10.010}
    rec.forward_end_s = 10.030 if forward_end else None
    # the last layer's gradients 50 ms after the forward's end (a head's backward, the loss), the first's 20 later
    rec.ready_s = {id(p): 10.080 for p in last.parameters()} | {id(p): 10.100 for p in first.parameters()}
    workload, _ = measured_workload(model, rec)
    assert [layer.forward_ms for layer in workload.layers] == pytest.approx([10.0, 20.0 if forward_end else 0.0])
    expected = [70.0, 70.0, 50.0, 50.0] if forward_end else [20.0, 20.0, 0.0, 0.0]
    assert list(workload.grad_ready_ms) == pytest.approx(expected)
