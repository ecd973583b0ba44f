"""The agent: one rank's dispatcher, driven by whichever thread has news, starting real transports.

The :class:`~commsched.schedule.dispatch.Dispatcher` is not thread-safe, so it
lives behind one lock and is called, synchronously, by the thread that has
something to report — no event is handed to another thread:

* the **training thread** reports its events (gradient ready, backward done,
  step, a layer's forward, flush) from its hooks;
* the **watcher** thread waits for started tasks in start order, records them
  in the trace, marks them in :class:`Completions` (what the training thread
  waits on) and reports them; a task whose transport calls back when it ends
  (``then``: the ``ps`` transport's) is recorded so in the transport's thread
  that ended it (or, where it ended at its start, by the thread that started
  it), and the watcher never wakes for it;
* a **follower** (a rank other than 0 under a completion-driven scheduler)
  receives the leader's decisions and reports them: its training thread
  reads those already arrived at each of its events (without blocking),
  and its follow thread waits for them while the training thread does not
  keep (below) — so that an order arriving during the backward does not
  wake a thread of its own;
* a deciding **leader** writes its decisions at once, without blocking, from
  the thread that made them (:meth:`DecisionChannel.offer`); only what a
  follower's socket does not take is left to a sender thread, so that a slow
  peer never blocks the training thread.

Whatever the dispatcher returns is started at once on the task's transport (a
non-blocking call). While the training thread is *keeping* (from one of its
events until it next hands over), a task whose transport can complete an op
without waiting and whose peers' data fits the kernel's socket buffers
(``fits_buffers()``, ``try_complete()``: the direct all-reduce) is kept for
it, whichever thread started it: it completes the task at its next events,
once the data has arrived, instead of waking the watcher twice (to take the
task, when its data arrives), and hands the rest over before it may block
(``backward_done``, ``step``, ``flush``, :meth:`Agent.wait`). A
completion-driven scheduler then hears of such a completion at the training
thread's next event (every layer, in the backward and the forward); its
window keeps earlier tasks on the link meanwhile. Reports carry the *epoch*
of their plan: completions of a plan switched away from are dropped; a
leader's orders for a plan this rank has not adopted yet wait until it has.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from commsched._threads import daemon_thread
from commsched.errors import RuntimeCommError
from commsched.runtime.buffers import GradientBuffers
from commsched.runtime.completions import Completions, Started
from commsched.runtime.decisions import DecisionChannel
from commsched.schedule import CommPlan, Dispatcher, Start, policy_class, scheduler_for
from commsched.schedule.dispatch import EventName
from commsched.trace import Trace, TraceEvent
from commsched.transport import Transport
from commsched.transport.tcp_mesh import POLL_S

#: Items the agent takes: (kind, task or tensor or layer, instance, epoch).
Item = tuple[str, int, int, int]
#: The training thread's events; the others come from the agent's threads.
_TRAINING_EVENTS = frozenset({"grad_ready", "forward_pre", "backward_done", "step", "flush"})
#: Events after which the training thread hands the watcher what it kept: it may block next.
_HAND_OVER_EVENTS = frozenset({"backward_done", "step", "flush"})


@dataclass
class _PlanState:
    plan: CommPlan
    dispatcher: Dispatcher
    buffers: GradientBuffers
    epoch: int
    leader_forwards: bool
    first_iteration: int  # training iterations before this plan: traces count iterations from the start


class Agent:
    """Runs one rank's dispatcher; see the module docstring."""

    def __init__(
        self,
        rank: int,
        world: int,
        transports: Callable[[str], Transport],
        open_decisions: Callable[[], DecisionChannel],
        timeout_s: float,
        trace: Trace | None,
        t0: float,
    ) -> None:
        self.rank = rank
        self.world = world
        self._transport = transports
        self._open_decisions = open_decisions
        self._decisions: DecisionChannel | None = None  # opened with the first plan whose leader decides
        self.timeout_s = timeout_s
        self._trace = trace
        self._t0 = t0
        self.completions = Completions()
        self._lock = threading.Lock()
        self._started: queue.SimpleQueue[Started | None] = queue.SimpleQueue()
        #: kept for the training thread to complete, oldest first: appended under the lock by any thread while
        #: ``_keeping``; only the training thread takes them out
        self._kept: list[Started] = []
        #: under the lock: from a training event until the training thread hands over
        self._keeping = False
        #: the follow thread waits on it while the training thread keeps (and reads the orders itself)
        self._resume = threading.Condition(self._lock)
        #: this rank follows the leader's orders under the current plan
        self._follows = False
        #: the leader's stop order was read (by either thread)
        self._orders_ended = False
        #: held while reading orders and posting them: whichever thread reads them, they start in their order
        self._orders = threading.Lock()
        #: tasks the training thread kept at their start (and then completed itself or handed over)
        self.kept = 0
        #: wakes the sender thread to write what the decision channel kept (None: stop)
        self._outbox: queue.SimpleQueue[bool | None] = queue.SimpleQueue()
        self._state: _PlanState | None = None
        self._stashed: list[Item] = []
        self._follower: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self._closing = False
        #: Called by the watcher for each finished transfer: (kind, bytes, seconds).
        self.on_transfer: Callable[[str, int, float], None] | None = None
        self._watcher = self._thread(self._watch_loop, "watch")

    # ---- reports ----

    def _leader_decides(self, plan: CommPlan) -> bool:
        """Whether rank 0 decides for every rank under ``plan`` (a scheduler that reacts to completions)."""
        return policy_class(plan.policy).decides_on_completions(plan) and self.world > 1

    def prepare(self, plan: CommPlan) -> None:
        """Before adopting ``plan``: open the leader's decision channel if ``plan`` is the first whose leader
        decides (collective: every rank adopts the same plans in the same order)."""
        if self._leader_decides(plan) and self._decisions is None:
            self._decisions = self._open_decisions()

    def set_plan(self, plan: CommPlan, buffers: GradientBuffers, epoch: int, first_iteration: int = 0) -> None:
        """Switch to ``plan``: later reports of an earlier epoch are dropped."""
        self.hand_over()
        leader_decides = self._leader_decides(plan)
        scheduler = scheduler_for(plan) if (self.rank == 0 or not leader_decides) else None
        dispatcher = Dispatcher(plan, scheduler, forward_decisions=leader_decides)
        state = _PlanState(plan, dispatcher, buffers, epoch, leader_decides and self.rank == 0, first_iteration)
        with self._lock:
            self.completions.reset(len(plan.tasks), epoch)
            self._state = state
            self._follows = leader_decides and self.rank != 0 and not self._orders_ended
            stashed, self._stashed = self._stashed, []
        for item in stashed:
            self.post(item[0], item[1], item[3], item[2])
        if state.leader_forwards and self._sender is None:
            self._sender = self._thread(self._send_loop, "send")
        if leader_decides and self.rank != 0 and self._follower is None:
            self._follower = self._thread(self._follow_loop, "follow")

    def post(self, event: str, arg: int, epoch: int, instance: int = 0) -> None:
        """Report to the dispatcher and start what it returns: the training thread's events
        (grad_ready, backward_done, step, forward_pre, flush); ``completed`` and ``follow``
        (with ``instance``) from the other threads."""
        training = event in _TRAINING_EVENTS
        with self._lock:
            state = self._state
            if state is None or epoch < state.epoch:
                return  # a completion of a plan switched away from
            if epoch > state.epoch:
                self._stashed.append((event, arg, instance, epoch))  # the leader's order for a later plan
                return
            d = state.dispatcher
            if event in ("completed", "follow"):
                starts = d.completed(arg, instance) if event == "completed" else d.follow(arg, instance)
            elif event in ("grad_ready", "forward_pre"):
                starts = d.grad_ready(arg) if event == "grad_ready" else d.forward_pre(arg)
            else:
                starts = {"backward_done": d.backward_done, "step": d.step, "flush": d.flush}[event]()
            if training:
                self._keeping = True
            keeps = self._keeping and self.on_transfer is None
            ended = [started for s in starts if (started := self._start(state, s, keeps)) is not None]
            if state.leader_forwards:
                decisions = d.take_decisions()
                if decisions:
                    self._offer([(task, inst, state.epoch) for task, inst in decisions])
        for started in ended:  # ended at their start: recorded by this thread, out of the lock
            self._ended(started)
        if training:
            if self._follows:
                self._take_orders()
            if self._kept:
                self._complete_kept()
            if event in _HAND_OVER_EVENTS:
                self.hand_over()

    def wait(self, task: int, instance: int, timeout_s: float, describe: Callable[[], str]) -> None:
        """The training thread: block until ``task`` of ``instance`` has completed (:meth:`Completions.wait`),
        after taking the leader's orders that have arrived, completing what it kept that has arrived and handing
        the rest to the watcher."""
        if self._follows:
            self._take_orders()
        if self._kept:
            self._complete_kept()
        if not self.completions.done(task, instance):
            self.hand_over()
        self.completions.wait(task, instance, timeout_s, describe)

    def hand_over(self) -> None:
        """The training thread: give the watcher every task kept, in start order, and keep no more until its next
        event (under the lock: a task another thread starts meanwhile queues behind them)."""
        with self._lock:
            self._keeping = False
            kept, self._kept = self._kept, []
            for started in kept:
                self._started.put(started)
            self._resume.notify()

    def _complete_kept(self) -> None:
        """Record the kept tasks that complete without waiting, oldest first, up to the first that does not."""
        with self._lock:
            kept = list(self._kept)
        done = 0
        for started in kept:
            if not getattr(started.handle, "try_complete")():  # noqa: B009 (kept: it has one)
                break
            done += 1
        if not done:
            return
        with self._lock:  # other threads only append
            del self._kept[:done]
        for started in kept[:done]:
            if not self._ended(started):
                with self._lock:
                    self._kept = []
                return

    def listens(self, event: EventName) -> bool:
        """Whether the current plan's scheduler reacts to ``event`` (others need not be reported)."""
        state = self._state
        return state is not None and state.dispatcher.listens(event)

    def close(self, join_timeout_s: float) -> None:
        """Stop the threads: the leader tells its followers to stop (also when the plan in use is one it
        does not decide: its followers still listen); each join is bounded."""
        self.hand_over()
        with self._lock:
            self._closing = True
            self._resume.notify()
            if self._sender is not None:
                with contextlib.suppress(RuntimeCommError):  # a broken connection: the follower sees it close
                    self._offer([(-1, -1, -1)])
        self._started.put(None)
        self._outbox.put(None)
        for t in (self._watcher, self._sender, self._follower):
            if t is not None:
                t.join(timeout=join_timeout_s)
        if self._decisions is not None:
            self._decisions.close(join_timeout_s)

    # ---- threads ----

    def _thread(self, fn: Callable[[], None], what: str) -> threading.Thread:
        """A started thread running ``fn``; what ``fn`` raises is reported to the training thread."""

        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                if not self._closing:
                    self.completions.fail(exc)

        t = daemon_thread(run, f"commsched-{what}-r{self.rank}")
        t.start()
        return t

    def _start(self, state: _PlanState, s: Start, keeps: bool) -> Started | None:
        """Under the lock: start ``s``. The training thread keeps it if ``keeps`` (it is keeping) and it can
        complete it itself; else the transport calls back when it ends, or the watcher waits for it. Returns it
        where it ended at its start (the caller records it once out of the lock)."""
        task = state.plan.tasks[s.task]
        start = time.perf_counter()
        handle = self._transport(task.transport).start(task, state.buffers.buffer(s.task))
        started = Started(s.task, s.instance, state.epoch, handle, start)
        # a frame the peers' sockets cannot hold whole would stop their senders until read: the watcher reads it
        if keeps and getattr(handle, "fits_buffers", lambda: False)():
            self._kept.append(started)
            self.kept += 1
        elif not hasattr(handle, "then"):
            self._started.put(started)
        elif not handle.then(lambda: self._ended(started)):
            return started
        return None

    def _watch_loop(self) -> None:
        while True:
            started = self._started.get()
            if started is None:
                return
            started.handle.wait(self.timeout_s)  # a handle raises RuntimeCommError: reported by _thread
            self._record(started, time.perf_counter())

    def _ended(self, started: Started) -> bool:
        """Record ``started``, whose op has ended (called back by the transport, in its thread that ended it, or
        by :meth:`_complete_kept`); an op that failed fails the completions instead. Whether it succeeded."""
        try:
            started.handle.wait(0.0)  # ended: raises the op's error, if it failed
            if not self._closing:
                self._record(started, time.perf_counter())
        except BaseException as exc:
            self.completions.fail(exc)
            return False
        return True

    def _record(self, started: Started, end: float) -> None:
        """A completed transfer: timed, traced, marked, reported."""
        state = self._state
        # From when the transfer began where the handle knows it (ring ops queue behind
        # each other on one thread), else from the start, as the simulator's trace counts.
        begin = getattr(started.handle, "started_s", None) or started.start_s
        if state is not None and state.epoch == started.epoch and self.on_transfer is not None:
            task = state.plan.tasks[started.task]
            self.on_transfer(task.kind, task.bytes, end - begin)
        if self._trace is not None and state is not None and state.epoch == started.epoch:
            task = state.plan.tasks[started.task]
            self._trace.add(
                TraceEvent(
                    task.name, task.kind, self.rank, begin - self._t0, end - self._t0,
                    task.bytes, state.first_iteration + started.instance,
                )
            )  # fmt: skip
        # reported before it is marked: a thread that waited for the mark may complete the task's next
        # instance itself (a kept task), and the dispatcher takes each task's instances in order
        self.post("completed", started.task, started.epoch, started.instance)
        self.completions.mark(started.task, started.instance, started.epoch)

    # ---- the leader's decisions ----

    def _offer(self, decisions: list[tuple[int, int, int]]) -> None:
        """Under the lock: write ``decisions`` (task, instance, epoch) to every follower; what a socket does not
        take at once the sender thread writes."""
        assert self._decisions is not None
        if self._decisions.offer([len(decisions), *itertools.chain.from_iterable(decisions)]):
            self._outbox.put(True)

    def _send_loop(self) -> None:
        assert self._decisions is not None
        while self._outbox.get() is not None:
            self._decisions.drain()

    def _follow_loop(self) -> None:
        """Wait for the leader's orders while the training thread does not keep; while it keeps, at most every
        :data:`POLL_S` (a training thread that keeps without reaching another event, in code of the user's
        between two events, delays the orders no longer than that)."""
        assert self._decisions is not None
        while True:
            with self._lock:
                if self._keeping and not (self._closing or self._orders_ended):
                    self._resume.wait(timeout=POLL_S)
                if self._closing or self._orders_ended:
                    return
            with self._orders:
                if self._closing or self._orders_ended:  # the stop order, read meanwhile: the leader closes next
                    return
                values = self._decisions.receive(stop=lambda: self._closing or self._keeping or self._orders_ended)
                if values is not None and not self._follow(values):
                    return

    def _take_orders(self) -> None:
        """The training thread: follow the leader's orders that have arrived (none while the follow thread
        reads); a broken connection is reported as the follow thread's would be."""
        assert self._decisions is not None
        if not self._orders.acquire(blocking=False):
            return  # the follow thread reads them
        try:
            if self._orders_ended:  # the follow thread took the stop order after this thread saw ``_follows``
                return
            for values in self._decisions.poll():
                if not self._follow(values):
                    return
        except RuntimeCommError as exc:
            self._follows = False
            self.completions.fail(exc)
        finally:
            self._orders.release()

    def _follow(self, values: list[int]) -> bool:
        """Post one message of orders (task, instance, epoch triples); at the leader's stop order neither thread
        reads orders again, and False."""
        for i in range(values[0]):
            task, inst, epoch = values[1 + 3 * i : 4 + 3 * i]
            if task < 0:
                with self._lock:
                    self._orders_ended, self._follows = True, False
                    self._resume.notify()
                return False
            self.post("follow", task, epoch, inst)
        return True
