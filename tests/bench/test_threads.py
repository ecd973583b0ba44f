"""commsched.bench.threads: each thread's CPU time, summed by name, per iteration."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from commsched._threads import daemon_thread
from commsched.bench.threads import (
    all_per_iteration,
    per_iteration,
    per_iteration_ms,
    read_all,
    thread_cpu_s,
    thread_sleeps,
    thread_wait_s,
)


def test_per_iteration_sums_threads_of_one_name_and_divides_by_the_iterations() -> None:
    before = {"python:1": 1.0, "gloo_tcp_loop:7": 0.5, "gloo_tcp_loop:8": 0.25}
    after = {"python:1": 1.2, "gloo_tcp_loop:7": 0.6, "gloo_tcp_loop:8": 0.35, "pt_gloo_runloop:9": 0.04}
    got = per_iteration_ms(before, after, 4)
    assert got == pytest.approx({"python": 50.0, "gloo_tcp_loop": 50.0, "pt_gloo_runloop": 10.0})


def test_no_iterations_is_refused_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="iterations: must be >= 1, got 0"):
        per_iteration_ms({}, {}, 0)


def test_the_calling_threads_spin_shows_in_the_readings() -> None:
    before = thread_cpu_s()
    start = time.thread_time()
    while time.thread_time() - start < 0.3:  # 300 ms of this thread's CPU, however loaded the machine is
        pass
    after = thread_cpu_s()
    assert after and all(key.rsplit(":", 1)[1].isdigit() for key in after), after  # name:tid
    assert sum(per_iteration_ms(before, after, 1).values()) >= 280.0  # 300 ms spun, read in ticks of 10 ms


def test_a_spin_is_user_time_and_the_parts_add_up_to_both() -> None:
    before = {part: thread_cpu_s(part) for part in ("user", "system", "both")}
    start = time.thread_time()
    while time.thread_time() - start < 0.3:  # interpreter work (user time) between reads of the clock (system)
        sum(range(100_000))
    spent = {part: sum(per_iteration_ms(before[part], thread_cpu_s(part), 1).values()) for part in before}
    assert spent["user"] >= 250.0, spent
    assert spent["user"] + spent["system"] == pytest.approx(spent["both"], abs=30.0), spent  # a few ticks apart


def test_an_unknown_part_of_cpu_time_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="part: must be both, user or system, got 'kernel'"):
        thread_cpu_s("kernel")


def test_all_readings_come_per_iteration_under_the_keys_a_bench_report_keeps() -> None:
    before = read_all()
    start = time.thread_time()
    while time.thread_time() - start < 0.1:  # 100 ms of this thread's CPU
        pass
    got = all_per_iteration(before, 2)
    assert set(got) <= {"thread_cpu_ms", "thread_wait_ms", "thread_sleeps"} and "thread_cpu_ms" in got, got
    assert sum(got["thread_cpu_ms"].values()) >= 40.0, got  # 100 ms over 2 iterations, in ticks of 10 ms


def test_a_thread_that_sleeps_shows_each_sleep_and_one_that_spins_hardly_any() -> None:
    slept, read = threading.Event(), threading.Event()

    def sleep_fifty_times() -> None:
        for _ in range(50):
            time.sleep(0.002)  # blocks: one voluntary switch each
        slept.set()
        read.wait(30)

    sleeper = daemon_thread(sleep_fifty_times, "commsched-sleeper")
    before = thread_sleeps()
    sleeper.start()
    start = time.thread_time()
    while time.thread_time() - start < 0.05:  # this thread spins meanwhile, never blocking
        pass
    assert slept.wait(30)
    after = thread_sleeps()
    read.set()
    sleeper.join()
    got = per_iteration(before, after, 1)
    assert got["cs-sleeper"] >= 50, got
    me = next(key for key in after if key.endswith(f":{threading.get_native_id()}"))
    assert after[me] - before[me] < 25, (before[me], after[me])  # the spinner: a few switches (its /proc reads)


_CONTENDED = """
import os, subprocess, sys, time
from commsched.bench.threads import per_iteration_ms, thread_wait_s
cpu = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})
rival = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {%d})\\nwhile True: pass" % cpu])
try:
    time.sleep(0.2)  # the rival spinning on the same core
    before = thread_wait_s()
    start = time.thread_time()
    while time.thread_time() - start < 0.3:
        pass
    print(sum(per_iteration_ms(before, thread_wait_s(), 1).values()))
finally:
    rival.kill()
"""


def test_a_thread_sharing_its_core_with_a_spinning_process_shows_its_wait() -> None:
    if not Path("/proc/self/schedstat").exists():
        pytest.skip("this kernel keeps no scheduler statistics (/proc/self/schedstat)")
    quiet = thread_wait_s()
    assert quiet and all(v >= 0 for v in quiet.values()), quiet
    done = subprocess.run([sys.executable, "-c", _CONTENDED], capture_output=True, text=True, timeout=60, check=True)
    # 300 ms of CPU on a core shared with a spinner: the scheduler keeps it waiting about as long
    assert float(done.stdout) >= 100.0, done.stdout


def test_a_pinned_worker_and_the_threads_it_starts_run_on_its_core_alone() -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip(f"needs 2 cores to tell rank 1's apart, this process may use {cores}")
    code = (
        "import os, threading\n"
        "from commsched.bench.worker import pin_to_core\n"
        "core = pin_to_core(1)\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))\n"
        "t.start(); t.join()\n"
        "print(core, sorted(os.sched_getaffinity(0)), seen[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split(maxsplit=1) == [str(cores[1]), f"[{cores[1]}] [{cores[1]}]\n"], done.stdout
