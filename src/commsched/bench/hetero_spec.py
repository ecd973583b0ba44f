"""The cluster spec of a heterogeneous testbed, from measurement: what ``commsched bench --plan`` plans on.

Nothing in it is typed in. Before anything is timed, the workers (each in
its cgroup, on its shaped link) run the ``calibrate`` task of
:mod:`commsched.bench.worker`: the α-β probe of gloo's collectives over the
shaped links, then every rank profiles its own replica layer by layer at the
same time, in lock-step, under its own CPU quota; and each worker's link is
probed on its own (:func:`commsched.testbed.linkrate.probe_worker_links`).
:func:`measured_spec` turns that into:

* the **workload**: rank 0's profile (its layers, tensors and times);
* per rank a **speed** relative to rank 0: rank 0's forward + backward time
  over the rank's own, both measured at the same batch; and, where the ranks
  timed forward + backward at several batches (``batch_ms``), those points as
  the device's ``model_batch_ms``, so that compute follows them as the plan
  changes a rank's batch. Where every rank's curve holds the profile's batch,
  the curves also set the level: the speeds are the ratios of the curves at
  that batch and the workload's layer times are scaled so that their sum is
  rank 0's curve there (the layer profile keeps the shares). The curves'
  points are medians over rounds taken in turn across a minute; a layer
  profile is one stretch of iterations, on a host whose speed drifts by tens
  of percent within a minute; the plan's compute alone (``commsched bench
  --plan``'s reference row) came out closer to the curves than to the
  profile on every rank;
* per rank a one-device node whose **NIC** runs at the link's measured TCP
  rate, with the collective probe's per-step latency α (``latency_us``), as
  :func:`commsched.profile.probe_fit.measured_cluster` does for one rate;
* the simulator **options** of the runtime on gloo
  (:func:`commsched.plan.gloo.gloo_options`), the measured optimizer
  step (``update_ms``) and communication's CPU work (``cpu_per_task_ms``,
  ``cpu_ms_per_mb``, from rank 0's probe), taking ``1 / speed`` as long on a
  slower rank (``cpu_scales_with_speed``: the quota that slows a worker's
  compute slows its communication threads alike);
* per rank, where the calibration timed it (``overlap``), the device's
  **overlap cost** ``overlap_ms_per_mb``: how much longer its backward took
  per MiB of an all-reduce running beside it (:mod:`commsched.bench.overlap`;
  the probe's per-task CPU work, charged apart, taken off). The probe's CPU
  times see only the process's own work at full speed; on the testbed the
  backward beside an all-reduce loses several times that (the kernel's
  packet processing is charged to no process), and most where the quota is
  tightest; and where it also timed the runtime's tasks (``task_overlap``),
  its ``overlap_ms_per_task``: the backward's growth beside them less their
  bytes at that cost per MiB, per task (:mod:`commsched.bench.task_overlap`);
  and from the same rounds, the all-reduce's side: ``overlap_comm_rate``,
  the share of its rate it kept while the ranks computed, given to the ranks
  that computed longest (:func:`_overlap_comm_rates`). Where the rank timed
  the runtime's tasks in two or more bucket layouts (``task_overlap_large``,
  ``task_overlap_fine``), both costs come from those instead
  (:func:`_overlap_costs`): what the runtime pays, at the batch plans put on
  the rank.

``memory_gib`` fills the devices' memory (the testbed's workers share the
machine's memory; a per-worker cap is not part of this spec).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from commsched.bench.overlap import OverlapTimes
from commsched.bench.task_overlap import TaskOverlap, fit_costs, layouts
from commsched.cluster import Cluster
from commsched.errors import SpecError
from commsched.plan.gloo import gloo_options
from commsched.plan.search import simulate_candidate
from commsched.profile.probe_fit import CpuFit, ProbeSample, fit_alpha_beta, fit_cpu
from commsched.schedule import LOSSLESS, CommPlan, make_knobs, policy_class
from commsched.sim.compute import batch_factor
from commsched.sim.options import SimOptions
from commsched.sim.result import SimResult
from commsched.sim.simulator import simulate_plan
from commsched.testbed.linkrate import LinkRate
from commsched.transport import TRANSPORTS
from commsched.workload import Workload

__all__ = ["MeasuredSpec", "measured_spec", "plan_command", "runnable_policies"]

_Rounds = TypeVar("_Rounds", OverlapTimes, TaskOverlap)


@dataclass(frozen=True)
class MeasuredSpec:
    """A testbed as measured: the workload (rank 0's profile), the cluster and the simulator's options."""

    workload: Workload
    cluster: Cluster
    rank_compute_ms: tuple[float, ...]  # forward + backward at the profile batch, per rank
    update_ms: float
    alpha_s: float
    allreduce_mbit_s: float  # what gloo's all-reduce sustained over the shaped links (the probe's β)
    cpu: CpuFit | None

    @property
    def speeds(self) -> tuple[float, ...]:
        return self.cluster.worker_speeds(self.workload.model)

    def options(self, policy: str = "ddp", knobs: Mapping[str, Any] | None = None) -> SimOptions:
        """The runtime on gloo for ``policy`` (:func:`gloo_options`), with the measured update and CPU work."""
        return gloo_options(
            self.workload,
            self.cluster,
            policy,
            update_ms=self.update_ms,
            cpu_per_task_ms=self.cpu.per_op_ms if self.cpu is not None else 0.0,
            cpu_ms_per_mb=self.cpu.ms_per_mb if self.cpu is not None else 0.0,
            cpu_scales_with_speed=True,
            **dict(knobs or {}),
        )

    def predict_ms(self, policy: str, knobs: Mapping[str, Any], batch_sizes: Sequence[int]) -> float:
        """Simulated iteration time of ``policy`` with ``knobs`` at per-rank ``batch_sizes``."""
        result = simulate_candidate(
            self.workload,
            self.cluster,
            policy,
            knobs,
            batch_sizes=batch_sizes,
            options=self.options(policy, knobs),
        )
        return result.iteration_ms

    def simulate_plan(self, plan: CommPlan, *, trace: bool = False) -> SimResult:
        """The simulator's run of a plan file's plan on this cluster, at its own per-rank batches."""
        options = self.options(plan.policy, plan.knobs.to_dict())
        return simulate_plan(plan, self.cluster, options=options, trace=trace, batch_sizes=plan.batch_sizes)

    def compute_ms_at(self, rank: int, batch: int) -> float:
        """Rank ``rank``'s forward + backward at ``batch`` as calibrated: its time at the profile's batch times
        :func:`commsched.sim.compute.batch_factor` (its batch curve where it has one, as the simulator)."""
        curve = self.cluster.worker_batch_curves(self.workload.model)[rank]
        return self.rank_compute_ms[rank] * batch_factor(curve, batch, self.workload.batch_size)

    def rescaled(self, factors: Sequence[float | Mapping[int, float]], batches: Iterable[int] = ()) -> MeasuredSpec:
        """This spec with rank r's compute taking ``factors[r]`` times as long (its device's speed divided by the
        factor at the profile's batch, its batch curve multiplied; the workload, links and overlap costs as
        they are).

        A factor may be given per batch, ``{batch: factor}`` (one of them at the profile's batch), for a
        factor interpolated linearly in batch between those (the nearest one's beyond them). The curve then
        holds, at its own points, at those batches and at ``batches`` (those the caller will simulate), the
        calibrated time times the factor there: exact at each of them, linear between."""
        if len(factors) != self.cluster.num_workers:
            raise ValueError(f"factors: one per rank ({self.cluster.num_workers}), got {list(factors)}")
        pb, model = self.workload.batch_size, self.workload.model
        per_rank = [_factor_points(f, r, pb) for r, f in enumerate(factors)]
        wanted = set(batches)
        data = self.cluster.to_dict()
        for r, (node, points) in enumerate(zip(data["nodes"], per_rank, strict=True)):
            device = node.get("device")
            if device is None or node.get("count", 1) != 1:
                raise ValueError(f"nodes[{r}]: a measured spec has one device per node, got {node!r}")
            device["speed"] = device.get("speed", 1.0) / points[pb]
            curves = device.setdefault("model_batch_ms", {})
            if len(points) > 1:
                at = {int(b) for b in curves.get(model, {})} | set(points) | wanted | {pb}
                curves[model] = {b: self.compute_ms_at(r, b) for b in sorted(at)}
            for name, curve in curves.items():
                curve.update({b: ms * _along_points(points, int(b)) if name == model else ms * points[pb]
                              for b, ms in curve.items()})  # fmt: skip
        cluster = Cluster.from_dict(data, source=f"{self.cluster.name} (rescaled)")
        compute_ms = tuple(ms * points[pb] for ms, points in zip(self.rank_compute_ms, per_rank, strict=True))
        return replace(self, cluster=cluster, rank_compute_ms=compute_ms)

    def sim_pairs(self) -> list[str]:
        """The options as ``commsched plan --sim KEY=VALUE`` pairs (what ``--plan auto`` planned with)."""
        o = self.options()
        pairs = {
            "algorithm": o.algorithm,
            "max_concurrent": o.max_concurrent,
            "update_ms": f"{o.update_ms:.4g}",
            "cpu_per_task_ms": f"{o.cpu_per_task_ms:.4g}",
            "cpu_ms_per_mb": f"{o.cpu_ms_per_mb:.4g}",
            "cpu_scales_with_speed": str(o.cpu_scales_with_speed).lower(),
        }
        return [f"{k}={v}" for k, v in pairs.items()]


def _factor_points(factor: float | Mapping[int, float], rank: int, profile_batch: int) -> dict[int, float]:
    """One rank's factors as ``{batch: factor}`` (a single factor: at the profile's batch), checked."""
    points = {profile_batch: factor} if isinstance(factor, (int, float)) else {int(b): f for b, f in factor.items()}
    if profile_batch not in points or any(not (isinstance(f, (int, float)) and f > 0) for f in points.values()):
        raise ValueError(
            f"factors[{rank}]: a number > 0, or one per batch including the profile's batch {profile_batch}, "
            f"got {factor!r}"
        )
    return points


def _along_points(points: Mapping[int, float], batch: int) -> float:
    """The factor at ``batch``: linear between the two nearest batches of ``points``, the nearest beyond them."""
    xs = sorted(points)
    if batch <= xs[0]:
        return points[xs[0]]
    if batch >= xs[-1]:
        return points[xs[-1]]
    hi = next(i for i, x in enumerate(xs) if x >= batch)
    b0, b1 = xs[hi - 1], xs[hi]
    return points[b0] + (points[b1] - points[b0]) * (batch - b0) / (b1 - b0)


def measured_spec(
    ranks: Sequence[Mapping[str, Any]], links: Sequence[LinkRate], *, memory_gib: float, name: str = "testbed"
) -> MeasuredSpec:
    """The spec of the module docstring from every rank's ``calibrate`` output and every link's probe.

    ``ranks[r]``: what rank r of the ``calibrate`` job wrote (its ``workload``,
    ``update_ms``; rank 0 also the probe's ``samples``). Raises SpecError when
    the ranks disagree on the model or batch, or a measurement is missing.
    """
    if len(ranks) != len(links) or not ranks:
        raise SpecError(name, [f"ranks: {len(ranks)} calibrations for {len(links)} link probes"])
    workloads = [Workload.from_json(json.dumps(r["workload"]), source=f"{name}: rank {i}") for i, r in enumerate(ranks)]
    ref = workloads[0]
    problems = []
    for i, w in enumerate(workloads):
        if (w.model, w.batch_size, w.num_params) != (ref.model, ref.batch_size, ref.num_params):
            problems.append(
                f"ranks[{i}]: profiled {w.model} at batch {w.batch_size}, rank 0 {ref.model} at {ref.batch_size}"
            )
    for link in links:
        if not link.throughput_mbit_s > 0:
            problems.append(f"links[{link.rank}].throughput_mbit_s: must be > 0, got {link.throughput_mbit_s!r}")
    if problems:
        raise SpecError(name, problems)
    profiled_ms = tuple(w.forward_ms + w.backward_ms for w in workloads)
    curves = [{int(b): float(t) for b, t in r.get("batch_ms", {}).items()} for r in ranks]
    workload, compute_ms = ref, profiled_ms
    if all(ref.batch_size in c for c in curves):  # the level of the curves (module docstring)
        compute_ms = tuple(c[ref.batch_size] for c in curves)
        workload = ref.scaled(profiled_ms[0] / compute_ms[0])
    samples = tuple(
        ProbeSample(**{**s, "seconds": tuple(s["seconds"]), "cpu_seconds": tuple(s.get("cpu_seconds", ()))})
        for s in ranks[0]["samples"]
    )
    fit = fit_alpha_beta(samples, "all_reduce")
    nodes = []
    cpu = fit_cpu(samples, "all_reduce")
    speeds = [compute_ms[0] / ms for ms in compute_ms]
    for r, (speed, overlap, link) in enumerate(
        zip(speeds, overlap_fields(ranks, name, cpu, speeds), links, strict=True)
    ):
        device: dict[str, Any] = {"name": f"cpu-w{r}", "speed": speed, "memory_gib": memory_gib, **overlap}
        if len(curves[r]) >= 2:
            device["model_batch_ms"] = {ref.model: curves[r]}
        nic = {"bandwidth_gbps": link.throughput_mbit_s / 1e3, "latency_us": fit.alpha_s * 1e6}
        nodes.append({"name": f"w{r}", "count": 1, "device": device, "nic": nic})
    description = (
        f"Measured on the testbed: per-rank speed from each rank's {'profile' if workload is ref else 'batch curve'} "
        f"under its CPU quota (rank 0 = 1), "
        f"NIC = the worker's TCP rate to the bridge, latency = gloo all-reduce step alpha {fit.alpha_s * 1e6:.1f} us"
    )
    cluster = Cluster.from_dict({"name": name, "description": description, "nodes": nodes}, source=name)
    return MeasuredSpec(
        workload=workload,
        cluster=cluster,
        rank_compute_ms=compute_ms,
        update_ms=float(ranks[0]["update_ms"]),
        alpha_s=fit.alpha_s,
        allreduce_mbit_s=8.0 / fit.beta_s_per_byte / 1e6,
        cpu=cpu,
    )


def overlap_fields(
    ranks: Sequence[Mapping[str, Any]], name: str, cpu: CpuFit | None, speeds: Sequence[float]
) -> list[dict[str, float]]:
    """Per rank, the device fields its calibration's overlap rounds give (``overlap_ms_per_mb``,
    ``overlap_ms_per_task``, ``overlap_comm_rate``; each only where measured, none without rounds)."""
    rounds = [_read(rank, "overlap", OverlapTimes, name) for rank in ranks]
    costs = [_overlap_costs(rank, t, name, cpu, speed) for rank, t, speed in zip(ranks, rounds, speeds, strict=True)]
    rates = _overlap_comm_rates(rounds)
    out = []
    for (per_mb, per_task), rate in zip(costs, rates, strict=True):
        fields = {"overlap_ms_per_mb": per_mb, "overlap_ms_per_task": per_task, "overlap_comm_rate": rate}
        out.append({key: value for key, value in fields.items() if value is not None})
    return out


def _read(rank: Mapping[str, Any], key: str, kind: type[_Rounds], name: str) -> _Rounds | None:
    """The rank's saved rounds under ``key`` (None where it has none); a SpecError naming the rank and key."""
    if key not in rank:
        return None
    # a message names the kind of rounds (overlap, task_overlap); the other layouts add their key
    where = "" if key in ("overlap", "task_overlap") else f" ({key})"
    try:
        return kind.from_dict(rank[key], f"{name}: rank {rank.get('rank', '?')}{where}")
    except ValueError as exc:
        raise SpecError(name, [str(exc)]) from exc


def _overlap_costs(
    rank: Mapping[str, Any], rounds: OverlapTimes | None, name: str, cpu: CpuFit | None, speed: float
) -> tuple[float | None, float | None]:
    """The rank's overlap costs per MiB and per task: both fitted to the runtime's bucket layouts where it timed
    two or more (:func:`commsched.bench.task_overlap.fit_costs`); else the gloo all-reduce's cost per MiB, its
    per-task CPU work (as the simulator charges it) taken off, and the runtime's small buckets' growth less
    their bytes at that cost, per task."""
    timed = [t for t in (_read(rank, key, TaskOverlap, name) for key in layouts(1.0)) if t is not None]
    if len(timed) >= 2:
        per_task, per_mb = fit_costs(*timed)
        return per_mb, per_task
    if rounds is None:
        return None, None
    per_mb = rounds.ms_per_mb(cpu.per_op_ms / speed if cpu is not None else 0.0)
    return per_mb, (timed[0].ms_per_task(per_mb) if timed else None)


def _overlap_comm_rates(rounds: Sequence[OverlapTimes | None]) -> list[float | None]:
    """Per rank, the share of its rate the all-reduce kept while the rank computed beside it, or None.

    The all-reduce spans every rank, so its slowdown is the slowest's doing:
    it is taken against the longest backward (the ranks' medians) and given to
    the ranks whose backward lasted at least half as long; a rank that stopped
    computing well before the others gets none (the rounds cannot tell its
    share).
    """
    if not rounds or any(t is None for t in rounds):
        return [None] * len(rounds)
    computing = [statistics.median(t.backward_beside_ms) for t in rounds if t is not None]
    longest = max(computing)
    if not longest > 0:
        return [None] * len(rounds)
    return [
        t.comm_rate(longest) if t is not None and c >= longest / 2 else None
        for t, c in zip(rounds, computing, strict=True)
    ]


def runnable_policies() -> list[str]:
    """The lossless policies whose every transport the runtime has (a plan of another could not run here)."""
    return [p for p in sorted(LOSSLESS) if set(policy_class(p).transports(make_knobs(p, {}))) <= set(TRANSPORTS)]


def plan_command(spec: MeasuredSpec, workload_path: str, cluster_path: str, global_batch: int, budget_s: float) -> str:
    """The ``commsched plan`` command that makes the plan ``--plan auto`` makes (same search, same inputs)."""
    sims = " ".join(f"--sim {p}" for p in spec.sim_pairs())
    return (
        f"commsched plan -m {workload_path} -c {cluster_path} --global-batch {global_batch} "
        f"--budget-s {budget_s:g} --policies {','.join(runnable_policies())} {sims} -o plan.json"
    )
