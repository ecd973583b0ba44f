"""The DLCP link's own counters (``LinkStats``) over a ``commsched bench`` run, per rank and per step.

    sudo .venv/bin/python benchmarks/dlcp_link_counters.py --model cnn --workers 2 --bandwidth 300mbit --mtu 9000 \\
        --policies dlcp --iters 100 --warmup 5 --repeats 1 --no-ddp-grid --no-references --no-probe --out /tmp/counters

Every argument goes to ``commsched bench`` unchanged (one ``dlcp`` policy,
one repeat: the counters of one link per rank). The bench workers import a
``sitecustomize`` from a temporary directory put first on ``PYTHONPATH``
(the bench passes the environment on to its workers); it wraps
``DlcpLink.__init__`` so that a daemon thread writes the link's counters to
that directory every 0.5 s, and ``DlcpLink.close`` to write them once more
as the link ends. What the last write held is printed per rank,
in total and per step (divided by ``--warmup`` + ``--iters``: the link also
carried the runtime's start-up, so per-step figures are upper bounds), then
each rank's rate control toward each peer (``DlcpLink.rate_counters``: cuts,
feedback timeouts, losses, the rate and round trips as the link ended).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HOOK = r"""
import dataclasses, json, os, sys, threading, time
import builtins

_out = os.environ["DLCP_LINK_COUNTERS_DIR"]


_lock = threading.Lock()


def _write(link):
    s = link.stats
    counters = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)
                if isinstance(getattr(s, f.name), int) and not isinstance(getattr(s, f.name), bool)}
    counters["rate"] = {str(peer): c for peer, c in link.rate_counters().items()}
    with _lock:
        tmp = os.path.join(_out, f".rank{link.rank}.tmp")
        with open(tmp, "w") as f:
            json.dump(counters, f)
        os.replace(tmp, os.path.join(_out, f"rank{link.rank}.json"))


def _dump(link):
    while True:
        time.sleep(0.5)
        _write(link)


_import = builtins.__import__


def _hook(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    link = sys.modules.get("commsched.transport.dlcp.link")
    if link is not None and hasattr(link, "DlcpLink") and not getattr(link.DlcpLink, "_counted", False):
        init = link.DlcpLink.__init__

        def counted_init(self, *a, **k):
            init(self, *a, **k)
            threading.Thread(target=_dump, args=(self,), daemon=True, name="link-counters").start()

        close = link.DlcpLink.close

        def counted_close(self):
            _write(self)  # the counters as the link ends (a process may exit before the next periodic write)
            close(self)

        link.DlcpLink.__init__ = counted_init
        link.DlcpLink.close = counted_close
        link.DlcpLink._counted = True
        builtins.__import__ = _import
    return module


builtins.__import__ = _hook
"""

SHOWN = ("sent", "resent", "send_errors", "received", "written", "early_buffered", "control_datagrams_sent",
         "control_sent", "control_received", "control_duplicate", "probes", "probes_held_out", "bitmaps",
         "send_calls", "recv_calls", "turns", "idle_turns")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    known, _ = parser.parse_known_args()
    steps = known.iters + known.warmup
    with tempfile.TemporaryDirectory(prefix="dlcp-counters-") as hook_dir:
        Path(hook_dir, "sitecustomize.py").write_text(HOOK)
        env = dict(os.environ, DLCP_LINK_COUNTERS_DIR=hook_dir)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (hook_dir, env.get("PYTHONPATH", "")) if p)
        bench = [sys.executable, "-c", "from commsched.cli import main; main()", "bench", *sys.argv[1:]]
        code = subprocess.run(bench, env=env, cwd=ROOT).returncode
        dumps = sorted(Path(hook_dir).glob("rank*.json"))
        if not dumps:
            sys.exit(f"no link counters were written (bench exited {code}; did it run the dlcp policy?)")
        counters = [json.loads(p.read_text()) for p in dumps]
    print(f"{'counter':24}" + "".join(f"{'rank ' + str(r) + ' total':>14}{'per step':>10}" for r in range(len(dumps))))
    for name in SHOWN:
        cells = "".join(f"{c.get(name, 0):>14,}{c.get(name, 0) / steps:>10.1f}" for c in counters)
        print(f"{name:24}{cells}")
    print(f"per step: divided by --warmup + --iters = {steps}")
    print("rate control toward each peer, as the link ended (RateControl's counters):")
    for rank, c in enumerate(counters):
        for peer, rate in sorted(c.get("rate", {}).items()):
            print(
                f"  rank {rank} -> {peer}: {rate['decreases']:.0f} cuts ({rate['undone']:.0f} undone), "
                f"{rate['timeouts']:.0f} feedback timeouts, {rate['lost']:.0f} lost, "
                f"{rate.get('refused', 0):.0f} refused by this host, "
                f"{rate['reordered']:.0f} reordered, {rate['rounds']:.0f} rounds; rate "
                f"{rate['rate_bytes_per_s'] * 8e-6:.0f} Mbit/s, srtt {rate['srtt_s'] * 1e3:.2f} ms, "
                f"min rtt {rate['min_rtt_s'] * 1e3:.2f} ms"
            )
    sys.exit(code)


if __name__ == "__main__":
    main()
