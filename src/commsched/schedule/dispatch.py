"""The one interpreter of the Scheduler contract: events in, ordered starts out, no clock.

Both drivers run a policy only through a :class:`Dispatcher`: the simulator
(:mod:`commsched.sim`) in virtual time, the runtime (:mod:`commsched.runtime`)
on an agent thread with real transports. A driver reports what happened on its
rank, in the order it happened, and gets back the tasks to start now::

    d = Dispatcher(plan, scheduler_for(plan))
    d.grad_ready(7)          # -> [Start(task=3, instance=0)]: start bucket 3 of iteration 0
    d.completed(3, 0)        # the transport finished it -> perhaps more starts
    d.done(3, 0)             # True

What the dispatcher does, and so no driver does:

* **Event order and Wait.** Scheduler events are delivered one at a time in
  arrival order. ``Wait(task)`` stops the delivery of later events (they queue)
  until the task's latest launch has completed; it never blocks readiness
  bookkeeping, which is applied at once.
* **Launch order and holding.** Launches are started strictly in the order the
  scheduler returned them. A launch whose inputs are not ready on this rank
  (the gradients its task reads, for the iteration it belongs to, and the
  tasks in its ``deps``) is held, with every launch behind it.
* **Instances.** The n-th launch of a task belongs to iteration n (counted
  from the plan's first iteration); the n-th ``grad_ready(t)`` is tensor
  ``t``'s gradient of iteration n. A start names both, so a driver knows
  which gradients a task carries.
* **One rank decides.** For a plan whose scheduler decides on completions
  (:meth:`~commsched.schedule.base.Scheduler.decides_on_completions`) only the
  leader's dispatcher runs it (``on_comm_done`` is delivered there); its
  launches are recorded as decisions (:meth:`take_decisions`) that the driver
  forwards to the followers' dispatchers (:meth:`follow`), which hold and
  start them against their own readiness, in the leader's order. Any other
  scheduler runs on every rank, fed that rank's own events.
* **Completion bookkeeping** for the drivers' gates: :meth:`done`,
  :meth:`layer_ready` (``update="forward"``: may this layer apply the update
  of iteration k?) and :meth:`iteration_done` (``update="step"``).

Everything is a function of the calls made, so feeding the same call sequence
through any driver yields the same starts (tested).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from commsched.errors import ScheduleError
from commsched.schedule.base import READING_KINDS, Action, Launch, Scheduler, Wait
from commsched.schedule.plan import CommPlan

EventName = Literal["grad_ready", "backward_done", "step", "forward_pre", "flush", "comm_done"]


@dataclass(frozen=True, slots=True)
class Start:
    """Start ``task`` now, for the gradients of iteration ``instance``."""

    task: int
    instance: int


class Dispatcher:
    """Interprets one plan's scheduler on one rank (or, in the simulator, one class of identical ranks).

    ``scheduler=None`` makes a follower: it runs no scheduler and starts the
    launches given to :meth:`follow`. A leader of a ``uses_completions``
    scheduler records its launches for the followers (``forward_decisions``).
    """

    __slots__ = (
        "_actions",
        "_blocked",
        "_completed_in",
        "_completions",
        "_decisions",
        "_forward",
        "_inbox",
        "_queue",
        "_running",
        "_starts",
        "done_count",
        "launched",
        "plan",
        "ready_count",
        "scheduler",
    )

    def __init__(self, plan: CommPlan, scheduler: Scheduler | None, *, forward_decisions: bool = False) -> None:
        if scheduler is not None and scheduler.plan is not plan:
            raise ScheduleError(f"{plan.policy}: the scheduler was built for another plan")
        self.plan = plan
        self.scheduler = scheduler
        self._forward = forward_decisions and scheduler is not None
        #: whether the scheduler hears of completions (``on_comm_done``)
        self._completions = scheduler is not None and type(scheduler).decides_on_completions(plan)
        n_tasks = len(plan.tasks)
        #: Launches decided (or followed) per task: the n-th belongs to iteration n.
        self.launched = [0] * n_tasks
        #: Completions per task (instances complete in order).
        self.done_count = [0] * n_tasks
        #: Gradients reported ready per tensor.
        self.ready_count = [0] * len(plan.workload.tensors)
        self._inbox: deque[tuple[EventName, int]] = deque()
        self._actions: deque[Action] = deque()
        self._blocked: tuple[int, int] | None = None  # (task, instance) a Wait is on
        self._queue: deque[tuple[int, int]] = deque()  # launches not started yet, in order
        self._completed_in: dict[int, int] = {}  # completions per iteration
        self._decisions: list[tuple[int, int]] = []
        self._starts: list[Start] = []
        self._running = False

    # ---- what a driver reports ----

    def grad_ready(self, tensor: int) -> list[Start]:
        """This rank's gradient of ``tensor`` is final for its next iteration (and in its buffer)."""
        self.ready_count[tensor] += 1
        return self._post("grad_ready", tensor)

    def backward_done(self) -> list[Start]:
        return self._post("backward_done", 0)

    def step(self) -> list[Start]:
        return self._post("step", 0)

    def forward_pre(self, layer: int) -> list[Start]:
        return self._post("forward_pre", layer)

    def flush(self) -> list[Start]:
        return self._post("flush", 0)

    def completed(self, task: int, instance: int) -> list[Start]:
        """The transport finished ``task`` of iteration ``instance`` (every rank's part of it)."""
        if self.done_count[task] != instance:
            raise ScheduleError(
                f"{self.plan.policy}: task {self.plan.tasks[task].name!r} completed instance {instance}, "
                f"expected {self.done_count[task]} (instances complete in order)"
            )
        self.done_count[task] = instance + 1
        self._completed_in[instance] = self._completed_in.get(instance, 0) + 1
        if self._completions:
            return self._post("comm_done", task)
        return self._run()

    def follow(self, task: int, instance: int) -> list[Start]:
        """A follower takes the leader's launch of ``task`` for iteration ``instance``."""
        if self.scheduler is not None:
            raise ScheduleError(f"{self.plan.policy}: follow() on a rank that runs the scheduler itself")
        self._check_task(task, "launch")
        if instance != self.launched[task]:
            raise ScheduleError(
                f"{self.plan.policy}: the leader launched task {self.plan.tasks[task].name!r} for iteration "
                f"{instance}, this rank expected iteration {self.launched[task]}"
            )
        self.launched[task] += 1
        self._queue.append((task, instance))
        return self._run()

    # ---- what a driver reads ----

    def listens(self, event: EventName) -> bool:
        """Whether this rank's scheduler handles ``event`` (a driver may skip reporting the others).

        Skipping an event the scheduler does not override changes nothing: its handler
        would return no action. ``grad_ready`` must always be reported (it records readiness).
        """
        if self.scheduler is None:
            return event in ("grad_ready", "comm_done")
        if event == "comm_done":
            return self._completions
        handler = getattr(type(self.scheduler), f"on_{event}")
        return event == "grad_ready" or handler is not getattr(Scheduler, f"on_{event}")

    def take_decisions(self) -> list[tuple[int, int]]:
        """Launches decided since the last call, as ``(task, instance)``, for the followers."""
        out, self._decisions = self._decisions, []
        return out

    def done(self, task: int, instance: int) -> bool:
        return self.done_count[task] > instance

    def layer_ready(self, layer: int, instance: int) -> bool:
        """``update="forward"``: every task delivering ``layer``'s gradients of ``instance`` has completed."""
        return all(self.done_count[t] > instance for t in self.plan.final_tasks_of_layer[layer])

    def iteration_done(self, instance: int) -> bool:
        """``update="step"``: every task of iteration ``instance`` has completed."""
        return self._completed_in.get(instance, 0) == len(self.done_count)

    @property
    def scheduler_idle(self) -> bool:
        """No event or action queued for the scheduler, and no Wait pending."""
        return not self._inbox and not self._actions and self._blocked is None

    @property
    def held(self) -> tuple[tuple[int, int], ...]:
        """Launches not started yet, as ``(task, instance)``, in order."""
        return tuple(self._queue)

    def describe(self) -> str:
        """What the dispatcher is stuck on, for stall and time-out messages."""
        tasks = self.plan.tasks
        parts = []
        if self._blocked is not None:
            task, inst = self._blocked
            parts.append(f"the scheduler waits on task {tasks[task].name!r} of iteration {inst}")
        if self._queue:
            task, inst = self._queue[0]
            missing = self._missing(task, inst)
            parts.append(f"the launch of task {tasks[task].name!r} (iteration {inst}) waits for {missing}")
        if self._inbox or self._actions:
            parts.append(f"{len(self._inbox)} event(s) and {len(self._actions)} action(s) are queued")
        return "; ".join(parts) or "nothing is pending"

    # ---- interpretation ----

    def _post(self, event: EventName, arg: int) -> list[Start]:
        if self.scheduler is not None:
            self._inbox.append((event, arg))
        return self._run()

    def _run(self) -> list[Start]:
        """Deliver events and execute actions until blocked or out of work; start what is ready."""
        if self._running:  # re-entered from a scheduler handler: the outer call continues
            return []
        self._running = True
        try:
            while True:
                if self._blocked is not None:
                    task, inst = self._blocked
                    if self.done_count[task] <= inst:
                        break
                    self._blocked = None
                if self._actions:
                    self._execute(self._actions.popleft())
                    continue
                if self._inbox:
                    assert self.scheduler is not None
                    self._actions.extend(self._deliver(self.scheduler, *self._inbox.popleft()))
                    continue
                break
            self._pump()
        finally:
            self._running = False
        out, self._starts = self._starts, []
        return out

    @staticmethod
    def _deliver(s: Scheduler, event: EventName, arg: int) -> Sequence[Action]:
        if event == "grad_ready":
            return s.on_grad_ready(arg)
        if event == "backward_done":
            return s.on_backward_done()
        if event == "step":
            return s.on_step()
        if event == "forward_pre":
            return s.on_forward_pre(arg)
        if event == "flush":
            return s.on_flush()
        return s.on_comm_done(arg)

    def _execute(self, action: Action) -> None:
        if type(action) is Launch:
            self._check_task(action.task, "launch")
            inst = self.launched[action.task]
            self.launched[action.task] = inst + 1
            self._queue.append((action.task, inst))
            if self._forward:
                self._decisions.append((action.task, inst))
            self._pump()
        elif type(action) is Wait:
            self._check_task(action.task, "wait on")
            inst = self.launched[action.task] - 1
            if inst < 0:
                name = self.plan.tasks[action.task].name
                raise ScheduleError(f"{self.plan.policy}: wait on task {name!r}, which was never launched")
            if self.done_count[action.task] <= inst:
                self._blocked = (action.task, inst)
        else:
            raise ScheduleError(f"{self.plan.policy}: unknown action {action!r}")

    def _pump(self) -> None:
        """Start the held launches whose inputs are ready, in order; stop at the first that is not."""
        queue = self._queue
        while queue:
            task, inst = queue[0]
            if self._missing(task, inst):
                return
            queue.popleft()
            self._starts.append(Start(task, inst))

    def _missing(self, task: int, inst: int) -> str:
        """What ``task`` of iteration ``inst`` still needs on this rank ('' when ready)."""
        spec = self.plan.tasks[task]
        if spec.kind in READING_KINDS:
            for t in spec.tensors:
                if self.ready_count[t] <= inst:
                    return f"the gradient of {self.plan.workload.tensors[t].name!r}"
        for dep in spec.deps:
            if self.done_count[dep] <= inst:
                return f"task {self.plan.tasks[dep].name!r}"
        return ""

    def _check_task(self, task: int, what: str) -> None:
        if not 0 <= task < len(self.plan.tasks):
            raise ScheduleError(f"{self.plan.policy}: {what} unknown task {task}")
