"""Flow-completion times of the packet-level model against ns-3 on the same small scenarios.

Each scenario is built twice, in ns-3 (through its Python bindings, ``pip
install ns3``; the scenario itself is C++ compiled on the fly by cppyy) and
in ``commsched.sim.packet``, with the same topology, rates, delays, buffers
and TCP parameters pinned on both sides:

* hosts at 10 Gbit/s, 2 µs per link; one switch, or 2 leaves x 2 spines
  with 4 hosts per leaf and per-packet random spraying over the spines (ns-3:
  ``Ipv4GlobalRouting::RandomEcmpRouting``);
* TCP: MSS 1448 B, 54 B of headers per packet on the wire (IP 20, TCP 20,
  timestamps 12, PPP 2), initial window 10, min RTO 1 ms, initial RTT 1 ms,
  clock granularity 1 µs, delayed ACK off, no SACK, limited transmit on,
  classic NewReno recovery (not PRR), a handshake before data;
* NewReno: drop-tail switch buffers of 100 full packets (150,200 B);
  DCTCP: RED/ECN with a single threshold K = 20 full packets (instantaneous
  queue), same buffers; both sides count queues in bytes. ns-3 keeps one
  packet in the device queue beyond its queue disc, so its queue-disc limits
  are one packet lower. DCTCP's ACKs are ECN-capable on both sides.

Scenarios: one flow; 8 -> 1 incast; all-to-all among 8 hosts; each on both
topologies. FCT: from the flow's start until the receiver has every byte.
Per scenario and TCP the table gives the error of the median FCT and of the
p99 FCT (ours against ns-3's, over the scenario's flows), and, stricter, the
median over flows of each flow's own error (which flow of an all-to-all
finishes first is chaotic, so this one is large where flows contend).
Leaf-spine scenarios pool the flows of five seeds on each side (spraying is
random, and differently so in each simulator); one switch is deterministic.

``--events`` adds, per row, what happened on each side (switch drops, fast
recoveries, retransmission timeouts) and the most data an ns-3 sender had
outstanding beyond its congestion window outside recovery.
``--linux-reno-sack`` runs ns-3 with its duplicate-ACK bookkeeping reset the
way Linux does it (``scripts/ns3_validate.cc`` says what and why; see
docs/simulator.md for what it explains).

    python scripts/ns3_validate.py                       # the full table (about 20 s)
    python scripts/ns3_validate.py --quick               # one small scenario
    python scripts/ns3_validate.py --rows all-to-all --events --linux-reno-sack
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from commsched.cluster import Cluster
from commsched.sim.packet import PacketConfig, RedParams, TcpParams, build
from commsched.sim.packet.scenario import Flow, run_flows

GBPS = 10.0
LINK_DELAY_US = 2.0
MSS = 1448
HEADER_BYTES = 54
PACKET_BYTES = MSS + HEADER_BYTES
BUFFER_PACKETS = 100
K_PACKETS = 20
#: Seeds of the leaf-spine runs (per-packet spraying is random); their flows are pooled.
SEEDS = (1, 2, 3, 4, 5)
TCP = TcpParams(
    segment_bytes=MSS,
    header_bytes=HEADER_BYTES,
    initial_window_segments=10,
    min_rto_s=1e-3,
    initial_rto_s=3e-3,
    clock_granularity_s=1e-6,
    delayed_ack_segments=1,
    handshake=True,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    hosts: int
    per_leaf: int  # 0: one switch
    flows: tuple[Flow, ...]


def scenarios(quick: bool = False) -> list[Scenario]:
    if quick:
        return [Scenario("incast 4->1, one switch", 5, 0, tuple(Flow(s, 4, 200_000) for s in range(4)))]
    out = []
    for per_leaf, where in ((0, "one switch"), (4, "2 leaves x 2 spines")):
        hosts = 9 if per_leaf == 0 else 8
        out.append(Scenario(f"one flow, {where}", hosts, per_leaf, (Flow(0, hosts - 1, 2_000_000),)))
        sink = hosts - 1
        out.append(Scenario(f"incast 7->1, {where}", hosts, per_leaf, tuple(Flow(s, sink, 500_000) for s in range(7))))
        if per_leaf == 0:
            out.append(Scenario(f"incast 8->1, {where}", 9, 0, tuple(Flow(s, 8, 500_000) for s in range(8))))
        a2a = tuple(Flow(s, d, 200_000) for s in range(8) for d in range(8) if s != d)
        out.append(Scenario(f"all-to-all 8, {where}", 8, per_leaf, a2a))
    return out


# ---- ours ----


@dataclass(frozen=True)
class Run:
    """One scenario on one side: completion time of each flow (s), and what happened on the way.

    ``overshoot_segments``: the most data any sender had outstanding beyond
    its congestion window outside recovery, in segments (ns-3 only; our
    senders never exceed the window).
    """

    fcts: list[float]
    drops: int
    recoveries: int
    timeouts: int
    overshoot_segments: float = 0.0


def ours_run(scn: Scenario, transport: str, seed: int = 1) -> Run:
    nic = {"bandwidth_gbps": GBPS, "latency_us": 2 * LINK_DELAY_US}
    nodes = [{"name": f"n{i}", "devices": [{"name": "gpu", "memory_gib": 16}], "nic": nic} for i in range(scn.hosts)]
    cluster = Cluster.from_dict({"name": "ns3-validate", "nodes": nodes})
    k_bytes = K_PACKETS * PACKET_BYTES
    config = PacketConfig(
        topology="leaf_spine" if scn.per_leaf else "single_switch",
        hosts_per_leaf=scn.per_leaf or 4,
        spines=2,
        fabric_gbps=GBPS,
        fabric_latency_us=LINK_DELAY_US,
        buffer_bytes=BUFFER_PACKETS * PACKET_BYTES,
        red=RedParams(min_bytes=k_bytes, max_bytes=k_bytes) if transport == "dctcp" else None,
        load_balancing="spray",
        transport=transport,
        tcp=TCP,
        seed=seed,
        acks_first=False,  # ns-3's hosts: one FifoQueueDisc, ACKs behind data
    )
    results = run_flows(build(cluster, config).fabric, list(scn.flows), config)
    return Run(
        [r.fct_s for r in results],
        sum(r.drops for r in results),
        sum(r.recoveries for r in results),
        sum(r.timeouts for r in results),
    )


def ours(scn: Scenario, transport: str, seed: int = 1) -> list[float]:
    return ours_run(scn, transport, seed).fcts


# ---- ns-3 ----

_compiled = False


def ns3_available() -> str | None:
    """None when ns-3's Python bindings import, else why not."""
    try:
        from ns import ns  # noqa: F401
    except Exception as exc:  # ImportError, or a bindings build that fails to load
        return f"ns-3 Python bindings not importable ({type(exc).__name__}: {exc}); pip install ns3"
    return None


def ns3_run(scn: Scenario, transport: str, seed: int = 1, linux_reno_sack: bool = False) -> Run:
    global _compiled
    from ns import ns

    cppyy = ns.cppyy
    if not _compiled:
        cppyy.cppdef((Path(__file__).parent / "ns3_validate.cc").read_text())
        _compiled = True
    std = cppyy.gbl.std
    vi = lambda xs: std.vector[int](list(xs))  # noqa: E731
    vd = lambda xs: std.vector[float](list(map(float, xs)))  # noqa: E731
    fl = scn.flows
    out = cppyy.gbl.commsched_ns3.run(
        scn.hosts,
        scn.per_leaf,
        GBPS,
        LINK_DELAY_US,
        transport == "dctcp",
        MSS,
        TCP.initial_window_segments,
        TCP.min_rto_s,
        TCP.initial_rto_s / 3,
        TCP.clock_granularity_s,
        BUFFER_PACKETS,
        K_PACKETS,
        vi(f.src for f in fl),
        vi(f.dst for f in fl),
        vd(f.nbytes for f in fl),
        vd(f.start_s for f in fl),
        seed,
        linux_reno_sack,
    )
    drops, recoveries, timeouts, overshoot = cppyy.gbl.commsched_ns3.counts()
    return Run(list(out), int(drops), int(recoveries), int(timeouts), max(0.0, float(overshoot)))


def ns3(scn: Scenario, transport: str, seed: int = 1, linux_reno_sack: bool = False) -> list[float]:
    return ns3_run(scn, transport, seed, linux_reno_sack).fcts


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def compare(quick: bool = False, only: tuple[str, ...] = (), linux_reno_sack: bool = False) -> list[dict[str, object]]:
    """One row per (scenario, transport): median and p99 FCT on both sides, their errors, per-flow errors,
    and the event counts of both sides; ``only``: scenarios whose name contains one of these."""
    rows = []
    for scn in scenarios(quick):
        if only and not any(part in scn.name for part in only):
            continue
        for transport in ("tcp", "dctcp"):
            # spraying is random: pool the flows of several seeds; one switch is deterministic on both sides
            seeds = SEEDS if scn.per_leaf else SEEDS[:1]
            theirs = [ns3_run(scn, transport, seed, linux_reno_sack) for seed in seeds]
            mine = [ours_run(scn, transport, seed) for seed in seeds]
            ref = [fct for run in theirs for fct in run.fcts]
            got = [fct for run in mine for fct in run.fcts]
            if any(r <= 0 for r in ref):
                raise RuntimeError(f"ns-3: a flow of {scn.name} / {transport} did not complete: {ref}")
            per_flow = [abs(g - r) / r for g, r in zip(got, ref, strict=True)]
            ref_med, got_med = statistics.median(ref), statistics.median(got)
            ref_p99, got_p99 = _pct(ref, 0.99), _pct(got, 0.99)
            rows.append(
                {
                    "scenario": scn.name,
                    "transport": "NewReno" if transport == "tcp" else "DCTCP",
                    "flows": len(ref),
                    "ns3_median_ms": ref_med * 1e3,
                    "ours_median_ms": got_med * 1e3,
                    "median_error": abs(got_med - ref_med) / ref_med,
                    "ns3_p99_ms": ref_p99 * 1e3,
                    "ours_p99_ms": got_p99 * 1e3,
                    "p99_error": abs(got_p99 - ref_p99) / ref_p99,
                    "per_flow_median_error": statistics.median(per_flow),
                    **{
                        f"{side}_{what}": sum(getattr(run, what) for run in runs)
                        for side, runs in (("ns3", theirs), ("ours", mine))
                        for what in ("drops", "recoveries", "timeouts")
                    },
                    "ns3_overshoot_segments": max(run.overshoot_segments for run in theirs),
                }
            )
    return rows


def _ms(x: object) -> str:
    return f"{float(x):.3f}"  # type: ignore[arg-type]


def _pc(x: object) -> str:
    return f"{100 * float(x):.1f} %"  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one small scenario only")
    parser.add_argument("--rows", action="append", default=[], help="only scenarios whose name contains this")
    parser.add_argument("--events", action="store_true", help="also print drops, recoveries, timeouts per side")
    parser.add_argument(
        "--linux-reno-sack", action="store_true", help="ns-3 with its duplicate-ACK counts reset as Linux does"
    )
    args = parser.parse_args()
    why = ns3_available()
    if why:
        print(why, file=sys.stderr)
        return 2
    rows = compare(args.quick, tuple(args.rows), args.linux_reno_sack)
    if args.linux_reno_sack:
        print("ns-3 with its reno-SACK counts reset as Linux does (--linux-reno-sack)\n")
    print(
        "| scenario | TCP | flows | median FCT ns-3 / ours (ms) | median error "
        "| p99 FCT ns-3 / ours (ms) | p99 error | per-flow median error |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['transport']} | {r['flows']} | {_ms(r['ns3_median_ms'])} / "
            f"{_ms(r['ours_median_ms'])} | {_pc(r['median_error'])} | {_ms(r['ns3_p99_ms'])} / "
            f"{_ms(r['ours_p99_ms'])} | {_pc(r['p99_error'])} | {_pc(r['per_flow_median_error'])} |"
        )
    med = [float(r["median_error"]) for r in rows]  # type: ignore[arg-type]
    p99 = [float(r["p99_error"]) for r in rows]  # type: ignore[arg-type]
    print(
        f"\nover {len(rows)} scenario x TCP rows: median FCT error median {_pc(statistics.median(med))}, "
        f"worst {_pc(max(med))}; p99 FCT error median {_pc(statistics.median(p99))}, worst {_pc(max(p99))}"
    )
    if args.events:
        print(
            "\n| scenario | TCP | switch drops ns-3 / ours | fast recoveries ns-3 / ours | timeouts ns-3 / ours "
            "| ns-3 beyond its window (segments) |"
        )
        print("|---|---|---:|---:|---:|---:|")
        for r in rows:
            pairs = " | ".join(f"{r[f'ns3_{w}']} / {r[f'ours_{w}']}" for w in ("drops", "recoveries", "timeouts"))
            print(f"| {r['scenario']} | {r['transport']} | {pairs} | {float(r['ns3_overshoot_segments']):.0f} |")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
