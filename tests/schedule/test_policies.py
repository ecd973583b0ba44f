"""The policies as state machines: events in, actions out (no simulator, no torch)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.errors import ScheduleError
from commsched.schedule import POLICIES, CommPlan, Launch, NetworkEstimate, Wait, build_scheduler, knobs
from commsched.schedule.base import CommTask, Segment
from commsched.schedule.dispatch import Dispatcher
from commsched.schedule.knobs import NoKnobs
from commsched.schedule.prophet import find_stages
from commsched.workload import Workload

MiB = 1024 * 1024
NET = NetworkEstimate(4, 1.25e8, 0.0)  # 1 Gbit/s, no latency


def workload(sizes: list[int], backward_ms: list[float] | None = None, ready: list[float] | None = None) -> Workload:
    """One tensor per layer; ``sizes`` in elements (fp32), forward order."""
    layers = []
    for i, n in enumerate(sizes):
        layer = {
            "name": f"l{i}",
            "forward_ms": 1.0,
            "backward_ms": (backward_ms or [1.0] * len(sizes))[i],
            "tensors": [{"name": f"w{i}", "numel": n}],
        }
        if ready is not None:
            layer["grad_ready_ms"] = [ready[i]]
        layers.append(layer)
    return Workload.from_dict(
        {
            "model": "t",
            "batch_size": 1,
            "device": "x",
            "provenance": {"kind": "estimated", "source": "t"},
            "layers": layers,
        }
    )


def backward(scheduler, n: int) -> list:
    """Deliver one backward (tensors ready last to first), backward_done and step; return all actions."""
    out = []
    for t in reversed(range(n)):
        out += scheduler.on_grad_ready(t)
    out += scheduler.on_backward_done()
    out += scheduler.on_step()
    return out


def launched(actions: list) -> list[int]:
    return [a.task for a in actions if isinstance(a, Launch)]


def test_ddp_buckets_in_ready_order_with_a_small_first_bucket() -> None:
    w = workload([MiB // 4] * 8)  # 1 MiB each
    s = build_scheduler("ddp", w, NET, bucket_cap_mb=3, first_bucket_mb=1)
    groups = [t.tensors for t in s.plan.tasks]
    assert groups == [(7,), (6, 5, 4), (3, 2, 1), (0,)]
    assert launched(backward(s, 8)) == [0, 1, 2, 3]
    assert s.plan.update == "step"


def test_ddp_launches_buckets_in_index_order_even_if_a_later_one_fills_first() -> None:
    w = workload([10, 10, 10, 10])
    s = build_scheduler("ddp", w, NET, bucket_cap_mb=40 / MiB, first_bucket_mb=None)
    assert [t.tensors for t in s.plan.tasks] == [(3,), (2,), (1,), (0,)]
    assert launched(s.on_grad_ready(2)) == []  # bucket 1 full, bucket 0 not yet: wait
    assert launched(s.on_grad_ready(3)) == [0, 1]


def test_wfbp_launches_one_all_reduce_per_tensor_when_ready() -> None:
    s = build_scheduler("wfbp", workload([5, 6, 7]), NET)
    assert launched(backward(s, 3)) == [2, 1, 0]


def test_dear_reduce_scatters_in_backward_and_gathers_one_group_ahead_in_forward() -> None:
    w = workload([MiB // 4] * 6)  # 1 MiB per layer
    s = build_scheduler("dear", w, NET, threshold_mb=2.5)  # groups of 2 layers: [0,1] [2,3] [4,5]
    kinds = [t.kind for t in s.plan.tasks]
    assert kinds == ["reduce_scatter", "all_gather"] * 3
    # backward: RS of the last group first; nothing gathered yet
    acts = []
    for t in reversed(range(6)):
        acts += s.on_grad_ready(t)
    assert launched(acts) == [4, 2, 0]
    assert launched(s.on_step()) == [1]  # AG(0) at step
    assert launched(s.on_forward_pre(0)) == [3]  # first layer of group 0: AG(1)
    assert launched(s.on_forward_pre(1)) == []  # same group: nothing new
    assert launched(s.on_forward_pre(2)) == [5]  # group 1: AG(2)
    assert launched(s.on_forward_pre(4)) == []
    assert s.plan.update == "forward"
    assert s.plan.final_tasks_of_layer[3] == (3,)


def test_ddp_initial_buckets_follow_registration_order_and_reduce_the_last_layers_first() -> None:
    # DDP with find_unused_parameters=True keeps these (torch 2.13: resnet5m gave 19474472 + 1485056 bytes)
    w = workload([MiB // 8, MiB // 8, MiB // 4, MiB, MiB // 2])  # 0.5, 0.5, 1, 4, 2 MiB
    rebuilt = build_scheduler("ddp", w, NET, bucket_cap_mb=3)
    initial = build_scheduler("ddp", w, NET, bucket_cap_mb=3, rebuilt=False)
    assert [t.tensors for t in rebuilt.plan.tasks] == [(4,), (3,), (2, 1, 0)]  # ready order: 1 MiB first
    # registration order, closed once at or over the cap (first layers: 1 MiB), the last layers reduced first
    assert [t.tensors for t in initial.plan.tasks] == [(4,), (2, 3), (0, 1)]
    assert launched(initial.on_grad_ready(4)) == [0]
    assert launched(initial.on_grad_ready(3)) == []  # its bucket still waits for tensor 2
    assert launched(initial.on_grad_ready(2)) == [1]
    assert launched(initial.on_grad_ready(1) + initial.on_grad_ready(0)) == [2]


@pytest.mark.parametrize(
    ("policy", "knob", "value", "message"),
    [
        ("ddp", "rebuilt", "False", r"ddp: knob 'rebuilt' must be true or false, got 'False'"),
        ("ddp", "bucket_cap_mb", "25", r"ddp: knob 'bucket_cap_mb' must be a number >= 0, got '25'"),
        ("dear", "threshold_mb", None, r"dear: knob 'threshold_mb' must be a number > 0, got none"),
        ("horovod", "cycle_time_ms", float("nan"), r"horovod: knob 'cycle_time_ms' must be a number > 0, got nan"),
        ("dear", "threshold_mb", -2, r"dear: knob 'threshold_mb' must be a number > 0, got -2"),
        ("prophet", "bandwidth_gbps", 0, r"prophet: knob 'bandwidth_gbps' must be a number > 0, got 0"),
    ],
)
def test_a_knob_of_the_wrong_type_is_refused(policy: str, knob: str, value: object, message: str) -> None:
    # a command line's "False" is a non-empty string: taken as is, it would silently mean True
    with pytest.raises(ScheduleError, match=message):
        build_scheduler(policy, workload([MiB // 4] * 2), NET, **{knob: value})


def test_dear_lookahead_issues_gathers_that_many_groups_ahead_of_the_forward() -> None:
    w = workload([MiB // 4] * 6)
    s = build_scheduler("dear", w, NET, threshold_mb=1.5, lookahead=3)  # one group per layer
    backward(s, 6)
    assert launched(s.on_step()) == [1, 3, 5]  # AG(0..2) at step
    assert launched(s.on_forward_pre(0)) == [7]  # group 0 starts: AG(3)
    assert launched(s.on_forward_pre(1)) == [9]
    assert launched(s.on_forward_pre(2)) == [11]
    assert launched(s.on_forward_pre(3)) == []  # nothing left
    s = build_scheduler("dear", w, NET, threshold_mb=1.5, lookahead=100)
    backward(s, 6)
    assert launched(s.on_step()) == [1, 3, 5, 7, 9, 11]


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_dear_refuses_a_lookahead_that_is_not_a_whole_number_of_groups(bad: object) -> None:
    with pytest.raises(ScheduleError, match=r"dear: knob 'lookahead' must be a whole number >= 1, got"):
        build_scheduler("dear", workload([MiB // 4] * 2), NET, lookahead=bad)


def test_dear_settles_gathers_the_forward_skipped_before_the_next_backward() -> None:
    w = workload([MiB // 4] * 4)
    s = build_scheduler("dear", w, NET, threshold_mb=1.5)  # one group per layer
    backward(s, 4)
    # the forward only reached layer 0, so AG(2), AG(3) are still owed when backward begins
    s.on_forward_pre(0)
    acts = s.on_grad_ready(3)
    assert launched(acts)[:2] == [5, 7] and launched(acts)[2] == 6


def test_dear_flush_launches_every_owed_gather() -> None:
    s = build_scheduler("dear", workload([MiB // 4] * 3), NET, threshold_mb=1.5)
    backward(s, 3)
    assert launched(s.on_flush()) == [3, 5]


def test_bytescheduler_front_layers_overtake_queued_partitions_but_not_in_flight_ones() -> None:
    w = workload([MiB // 4] * 4)  # 1 MiB per tensor
    s = build_scheduler("bytescheduler", w, NET, partition_mb=0.5, credit_mb=1)  # 2 partitions per tensor
    assert s.uses_completions
    assert launched(s.on_grad_ready(3)) == [6, 7]  # 1 MiB in flight: the window is full
    assert launched(s.on_grad_ready(2)) == []  # queued behind the window
    assert launched(s.on_grad_ready(1)) == []
    assert launched(s.on_grad_ready(0)) == []
    # as credit returns, tensor 0 (nearest the input) goes first, then 1, then 2
    assert launched(s.on_comm_done(6)) == [0]
    assert launched(s.on_comm_done(7)) == [1]
    assert launched(s.on_comm_done(0)) == [2]
    assert launched(s.on_comm_done(1)) == [3]
    assert launched(s.on_comm_done(2)) == [4]


def test_bytescheduler_drains_everything_through_completions() -> None:
    w = workload([MiB // 4] * 3)
    s = build_scheduler("bytescheduler", w, NET, partition_mb=0.25, credit_mb=0.5)
    pending = launched(backward(s, 3))
    seen = list(pending)
    while pending:
        nxt = launched(s.on_comm_done(pending.pop(0)))
        pending += nxt
        seen += nxt
    assert sorted(seen) == list(range(len(s.plan.tasks)))


def test_prophet_finds_stages_at_large_gaps() -> None:
    # ready times: burst at 0-2 ms, gap, burst at 20-21 ms, gap, 40 ms
    w = workload([10] * 6, ready=[40, 21, 20, 2, 1, 0])
    stages = find_stages(w, 2.0)
    assert [sorted(s) for s, _ in stages] == [[3, 4, 5], [1, 2], [0]]
    assert [round(g) for _, g in stages] == [18, 19, 0]


def test_prophet_sends_a_block_that_fits_the_gap_then_drains_with_credit() -> None:
    # 3 stages; 1 Gbit/s and 4 workers: 1 MiB costs 2*(3/4)*1 MiB / 125 MB/s = 12.6 ms
    w = workload([MiB // 4] * 4, ready=[40, 20, 20, 0])
    s = build_scheduler("prophet", w, NET, partition_mb=1, credit_mb=3, gap_factor=1.0)
    first = launched(s.on_grad_ready(3))  # stage 0 complete: gap 20 ms fits one 12.6 ms partition
    assert first == [3]
    assert launched(s.on_grad_ready(2)) == []  # stage 1 not complete yet
    assert launched(s.on_grad_ready(1)) == [1]  # stage 1 complete: the front-most pending partition first
    # last stage: credit window (3 MiB, 2 in flight), priority order, then completions release the rest
    assert launched(s.on_grad_ready(0)) == [0]
    assert launched(s.on_step()) == []
    assert launched(s.on_comm_done(3)) == [2]  # still draining after step(): nothing is left behind


def test_every_policy_rejects_unknown_knobs_with_the_known_ones() -> None:
    w = workload([10])
    for name in POLICIES:
        with pytest.raises(ScheduleError, match="unknown knob"):
            build_scheduler(name, w, NET, bogus=1)
    with pytest.raises(ScheduleError, match="known: "):
        build_scheduler("nope", w, NET)
    assert "threshold_mb" in knobs("dear")


def test_plan_check_rejects_a_plan_that_loses_gradient_elements() -> None:
    w = workload([10, 10])
    task = CommTask(0, "all_reduce", (Segment(0, 0, 10), Segment(1, 0, 5)), 60, "bad")
    with pytest.raises(ScheduleError, match="5 of 10 elements reduced"):
        CommPlan("bad", w, NET, (task,), "step", NoKnobs())


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300_000), min_size=1, max_size=12),
    policy=st.sampled_from(sorted(POLICIES)),
    scale=st.floats(0.01, 4.0),
)
def test_every_policy_launches_every_task_exactly_once_per_iteration(
    sizes: list[int], policy: str, scale: float
) -> None:
    """Over three iterations, with completions answered in launch order and Waits honoured."""
    w = workload(sizes, backward_ms=[1.0 + (i % 3) for i in range(len(sizes))])
    options = {
        "ddp": {"bucket_cap_mb": scale},
        "horovod": {"fusion_threshold_mb": scale},
        "bytescheduler": {"partition_mb": scale / 4, "credit_mb": scale},
        "prophet": {"partition_mb": scale / 4, "credit_mb": scale},
        "dear": {"threshold_mb": scale},
        "no_overlap": {},
        "ps": {"partition_mb": scale / 4, "credit_mb": scale, "fuse_kb": scale * 100},
        "dlcp": {"partition_mb": scale / 4, "credit_mb": scale, "fuse_kb": scale * 100},
        "wfbp": {},
        "mgwfbp": {"alpha_ms": scale},
    }[policy]
    s = build_scheduler(policy, w, NET, **options)
    n_tasks = len(s.plan.tasks)
    in_flight: list[int] = []

    def run(actions) -> list[int]:
        out = []
        queue = list(actions)
        while queue:
            a = queue.pop(0)
            if isinstance(a, Launch):
                out.append(a.task)
                in_flight.append(a.task)
            elif isinstance(a, Wait):
                assert a.task in in_flight
        if s.uses_completions:
            while in_flight:
                done = in_flight.pop(0)
                out += run(s.on_comm_done(done))
        else:
            in_flight.clear()
        return out

    for _ in range(3):
        seen = []
        for li in range(len(w.layers)):
            seen += run(s.on_forward_pre(li))
        for t in reversed(range(len(w.tensors))):
            seen += run(s.on_grad_ready(t))
        seen += run(s.on_backward_done())
        seen += run(s.on_step())
        seen += run(s.on_flush())
        if policy == "dear":
            # gathers of this step are launched in the next forward / flush: count RS here, AG next
            assert sorted(t for t in seen if s.plan.tasks[t].kind == "reduce_scatter") == list(range(0, n_tasks, 2))
        else:
            assert sorted(seen) == list(range(n_tasks)), (policy, seen)


def test_bytescheduler_decides_on_completions_only_where_its_window_can_fill() -> None:
    w = workload([MiB // 4] * 4)  # 4 MiB in all
    for credit_mb, decides in ((3.9, True), (4.0, False), (64.0, False)):
        s = build_scheduler("bytescheduler", w, NET, partition_mb=0.5, credit_mb=credit_mb)
        assert type(s).decides_on_completions(s.plan) is decides, credit_mb
        assert Dispatcher(s.plan, s).listens("comm_done") is decides, credit_mb


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_bytescheduler_with_an_open_window_launches_what_the_window_would_whenever_completions_arrive(
    data: st.DataObject,
) -> None:
    """Where the window holds every byte, the scheduler that hears no completions (every rank deciding for
    itself) launches exactly what one with the window, told of completions at any moment of the iteration
    (before the layer's next forward, as the runtime waits), launches."""
    sizes = data.draw(st.lists(st.integers(1, MiB // 4), min_size=1, max_size=6))
    w = workload(sizes)
    credit_mb = sum(sizes) * 4 / MiB * data.draw(st.sampled_from([1.0, 1.5, 16.0]))
    open_ = build_scheduler("bytescheduler", w, NET, partition_mb=0.1, credit_mb=credit_mb)
    told = build_scheduler("bytescheduler", w, NET, partition_mb=0.1, credit_mb=credit_mb)
    assert not type(open_).decides_on_completions(open_.plan)
    told._queue.credit_bytes = int(credit_mb * MiB)  # the window as it would be, completions reported
    in_flight: list[int] = []
    for _ in range(3):
        for t in reversed(range(len(w.tensors))):
            for _ in range(data.draw(st.integers(0, len(in_flight)))):  # some completions arrive first
                done = in_flight.pop(data.draw(st.integers(0, len(in_flight) - 1)))
                assert launched(told.on_comm_done(done)) == []
            ours = launched(open_.on_grad_ready(t))
            theirs = launched(told.on_grad_ready(t))
            assert ours == theirs
            in_flight += theirs
        for task in in_flight:  # every layer's next forward waits for its partitions
            assert launched(told.on_comm_done(task)) == []
        in_flight.clear()
        open_.on_step()
        told.on_step()


def test_ps_pushes_front_layers_first_within_the_credit_and_pulls_right_after_each_push() -> None:
    w = workload([MiB // 4] * 3)  # 1 MiB per tensor
    s = build_scheduler("ps", w, NET, partition_mb=0.5, credit_mb=1)  # 2 partitions per tensor: 6 push/pull pairs
    kinds = [(t.kind, t.deps, t.transport, t.loss_bound) for t in s.plan.tasks]
    assert kinds == [
        (kind, (i - 1,) if kind == "pull" else (), "ps", 0.0) for i, kind in enumerate(["push", "pull"] * 6)
    ]
    assert s.uses_completions and s.plan.update == "forward"
    assert [t.priority for t in s.plan.tasks] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert launched(s.on_grad_ready(2)) == [8, 10]  # 1 MiB in flight: the window is full
    assert launched(s.on_grad_ready(1)) == []
    assert launched(s.on_grad_ready(0)) == []
    assert launched(s.on_comm_done(8)) == [9]  # a push done: its pull at once, the credit still held
    assert launched(s.on_comm_done(9)) == [0]  # a pull done: credit back, layer 0 overtakes layer 1
    assert launched(s.on_comm_done(10)) == [11]
    assert launched(s.on_comm_done(11)) == [2]
    assert launched(s.on_comm_done(0)) == [1]
    assert launched(s.on_comm_done(1)) == [4]


def test_ps_fuses_small_tensors_into_the_partition_before_them_and_pushes_it_when_all_are_ready() -> None:
    kib = 1024 // 4  # elements of fp32
    w = workload([256 * kib, 4 * kib, 4 * kib, 1200 * kib, 8 * kib, 12 * kib])
    s = build_scheduler("ps", w, NET, partition_mb=0.5, credit_mb=100, fuse_kb=10)
    pushes = [t for t in s.plan.tasks if t.kind == "push"]
    assert [t.tensors for t in pushes] == [(0, 1, 2), (3,), (3,), (3, 4), (5,)]  # 12K is not below 10 KiB
    assert [t.name for t in pushes] == ["push:w0#0+w1+w2", "push:w3#0", "push:w3#1", "push:w3#2+w4", "push:w5#0"]
    assert [t.priority for t in pushes] == [0, 3, 3, 3, 5]
    assert sum(t.bytes for t in pushes) == sum(t.bytes for t in w.tensors)
    for step in range(2):  # the same readiness in every iteration
        assert launched(s.on_grad_ready(5)) == [8]
        assert launched(s.on_grad_ready(4)) == []  # w3's last partition waits for w3
        assert launched(s.on_grad_ready(3)) == [2, 4, 6]
        assert launched(s.on_grad_ready(2)) == [] and launched(s.on_grad_ready(1)) == []
        assert launched(s.on_grad_ready(0)) == [0], step
        s.on_backward_done()
        s.on_step()
    unfused = build_scheduler("ps", w, NET, partition_mb=0.5, credit_mb=100, fuse_kb=0)  # every tensor alone
    unfused_pushes = [t.tensors for t in unfused.plan.tasks if t.kind == "push"]
    assert unfused_pushes == [(0,), (1,), (2,), (3,), (3,), (3,), (4,), (5,)]
    for policy in ("ps", "dlcp"):  # both fuse below 64 KiB by default (ps: at 1 Gbit/s without latency)
        default = build_scheduler(policy, w, NET, partition_mb=0.5, credit_mb=100)
        assert [t.tensors for t in default.plan.tasks if t.kind == "push"] == [(0, 1, 2), (3,), (3,), (3, 4, 5)]


def test_ps_fuses_what_the_network_carries_in_a_tasks_fixed_cost_and_at_least_below_64_kib() -> None:
    from commsched.schedule.base import PS_TRANSPORT
    from commsched.schedule.ps import fuse_bytes

    slow = NetworkEstimate(2, 37.5e6, 50e-6, cpu_per_message_s=100e-6)  # 300 Mbit/s: 5.6 KB in 150 us
    assert fuse_bytes(None, slow) == 64 * 1024
    fast = NetworkEstimate(2, 2e9, 20e-6, cpu_per_message_s=60e-6)  # 160 KB in 80 us
    assert fuse_bytes(None, fast) == int(2e9 * 80e-6)
    measured = NetworkEstimate(2, 2e9, 20e-6, cpu_per_message_s=60e-6, transport_cpu=((PS_TRANSPORT, 480e-6, 1e-9),))
    assert fuse_bytes(None, measured) == int(2e9 * 500e-6)  # a ps task's own CPU where it was timed apart
    assert fuse_bytes(0.0, measured) == 0 and fuse_bytes(16.0, slow) == 16 * 1024  # the knob, where given
    kib = 1024 // 4
    w = workload([2048 * kib, 300 * kib, 2048 * kib, 700 * kib, 2048 * kib, 100 * kib])
    partitions = {
        net: [t.tensors for t in build_scheduler("ps", w, net, partition_mb=4).plan.tasks if t.kind == "push"]
        for net in (slow, fast, measured)
    }
    assert partitions[slow] == [(0,), (1,), (2,), (3,), (4,), (5,)]
    assert partitions[fast] == [(0,), (1,), (2,), (3,), (4, 5)]  # 100 KiB below 160 KB
    assert partitions[measured] == [(0, 1), (2, 3), (4, 5)]  # below 1 MB: each joins the one before
    plan = build_scheduler("ps", w, measured, partition_mb=4).plan
    assert plan.knobs.to_dict()["fuse_kb"] == int(2e9 * 500e-6) / 1024  # the plan records the size it fused at
    again = build_scheduler("ps", w, slow, **plan.knobs.to_dict()).plan  # and replays it on another network
    assert [t.tensors for t in again.tasks if t.kind == "push"] == partitions[measured]
