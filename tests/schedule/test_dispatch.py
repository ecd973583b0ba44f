"""The dispatcher: the one interpretation of the Scheduler contract, used by both drivers."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from commsched.errors import ScheduleError
from commsched.schedule import (
    POLICIES,
    Action,
    CommPlan,
    Dispatcher,
    Launch,
    NetworkEstimate,
    Scheduler,
    Start,
    Wait,
    build_plan,
    scheduler_for,
)
from commsched.schedule.fusion import make_task, whole
from commsched.schedule.knobs import NoKnobs
from commsched.sim import simulate
from commsched.sim import simulation as sim_module
from commsched.workload import Layer, Provenance, Tensor, Workload

NET = NetworkEstimate(2, 1e9)


def workload(n: int = 4) -> Workload:
    layers = tuple(
        Layer(name=f"l{i}", tensors=(Tensor(name=f"t{i}", numel=1000 * (i + 1)),), forward_ms=1.0, backward_ms=2.0)
        for i in range(n)
    )
    return Workload(
        model="m", batch_size=1, device="test", layers=layers, provenance=Provenance(kind="estimated", source="test")
    )


def per_tensor_plan(w: Workload, update: str = "step") -> CommPlan:
    tasks = tuple(make_task(w, t, "all_reduce", whole(w, [t]), f"t{t}") for t in range(len(w.tensors)))
    return CommPlan("test", w, NET, tasks, update, NoKnobs())  # type: ignore[arg-type]


class Scripted(Scheduler):
    """Launches what a test says, when it says so."""

    name: ClassVar[str] = "scripted"

    def __init__(self, plan: CommPlan, on_ready: dict[int, list[Action]]) -> None:
        super().__init__(plan)
        self.on_ready = on_ready
        self.seen: list[tuple[str, int]] = []

    def on_grad_ready(self, tensor: int) -> Sequence[Action]:
        self.seen.append(("grad_ready", tensor))
        return self.on_ready.get(tensor, [])

    def on_step(self) -> Sequence[Action]:
        self.seen.append(("step", 0))
        return ()


def test_a_launch_is_held_until_its_gradient_is_ready_and_later_launches_wait_behind_it() -> None:
    w = workload()
    plan = per_tensor_plan(w)
    d = Dispatcher(plan, Scripted(plan, {0: [Launch(3), Launch(0)]}))
    assert d.grad_ready(0) == []  # task 3 reads tensor 3, not ready yet; task 0 waits behind it
    assert "the gradient of 't3'" in d.describe()
    assert d.grad_ready(3) == [Start(3, 0), Start(0, 0)]


def test_wait_stops_later_events_until_the_task_completes_but_readiness_is_recorded_at_once() -> None:
    w = workload()
    plan = per_tensor_plan(w)
    s = Scripted(plan, {0: [Launch(0), Wait(0)], 1: [Launch(1)]})
    d = Dispatcher(plan, s)
    assert d.grad_ready(0) == [Start(0, 0)]
    assert d.grad_ready(1) == []  # the scheduler is waiting: the event queues
    assert s.seen == [("grad_ready", 0)]
    assert d.ready_count[1] == 1
    assert d.completed(0, 0) == [Start(1, 0)]
    assert s.seen == [("grad_ready", 0), ("grad_ready", 1)]


def test_the_nth_launch_of_a_task_belongs_to_iteration_n_and_completions_come_in_order() -> None:
    w = workload(1)
    plan = per_tensor_plan(w)
    d = Dispatcher(plan, Scripted(plan, {0: [Launch(0)]}))
    assert d.grad_ready(0) == [Start(0, 0)]
    assert d.grad_ready(0) == [Start(0, 1)]
    with pytest.raises(ScheduleError, match="completed instance 1, expected 0"):
        d.completed(0, 1)
    d.completed(0, 0)
    assert d.done(0, 0) and not d.done(0, 1) and d.iteration_done(0) and not d.iteration_done(1)


def test_a_follower_starts_the_leaders_decisions_against_its_own_readiness() -> None:
    w = workload()
    plan = per_tensor_plan(w)
    leader = Dispatcher(plan, Scripted(plan, {2: [Launch(2), Launch(1)]}), forward_decisions=True)
    follower = Dispatcher(plan, None)
    assert leader.grad_ready(2) == [Start(2, 0)]  # task 1 is held: tensor 1 is not ready on the leader
    assert leader.grad_ready(1) == [Start(1, 0)]
    decisions = leader.take_decisions()
    assert decisions == [(2, 0), (1, 0)]
    out = []
    for task, inst in decisions:
        out += follower.follow(task, inst)
    assert out == []  # nothing is ready on the follower yet
    assert follower.grad_ready(1) == []  # task 2 still holds the queue
    assert follower.grad_ready(2) == [Start(2, 0), Start(1, 0)]
    with pytest.raises(ScheduleError, match="expected iteration 1"):
        follower.follow(2, 0)


def test_unknown_tasks_and_waits_on_unlaunched_tasks_are_contract_errors() -> None:
    w = workload()
    plan = per_tensor_plan(w)
    with pytest.raises(ScheduleError, match="launch unknown task 9"):
        Dispatcher(plan, Scripted(plan, {0: [Launch(9)]})).grad_ready(0)
    with pytest.raises(ScheduleError, match="never launched"):
        Dispatcher(plan, Scripted(plan, {0: [Wait(1)]})).grad_ready(0)


# ---- both drivers, one interpretation ----


class _Recording(Dispatcher):
    """A dispatcher that logs every call a driver makes, and what it returned."""

    log: ClassVar[list[tuple[str, tuple[int, ...], list[Start]]]] = []

    def _logged(name: str) -> Any:  # type: ignore[misc]
        def call(self: _Recording, *args: int) -> list[Start]:
            out = getattr(Dispatcher, name)(self, *args)
            if self.scheduler is not None:  # the class whose scheduler runs (one worker class here)
                _Recording.log.append((name, args, list(out)))
            return out

        return call

    grad_ready = _logged("grad_ready")
    backward_done = _logged("backward_done")
    step = _logged("step")
    forward_pre = _logged("forward_pre")
    flush = _logged("flush")
    completed = _logged("completed")


class _NeverDone:
    """A transfer the test completes itself (the agent's watcher blocks on it until the end)."""

    release = threading.Event()

    def wait(self, timeout_s: float | None = None) -> None:
        self.release.wait()

    def is_completed(self) -> bool:
        return self.release.is_set()


class _FakeTransport:
    def __init__(self) -> None:
        self.started: list[tuple[int, int]] = []

    def start(self, task: Any, buffer: Any) -> _NeverDone:
        self.started.append(task.id)  # type: ignore[arg-type]
        return _NeverDone()

    def close(self) -> None:
        pass


class _NoBuffers:
    def buffer(self, task: int) -> None:
        return None


SMALL = {
    "ddp": {"bucket_cap_mb": 0.01, "first_bucket_mb": 0.005},
    "horovod": {"fusion_threshold_mb": 0.01, "cycle_time_ms": 0.5},
    "bytescheduler": {"partition_mb": 0.003, "credit_mb": 0.006},
    "prophet": {"partition_mb": 0.003, "credit_mb": 0.006},
    "dear": {"threshold_mb": 0.01},
    "no_overlap": {"bucket_cap_mb": 0.01},
    "ps": {"partition_mb": 0.003, "credit_mb": 0.006},
    "dlcp": {"partition_mb": 0.003, "credit_mb": 0.006},
    "wfbp": {},
    "mgwfbp": {"alpha_ms": 0.01},
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_one_event_sequence_gives_the_same_starts_through_the_simulator_and_the_runtime_agent(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulator's calls are recorded, then replayed through the runtime's agent thread.

    Both drivers run policies only through the dispatcher, so the agent must start exactly the
    tasks the simulator started, in the same order; a driver that interpreted the contract on its
    own (reordering, dropping or adding a launch) fails this.
    """
    from commsched.cluster import load_cluster
    from commsched.runtime.agent import Agent

    w = workload(6)
    _Recording.log = []
    monkeypatch.setattr(sim_module, "Dispatcher", _Recording)
    simulate(w, load_cluster("8xV100-10GbE"), policy, iterations=3, warmup=1, trace=False, **SMALL[policy])
    log = list(_Recording.log)
    sim_starts = [s.task for _, _, out in log for s in out]
    assert sim_starts, "the simulation started nothing: the test would prove nothing"

    plan = build_plan(policy, w, NetworkEstimate(8, 1.25e9), **SMALL[policy])
    transport = _FakeTransport()
    agent = Agent(0, 1, lambda name: transport, None, 30.0, None, 0.0)  # type: ignore[arg-type]
    try:
        agent.set_plan(plan, _NoBuffers(), 1)  # type: ignore[arg-type]
        for name, args, _ in log:
            if name == "completed":
                agent.post("completed", args[0], 1, args[1])
            else:
                agent.post(name, args[0] if args else 0, 1)
        deadline = time.monotonic() + 20
        while len(transport.started) < len(sim_starts) and time.monotonic() < deadline:
            time.sleep(0.01)
        agent.completions.raise_if_failed()
        assert transport.started == sim_starts
        assert scheduler_for(plan).name == policy
    finally:
        _NeverDone.release.set()
        agent.close(join_timeout_s=5)
        _NeverDone.release = threading.Event()
