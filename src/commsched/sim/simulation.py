"""A discrete-event simulation of data-parallel training: :class:`Simulation` replays iterations around a plan.

The plan is a policy's (:func:`~commsched.sim.simulator.plan_for`, a planner
or a file), and the simulation holds no policy logic: every collective it
runs was launched by the scheduler, in the order the scheduler chose.

What one iteration is, on every worker (the runtime does the same):

* **Forward**, layers ``0..L-1``, each taking ``forward_ms / speed``
  (all compute times come from the compute model, :mod:`commsched.sim.compute`;
  the default scales the profile by speed and batch size). Just
  before layer ``l`` the leader (rank 0) delivers ``on_forward_pre(l)``. With
  ``plan.update == "forward"`` the layer then waits until the tasks of
  ``plan.final_tasks_of_layer[l]`` launched for the previous iteration's
  gradients have completed (not in the first iteration), and applies its
  update (``update_ms`` spread over layers by bytes).
* **Backward**: gradient ``t`` is ready ``grad_ready_ms[t] / speed`` after
  backward starts; ``on_grad_ready(t)`` in ready order, then
  ``on_backward_done()`` at the end of backward.
* ``plan.update == "step"``: the worker waits until every task of the
  iteration has completed (DDP: ``backward()`` returns averaged gradients),
  then ``on_step()``, the whole update, the next forward. ``"forward"``:
  ``on_step()`` right after backward, then the next forward.

The policy runs only through :class:`~commsched.schedule.dispatch.Dispatcher`
(one per worker class), exactly as in the runtime: the simulator reports each
class's events to its dispatcher and starts what it returns. The dispatcher
owns event order, ``Wait``, holding launches until their inputs are ready on
that worker, instances, and the rule that a scheduler deciding on completions
runs on the leader (rank 0) only, whose decisions the other classes follow.
A collective is ready when every worker class has started it; the network
model (:mod:`commsched.sim.network`, chosen by ``SimOptions.network``; the
flow-level one today) starts ready collectives in order, at most
``max_concurrent`` at once, and shares link bandwidth between those in
flight. What a task costs comes from its kind and the algorithm
(:data:`~commsched.sim.costs.TASK_COSTS`); a task whose ``transport`` is
``"ps"`` is priced under the ``ps`` algorithm whatever the option says, so a
plan can send some buckets through parameter servers and the rest by ring
(:mod:`commsched.sim.pricing`). Communication's CPU work and a device's
measured overlap costs are charged as :mod:`commsched.sim.contention` says.
``on_comm_done`` is delivered only to schedulers that decide on completions
(:meth:`~commsched.schedule.base.Scheduler.decides_on_completions`).

Symmetry: workers with the same compute speed and batch size behave
identically, so the simulation keeps one timeline per *worker class*
(:class:`~commsched.sim.compute.WorkerClass`), and a
homogeneous cluster of 1024 workers costs as much as one of 2. Trace events of
a class carry the class's lowest rank as ``worker``.

Clock: after ``warmup + iterations`` iterations the simulator runs one more
forward (the one that consumes the last update) and then ``on_flush``; the
steady-state iterations are measured as :mod:`commsched.sim.result` says.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from commsched.cluster import Cluster
from commsched.errors import ScheduleError
from commsched.schedule import CommPlan, Dispatcher, Scheduler, Start
from commsched.schedule.fusion import ready_order
from commsched.sim.compute import PROFILE, ComputeModel, WorkerClass, worker_classes
from commsched.sim.contention import cpu_floor_s, debt_s, slowed_floor_s
from commsched.sim.costs import CommModel
from commsched.sim.engine import EventLoop
from commsched.sim.network import NETWORK_MODELS, Collective, NetworkContext, NetworkFactory
from commsched.sim.options import SimOptions
from commsched.sim.pricing import price_tasks
from commsched.sim.result import SimResult, measure
from commsched.sim.timeline import GATE, STEP, Timeline, backward_spans, check_finished, ready_batches
from commsched.trace import Trace, TraceEvent
from commsched.workload import Workload


class Simulation:
    """One simulated training run. Build it, call :meth:`run` once.

    ``compute``: the compute model (default :data:`~commsched.sim.compute.PROFILE`).
    ``network``: a factory for the network model (default the one
    ``options.network`` names). ``batch_sizes``: one per rank (default the
    workload's batch size for every rank).
    """

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        scheduler: Scheduler,
        iterations: int,
        warmup: int,
        options: SimOptions,
        comm: CommModel,
        record_trace: bool = True,
        *,
        compute: ComputeModel = PROFILE,
        network: NetworkFactory | None = None,
        batch_sizes: Sequence[int] | None = None,
    ) -> None:
        if iterations < 1:
            raise ScheduleError(f"sim: iterations must be >= 1, got {iterations}")
        if warmup < 0:
            raise ScheduleError(f"sim: warmup must be >= 0, got {warmup}")
        self.workload = workload
        self.cluster = cluster
        self.plan: CommPlan = scheduler.plan
        self.options = options
        self.comm = comm
        self.iterations = iterations
        self.warmup = warmup
        self.total = warmup + iterations
        self.loop = EventLoop()
        factory = network if network is not None else NETWORK_MODELS[options.network]
        context = NetworkContext(
            self.loop, cluster, comm, self.plan.tasks, options.max_concurrent, self._completed, self.plan.workload
        )
        self.network = factory(context)
        self.trace: Trace | None = Trace() if record_trace else None
        self.compute = compute
        self.classes = worker_classes(cluster, workload.model, batch_sizes, workload.batch_size)
        #: A scheduler that decides on completions runs on the leader only; the other classes follow it.
        self.leader_decides = type(scheduler).decides_on_completions(self.plan) and len(self.classes) > 1
        self.timelines: list[Timeline] = []
        for wc in self.classes:
            if wc.index == 0:
                dispatcher = Dispatcher(self.plan, scheduler, forward_decisions=self.leader_decides)
            elif self.leader_decides:
                dispatcher = Dispatcher(self.plan, None)
            else:  # every class runs its own copy of the scheduler on its own events
                memo: dict[int, Any] = {id(scheduler.plan): scheduler.plan, id(workload): workload}
                dispatcher = Dispatcher(self.plan, copy.deepcopy(scheduler, memo))
            self.timelines.append(Timeline(wc, dispatcher))
        self._prepare()

    # ---- precomputation ----

    def _prepare(self) -> None:
        w, plan = self.workload, self.plan
        self.gated = plan.update == "forward"
        self.order = ready_order(w)
        self.prices = price_tasks(plan.tasks, self.comm, self.cluster, self.options)
        self.phases = self.prices.phases
        self.issued: dict[tuple[int, int], int] = {}
        self.reduced_bytes = 0.0
        self.sent_bytes = 0.0

        o = self.options
        self.charges_cpu = o.charges_cpu
        self.charges_overlap = any(
            wc.overlap_ms_per_mb is not None or wc.overlap_ms_per_task is not None for wc in self.classes
        )
        self.slows_beside_compute = any(wc.overlap_comm_rate is not None for wc in self.classes)

        self.forward_s: list[tuple[float, ...]] = []
        self.update_s: list[tuple[float, ...]] = []
        self.backward_s: list[float] = []
        self.batches: list[list[tuple[float, int, int]]] = []  # (offset, first pos, end pos) per ready time
        self.backward_layers: list[list[tuple[float, float]]] = []  # per layer (offset, duration)
        self.compute_s: list[float] = []
        for wc in self.classes:
            timing = self.compute.timings(w, wc, self.options.update_ms)
            self.forward_s.append(timing.forward_s)
            self.update_s.append(timing.update_s)
            self.backward_s.append(timing.backward_s)
            self.batches.append(ready_batches(self.order, timing.grad_ready_s))
            self.backward_layers.append(backward_spans(timing.backward_layer_s, len(w.layers)))
            self.compute_s.append(timing.compute_s)

    # ---- running ----

    def run(self) -> None:
        for tl in self.timelines:
            self.loop.schedule(0.0, self._begin_iteration, tl, 0)
        self.loop.run()
        check_finished(self.timelines, self.workload, self.plan, self.total)

    # ---- the dispatcher's starts ----

    def _report(self, tl: Timeline, starts: list[Start]) -> None:
        """Start what a class's dispatcher returned; forward a deciding leader's launches to the others."""
        self._charge(tl, starts)
        self._start(starts)
        if self.leader_decides and tl.leader:
            for task, inst in tl.dispatcher.take_decisions():
                for other in self.timelines[1:]:
                    followed = other.dispatcher.follow(task, inst)
                    self._charge(other, followed)
                    self._start(followed)

    def _charge(self, tl: Timeline, starts: list[Start]) -> None:
        """Communication's CPU work, taken from ``tl``'s compute when it starts while ``tl`` computes."""
        if (self.charges_cpu or self.charges_overlap) and starts and not tl.blocked and not tl.finished:
            tasks = self.plan.tasks
            tl.debt_s += sum(debt_s(tl.wc, self.options, tasks[s.task].bytes, tasks[s.task].transport) for s in starts)

    def _deferred(self, tl: Timeline, handler: Callable[..., None], *args: Any) -> bool:
        """Pay ``tl``'s CPU debt: run ``handler`` that much later (and move backward's clock along)."""
        if tl.debt_s <= 0.0:
            return False
        delay, tl.debt_s = tl.debt_s, 0.0
        tl.bstart += delay
        self.loop.schedule(self.loop.now + delay, handler, tl, *args)
        return True

    def _start(self, starts: list[Start]) -> None:
        """A collective is ready for the network once every worker class has started it."""
        classes = len(self.timelines)
        for s in starts:
            if classes == 1:
                self._ready(s.task, s.instance)
                continue
            key = (s.task, s.instance)
            count = self.issued.get(key, 0) + 1
            if count == classes:
                del self.issued[key]
                self._ready(s.task, s.instance)
            else:
                self.issued[key] = count

    def _ready(self, task: int, inst: int) -> None:
        phases = self.phases[task]
        work_s = self.prices.cpu_s[task]
        floor = cpu_floor_s(work_s, self._computing(), self.options) if self.charges_cpu and phases else 0.0
        slowed = functools.partial(self._slowed_floor, task) if self.slows_beside_compute and phases else None
        self.network.ready(Collective(task, inst, phases, self.loop.now, floor_s=floor, floor_at_start=slowed))

    def _slowed_floor(self, task: int) -> float:
        """``task``'s floor where its workers' compute slows it, taken as the collective starts."""
        return slowed_floor_s(self.prices.uncontended_s[task], self._computing())

    def _computing(self) -> list[tuple[WorkerClass, float]]:
        """``(worker class, compute left from now)`` for every class, what the contention floors are taken against."""
        now = self.loop.now
        return [(tl.wc, tl.compute_left_s(now, self.backward_s[tl.wc.index])) for tl in self.timelines]

    def _completed(self, coll: Collective) -> None:
        task, inst = coll.task, coll.instance
        spec = self.plan.tasks[task]
        if self.warmup <= inst < self.total:
            self.reduced_bytes += self.prices.reduced_bytes[task]
            self.sent_bytes += self.prices.sent_bytes[task]
        if self.trace is not None:
            for wc in self.classes:
                self.trace.add(TraceEvent(spec.name, spec.kind, wc.rank, coll.start_s, coll.end_s, spec.bytes, inst))
        for tl in self.timelines:
            self._report(tl, tl.dispatcher.completed(task, inst))
        for tl in self.timelines:
            if tl.blocked:
                self._try_unblock(tl)

    # ---- compute timeline ----

    def _record(self, name: str, kind: str, tl: Timeline, start_s: float, end_s: float, iteration: int) -> None:
        if self.trace is not None and end_s > start_s:
            self.trace.add(TraceEvent(name, kind, tl.wc.rank, start_s, end_s, 0, iteration))

    def _begin_iteration(self, tl: Timeline, k: int) -> None:
        if self._deferred(tl, self._begin_iteration, k):
            return
        tl.fstart.append(self.loop.now)
        tl.in_forward = True
        self._forward_layer(tl, k, 0)

    def _forward_layer(self, tl: Timeline, k: int, layer: int) -> None:
        if self._deferred(tl, self._forward_layer, k, layer):
            return
        self._report(tl, tl.dispatcher.forward_pre(layer))
        if self.gated and k > 0 and not tl.dispatcher.layer_ready(layer, k - 1):
            tl.blocked, tl.block_k, tl.block_l, tl.stall_since = GATE, k, layer, self.loop.now
            return
        self._run_layer(tl, k, layer)

    def _run_layer(self, tl: Timeline, k: int, layer: int) -> None:
        c = tl.wc.index
        now = self.loop.now
        name = self.workload.layers[layer].name
        if self.gated and k > 0:
            update = self.update_s[c][layer]
            if update > 0:
                self._record(name, "update", tl, now, now + update, k)
                now += update
        end = now + self.forward_s[c][layer]
        self._record(name, "forward", tl, now, end, k)
        if layer + 1 < len(self.workload.layers):
            self.loop.schedule(end, self._forward_layer, tl, k, layer + 1)
        elif k < self.total:
            self.loop.schedule(end, self._backward_start, tl, k)
        else:
            self.loop.schedule(end, self._finish, tl)

    def _backward_start(self, tl: Timeline, k: int) -> None:
        if self._deferred(tl, self._backward_start, k):
            return
        c = tl.wc.index
        now = self.loop.now
        tl.bstart = now
        tl.in_forward, tl.in_backward = False, True
        if self.trace is not None:
            for layer, (offset, duration) in zip(self.workload.layers, self.backward_layers[c], strict=True):
                self._record(layer.name, "backward", tl, now + offset, now + offset + duration, k)
        self.loop.schedule(now + self.batches[c][0][0], self._grads_ready, tl, k, 0)

    def _grads_ready(self, tl: Timeline, k: int, batch: int) -> None:
        if self._deferred(tl, self._grads_ready, k, batch):
            return
        c = tl.wc.index
        batches = self.batches[c]
        _, lo, hi = batches[batch]
        order = self.order
        for pos in range(lo, hi):
            self._report(tl, tl.dispatcher.grad_ready(order[pos]))
        if batch + 1 < len(batches):
            self.loop.schedule(tl.bstart + batches[batch + 1][0], self._grads_ready, tl, k, batch + 1)
        else:
            end = max(self.loop.now, tl.bstart + self.backward_s[c])
            self.loop.schedule(end, self._backward_end, tl, k)

    def _backward_end(self, tl: Timeline, k: int) -> None:
        # No debt paid here: what is left falls into the wait for the iteration's tasks
        # (absorbed) or, where the next forward starts at once, delays it.
        tl.in_backward = False
        self._report(tl, tl.dispatcher.backward_done())
        if self.gated:
            self._report(tl, tl.dispatcher.step())
            self._begin_iteration(tl, k + 1)
        elif tl.dispatcher.iteration_done(k):
            self._step(tl, k)
        else:
            tl.blocked, tl.block_k, tl.stall_since = STEP, k, self.loop.now

    def _step(self, tl: Timeline, k: int) -> None:
        self._report(tl, tl.dispatcher.step())
        update = sum(self.update_s[tl.wc.index])
        if update > 0:
            now = self.loop.now
            self._record("step", "update", tl, now, now + update, k)
            self.loop.schedule(now + update, self._begin_iteration, tl, k + 1)
        else:
            self._begin_iteration(tl, k + 1)

    def _try_unblock(self, tl: Timeline) -> None:
        if tl.blocked == GATE:
            if not tl.dispatcher.layer_ready(tl.block_l, tl.block_k - 1):
                return
            tl.blocked = 0
            tl.debt_s = max(0.0, tl.debt_s - (self.loop.now - tl.stall_since))  # done while the core was idle
            name = f"wait:{self.workload.layers[tl.block_l].name}"
            self._record(name, "wait", tl, tl.stall_since, self.loop.now, tl.block_k)
            self._run_layer(tl, tl.block_k, tl.block_l)
        elif tl.blocked == STEP:
            if not tl.dispatcher.iteration_done(tl.block_k):
                return
            tl.blocked = 0
            tl.debt_s = max(0.0, tl.debt_s - (self.loop.now - tl.stall_since))
            self._record("wait:step", "wait", tl, tl.stall_since, self.loop.now, tl.block_k)
            self._step(tl, tl.block_k)

    def _finish(self, tl: Timeline) -> None:
        self._report(tl, tl.dispatcher.flush())
        tl.finished = True

    # ---- results ----

    def result(self, knobs: Mapping[str, Any], wall_s: float) -> SimResult:
        """What the run predicts (:func:`~commsched.sim.result.measure`); call after :meth:`run`."""
        return measure(
            self.plan,
            self.workload.model,
            self.cluster,
            self.options,
            self.classes,
            starts_s=self.timelines[0].fstart,
            warmup=self.warmup,
            iterations=self.iterations,
            compute_s=self.compute_s,
            links=self.network.links,
            reduced_bytes=self.reduced_bytes,
            sent_bytes=self.sent_bytes,
            events=self.loop.processed,
            trace=self.trace,
            knobs=knobs,
            wall_s=wall_s,
        )
