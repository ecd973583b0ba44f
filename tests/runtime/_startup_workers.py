"""Rank functions for plan files, start-up agreement, early refusals, hung peers and launch order.

Each writes ``rank{r}.json`` into ``out``; spawned by the tests with :func:`conftest.spawn`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from commsched.runtime.api import parallelize

import _models as M
from _workers import SMALL_KNOBS, _diff, init


def _write(out: str, rank: int, result: dict[str, Any]) -> None:
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def _outcome(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _train_always_branch(wrapped: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, steps: int) -> None:
    M.train(wrapped, opt, rank, steps, branch=lambda step: True)


def plan_file(rank: int, world: int, port: int, out: str, plan_path: str, steps: int) -> None:
    """A plan file made by the simulator, run by parallelize, trains like torch_ddp and like the policy by name."""
    try:
        init(rank, world, port)
        base = M.fresh()
        results: dict[str, Any] = {}
        trained = {}
        for name, kwargs in (
            ("torch_ddp", {"policy": "torch_ddp"}),
            ("by_name", {"policy": "dear", **SMALL_KNOBS["dear"]}),
            ("plan", {"plan": plan_path}),
        ):
            model = M.clone(base)
            opt = M.make_optimizer("adamw", model)
            wrapped, opt = parallelize(model, opt, **kwargs)
            _train_always_branch(wrapped, opt, rank, steps)
            trained[name] = M.snapshot(wrapped)
            if name == "plan":
                results["plan_in_use"] = wrapped.plan.policy  # type: ignore[union-attr]
            if hasattr(wrapped, "close"):
                wrapped.close()
        results["plan_vs_ddp"] = _diff(trained["plan"], trained["torch_ddp"])
        results["by_name_vs_ddp"] = _diff(trained["by_name"], trained["torch_ddp"])
        results["moved"] = _diff(trained["plan"], M.snapshot(base))
        # A plan made for another world size is refused at parallelize, before anything runs.
        from commsched.schedule import CommPlan

        plan = CommPlan.load(plan_path)
        wrong = CommPlan.from_dict({**plan.to_dict(), "network": {**plan.network.to_dict(), "world_size": world + 1}})
        model = M.clone(base)
        results["wrong_world"] = _outcome(lambda: parallelize(model, M.make_optimizer("sgd", model), plan=wrong))
        # A model that runs in another order than the plan says is refused in its first iteration.
        model = M.clone(base)
        opt = M.make_optimizer("sgd", model)
        reordered = _reorder(plan)

        def run_reordered() -> None:
            wrapped, o = parallelize(model, opt, plan=reordered, timeout_s=30)
            _train_always_branch(wrapped, o, rank, 1)

        results["wrong_order"] = _outcome(run_reordered)
        dist.barrier()
    except Exception:
        results = {"error": traceback.format_exc()}
    _write(out, rank, results)
    os._exit(0)


def _reorder(plan: Any) -> Any:
    """The plan with gradient-ready times in forward order (a wrong profile: backward runs the other way)."""
    from commsched.schedule import CommPlan

    data = plan.to_dict()
    layers = data["workload"]["layers"]
    assert any(layer.get("grad_ready_ms") for layer in layers), "the profile has gradient-ready times"
    for k, layer in enumerate(layers):
        if layer.get("grad_ready_ms"):
            # the first layer's gradients claim to be ready first, which no backward does
            layer["grad_ready_ms"] = [10.0 * k] * len(layer["grad_ready_ms"])
    return CommPlan.from_dict(data)


def disagree(rank: int, world: int, port: int, out: str, what: str) -> None:
    """The last rank differs in ``what``; every rank must end with one error naming the difference."""
    init(rank, world, port)
    odd = rank == world - 1
    policy, knobs = "dear", dict(SMALL_KNOBS["dear"])
    model = M.fresh()
    if what == "policy" and odd:
        policy, knobs = "ddp", dict(SMALL_KNOBS["ddp"])
    if what == "knob" and odd:
        knobs["threshold_mb"] = 0.003
    if what == "shape" and odd:
        model = M.TrickyNet(dim=17)
    if what == "batch_sizes":
        knobs["batch_sizes"] = [2] * world if odd else [1] * world
    opt = M.make_optimizer("sgd", model)
    start = time.monotonic()
    outcome = _outcome(lambda: parallelize(model, opt, policy=policy, timeout_s=30, **knobs))
    _write(out, rank, {"outcome": outcome, "seconds": time.monotonic() - start})
    os._exit(0)


def refuse_early(rank: int, world: int, port: int, out: str) -> None:
    """Rank 0 alone calls parallelize with bad arguments: each must raise at once, not wait for a peer."""
    init(rank, world, port)
    results: dict[str, Any] = {}
    if rank == 0:
        model = M.fresh()
        frozen = M.fresh()
        for p in frozen.parameters():
            p.requires_grad_(False)
        sgd = M.make_optimizer("sgd", model)
        cases = {
            "unknown_knob": lambda: parallelize(model, sgd, policy="dear", colour=1),
            "wrong_type": lambda: parallelize(model, sgd, policy="ddp", rebuilt="False"),
            "out_of_range": lambda: parallelize(model, sgd, policy="dear", threshold_mb=-1),
            "unknown_policy": lambda: parallelize(model, sgd, policy="fastest"),
            "grad_scaler": lambda: parallelize(model, sgd, policy="dear", grad_scaler=torch.amp.GradScaler("cpu")),
            "lbfgs": lambda: parallelize(model, torch.optim.LBFGS(model.parameters()), policy="ddp"),
            "frozen": lambda: parallelize(frozen, torch.optim.SGD([torch.zeros(1, requires_grad=True)]), "ddp"),
            "warmup": lambda: parallelize(model, sgd, policy="ddp", warmup_iters=0),
            "torch_ddp_knobs": lambda: parallelize(model, sgd, policy="torch_ddp", bucket_cap_mb=4),
        }
        for name, case in cases.items():
            start = time.monotonic()
            results[name] = {"outcome": _outcome(case), "seconds": time.monotonic() - start}
    dist.barrier()
    _write(out, rank, results)
    os._exit(0)


def stopped_peer(rank: int, world: int, port: int, out: str, policy: str, where: str, timeout_s: float) -> None:
    """The last rank stops (SIGSTOP) at step 3, before its forward or its backward; the others must end."""
    init(rank, world, port, timeout_s=600)  # the user's default group keeps its long timeout
    model = M.fresh()
    opt = M.make_optimizer("sgd", model)
    wrapped, opt = parallelize(model, opt, policy=policy, timeout_s=timeout_s, **SMALL_KNOBS[policy])
    loss_fn = torch.nn.CrossEntropyLoss()
    start = None
    outcome = "finished"
    try:
        for step in range(8):
            if step == 3:
                start = time.monotonic()
                if rank == world - 1 and where == "forward":
                    _write(out, rank, {"stopped": True})
                    os.kill(os.getpid(), signal.SIGSTOP)
            x, y = M.batch(rank, step)
            loss = loss_fn(wrapped(x), y)
            if step == 3 and rank == world - 1 and where == "backward":
                _write(out, rank, {"stopped": True})
                os.kill(os.getpid(), signal.SIGSTOP)
            loss.backward()
            opt.step()
            opt.zero_grad()
        wrapped(x)
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - start if start is not None else -1.0
    _write(out, rank, {"outcome": outcome, "seconds": seconds})
    os._exit(0)


def launch_orders(
    rank: int, world: int, port: int, out: str, cases: list[tuple[str, dict[str, Any]]], steps: int
) -> None:
    """For each (policy, knobs) in turn, in these processes: train with a trace; write, by policy, the trace's
    task order and the plan the runtime made after warm-up."""
    results: dict[str, Any] = {}
    try:
        init(rank, world, port)
        for policy, knobs in cases:
            model = M.fresh()
            opt = M.make_optimizer("sgd", model)
            wrapped, opt = parallelize(model, opt, policy=policy, trace=True, **knobs)
            _train_always_branch(wrapped, opt, rank, steps)
            wrapped.flush()  # type: ignore[operator]
            trace = wrapped.trace  # type: ignore[union-attr]
            comm = [e for e in trace.events if e.kind in ("all_reduce", "reduce_scatter", "all_gather")]
            comm.sort(key=lambda e: e.start_s)
            results[policy] = {
                "plan": wrapped.plan.to_json(indent=None),  # type: ignore[union-attr]
                "order": [[e.iteration, e.task] for e in comm],
            }
            wrapped.close()  # type: ignore[operator]
    except Exception:
        results["error"] = traceback.format_exc()
    _write(out, rank, results)
    os._exit(0)


def switch_plans(rank: int, world: int, port: int, out: str, steps: int) -> None:
    """dear, then a ddp plan mid-run, then dear again: deferred and step updates follow each other."""
    try:
        from commsched.schedule import build_plan

        init(rank, world, port)
        base = M.fresh()
        model = M.clone(base)
        opt = M.make_optimizer("adamw", model)
        ref_model = M.clone(base)
        ref, ref_opt = parallelize(ref_model, M.make_optimizer("adamw", ref_model), policy="torch_ddp")
        M.train(ref, ref_opt, rank, 3 * steps)
        wrapped, opt = parallelize(model, opt, policy="dear", **SMALL_KNOBS["dear"])
        M.train(wrapped, opt, rank, steps)
        dear_plan = wrapped.plan  # type: ignore[union-attr]
        ddp_plan = build_plan("ddp", dear_plan.workload, dear_plan.network, **SMALL_KNOBS["ddp"])
        wrapped.use_plan(ddp_plan)  # type: ignore[operator]
        M.train(wrapped, opt, rank, steps, start=steps)
        used = [dear_plan.update, wrapped.plan.update]  # type: ignore[union-attr]
        wrapped.use_plan(dear_plan)  # type: ignore[operator]
        M.train(wrapped, opt, rank, steps, start=2 * steps)
        used.append(wrapped.plan.update)  # type: ignore[union-attr]
        result = {
            "diff": _diff(M.snapshot(wrapped), M.snapshot(ref)),
            "moved": _diff(M.snapshot(wrapped), M.snapshot(base)),
            "updates": used,
        }
        wrapped.close()  # type: ignore[operator]
    except Exception:
        result = {"error": traceback.format_exc()}
    _write(out, rank, result)
    os._exit(0)


def auto_policy(rank: int, world: int, port: int, out: str, steps: int) -> None:
    """policy='auto' with re-planning forced often: still DDP's parameters; reports what it chose."""
    try:
        from commsched.runtime.replan import DriftPolicy

        init(rank, world, port)
        base = M.fresh()
        ref_model = M.clone(base)
        ref, ref_opt = parallelize(ref_model, M.make_optimizer("sgd", ref_model), policy="torch_ddp")
        M.train(ref, ref_opt, rank, steps)
        model = M.clone(base)
        drift = DriftPolicy(every=2, threshold=1e-9, patience=1)  # any change re-plans, every 4 iterations
        wrapped, opt = parallelize(
            model, M.make_optimizer("sgd", model), policy="auto", auto_budget_s=30.0, replan=drift
        )
        M.train(wrapped, opt, rank, 3)
        first = wrapped.plan  # type: ignore[union-attr]
        M.train(wrapped, opt, rank, steps - 3, start=3)
        result = {
            "diff": _diff(M.snapshot(wrapped), M.snapshot(ref)),
            "moved": _diff(M.snapshot(wrapped), M.snapshot(base)),
            "first_plan": first.to_json(indent=None),
            "replans": wrapped.engine.replans,  # type: ignore[union-attr]
        }
        wrapped.close()  # type: ignore[operator]
    except Exception:
        result = {"error": traceback.format_exc()}
    _write(out, rank, result)
    os._exit(0)


def checkpoint_with_plan(rank: int, world: int, port: int, out: str, steps: int) -> None:
    """A checkpoint keeps the plan in use; restoring it runs that plan (no new search) and continues exactly."""
    try:
        from commsched.schedule import CommPlan

        init(rank, world, port)
        base = M.fresh()
        whole_model = M.clone(base)
        opt = M.make_optimizer("adamw", whole_model)
        whole, opt = parallelize(whole_model, opt, policy="dear", **SMALL_KNOBS["dear"])
        M.train(whole, opt, rank, 2 * steps)
        uninterrupted = M.snapshot(whole)
        whole.close()  # type: ignore[operator]

        first_model = M.clone(base)
        opt = M.make_optimizer("adamw", first_model)
        first, opt = parallelize(first_model, opt, policy="dear", **SMALL_KNOBS["dear"])
        M.train(first, opt, rank, steps)
        checkpoint = {
            "model": first.state_dict(),
            "optimizer": opt.state_dict(),
            "plan": first.plan.to_dict(),  # type: ignore[union-attr]
        }
        first.close()  # type: ignore[operator]

        second_model = M.clone(base)
        opt = M.make_optimizer("adamw", second_model)
        plan = CommPlan.from_dict(checkpoint["plan"], "checkpoint")
        second, opt = parallelize(second_model, opt, plan=plan)
        second.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
        M.train(second, opt, rank, steps, start=steps)
        result = {
            "diff": _diff(M.snapshot(second), uninterrupted),
            "same_plan": second.plan.to_dict() == checkpoint["plan"],  # type: ignore[union-attr]
        }
        second.close()  # type: ignore[operator]
    except Exception:
        result = {"error": traceback.format_exc()}
    _write(out, rank, result)
    os._exit(0)


def _auto_against_ddp(rank: int, world: int, port: int, out: str, steps: int, optimizer: str) -> None:
    """Train torch_ddp, then auto (as patched by the caller) from the same start; write the difference,
    the plan after every step and the number of switches."""
    try:
        init(rank, world, port)
        base = M.fresh()
        ref_model = M.clone(base)
        ref, ref_opt = parallelize(ref_model, M.make_optimizer(optimizer, ref_model), policy="torch_ddp")
        M.train(ref, ref_opt, rank, steps)
        model = M.clone(base)
        opt = M.make_optimizer(optimizer, model)
        wrapped, opt = parallelize(model, opt, policy="auto", auto_budget_s=30.0)
        policies, knobs = [], []
        for step in range(steps):
            M.train(wrapped, opt, rank, 1, start=step)
            policies.append(wrapped.plan.policy)  # type: ignore[union-attr]
            knobs.append(wrapped.plan.knobs.to_dict())  # type: ignore[union-attr]
        result = {
            "diff": _diff(M.snapshot(wrapped), M.snapshot(ref)),
            "policies": policies,
            "knobs": knobs,
            "replans": wrapped.engine.replans,  # type: ignore[union-attr]
        }
        wrapped.close()  # type: ignore[operator]
    except Exception:
        result = {"error": traceback.format_exc()}
    _write(out, rank, result)
    os._exit(0)


def _forced_medians(*first: float, ties: int = 0, reference: int = 0) -> None:
    """Trials measure ``first`` (seconds, in order), every later one 1 s; at most ``ties`` near-ties are
    measured, and every candidate is one (none: the choice and the runner-up only); ``reference``: whether
    the reference plan (DDP's schedule at its defaults) is measured too."""
    import commsched.runtime.replan as replan
    import commsched.runtime.switching as switching

    switching.TIE_TRIALS = ties
    switching.REFERENCE_TRIALS = reference
    switching.TIE_MARGIN = 100.0
    medians = iter(first)
    replan.Replanner.trial_mean = lambda self, a, b: next(medians, 1.0)  # type: ignore[method-assign]


def auto_trial(rank: int, world: int, port: int, out: str, steps: int) -> None:
    """Both trials seem slower than the warm-up (margin < -1): auto measures the warm-up's plan too; measured
    fastest (twice: it runs on, measured again), it is kept; still DDP's result."""
    import commsched.runtime.replan as replan

    replan.TRIAL_MARGIN = -2.0  # every plan measures "slower than the warm-up"
    _forced_medians(1.0, 1.0, 0.001, 0.001)
    _auto_against_ddp(rank, world, port, out, steps, "sgd")


def auto_trial_warmup_slower(rank: int, world: int, port: int, out: str, steps: int) -> None:
    """Both trials seem slower than the warm-up, but the warm-up's plan measured like them is slower still:
    auto goes back to the faster trial, the runner-up, measures it again (as fast) and keeps it; still DDP's
    result."""
    import commsched.runtime.replan as replan

    replan.TRIAL_MARGIN = -2.0
    _forced_medians(0.5, 0.2, 0.9, 0.2)
    _auto_against_ddp(rank, world, port, out, steps, "adam")


def auto_trials_keep_first(rank: int, world: int, port: int, out: str, steps: int) -> None:
    """The first trial measures faster than the runner-up: auto measures both, then goes back to the first,
    measures it again (as fast) and keeps it; still DDP's result."""
    import commsched.runtime.replan as replan

    replan.TRIAL_MARGIN = 100.0  # no trial loses to the warm-up
    _forced_medians(0.001, 1.0, 0.001)  # the first trial, the runner-up, the first again; every later one: 1 s
    _auto_against_ddp(rank, world, port, out, steps, "adam")


def auto_trials_near_ties(rank: int, world: int, port: int, out: str, steps: int) -> None:
    """Every candidate a near-tie: auto measures its choice, the runner-up and two near-ties, and keeps the
    last, measured fastest (twice: it runs on, measured again); still DDP's result. The warm-up's policy is
    left out of the ranking: measured as a near-tie, it would end the trials early (the warm-up's plan is the
    last a run measures)."""
    import commsched.runtime.replan as replan
    import commsched.runtime.switching as switching

    replan.TRIAL_MARGIN = 100.0  # no trial loses to the warm-up
    search = switching.AutoPlanner._search
    switching.AutoPlanner._search = lambda self, w, n: [c for c in search(self, w, n) if c[0] != "no_overlap"]  # type: ignore[method-assign]
    _forced_medians(1.0, 1.0, 1.0, 0.001, 0.001, ties=2)
    _auto_against_ddp(rank, world, port, out, steps, "adam")


def auto_trials_reference(rank: int, world: int, port: int, out: str, steps: int, outcome: str) -> None:
    """The search ranks ``ps`` first and Horovod second: auto measures both, then the reference (``ddp`` at its
    defaults), which measures 2 % slower than ``ps``, within the margin (kept: ``"within"``), or 10 %: then
    ``ps`` is measured again and kept where it is as fast again (``"beaten"``), the reference where it is now
    slower than the reference (``"overturned"``); still DDP's result."""
    import commsched.runtime.replan as replan
    import commsched.runtime.switching as switching

    replan.TRIAL_MARGIN = 100.0  # no trial loses to the warm-up
    ranking = [("ps", {}, 10.0), ("horovod", {}, 11.0)]
    switching.AutoPlanner._search = lambda self, w, n: ranking  # type: ignore[method-assign]
    second = {"within": (0.51,), "beaten": (0.55, 0.5), "overturned": (0.55, 0.6)}[outcome]
    _forced_medians(0.5, 1.0, *second, reference=1)
    _auto_against_ddp(rank, world, port, out, steps, "adam")


def broadcast_mixed(rank: int, world: int, port: int, out: str) -> None:
    """broadcast_tensors over float, double, long and a non-contiguous tensor, from rank 1: every rank ends
    with rank 1's values, in place (the same tensor objects), shapes and strides kept."""
    from commsched.runtime.startup import broadcast_tensors

    try:
        init(rank, world, port)
        base = 10.0 * (rank + 1)
        floats = torch.arange(6, dtype=torch.float32).reshape(2, 3) + base
        doubles = torch.full((4,), base, dtype=torch.float64)
        counts = torch.tensor([int(base)], dtype=torch.long)
        strided = (torch.arange(6, dtype=torch.float32).reshape(3, 2) + base).t()  # not contiguous
        objects = [floats, doubles, counts, strided]
        before = [(t.data_ptr(), t.stride()) for t in objects]
        broadcast_tensors(objects, 1, dist.group.WORLD, "test")
        _write(
            out,
            rank,
            {
                "values": [t.tolist() for t in objects],
                "same_objects": before == [(t.data_ptr(), t.stride()) for t in objects],
            },
        )
    except Exception:
        _write(out, rank, {"error": traceback.format_exc()})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _live() -> tuple[int, int]:
    """This process's threads and registered process groups."""
    return len(os.listdir("/proc/self/task")), len(dist.distributed_c10d._world.pg_map)


def _event_loops() -> int:
    """gloo's event-loop threads in this process: one per live gloo group (a thread that ends while they are
    read is not one)."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            names.append((task / "comm").read_text().strip())
    return names.count("gloo_tcp_loop")


def repeated_runs(rank: int, world: int, port: int, out: str, policies: list[str], hashed_group: bool) -> None:
    """One policy after another in this process, each closed: what is live after each run, and each run's
    distance from DDP; the gloo event loops while each run trains. ``hashed_group``: a locally synchronised
    group lives first (groups are then kept)."""
    try:
        init(rank, world, port)
        if hashed_group:
            kept = dist.new_group(list(range(world)), backend="gloo", use_local_synchronization=True)
            dist.barrier(group=kept)
        base = M.fresh()
        ref_model = M.clone(base)
        ref, ref_opt = parallelize(ref_model, M.make_optimizer("adamw", ref_model), policy="torch_ddp")
        M.train(ref, ref_opt, rank, 6)
        before = _live()
        after, diffs, loops, here = [], [], [], []
        for policy in policies:
            model = M.clone(base)
            idle = _event_loops()
            wrapped, opt = parallelize(model, M.make_optimizer("adamw", model), policy=policy, **SMALL_KNOBS[policy])
            M.train(wrapped, opt, rank, 6)
            loops.append(_event_loops() - idle)
            diffs.append(_diff(M.snapshot(wrapped), M.snapshot(ref)))
            agent = wrapped.engine.agent  # type: ignore[union-attr]
            kept = agent.kept
            M.train(wrapped, opt, rank, 2)  # past the warm-up: what the training thread keeps of the plan's tasks
            here.append(agent.kept - kept)
            wrapped.close()  # type: ignore[operator]
            del wrapped, opt, model
            gc.collect()
            after.append(_live())
        result = {"before": before, "after": after, "diffs": diffs, "loops": loops, "here": here}
    except Exception:
        result = {"error": traceback.format_exc()}
    _write(out, rank, result)
