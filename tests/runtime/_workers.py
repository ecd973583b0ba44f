"""Functions run inside spawned gloo ranks by the runtime tests. Results go back through files."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import commsched
from commsched.runtime.api import parallelize

import _models as M

# Policies that must give DDP's parameters: the lossless ones, and dlcp with a zero loss bound (the bound is
# an allowance, not an error source).
# On a GPU (COMMSCHED_TEST_DEVICE=cuda) the transports that send from host memory are refused, not compared.
HOST_MEMORY = ("ps", "dlcp")


def here(*policies: str) -> list[str]:
    """Those of ``policies`` that run on the tests' device (on a GPU, not the host-memory ones)."""
    return [p for p in policies if M.DEVICE.type == "cpu" or p not in HOST_MEMORY]


LOSSLESS = tuple(
    here(
        "ddp", "wfbp", "mgwfbp", "horovod", "bytescheduler", "bytescheduler[open-window]", "prophet", "dear",
        "no_overlap", "ps", "dlcp",
    )
)  # fmt: skip


# Small thresholds so the tiny test model is split into several buckets / groups / partitions.
SMALL_KNOBS: dict[str, dict[str, Any]] = {
    "ddp": {"bucket_cap_mb": 0.002, "first_bucket_mb": 0.0005},
    "horovod": {"fusion_threshold_mb": 0.001, "cycle_time_ms": 0.05},
    "bytescheduler": {"partition_mb": 0.0004, "credit_mb": 0.001},
    "prophet": {"partition_mb": 0.0004, "credit_mb": 0.001},
    "dear": {"threshold_mb": 0.0015},
    "no_overlap": {"bucket_cap_mb": 0.002},
    "ps": {"partition_mb": 0.0004, "credit_mb": 0.001},
    "dlcp": {"partition_mb": 0.0004, "credit_mb": 0.001, "fuse_kb": 0.1, "loss_bound": 0.0},  # biases fused
    "wfbp": {},
    "mgwfbp": {"alpha_ms": 0.0, "bandwidth_gbps": 1000.0},
}


#: Policies run again with other knobs, under names of their own: ByteScheduler with a window that holds every
#: byte of an iteration, where every rank decides for itself (no leader, no completions reported).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "bytescheduler[open-window]": ("bytescheduler", {"partition_mb": 0.0004, "credit_mb": 64.0}),
}


def policy_and_knobs(name: str) -> tuple[str, dict[str, Any]]:
    """The policy a test name runs and its knobs (:data:`SMALL_KNOBS`, :data:`VARIANTS`)."""
    if name in VARIANTS:
        return VARIANTS[name]
    return name, ({} if name == "torch_ddp" else SMALL_KNOBS[name])


def init(rank: int, world: int, port: int, timeout_s: float = 60.0) -> None:
    faulthandler.dump_traceback_later(
        float(os.environ.get("COMMSCHED_TEST_HANG_S", "240")), exit=True
    )  # a hang fails the test with a stack, never blocks CI
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    from datetime import timedelta

    backend = os.environ.get("COMMSCHED_TEST_BACKEND", "gloo")  # nccl: tests/runtime/test_cuda.py
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest difference of any element, relative to the largest magnitude in its tensor (floored at 1e-3)."""
    return max(
        ((a[k].double() - b[k].double()).abs().max() / b[k].double().abs().max().clamp(min=1e-3)).item() for k in a
    )


def _opt_state(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                out[f"{i}.{k}"] = v.detach().clone()
    return out


def run_policy(policy: str, optname: str, rank: int, steps: int, base: torch.nn.Module, **kw: Any) -> Any:
    model = M.clone(base)
    opt = M.make_optimizer(optname, model)
    policy, knobs = policy_and_knobs(policy)
    wrapped, opt = parallelize(model, opt, policy=policy, **knobs, **kw)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    M.train(wrapped, opt, rank, steps, scheduler=sched, evaluate_every=3)
    result = (M.snapshot(wrapped), _opt_state(opt))
    if hasattr(wrapped, "close"):
        wrapped.close()
    return result


def equivalence(rank: int, world: int, port: int, out: str, optimizers: list[str], steps: int) -> None:
    """Every lossless policy vs torch_ddp: parameter/buffer and optimizer-state differences."""
    init(rank, world, port)
    base = M.fresh()
    results: dict[str, Any] = {}
    try:
        for optname in optimizers:
            ref, ref_state = run_policy("torch_ddp", optname, rank, steps, base)
            for policy in LOSSLESS:
                params, state = run_policy(policy, optname, rank, steps, base)
                results[f"{policy}/{optname}"] = {
                    "params": _diff(ref, params),
                    "state": _diff(ref_state, state) if ref_state else 0.0,
                    "moved": _diff({k: v for k, v in M.snapshot(base).items() if v.is_floating_point()}, params),
                }
        # Harness self-check: a run that differs on purpose (other learning rate) must be detected.
        model = M.clone(base)
        opt = M.make_optimizer("sgd", model)
        for g in opt.param_groups:
            g["lr"] *= 1.01
        wrapped, opt = parallelize(model, opt, policy="dear")
        M.train(wrapped, opt, rank, steps)
        ref, _ = run_policy("torch_ddp", "sgd", rank, steps, base)
        results["wrong_lr"] = {"params": _diff(ref, M.snapshot(wrapped))}
        wrapped.close()
    except Exception:
        results["error"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def features(rank: int, world: int, port: int, out: str) -> None:
    """Checkpoint/restore, clipping, gradient accumulation, LBFGS refusal."""
    init(rank, world, port)
    base = M.fresh()
    results: dict[str, Any] = {}
    try:
        # --- checkpoint after 4 steps, restore into a fresh model, 3 more steps == 7 uninterrupted steps
        model = M.clone(base)
        opt = M.make_optimizer("adamw", model)
        wrapped, opt = parallelize(model, opt, policy="torch_ddp")
        M.train(wrapped, opt, rank, 7)
        ref = M.snapshot(wrapped)
        model = M.clone(base)
        opt = M.make_optimizer("adamw", model)
        wrapped, opt = parallelize(model, opt, policy="dear", **SMALL_KNOBS["dear"])
        M.train(wrapped, opt, rank, 4)
        ckpt = {"model": wrapped.state_dict(), "opt": opt.state_dict()}
        wrapped.close()
        model2 = M.fresh(seed=123)  # different initial weights: everything must come from the checkpoint
        model2.load_state_dict({k.removeprefix("module."): v for k, v in ckpt["model"].items()})
        opt2 = M.make_optimizer("adamw", model2)
        opt2.load_state_dict(ckpt["opt"])
        wrapped2, opt2 = parallelize(model2, opt2, policy="dear", **SMALL_KNOBS["dear"])
        M.train(wrapped2, opt2, rank, 3, start=4)
        results["checkpoint"] = _diff(ref, M.snapshot(wrapped2))
        wrapped2.close()

        # --- global-norm clipping, every policy vs clip_grad_norm_ on DDP's averaged gradients
        ref, _ = run_policy("torch_ddp", "sgd", rank, 5, base, max_grad_norm=0.05)
        for policy in here("ddp", "dear", "bytescheduler", "ps"):
            params, _ = run_policy(policy, "sgd", rank, 5, base, max_grad_norm=0.05)
            results[f"clip/{policy}"] = _diff(ref, params)
        unclipped, _ = run_policy("torch_ddp", "sgd", rank, 5, base)
        results["clip/effect"] = _diff(ref, unclipped)

        # --- gradient accumulation with no_sync(): 2 micro-batches per step
        def accumulate(policy: str) -> dict[str, torch.Tensor]:
            model = M.clone(base)
            opt = M.make_optimizer("sgd", model)
            knobs = {} if policy == "torch_ddp" else SMALL_KNOBS[policy]
            wrapped, opt = parallelize(model, opt, policy=policy, **knobs)
            loss_fn = torch.nn.CrossEntropyLoss()
            for step in range(5):
                for micro in range(2):
                    x, y = M.batch(rank, 10 * step + micro)
                    if micro == 0:
                        with wrapped.no_sync():
                            loss_fn(wrapped(x), y).backward()
                    else:
                        loss_fn(wrapped(x), y).backward()
                opt.step()
                opt.zero_grad()
            snap = M.snapshot(wrapped)
            if hasattr(wrapped, "close"):
                wrapped.close()
            return snap

        ref_acc = accumulate("torch_ddp")
        for policy in ("ddp", "dear", "prophet"):
            results[f"accumulate/{policy}"] = _diff(ref_acc, accumulate(policy))

        # --- the measured trace has the simulator's schema and the plan's task names
        model = M.clone(base)
        opt = M.make_optimizer("sgd", model)
        wrapped, opt = parallelize(model, opt, policy="dear", trace=True, **SMALL_KNOBS["dear"])
        M.train(wrapped, opt, rank, 4)
        wrapped.flush()
        trace = wrapped.trace
        plan_names = {t.name for t in wrapped.engine.plan.tasks}
        comm = [e for e in trace.events if e.kind in ("reduce_scatter", "all_gather")]
        results["trace"] = {
            "kinds": sorted({e.kind for e in trace.events}),
            "comm_names_in_plan": bool(comm) and all(e.task in plan_names for e in comm),
            "ordered": all(e.end_s >= e.start_s for e in trace.events),
            "layers": sorted({e.task for e in trace.events if e.kind == "forward"}),
        }
        wrapped.close()

        # --- fp16 GradScaler: works where updates happen at step(), a clear error where they are deferred
        scaled = {}
        for policy in ("torch_ddp", "ddp", "dear"):
            model = M.clone(base)
            opt = M.make_optimizer("sgd", model)
            wrapped, opt = parallelize(model, opt, policy=policy, **SMALL_KNOBS.get(policy, {}))
            scaler = torch.amp.GradScaler(M.DEVICE.type)
            try:
                for step in range(4):
                    x, y = M.batch(rank, step)
                    scaler.scale(torch.nn.functional.cross_entropy(wrapped(x), y)).backward()
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad()
                results[f"scaler/{policy}"] = "ok"
                scaled[policy] = M.snapshot(wrapped)
            except commsched.errors.UnsupportedError as exc:
                results[f"scaler/{policy}"] = str(exc)
            if hasattr(wrapped, "close"):
                wrapped.close()
        results["scaler/ddp_diff"] = _diff(scaled["torch_ddp"], scaled["ddp"])

        # --- bf16 autocast: same result as torch_ddp under the same autocast
        autocast = {}
        for policy in here("torch_ddp", "dear", "bytescheduler", "ps"):
            model = M.clone(base)
            opt = M.make_optimizer("adamw", model)
            wrapped, opt = parallelize(model, opt, policy=policy, **SMALL_KNOBS.get(policy, {}))
            for step in range(5):
                x, y = M.batch(rank, step)
                with torch.autocast(M.DEVICE.type, dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(wrapped(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
            autocast[policy] = M.snapshot(wrapped)
            if hasattr(wrapped, "close"):
                wrapped.close()
        for policy in here("dear", "bytescheduler", "ps"):
            results[f"bf16/{policy}"] = _diff(autocast["torch_ddp"], autocast[policy])

        # --- an optimizer that cannot be split per layer is refused clearly
        model = M.clone(base)
        try:
            parallelize(model, torch.optim.LBFGS(model.parameters()), policy="dear")
            results["lbfgs"] = "accepted"
        except commsched.errors.UnsupportedError as exc:
            results["lbfgs"] = str(exc)
    except Exception:
        results["error"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def crash(rank: int, world: int, port: int, out: str, policy: str) -> None:
    """Rank 1 dies in its 4th backward; the others must fail with a clear error, in bounded time."""
    init(rank, world, port, timeout_s=20)
    model = M.fresh()
    opt = M.make_optimizer("sgd", model)
    wrapped, opt = parallelize(model, opt, policy=policy, timeout_s=20, **SMALL_KNOBS[policy])
    loss_fn = torch.nn.CrossEntropyLoss()
    start = time.monotonic()
    outcome = "finished"
    try:
        for step in range(8):
            x, y = M.batch(rank, step)
            loss = loss_fn(wrapped(x), y)
            if rank == 1 and step == 3:
                os._exit(17)  # a crashed peer: no clean-up, sockets just close
            loss.backward()
            opt.step()
            opt.zero_grad()
        wrapped(x)  # flush the last deferred update
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    Path(out, f"rank{rank}.json").write_text(json.dumps({"outcome": outcome, "seconds": time.monotonic() - start}))
    os._exit(0)


def task_overlap(rank: int, world: int, port: int, out: str, rounds: int) -> None:
    """``commsched.bench.task_overlap.time_task_overlap`` on every rank: its rounds, or the error."""
    from dataclasses import asdict

    from commsched.bench.task_overlap import time_task_overlap
    from commsched.models import synthetic_batch

    init(rank, world, port)
    try:
        seen: list[int] = []
        times = time_task_overlap("cnn", 0, synthetic_batch("cnn", 8, 0, rank, 0), rounds, 60.0, seen.append)
        result: dict[str, Any] = {"rounds": asdict(times), "progress": seen}
    except Exception:
        result = {"error": traceback.format_exc()}
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def decisions_broken(rank: int, world: int, port: int, out: str, cases: list[tuple[str, str]]) -> None:
    """For each case (how, read) in turn, on a channel of its own: rank 0 sends one message, then breaks the
    stream (``how``: "garbage", a frame of too many values, or "close"); each follower reports, by
    ``"how-read"``, the message and the error its next read raised (``read``: a blocking ``receive``, or
    ``poll`` called until it returns something or raises)."""
    import struct
    import time as _time

    from commsched.errors import RuntimeCommError
    from commsched.runtime.decisions import FRAME, MAGIC, MAX_VALUES, DecisionChannel
    from commsched.transport import TransportOptions

    init(rank, world, port)
    results: dict[str, Any] = {}
    for how, read in cases:
        result: dict[str, Any] = {}
        results[f"{how}-{read}"] = result
        try:
            channel = DecisionChannel(None, 20.0, TransportOptions(bind="127.0.0.1"))
            if rank == 0:
                channel.send([7, 8, 9])
                if how == "close":
                    channel.close()
                else:
                    bad = b"\xff" * FRAME.size if how == "garbage" else FRAME.pack(MAGIC, MAX_VALUES + 1)
                    for sock in channel.sockets:
                        sock.sendall(bad + struct.pack("<q", 1))
            elif read == "receive":
                result["got"] = channel.receive()
                try:
                    result["next"] = channel.receive()
                except RuntimeCommError as exc:
                    result["raised"] = str(exc)
            else:
                got: list[list[int]] = []
                deadline = _time.monotonic() + 20.0
                try:
                    while _time.monotonic() < deadline:
                        got += channel.poll()
                        _time.sleep(0.01)
                except RuntimeCommError as exc:
                    result["raised"] = str(exc)
                result["got"] = got[0] if got else None
                if len(got) > 1:
                    result["next"] = got[1:]
            dist.barrier()
            channel.close()
        except Exception:
            result["error"] = traceback.format_exc()
            break
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def decisions_poll(rank: int, world: int, port: int, out: str, count: int) -> None:
    """Rank 0 sends ``count`` messages; the follower then takes them all with non-blocking polls, in order; a
    poll with nothing there returns at once, and one while another thread waits in ``receive`` returns
    nothing (one reader at a time), and that thread gets the next message."""
    import threading as _threading
    import time as _time

    from commsched.runtime.decisions import DecisionChannel
    from commsched.transport import TransportOptions

    init(rank, world, port)
    result: dict[str, Any] = {}
    try:
        channel = DecisionChannel(None, 20.0, TransportOptions(bind="127.0.0.1"))
        if rank == 0:
            for n in range(count):
                channel.send([n, *range(n % 5)])
            dist.barrier()
            dist.barrier()
            channel.send([count])
        else:
            dist.barrier()
            got: list[list[int]] = []
            deadline = _time.monotonic() + 20.0
            while len(got) < count and _time.monotonic() < deadline:
                got += channel.poll()
            result["in_order"] = got == [[n, *range(n % 5)] for n in range(count)]
            t0 = _time.perf_counter()
            result["empty"] = channel.poll()
            result["empty_s"] = _time.perf_counter() - t0
            received: list[Any] = []
            reader = _threading.Thread(target=lambda: received.append(channel.receive()))
            reader.start()
            while not channel._read_lock.locked() and reader.is_alive():
                _time.sleep(0.001)
            result["while_reading"] = channel.poll()
            dist.barrier()
            reader.join(timeout=20.0)
            result["reader_got"] = received
        channel.close()
    except Exception:
        result["error"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def decisions_strangers(rank: int, world: int, port: int, out: str) -> None:
    """While the channel opens, two strangers reach the follower's listener before rank 0 does: one sends
    junk, one stays silent; the follower rejects both and still takes rank 0's connection and orders."""
    import socket as _socket
    import time as _time

    from commsched.runtime import decisions as D
    from commsched.transport import TransportOptions

    init(rank, world, port)
    result: dict[str, Any] = {}
    strangers: list[_socket.socket] = []
    real_share = D.share_addresses

    def share(*args: Any) -> Any:
        key, infos = real_share(*args)
        if rank == 1:  # before this rank accepts anything
            for junk in (b"GET / HTTP/1.0\r\n\r\n" * 8, b""):
                s = _socket.create_connection(tuple(infos[1][:2]))
                if junk:
                    s.sendall(junk)
                strangers.append(s)
        else:
            _time.sleep(1.0)  # rank 0 dials after the strangers are queued
        return key, infos

    D.share_addresses = share  # type: ignore[assignment]
    D.HANDSHAKE_S = 0.5
    try:
        channel = D.DecisionChannel(None, 20.0, TransportOptions(bind="127.0.0.1"))
        if rank == 0:
            channel.send([1, 2, 3])
        else:
            result["got"] = channel.receive()
            result["rejected"] = channel.rejected
        dist.barrier()
        channel.close()
    except Exception:
        result["error"] = traceback.format_exc()
    for s in strangers:
        s.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def decisions(rank: int, world: int, port: int, out: str, count: int) -> None:
    """The leader sends ``count`` messages of growing length; every follower reports what it received, in order,
    and whether its connections took the cluster timers."""
    import socket as _socket

    from commsched.runtime.decisions import DecisionChannel
    from commsched.transport import TransportOptions, tcp_options

    init(rank, world, port)
    result: dict[str, Any] = {}
    try:
        channel = DecisionChannel(None, 20.0, TransportOptions(bind="127.0.0.1"))
        floors = []
        for sock in channel.sockets:  # read while every connection is open
            with contextlib.suppress(OSError):
                floors.append(sock.getsockopt(_socket.IPPROTO_TCP, tcp_options._TCP_RTO_MIN_US))
        result["floors"] = floors
        dist.barrier()
        if rank == 0:
            for n in range(count):
                channel.send([n, *range(n % 7)])
        else:
            result["got"] = [channel.receive() for _ in range(count)]
        channel.close()
    except Exception:
        result["error"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def decisions_backlog(rank: int, world: int, port: int, out: str, count: int) -> None:
    """The leader offers ``count`` large messages while its follower reads nothing (it waits at a barrier the
    leader reaches only after its last offer): no offer blocks, what the socket did not take is kept; a thread
    drains it while the follower reads every message, in order."""
    import threading as _threading

    from commsched.runtime.decisions import DecisionChannel
    from commsched.transport import TransportOptions

    init(rank, world, port)
    result: dict[str, Any] = {}
    try:
        channel = DecisionChannel(None, 20.0, TransportOptions(bind="127.0.0.1"))
        if rank == 0:
            kept = [channel.offer([n, *range(4096)]) for n in range(count)]
            result["kept"] = [kept.index(True) if True in kept else -1, kept[-1]]
            drainer = _threading.Thread(target=channel.drain)
            drainer.start()
            dist.barrier()
            drainer.join(timeout=20.0)
            result["drained"] = not drainer.is_alive()
            channel.offer([count])  # nothing kept any more: written at once
            channel.drain()
        else:
            dist.barrier()
            got = [channel.receive() for _ in range(count + 1)]
            result["in_order"] = all(m == [n, *range(4096)] for n, m in enumerate(got[:count]))
            result["last"] = got[count]
        channel.close()
    except Exception:
        result["error"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
