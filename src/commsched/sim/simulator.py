"""Driver #1 of the Scheduler contract: a discrete-event simulation of data-parallel training.

``simulate(workload, cluster, policy)`` builds the policy's plan with
``schedule.build_plan`` and replays training iterations around it. The
simulator holds no policy logic: every collective it runs was launched by the
scheduler, in the order the scheduler chose.

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
that worker, instances, and the rule that a ``uses_completions`` scheduler
runs on the leader (rank 0) only, whose decisions the other classes follow.
A collective is ready when every worker class has started it; the network
model (:mod:`commsched.sim.network`, chosen by ``SimOptions.network``; the
flow-level one today) starts ready collectives in order, at most
``max_concurrent`` at once, and shares link bandwidth between those in
flight. What a task costs comes from its kind and the algorithm
(:data:`~commsched.sim.costs.TASK_COSTS`); a task whose ``transport`` is
``"ps"`` is priced under the ``ps`` algorithm whatever the option says, so a
plan can send some buckets through parameter servers and the rest by ring.
``on_comm_done`` is delivered only to schedulers with ``uses_completions``.

Symmetry: workers with the same compute speed and batch size behave
identically, so the simulation keeps one timeline per *worker class*
(:class:`~commsched.sim.compute.WorkerClass`), and a
homogeneous cluster of 1024 workers costs as much as one of 2. Trace events of
a class carry the class's lowest rank as ``worker``.

Clock and metrics: after ``warmup + iterations`` iterations the simulator runs
one more forward (the one that consumes the last update) and then
``on_flush``. Iteration ``k`` lasts from its forward start to the next one on
the leader; the reported iteration time is the median over the
``iterations`` steady-state iterations.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from statistics import median
from typing import Any

from commsched.cluster import Cluster
from commsched.errors import CommschedError, ScheduleError
from commsched.schedule import CommPlan, Dispatcher, Scheduler, Start, build_plan, scheduler_for
from commsched.schedule.base import PS_TRANSPORT, REDUCING_KINDS
from commsched.schedule.dlcp import DLCP_PS_TRANSPORT, DLCP_TRANSPORT
from commsched.schedule.fusion import ready_order
from commsched.sim.compute import PROFILE, ComputeModel, WorkerClass, worker_classes
from commsched.sim.costs import ALGORITHMS, CommModel
from commsched.sim.engine import EventLoop
from commsched.sim.network import NETWORK_MODELS, Collective, NetworkContext, NetworkFactory
from commsched.trace import Trace, TraceEvent
from commsched.workload import Workload


@dataclass(frozen=True)
class SimOptions:
    """Simulator settings (not policy knobs).

    ``algorithm``: collective algorithm of the cost model, ``ring`` (NCCL's and
    gloo's default), ``tree``, ``hierarchical`` or ``ps`` (see
    :class:`~commsched.sim.costs.CommModel`).
    ``max_concurrent``: collectives in flight at once. Default 1: NCCL runs
    the collectives of one communicator one after another on one stream, and
    PyTorch DDP, Horovod, ByteScheduler and this project's runtime use one
    communicator. Set 2 for gloo (its default number of worker threads per
    process group) or more to model several communicators; in-flight
    collectives then share bandwidth fairly while their startup latencies
    overlap.
    ``update_ms``: optimizer time per iteration on the profiled device
    (scaled by worker speed), spread over layers in proportion to their bytes.
    0 by default because the shipped profiles fold it into backward.
    ``network``: the network model (:data:`~commsched.sim.network.NETWORK_MODELS`):
    ``flow`` (α-β phases, bandwidth shared fairly on each link resource) or
    ``packet`` (queues, transports and packets: :mod:`commsched.sim.packet`).
    ``cpu_per_task_ms``, ``cpu_ms_per_mb``: the CPU work of communication
    (collective threads, the kernel's TCP, the runtime's own work) per task
    and per MiB of the task's buffer, ``cpu = cpu_per_task_ms + cpu_ms_per_mb ·
    bytes / 2²⁰``. A task that starts while its worker computes delays that
    worker's compute by its CPU work (one core does both); work that falls
    while the worker waits costs nothing (the core was idle): a wait absorbs
    the CPU work not yet charged, up to its length. The collective itself
    takes at least its CPU work on its slowest worker, twice that where the
    worker computes meanwhile (:meth:`Simulation._cpu_floor`): on a core
    that also computes, the transfer can be CPU-bound. 0 by default:
    overlap is free, as on a GPU whose copies and kernels run beside compute.
    ``commsched bench --validate`` fits them from the probe's CPU times.
    ``cpu_scales_with_speed``: that CPU work takes ``1 / speed`` as long on
    a worker of relative ``speed`` (where the devices are the CPUs that also
    communicate, as on ``commsched bench --plan``'s testbed of CPU quotas);
    off by default: a slower GPU does not make its host's CPU slower.
    A device whose spec measures its ``overlap_ms_per_mb`` (compute's
    slowdown per MiB all-reduced beside it) is charged that per MiB instead
    of ``cpu_ms_per_mb`` when a task starts while it computes, and one
    whose spec measures ``overlap_ms_per_task`` that per task instead of
    ``cpu_per_task_ms``; the floor keeps the options' CPU work (it is the
    collective's own). A device whose spec measures its
    ``overlap_comm_rate`` slows the collectives it takes part in while it
    computes: they keep that share of their uncontended rate until its
    compute ends (:meth:`Simulation._slowed_floor`).
    """

    algorithm: str = "ring"
    max_concurrent: int = 1
    update_ms: float = 0.0
    network: str = "flow"
    cpu_per_task_ms: float = 0.0
    cpu_ms_per_mb: float = 0.0
    cpu_scales_with_speed: bool = False

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ScheduleError(f"sim: unknown algorithm {self.algorithm!r}; known: {', '.join(ALGORITHMS)}")
        if isinstance(self.max_concurrent, bool) or not isinstance(self.max_concurrent, int):
            raise ScheduleError(f"sim: max_concurrent must be an integer >= 1, got {self.max_concurrent!r}")
        if self.max_concurrent < 1:
            raise ScheduleError(f"sim: max_concurrent must be >= 1, got {self.max_concurrent}")
        for name in ("update_ms", "cpu_per_task_ms", "cpu_ms_per_mb"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (value >= 0 and math.isfinite(value))
            ):
                raise ScheduleError(f"sim: {name} must be a finite number >= 0, got {value!r}")
        if not isinstance(self.cpu_scales_with_speed, bool):
            raise ScheduleError(f"sim: cpu_scales_with_speed must be true or false, got {self.cpu_scales_with_speed!r}")
        if self.network not in NETWORK_MODELS:
            known = ", ".join(NETWORK_MODELS)
            what = "packet-level network not available yet" if self.network == "packet" else "unknown network model"
            raise ScheduleError(f"sim: {what} ({self.network!r}); network must be one of: {known}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_mapping(cls, options: SimOptions | Mapping[str, Any] | None) -> SimOptions:
        if options is None:
            return cls()
        if isinstance(options, SimOptions):
            return options
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise ScheduleError(f"sim: unknown option(s) {', '.join(unknown)}; known: {', '.join(cls.names())}")
        return cls(**options)


@dataclass(frozen=True)
class SimResult:
    """What one simulated run predicts. Times are per iteration unless named otherwise.

    ``iteration_ms``: median over the steady-state iterations (leader's
    forward start to forward start). ``samples_per_s``: the batch sizes of
    all ranks / iteration. ``gpu_busy``: compute time / iteration time, averaged over
    workers. ``link_utilisation``: per link resource, the fraction of the
    steady-state window during which it carried data. ``exposed_comm_ms``:
    iteration time minus the compute time of the slowest worker (what
    communication adds to the critical path). ``gradient_bytes``: gradient
    bytes reduced per iteration (an RS+AG pair counts once).
    ``sent_bytes_per_worker``: bytes each worker sends per iteration under the
    cost model. ``events``: event-loop events processed.
    """

    policy: str
    model: str
    cluster: str
    num_workers: int
    iterations: int
    warmup: int
    iteration_ms: float
    iteration_ms_each: tuple[float, ...]
    samples_per_s: float
    compute_ms: float
    gpu_busy: float
    gpu_busy_by_class: tuple[float, ...]
    link_utilisation: dict[str, float]
    exposed_comm_ms: float
    gradient_bytes: float
    sent_bytes_per_worker: float
    num_tasks: int
    events: int
    wall_s: float
    knobs: dict[str, Any]
    options: SimOptions
    classes: tuple[WorkerClass, ...]
    trace: Trace | None = field(default=None, repr=False, compare=False)
    #: The plan that was simulated: ``result.plan.save(path)`` writes a plan file ``parallelize`` runs.
    plan: CommPlan | None = field(default=None, repr=False, compare=False)
    #: Why this prediction is not to be trusted as the others are (None: nothing known against it).
    unvalidated: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data, without the trace and the plan."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("trace", "plan")}
        out["options"] = asdict(self.options)
        out["classes"] = [
            {"speed": c.speed, "batch_size": c.batch_size, "workers": len(c.ranks), "first_rank": c.rank}
            for c in self.classes
        ]
        out["iteration_ms_each"] = list(self.iteration_ms_each)
        out["gpu_busy_by_class"] = list(self.gpu_busy_by_class)
        return out


# ---- the simulation ----

#: A task whose ``transport`` is :data:`~commsched.schedule.base.PS_TRANSPORT` is priced as a parameter-server
#: push/pull, whatever ``options.algorithm`` says (the cluster's servers, else one server on every worker).

_GATE = 1  # blocked before a forward layer, on the previous iteration's final tasks
_STEP = 2  # blocked after backward, on every task of the iteration


class _Timeline:
    """Mutable state of one worker class."""

    __slots__ = (
        "block_k",
        "block_l",
        "blocked",
        "bstart",
        "debt_s",
        "dispatcher",
        "finished",
        "fstart",
        "in_backward",
        "in_forward",
        "leader",
        "stall_since",
        "wc",
    )

    def __init__(self, wc: WorkerClass, dispatcher: Dispatcher) -> None:
        self.wc = wc
        self.leader = wc.index == 0
        self.dispatcher = dispatcher
        self.bstart = 0.0
        self.debt_s = 0.0  # communication's CPU work not yet taken from this worker's compute
        self.blocked = 0
        self.block_k = 0
        self.block_l = 0
        self.stall_since = 0.0
        self.fstart: list[float] = []
        self.in_forward = False  # in forward (or its update), backward's end not yet known
        self.in_backward = False
        self.finished = False


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
        self._ps_comm: CommModel | None = None
        self._dlcp_comm: dict[str, CommModel] = {}
        self.classes = worker_classes(cluster, workload.model, batch_sizes, workload.batch_size)
        #: A ``uses_completions`` scheduler runs on the leader only; the other classes follow its decisions.
        self.leader_decides = type(scheduler).uses_completions and len(self.classes) > 1
        self.timelines = []
        for wc in self.classes:
            if wc.index == 0:
                dispatcher = Dispatcher(self.plan, scheduler, forward_decisions=self.leader_decides)
            elif self.leader_decides:
                dispatcher = Dispatcher(self.plan, None)
            else:  # every class runs its own copy of the scheduler on its own events
                memo: dict[int, Any] = {id(scheduler.plan): scheduler.plan, id(workload): workload}
                dispatcher = Dispatcher(self.plan, copy.deepcopy(scheduler, memo))
            self.timelines.append(_Timeline(wc, dispatcher))
        self._prepare()

    # ---- precomputation ----

    def _prepare(self) -> None:
        w, plan = self.workload, self.plan
        self.gated = plan.update == "forward"
        self.order = ready_order(w)
        tasks = plan.tasks
        self.num_tasks = len(tasks)
        comms = [self._comm_of(task.transport) for task in tasks]
        self.phases = [comm.phases(task.kind, task.bytes) for comm, task in zip(comms, tasks, strict=True)]
        self.final_of_layer = plan.final_tasks_of_layer
        self.issued: dict[tuple[int, int], int] = {}
        self.reduced_bytes = 0.0
        self.sent_bytes = 0.0

        self.sent_of_task = [comm.sent_bytes(task.kind, task.bytes) for comm, task in zip(comms, tasks, strict=True)]
        self.reduced_of_task = [float(task.bytes) if task.kind in REDUCING_KINDS else 0.0 for task in tasks]
        o = self.options
        self.cpu_of_task = [(o.cpu_per_task_ms + o.cpu_ms_per_mb * task.bytes / 2**20) / 1e3 for task in tasks]
        self.charges_cpu = o.cpu_per_task_ms > 0 or o.cpu_ms_per_mb > 0
        self.charges_overlap = any(
            wc.overlap_ms_per_mb is not None or wc.overlap_ms_per_task is not None for wc in self.classes
        )
        self.slows_beside_compute = any(wc.overlap_comm_rate is not None for wc in self.classes)
        self.uncontended_s = [sum(ph.latency_s + ph.work_s for ph in phases) for phases in self.phases]

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
            batches: list[tuple[float, int, int]] = []
            for pos, t in enumerate(self.order):
                offset = timing.grad_ready_s[t]
                if batches and batches[-1][0] == offset:
                    batches[-1] = (offset, batches[-1][1], pos + 1)
                else:
                    batches.append((offset, pos, pos + 1))
            self.batches.append(batches)
            layers: list[tuple[float, float]] = [(0.0, 0.0)] * len(w.layers)
            elapsed = 0.0
            for li in range(len(w.layers) - 1, -1, -1):
                duration = timing.backward_layer_s[li]
                layers[li] = (elapsed, duration)
                elapsed += duration
            self.backward_layers.append(layers)
            self.compute_s.append(timing.compute_s)

    def _comm_of(self, transport: str) -> CommModel:
        """The cost model of a task: a ``"ps"`` task is priced by the parameter-server model, any other by ``comm``.

        DLCP's transports are parameter servers over the ring's links: ``"dlcp"``
        with a server on every worker (its transpose all-reduce), ``"dlcp_ps"``
        with one server on a worker, ``max(n / B, N·n / B)`` per push or pull (a
        little pessimistic: the server's own slice stays local). Bytes the
        transport does not wait for are not taken off: the flow-level model
        does not price what DLCP gains (see :mod:`commsched.schedule.dlcp`).
        """
        if transport in (DLCP_TRANSPORT, DLCP_PS_TRANSPORT):
            if transport not in self._dlcp_comm:
                ring = CommModel.from_cluster(self.cluster, "ring")
                one = transport == DLCP_PS_TRANSPORT
                self._dlcp_comm[transport] = dataclasses.replace(
                    ring,
                    algorithm="ps",
                    servers=1 if one else ring.world_size,
                    server_bandwidth=ring.bandwidth,
                    servers_on_workers=not one,
                )
            return self._dlcp_comm[transport]
        if transport != PS_TRANSPORT or self.comm.algorithm == "ps":
            return self.comm
        if self._ps_comm is None:
            self._ps_comm = CommModel.from_cluster(self.cluster, "ps")
        return self._ps_comm

    # ---- running ----

    def run(self) -> None:
        for tl in self.timelines:
            self.loop.schedule(0.0, self._begin_iteration, tl, 0)
        self.loop.run()
        self._check_finished()

    def _check_finished(self) -> None:
        policy = self.plan.policy
        for tl in self.timelines:
            if not tl.finished:
                what = self._describe_block(tl)
                raise ScheduleError(
                    f"{policy}: the simulation stalled: worker {tl.wc.rank} {what}; {tl.dispatcher.describe()}"
                )
        done = self.timelines[0].dispatcher.done_count
        for task, count in enumerate(done):
            if count < self.total:
                name = self.plan.tasks[task].name
                raise ScheduleError(
                    f"{policy}: task {name!r} completed {count} time(s) in {self.total} iterations "
                    "(never launched, or launched once too few)"
                )
        for tl in self.timelines:
            d = tl.dispatcher
            # Launches past the last iteration (from the trailing forward and flush) stay held.
            if not d.scheduler_idle or any(inst < self.total for _, inst in d.held):
                raise ScheduleError(f"{policy}: the simulation ended but {d.describe()}")

    def _describe_block(self, tl: _Timeline) -> str:
        done = tl.dispatcher.done_count
        if tl.blocked == _GATE:
            layer = self.workload.layers[tl.block_l].name
            missing = [self.plan.tasks[t].name for t in self.final_of_layer[tl.block_l] if done[t] < tl.block_k]
            return f"waits before layer {layer!r} of iteration {tl.block_k} for task(s) {missing[:5]}"
        if tl.blocked == _STEP:
            missing = [self.plan.tasks[t].name for t in range(self.num_tasks) if done[t] <= tl.block_k]
            return f"waits at step {tl.block_k} for task(s) {missing[:5]}"
        return "stopped"

    # ---- the dispatcher's starts ----

    def _report(self, tl: _Timeline, starts: list[Start]) -> None:
        """Start what a class's dispatcher returned; forward a deciding leader's launches to the others."""
        self._charge(tl, starts)
        self._start(starts)
        if self.leader_decides and tl.leader:
            for task, inst in tl.dispatcher.take_decisions():
                for other in self.timelines[1:]:
                    followed = other.dispatcher.follow(task, inst)
                    self._charge(other, followed)
                    self._start(followed)

    def _charge(self, tl: _Timeline, starts: list[Start]) -> None:
        """Communication's CPU work, taken from ``tl``'s compute when it starts while ``tl`` computes."""
        if (self.charges_cpu or self.charges_overlap) and starts and not tl.blocked and not tl.finished:
            tl.debt_s += sum(self._debt_s(tl, s.task) for s in starts)

    def _debt_s(self, tl: _Timeline, task: int) -> float:
        """What starting ``task`` takes from ``tl``'s compute: its CPU work, or the device's measured overlap costs
        (per task and per MiB, each where measured)."""
        per_mb, per_task = tl.wc.overlap_ms_per_mb, tl.wc.overlap_ms_per_task
        o = self.options
        fixed_s = self._cpu_s(tl, o.cpu_per_task_ms / 1e3) if per_task is None else per_task / 1e3
        mib = self.plan.tasks[task].bytes / 2**20
        bytes_s = self._cpu_s(tl, o.cpu_ms_per_mb * mib / 1e3) if per_mb is None else per_mb * mib / 1e3
        return fixed_s + bytes_s

    def _cpu_s(self, tl: _Timeline, work_s: float) -> float:
        """How long ``work_s`` of communication's CPU work takes on ``tl``'s worker (``cpu_scales_with_speed``)."""
        return work_s / tl.wc.speed if self.options.cpu_scales_with_speed else work_s

    def _deferred(self, tl: _Timeline, handler: Callable[..., None], *args: Any) -> bool:
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
        floor = self._cpu_floor(task) if self.charges_cpu and phases else 0.0
        slowed = functools.partial(self._slowed_floor, task) if self.slows_beside_compute and phases else None
        self.network.ready(Collective(task, inst, phases, self.loop.now, floor_s=floor, floor_at_start=slowed))

    def _compute_left_s(self, tl: _Timeline) -> float:
        """How much longer ``tl`` computes from now without a wait: what remains of its backward; in forward
        taken as unbounded (what follows it is the backward); nothing while it waits or once it is done."""
        if tl.blocked or tl.finished:
            return 0.0
        if tl.in_backward:
            return max(0.0, tl.bstart + self.backward_s[tl.wc.index] - self.loop.now)
        return math.inf if tl.in_forward else 0.0

    def _slowed_floor(self, task: int) -> float:
        """The least time ``task`` takes where a device slows transfers while it computes (``overlap_comm_rate``).

        The collective's uncontended time ``n`` (its phases' latency and
        transfer) runs at ``rate`` of its speed while a worker of that rate
        computes, ``left`` more, and at full speed after: ``n / rate`` if it is
        done before, else ``left + n - rate · left``; the slowest worker's
        figure bounds the collective (its peers wait for its share of the ring).
        Taken as the collective starts (a queued one may start after the
        compute it was issued beside has ended).
        """
        n = self.uncontended_s[task]
        floor = 0.0
        for tl in self.timelines:
            rate = tl.wc.overlap_comm_rate
            if rate is None or rate >= 1.0:
                continue
            left = self._compute_left_s(tl)
            floor = max(floor, n / rate if n <= rate * left else left + n - rate * left)
        return floor

    def _cpu_floor(self, task: int) -> float:
        """The least time ``task`` takes for its CPU work: on its slowest worker, sharing the core with compute.

        A worker's core runs its compute and the collective's CPU work ``w``
        side by side at half speed each (processor sharing), so with ``r`` of
        compute left the work is done after ``w + min(w, r)``: ``2w`` while
        forward or backward outlasts it, ``w`` on a worker that waits. In
        backward ``r`` is what remains of it; in forward it is taken as
        longer than the work; at backward's end (what follows is a wait or
        the step) as nothing.
        """
        work = self.cpu_of_task[task]
        floor = 0.0
        for tl in self.timelines:
            w = self._cpu_s(tl, work)
            floor = max(floor, w + min(w, self._compute_left_s(tl)))
        return floor

    def _completed(self, coll: Collective) -> None:
        task, inst = coll.task, coll.instance
        spec = self.plan.tasks[task]
        if self.warmup <= inst < self.total:
            self.reduced_bytes += self.reduced_of_task[task]
            self.sent_bytes += self.sent_of_task[task]
        if self.trace is not None:
            for wc in self.classes:
                self.trace.add(TraceEvent(spec.name, spec.kind, wc.rank, coll.start_s, coll.end_s, spec.bytes, inst))
        for tl in self.timelines:
            self._report(tl, tl.dispatcher.completed(task, inst))
        for tl in self.timelines:
            if tl.blocked:
                self._try_unblock(tl)

    # ---- compute timeline ----

    def _record(self, name: str, kind: str, tl: _Timeline, start_s: float, end_s: float, iteration: int) -> None:
        if self.trace is not None and end_s > start_s:
            self.trace.add(TraceEvent(name, kind, tl.wc.rank, start_s, end_s, 0, iteration))

    def _begin_iteration(self, tl: _Timeline, k: int) -> None:
        if self._deferred(tl, self._begin_iteration, k):
            return
        tl.fstart.append(self.loop.now)
        tl.in_forward = True
        self._forward_layer(tl, k, 0)

    def _forward_layer(self, tl: _Timeline, k: int, layer: int) -> None:
        if self._deferred(tl, self._forward_layer, k, layer):
            return
        self._report(tl, tl.dispatcher.forward_pre(layer))
        if self.gated and k > 0 and not tl.dispatcher.layer_ready(layer, k - 1):
            tl.blocked, tl.block_k, tl.block_l, tl.stall_since = _GATE, k, layer, self.loop.now
            return
        self._run_layer(tl, k, layer)

    def _run_layer(self, tl: _Timeline, k: int, layer: int) -> None:
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

    def _backward_start(self, tl: _Timeline, k: int) -> None:
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

    def _grads_ready(self, tl: _Timeline, k: int, batch: int) -> None:
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

    def _backward_end(self, tl: _Timeline, k: int) -> None:
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
            tl.blocked, tl.block_k, tl.stall_since = _STEP, k, self.loop.now

    def _step(self, tl: _Timeline, k: int) -> None:
        self._report(tl, tl.dispatcher.step())
        update = sum(self.update_s[tl.wc.index])
        if update > 0:
            now = self.loop.now
            self._record("step", "update", tl, now, now + update, k)
            self.loop.schedule(now + update, self._begin_iteration, tl, k + 1)
        else:
            self._begin_iteration(tl, k + 1)

    def _try_unblock(self, tl: _Timeline) -> None:
        if tl.blocked == _GATE:
            if not tl.dispatcher.layer_ready(tl.block_l, tl.block_k - 1):
                return
            tl.blocked = 0
            tl.debt_s = max(0.0, tl.debt_s - (self.loop.now - tl.stall_since))  # done while the core was idle
            name = f"wait:{self.workload.layers[tl.block_l].name}"
            self._record(name, "wait", tl, tl.stall_since, self.loop.now, tl.block_k)
            self._run_layer(tl, tl.block_k, tl.block_l)
        elif tl.blocked == _STEP:
            if not tl.dispatcher.iteration_done(tl.block_k):
                return
            tl.blocked = 0
            tl.debt_s = max(0.0, tl.debt_s - (self.loop.now - tl.stall_since))
            self._record("wait:step", "wait", tl, tl.stall_since, self.loop.now, tl.block_k)
            self._step(tl, tl.block_k)

    def _finish(self, tl: _Timeline) -> None:
        self._report(tl, tl.dispatcher.flush())
        tl.finished = True

    # ---- results ----

    def result(self, knobs: Mapping[str, Any], wall_s: float) -> SimResult:
        leader = self.timelines[0]
        starts = leader.fstart
        periods = [b - a for a, b in itertools.pairwise(starts)]
        steady = periods[self.warmup : self.total]
        iteration_s = median(steady)
        window = (starts[self.warmup], starts[self.total])
        span = window[1] - window[0]
        mean_period = span / self.iterations
        counts = [len(wc.ranks) for wc in self.classes]
        busy = tuple(min(1.0, cs / mean_period) if mean_period > 0 else 1.0 for cs in self.compute_s)
        gpu_busy = sum(b * n for b, n in zip(busy, counts, strict=True)) / sum(counts)
        slowest = max(self.compute_s)
        util = {
            name: (link.busy_within(*window) / span if span > 0 else 0.0)
            for name, link in sorted(self.network.links.items())
        }
        w = self.workload
        num_workers = self.cluster.num_workers
        samples = sum(wc.batch_size * len(wc.ranks) for wc in self.classes)
        if self.trace is not None:
            self.trace.meta.update(
                {
                    "source": "simulated",
                    "policy": self.plan.policy,
                    "model": w.model,
                    "cluster": self.cluster.name,
                    "num_workers": num_workers,
                    "update": self.plan.update,
                    "options": asdict(self.options),
                    "knobs": dict(knobs),
                    "classes": [
                        {"rank": wc.rank, "workers": len(wc.ranks), "speed": wc.speed, "batch_size": wc.batch_size}
                        for wc in self.classes
                    ],
                    "iteration_starts_s": list(starts),
                }
            )
        return SimResult(
            policy=self.plan.policy,
            model=w.model,
            cluster=self.cluster.name,
            num_workers=num_workers,
            iterations=self.iterations,
            warmup=self.warmup,
            iteration_ms=iteration_s * 1e3,
            iteration_ms_each=tuple(p * 1e3 for p in steady),
            samples_per_s=samples / iteration_s if iteration_s > 0 else math.inf,
            compute_ms=slowest * 1e3,
            gpu_busy=gpu_busy,
            gpu_busy_by_class=busy,
            link_utilisation=util,
            exposed_comm_ms=max(0.0, iteration_s - slowest) * 1e3,
            gradient_bytes=self.reduced_bytes / self.iterations,
            sent_bytes_per_worker=self.sent_bytes / self.iterations,
            num_tasks=self.num_tasks,
            events=self.loop.processed,
            wall_s=wall_s,
            knobs=dict(knobs),
            options=self.options,
            classes=self.classes,
            trace=self.trace,
            plan=self.plan,
            unvalidated=self._unvalidated(),
        )

    def _unvalidated(self) -> str | None:
        if self.options.network == "flow" and not self.plan.lossless:
            return (
                "bounded-loss tasks priced as lossless transfers: the flow-level network has no "
                "retransmission or incast tail for a bounded-loss transport to cut"
            )
        return None


def plan_for(
    workload: Workload,
    cluster: Cluster,
    policy: str,
    options: SimOptions | Mapping[str, Any] | None = None,
    **knobs: Any,
) -> CommPlan:
    """``policy``'s plan for ``workload`` on ``cluster``, made for the cost model's network estimate.

    Raises ScheduleError for an unknown policy, knob or option, or a bad value.
    """
    comm = CommModel.from_cluster(cluster, SimOptions.from_mapping(options).algorithm)
    try:
        return build_plan(policy, workload, comm.estimate(), **knobs)
    except CommschedError:
        raise
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise ScheduleError(f"{policy}: bad option value ({exc})") from None


def simulate_plan(
    plan: CommPlan,
    cluster: Cluster,
    iterations: int = 20,
    warmup: int = 3,
    *,
    options: SimOptions | Mapping[str, Any] | None = None,
    trace: bool = True,
    compute: ComputeModel = PROFILE,
    batch_sizes: Sequence[int] | None = None,
    network: NetworkFactory | None = None,
) -> SimResult:
    """Simulate ``plan`` (made by :func:`plan_for`, a planner or a file) under its policy's scheduler.

    ``network``: a factory for the network model (default: the one ``options.network`` names).
    """
    sim_options = SimOptions.from_mapping(options)
    comm = CommModel.from_cluster(cluster, sim_options.algorithm)
    start = time.perf_counter()
    sim = Simulation(
        plan.workload,
        cluster,
        scheduler_for(plan),
        iterations,
        warmup,
        sim_options,
        comm,
        record_trace=trace,
        compute=compute,
        network=network,
        batch_sizes=batch_sizes,
    )
    sim.run()
    return sim.result(plan.knobs.to_dict(), time.perf_counter() - start)


def simulate(
    workload: Workload,
    cluster: Cluster,
    policy: str,
    iterations: int = 20,
    warmup: int = 3,
    *,
    options: SimOptions | Mapping[str, Any] | None = None,
    trace: bool = True,
    compute: ComputeModel = PROFILE,
    batch_sizes: Sequence[int] | None = None,
    **knobs: Any,
) -> SimResult:
    """Simulate ``warmup + iterations`` iterations of ``policy`` on ``cluster``.

    ``knobs`` are the policy's (``schedule.knobs(policy)``); ``options`` the
    simulator's (:class:`SimOptions`). ``trace=False`` skips recording the
    Trace (faster, for searches). ``compute``: the compute model
    (:mod:`commsched.sim.compute`; default: the workload's profile scaled by
    speed and batch size). ``batch_sizes``: one per rank (default: the
    workload's batch size on every rank). Raises ScheduleError for an unknown policy,
    knob or option, a bad value, or a scheduler that breaks the contract
    (a deadlock is reported with what was waiting on what).

    >>> result = simulate(workload, load_cluster("64xV100-10GbE"), "dear")  # doctest: +SKIP
    >>> result.iteration_ms, result.samples_per_s  # doctest: +SKIP
    """
    plan = plan_for(workload, cluster, policy, options, **knobs)
    return simulate_plan(
        plan, cluster, iterations, warmup, options=options, trace=trace, compute=compute, batch_sizes=batch_sizes
    )
