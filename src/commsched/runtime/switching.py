"""Which plan runs, and switching between plans: the engine's plan lifecycle.

* after the warm-up, rank 0 makes the real plan from what it measured and
  sends it to every rank as plan JSON (:func:`replan_after_warmup`);
* the **trials**: the plan chosen by prediction, the planner's runner-up
  (the best plan of a policy that updates the other way) and, for ``auto``,
  up to :data:`TIE_TRIALS` near-ties (other policies predicted within
  :data:`TIE_MARGIN` of the best) and the **reference**, PyTorch DDP's
  schedule at its defaults, are each measured for a few iterations and the
  fastest is kept, unless the reference measured within
  :data:`~commsched.runtime.replan.REFERENCE_MARGIN` of it; where all
  measured slower than the last warm-up iteration, the warm-up's plan is
  measured the same way and the fastest of them all kept; ``auto`` measures
  the fastest a second time before keeping it (unless it is the reference),
  and that reading stands for it — :mod:`~commsched.runtime.replan`;
* **drift**: every few iterations rank 0 says whether compute or bandwidth
  moved enough to plan again;
* :func:`use_plan` switches between iterations, every rank at
  the same point, flushing deferred updates first;
* a plan given in is checked against the first iteration's real order.

Functions of the engine (each takes it first). Every decision is rank 0's,
sent to all ranks on the control group, so every rank switches at the same
iteration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from commsched.errors import PlanMismatchError, RuntimeCommError
from commsched.runtime import startup, warmup
from commsched.runtime.binding import bind_plan
from commsched.runtime.named import NamedPlanner
from commsched.runtime.replan import TRIAL_ITERATIONS, Replanner
from commsched.schedule import (
    CommPlan,
    NetworkEstimate,
    build_plan,
    provisional_plan,
    reference_plan,
    updating_like,
)
from commsched.schedule.base import COLLECTIVE, PS_TRANSPORT
from commsched.transport.base import HOST_MEMORY, CollectiveTransport, check_transports
from commsched.workload import Workload

if TYPE_CHECKING:
    from commsched.runtime.engine import Engine

log = logging.getLogger("commsched")

#: Plans the planner proposes for measuring after the warm-up: its choice and its runner-up.
PLANNED_TRIALS = 2
#: ``auto`` also measures up to this many more candidates predicted within :data:`TIE_MARGIN` of its choice.
TIE_TRIALS = 2
#: Relative distance from the best prediction within which candidates are near-ties, measured in trials: the
#: simulator's errors differ from policy to policy by more than that (resnet5m, 2 workers, 300 Mbit/s:
#: ByteScheduler predicted 586.5 ms and its trial ran 664, ``ps`` predicted 587.7 and runs 618; BENCHMARKS.md,
#: "auto measures near-ties").
TIE_MARGIN = 0.05
#: Searched knobs replace a policy's defaults in ``auto``'s search only when they are predicted faster by more
#: than this fraction (:func:`commsched.plan.search.search_policies`, ``defaults_margin``). Unlike policies,
#: two settings of one policy get no trial, and the simulator's error differs between them by about this
#: much on the testbed (2 workers, resnet5m): ddp[4MiB] and ddp[25MiB] were predicted -6.2 % and -3.4 % off
#: unshaped, -12.2 % and -2.3 % in another run, -10.7 % and -5.5 % at 1 Gbit/s (BENCHMARKS.md). Not enough
#: everywhere: unshaped, ``auto`` still kept ``ddp`` with 0.4-2.2 MiB buckets, predicted more than 5 % ahead
#: of 25 MiB, which DDP's own grid measured no faster ("Runs one after another release their process groups").
KNOB_MARGIN = TIE_MARGIN
#: ``auto`` also measures the reference, PyTorch DDP's schedule at its defaults (what a user runs without
#: commsched), where no trial ran it yet (1; 0: not).
REFERENCE_TRIALS = 1
#: ``auto`` measures the fastest trial a second time before keeping it, unless it is the reference (1; 0: not):
#: :meth:`~commsched.runtime.replan.Replanner.after_trials` says why.
AGAIN_TRIALS = 1
#: Trials at most: those, the warm-up's plan (measured only when all seem slower than the warm-up) and the
#: fastest measured again.
MAX_TRIALS = PLANNED_TRIALS + TIE_TRIALS + REFERENCE_TRIALS + 1 + AGAIN_TRIALS


def replan_after_warmup(engine: Engine) -> None:
    """After the warm-up: rank 0 plans from what it measured and sends the plan to every rank."""
    payload: list[Any] = [None]
    if engine.world > 1 and engine.network is None:  # the per-message cost: a few one-element all-reduces
        warmup_transport = engine._transport(COLLECTIVE)  # the warm-up's plan all-reduces every gradient
        assert isinstance(warmup_transport, CollectiveTransport)
        coll, device = warmup_transport.collectives, engine._params[0].device
        for wall_s, cpu_s in startup.tiny_allreduces(coll, 5, device):
            engine.recorder.latency_s.append(wall_s)
            engine.recorder.latency_cpu_s.append(cpu_s)
        if isinstance(engine.planner, AutoPlanner | NamedPlanner):  # and the transports whose CPU work it prices
            with startup.peers("timing the transports the plan may use"):
                engine.recorder.transport_samples = warmup.time_transports(
                    engine.groups.sync, engine.planner.timed_apart(), engine._transport_options
                )
    start = time.perf_counter()
    if engine.rank == 0:
        workload, _ = warmup.measured_workload(engine.module, engine.recorder)
        nbytes = sum(p.numel() * p.element_size() for p in engine._params)
        network = engine.network or warmup.measured_network(engine.world, nbytes, engine.recorder) or engine._network()
        engine._plan_inputs = (workload, network)
        payload = [engine.planner(workload, network, frozenset()).to_json(indent=None)]
    with startup.peers("sharing the plan made after warm-up"):
        dist.broadcast_object_list(payload, src=engine.groups.leader(), group=engine.groups.control)
    engine._adopt(CommPlan.from_json(payload[0], "the plan made after warm-up"))
    engine._warming = False
    if engine.replanner is not None:
        engine.replanner.exclude(time.perf_counter() - start)
        engine._baseline_iteration = engine._iteration - 1  # the last warm-up iteration
        start_trial(engine)


def auto_settles_after(warmup_iters: int) -> int:
    """Iterations before ``auto`` runs the plan it keeps, at most: the warm-up, then each trial's plan for
    its switch iteration and ``TRIAL_ITERATIONS`` more."""
    return warmup_iters + MAX_TRIALS * (TRIAL_ITERATIONS + 1)


def start_trial(engine: Engine) -> None:
    """Measure the plan just adopted (the first iteration after the switch is not counted)."""
    engine._trial = (engine._iteration + 1, engine._iteration + TRIAL_ITERATIONS + 1)


def check_trial(engine: Engine, replanner: Replanner) -> None:
    """A trial's end (every rank alike): rank 0 records it, then sends the next plan to measure (the
    runner-up, a near-tie, the warm-up's plan when all seem slower than the warm-up, or the fastest again),
    or the plan to keep after the last trial (the fastest measured), or nothing (stay)."""
    first, _ = engine._trial or (0, 0)
    engine._trial = None
    mean_s, start = trial_mean_then_flush(engine, replanner, first)
    payload: list[Any] = [None, False]
    if engine.rank == 0:
        current = engine.plan.to_json(indent=None)
        assert engine._plan_inputs is not None
        warmup_plan = provisional_plan(*engine._plan_inputs).to_json(indent=None)
        if replanner.again_of is not None:  # the fastest, measured a second time: now keep one
            replanner.measured_again(mean_s)
            plan, measure = replanner.after_trials(engine._baseline_iteration, warmup_plan, _again(engine))
            payload = [None if plan == current else plan, measure]
        else:
            payload = _next_trial(engine, replanner, current, mean_s, warmup_plan)
    with startup.peers("sharing the trial's outcome"):
        dist.broadcast_object_list(payload, src=engine.groups.leader(), group=engine.groups.control)
    if payload[0] is not None:
        engine.replans += 1
        engine.use_plan(CommPlan.from_json(payload[0], "the plan the trials chose"))
    replanner.exclude(time.perf_counter() - start)  # the flush and the decision are no plan's time
    if payload[1]:  # a trial of the plan now in use (switched to, or kept to be measured again)
        start_trial(engine)


def _next_trial(
    engine: Engine, replanner: Replanner, current: str, mean_s: float | None, warmup_plan: str
) -> list[Any]:
    """Rank 0, after a trial of ``current``: ``[plan JSON or None, measure it]``, the next plan to measure or
    the plan to keep (None: the current one)."""
    replanner.trials.append((current, engine.plan.policy, mean_s))
    assert engine._plan_inputs is not None
    workload, network = engine._plan_inputs
    measured = frozenset(policy for _, policy, _ in replanner.trials)
    runner_up = None
    if len(replanner.trials) < PLANNED_TRIALS:
        # the runner-up updates the other way: the simulator errs alike on plans of one kind (a forward
        # that waits for each layer's communication is priced the same way for all of them)
        candidate = engine.planner(workload, network, measured | updating_like(measured))
        runner_up = candidate if candidate.policy not in measured else None  # a planner of one policy: none
    # then near-ties and the reference, unless the warm-up's plan was measured as the last resort (the trials
    # end with it); where the search ranked the warm-up's plan (no-overlap) a candidate, its trial is no such end
    ties = len(replanner.trials) < PLANNED_TRIALS + TIE_TRIALS and not replanner.fell_back
    if runner_up is None and ties and isinstance(engine.planner, AutoPlanner):
        runner_up = engine.planner.near_tie(workload, network, measured)
    if isinstance(engine.planner, AutoPlanner) and not replanner.fell_back:
        reference = engine.planner.reference(workload, network) if REFERENCE_TRIALS > 0 else None
        if reference is not None and replanner.reference is None:
            replanner.reference = measured_as(replanner, reference)
            if replanner.reference is None and runner_up is None:
                replanner.reference, runner_up = len(replanner.trials), reference
    if runner_up is not None:
        return [runner_up.to_json(indent=None), True]
    plan, measure = replanner.after_trials(engine._baseline_iteration, warmup_plan, _again(engine))
    return [None if plan == current else plan, measure]


def _again(engine: Engine) -> bool:
    """Whether the fastest trial is measured a second time before it is kept (``auto``'s trials)."""
    return AGAIN_TRIALS > 0 and isinstance(engine.planner, AutoPlanner)


def measured_as(replanner: Replanner, plan: CommPlan) -> int | None:
    """The index of the trial that measured ``plan``'s policy at ``plan``'s knobs (None: none did)."""
    for index, (trial, policy, _) in enumerate(replanner.trials):
        if policy == plan.policy and CommPlan.from_json(trial, "a trial's plan").knobs == plan.knobs:
            return index
    return None


def trial_mean_then_flush(engine: Engine, replanner: Replanner, first: int) -> tuple[float | None, float]:
    """The trial's mean seconds per iteration (rank 0; None elsewhere), timed to the end of its last
    step, then every rank's flush of what the trial deferred; with the time the trial ended.

    The flush is left out of the measurement: in a steady run the work a plan defers past a step
    overlaps the next iteration, and the trial's first iteration inherited the same from the
    switch iteration before it. Counted (as it once was), it charged a plan that defers work
    with the deferred work's whole time once per trial, unoverlapped: at 300 Mbit/s, 460-590 ms
    on ByteScheduler's last trial iteration, whose trials read 771-829 ms per iteration where the
    plan ran 678-688 ms on its own (BENCHMARKS.md, "auto's trials without the flush").
    """
    end = time.perf_counter()
    mean_s = replanner.trial_mean(first, end) if engine.rank == 0 else None
    engine.flush()  # every rank: the next plan starts with nothing pending
    return mean_s, end


def check_drift(engine: Engine, replanner: Replanner) -> None:
    """Every ``every`` iterations: rank 0's drift decision, the same on every rank; re-plan if it says so."""
    payload: list[Any] = [None]
    if engine.rank == 0:
        new = replanner.new_plan(engine.plan, engine.planner)
        payload = [None if new is None else new.to_json(indent=None)]
    with startup.peers("sharing the drift check"):
        dist.broadcast_object_list(payload, src=engine.groups.leader(), group=engine.groups.control)
    if payload[0] is not None:
        engine.replans += 1
        engine.use_plan(CommPlan.from_json(payload[0], "the plan made after a drift"))


def use_plan(engine: Engine, plan: CommPlan) -> None:
    """Switch to ``plan`` between two iterations; every rank must call it at the same point.

    Pending updates are applied under the old plan first, so plans with different update
    modes can follow each other. The ranks check that they switch to the same plan.
    """
    if engine._in_backward:
        raise RuntimeCommError(f"rank {engine.rank}: use_plan() inside backward; call it between iterations")
    bind_plan(engine.module, plan, engine.world)
    check_transports((t.transport for t in plan.tasks), {p.device for p in engine.module.parameters()})
    engine.flush()
    theirs: list[Any] = [None] * engine.world
    digest = startup.plan_digest(plan.to_json(indent=None))
    with startup.peers("agreeing on a new plan"):
        dist.all_gather_object(theirs, digest, group=engine.groups.control)
    if len(set(theirs)) != 1:
        raise RuntimeCommError(f"rank {engine.rank}: use_plan(): the ranks switch to different plans ({theirs})")
    engine._adopt(plan)
    engine._warming = False


def check_plan_fits(engine: Engine, plan: CommPlan) -> None:
    """The first iteration under a plan given in: the model's real order must be the plan's."""
    engine._check_first = None
    engine.recorder.active = False
    problem = warmup.first_iteration_mismatch(plan, engine.recorder, engine._layer_modules, engine.buffers.params)
    if problem is not None:
        raise PlanMismatchError(f"plan: the model does not run as the plan expects: {problem}")


class AutoPlanner:
    """``policy="auto"``'s planner: the plan ``commsched advise`` ranks first for the measured model and
    network. The ranking is kept, so a replacement (a plan excluded after measuring slower than the
    warm-up) is the next candidate of the same search, at no new search's cost; with every candidate of
    the ranking excluded, the provisional plan the warm-up measured.

    ``gloo``: the runtime runs on gloo with CPU tensors, so candidates are simulated as it runs them there
    (:func:`commsched.plan.gloo.gloo_options`), with communication's CPU work as the warm-up measured it
    (:class:`~commsched.schedule.NetworkEstimate`'s ``cpu_per_message_s``, ``cpu_s_per_byte``).
    ``host_memory``: False when the model's parameters are not on the CPU; candidates whose plans use a
    transport that takes CPU tensors only (:data:`commsched.transport.base.HOST_MEMORY`) are then passed over.
    """

    __slots__ = ("_ranking", "budget_s", "gloo", "host_memory", "policies")

    def __init__(
        self, budget_s: float, policies: tuple[str, ...] | None, gloo: bool = False, host_memory: bool = True
    ) -> None:
        self.budget_s = budget_s
        self.policies = policies
        self.gloo = gloo
        self.host_memory = host_memory
        self._ranking: tuple[int, list[tuple[str, dict[str, Any], float]]] | None = None

    def timed_apart(self) -> frozenset[str]:
        """The transports the warm-up times apart for the search (:func:`warmup.time_transports`): the
        ``"ps"`` transport where candidates run on it on gloo with CPU tensors (its push and pull cost
        other CPU work than gloo's all-reduce: resnet5m's warm-up at 300 Mbit/s measured 0.25-0.51 ms
        per ``"ps"`` task against 0.14-0.21 ms per all-reduce, BENCHMARKS.md "auto measures near-ties")."""
        from commsched.schedule import LOSSLESS, make_knobs, policy_class

        if not (self.gloo and self.host_memory):
            return frozenset()
        names = LOSSLESS if self.policies is None else self.policies
        used = frozenset().union(*(policy_class(n).transports(make_knobs(n, {})) for n in names))
        return used & {PS_TRANSPORT}

    def __call__(self, workload: Workload, network: NetworkEstimate, exclude: frozenset[str]) -> CommPlan:
        host_only = 0
        for plan, predicted_ms in self._runnable(workload, network):
            if plan is None:
                host_only += 1
            elif plan.policy not in exclude:
                log.info("commsched auto: %s %s, predicted %.1f ms per iteration", plan.policy,
                         plan.knobs.to_dict(), predicted_ms)  # fmt: skip
                return plan
        log.info(
            "commsched auto: every candidate measured slower than the warm-up%s; running the warm-up's plan",
            f" or ({host_only}) takes CPU tensors only" if host_only else "",
        )
        return provisional_plan(workload, network)

    def reference(self, workload: Workload, network: NetworkEstimate) -> CommPlan | None:
        """The reference plan (:func:`~commsched.schedule.reference_plan`) where its policy is a candidate and it
        can run here, else None."""
        plan = reference_plan(workload, network)
        if self.policies is not None and plan.policy not in self.policies:
            return None
        return plan if self._runs_here(plan) else None

    def _runs_here(self, plan: CommPlan) -> bool:
        """Whether ``plan``'s transports take the model's tensors (off the CPU, none that takes CPU tensors only)."""
        return self.host_memory or not {t.transport for t in plan.tasks} & HOST_MEMORY

    def near_tie(self, workload: Workload, network: NetworkEstimate, measured: frozenset[str]) -> CommPlan | None:
        """The best-ranked plan of a policy not in ``measured`` predicted within :data:`TIE_MARGIN` of the
        ranking's best (None where there is none): a near-tie the trials measure rather than trust the
        prediction with."""
        best_ms = None
        for plan, predicted_ms in self._runnable(workload, network):
            if plan is None:
                continue
            best_ms = predicted_ms if best_ms is None else best_ms
            if predicted_ms > best_ms * (1 + TIE_MARGIN):
                return None
            if plan.policy not in measured:
                log.info("commsched auto: %s %s, predicted %.1f ms per iteration, within %.0f %% of the best: "
                         "measured too", plan.policy, plan.knobs.to_dict(), predicted_ms, TIE_MARGIN * 100)  # fmt: skip
                return plan
        return None

    def _runnable(self, workload: Workload, network: NetworkEstimate) -> Iterator[tuple[CommPlan | None, float]]:
        """The search's ranking as plans, best first, with their predicted ms (the search runs once per
        workload and network); None in place of a plan that takes CPU tensors only, off the CPU."""
        key = hash((workload.to_json(indent=None), network))
        if self._ranking is None or self._ranking[0] != key:
            self._ranking = (key, self._search(workload, network))
        for policy, knobs, predicted_ms in self._ranking[1]:
            plan = build_plan(policy, workload, network, **knobs)
            yield (plan if self._runs_here(plan) else None), predicted_ms

    def _search(self, workload: Workload, network: NetworkEstimate) -> list[tuple[str, dict[str, Any], float]]:
        from commsched.plan import advise
        from commsched.plan.gloo import gloo_options, measured_cpu
        from commsched.profile.probe_fit import measured_cluster
        from commsched.sim import SimOptions

        cluster = measured_cluster(network.latency_s, 1.0 / network.bandwidth_bytes_per_s, network.world_size)
        cpu = measured_cpu(network)
        apart = "".join(f"; {name}: {t:.3f} ms per task, {mb:.3f} ms per MiB" for name, t, mb in cpu["transport_cpu"])
        log.info(
            "commsched auto: measured α %.1f µs, %.0f Mbit/s; communication's CPU %.3f ms per task, %.3f ms per MiB%s",
            network.latency_s * 1e6, network.bandwidth_bytes_per_s * 8 / 1e6, cpu["cpu_per_task_ms"],
            cpu["cpu_ms_per_mb"], apart,
        )  # fmt: skip

        def options_for(policy: str, knobs: Mapping[str, Any]) -> SimOptions:
            return gloo_options(workload, cluster, policy, **cpu, **knobs)

        advice = advise(
            workload,
            cluster,
            budget_s=self.budget_s,
            policies=self.policies,
            defaults_margin=KNOB_MARGIN,
            sim_options=SimOptions(**cpu) if self.gloo else None,
            options_for=options_for if self.gloo else None,
        )
        log.info(
            "commsched auto: %d simulations in %.1f s of a %.1f s budget%s; ranked %s",
            advice.simulations, advice.search_s, self.budget_s,
            " (it cut the search short: the choice may differ from a longer search's)"
            if advice.budget_exhausted else "",
            ", ".join(f"{c.policy} {c.iteration_ms:.3f} ms" for c in advice.candidates[:4]),
        )  # fmt: skip
        return [(c.policy, dict(c.knobs), c.iteration_ms) for c in advice.candidates]
