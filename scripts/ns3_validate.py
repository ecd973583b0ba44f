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

    python scripts/ns3_validate.py            # the full table (about a minute)
    python scripts/ns3_validate.py --quick    # one small scenario
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass

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


def ours(scn: Scenario, transport: str, seed: int = 1) -> list[float]:
    nic = {"bandwidth_gbps": GBPS, "latency_us": 2 * LINK_DELAY_US}
    nodes = [{"name": f"n{i}", "devices": [{"name": "gpu", "memory_gib": 16}], "nic": nic} for i in range(scn.hosts)]
    cluster = Cluster.from_dict({"name": "ns3-validate", "nodes": nodes})
    red = (
        RedParams(min_bytes=K_PACKETS * PACKET_BYTES, max_bytes=K_PACKETS * PACKET_BYTES)
        if transport == "dctcp"
        else None
    )
    config = PacketConfig(
        topology="leaf_spine" if scn.per_leaf else "single_switch",
        hosts_per_leaf=scn.per_leaf or 4,
        spines=2,
        fabric_gbps=GBPS,
        fabric_latency_us=LINK_DELAY_US,
        buffer_bytes=BUFFER_PACKETS * PACKET_BYTES,
        red=red,
        load_balancing="spray",
        transport=transport,
        tcp=TCP,
        seed=seed,
        acks_first=False,  # ns-3's hosts: one FifoQueueDisc, ACKs behind data
    )
    fabric = build(cluster, config).fabric
    return [r.fct_s for r in run_flows(fabric, list(scn.flows), config)]


# ---- ns-3 ----

_CPP = r"""
#include "ns3/core-module.h"
#include "ns3/network-module.h"
#include "ns3/internet-module.h"
#include "ns3/point-to-point-module.h"
#include "ns3/applications-module.h"
#include "ns3/traffic-control-module.h"
#include <vector>
#include <string>

namespace commsched_ns3 {
using namespace ns3;

static std::vector<uint64_t> g_received;
static std::vector<uint64_t> g_target;
static std::vector<double> g_done;

static void OnRx(uint32_t i, Ptr<const Packet> p, const Address&) {
    g_received[i] += p->GetSize();
    if (g_done[i] < 0 && g_received[i] >= g_target[i]) g_done[i] = Simulator::Now().GetSeconds();
}

std::vector<double> run(int nHosts, int perLeaf, double gbps, double delayUs, bool dctcp, int mss, int iw,
                        double minRto, double initRtt, double clockG, int bufPkts, int kPkts,
                        std::vector<int> src, std::vector<int> dst, std::vector<double> bytes,
                        std::vector<double> start, int seed) {
    RngSeedManager::SetSeed(seed);
    RngSeedManager::ResetNextStreamIndex();  // the same streams whatever ran before in this process
    Config::SetDefault("ns3::TcpL4Protocol::SocketType", StringValue(dctcp ? "ns3::TcpDctcp" : "ns3::TcpNewReno"));
    Config::SetDefault("ns3::TcpL4Protocol::RecoveryType", TypeIdValue(TcpClassicRecovery::GetTypeId()));
    Config::SetDefault("ns3::TcpSocket::SegmentSize", UintegerValue(mss));
    Config::SetDefault("ns3::TcpSocket::InitialCwnd", UintegerValue(iw));
    Config::SetDefault("ns3::TcpSocket::DelAckCount", UintegerValue(1));
    Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(1 << 30));
    Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(1 << 30));
    Config::SetDefault("ns3::TcpSocketBase::MinRto", TimeValue(Seconds(minRto)));
    Config::SetDefault("ns3::TcpSocketBase::ClockGranularity", TimeValue(Seconds(clockG)));
    Config::SetDefault("ns3::RttEstimator::InitialEstimation", TimeValue(Seconds(initRtt)));
    Config::SetDefault("ns3::TcpSocketBase::Sack", BooleanValue(false));
    Config::SetDefault("ns3::TcpSocketBase::LimitedTransmit", BooleanValue(true));
    Config::SetDefault("ns3::TcpSocketBase::Timestamp", BooleanValue(true));
    Config::SetDefault("ns3::Ipv4GlobalRouting::RandomEcmpRouting", BooleanValue(true));
    Config::SetDefault("ns3::RedQueueDisc::UseEcn", BooleanValue(true));
    Config::SetDefault("ns3::RedQueueDisc::UseHardDrop", BooleanValue(false));
    Config::SetDefault("ns3::RedQueueDisc::Gentle", BooleanValue(false));
    Config::SetDefault("ns3::RedQueueDisc::QW", DoubleValue(1.0));
    Config::SetDefault("ns3::RedQueueDisc::LInterm", DoubleValue(1.0));
    Config::SetDefault("ns3::RedQueueDisc::MeanPktSize", UintegerValue(mss + 54));

    NodeContainer hosts; hosts.Create(nHosts);
    int leaves = perLeaf > 0 ? (nHosts + perLeaf - 1) / perLeaf : 1;
    NodeContainer switches; switches.Create(leaves);
    NodeContainer spines; if (perLeaf > 0) spines.Create(2);
    InternetStackHelper stack; stack.Install(hosts); stack.Install(switches); stack.Install(spines);

    PointToPointHelper p2p;
    p2p.SetDeviceAttribute("DataRate", DataRateValue(DataRate(gbps * 1e9)));
    p2p.SetChannelAttribute("Delay", TimeValue(NanoSeconds(delayUs * 1000)));
    p2p.SetQueue("ns3::DropTailQueue", "MaxSize", StringValue("1p"));

    TrafficControlHelper hostTc;
    hostTc.SetRootQueueDisc("ns3::FifoQueueDisc", "MaxSize", StringValue("1000000p"));
    TrafficControlHelper switchTc;
    int pkt = mss + 54;
    std::string buf = std::to_string((bufPkts - 1) * pkt) + "B";
    if (dctcp) {
        double k = (kPkts - 1) * pkt;
        switchTc.SetRootQueueDisc("ns3::RedQueueDisc", "MaxSize", StringValue(buf),
                                  "MinTh", DoubleValue(k), "MaxTh", DoubleValue(k + 1e-6));
    } else {
        switchTc.SetRootQueueDisc("ns3::FifoQueueDisc", "MaxSize", StringValue(buf));
    }

    Ipv4AddressHelper addr;
    std::vector<Ipv4Address> hostAddr(nHosts);
    int net = 0;
    auto nextBase = [&]() {
        std::string base = "10." + std::to_string(net / 256) + "." + std::to_string(net % 256) + ".0";
        net++;
        addr.SetBase(base.c_str(), "255.255.255.0");
    };
    for (int h = 0; h < nHosts; ++h) {
        int leaf = perLeaf > 0 ? h / perLeaf : 0;
        NetDeviceContainer d = p2p.Install(hosts.Get(h), switches.Get(leaf));
        hostTc.Install(d.Get(0));
        switchTc.Install(d.Get(1));
        nextBase();
        Ipv4InterfaceContainer ifc = addr.Assign(d);
        hostAddr[h] = ifc.GetAddress(0);
    }
    if (perLeaf > 0) {
        for (int l = 0; l < leaves; ++l) {
            for (int s = 0; s < 2; ++s) {
                NetDeviceContainer d = p2p.Install(switches.Get(l), spines.Get(s));
                switchTc.Install(d);
                nextBase();
                addr.Assign(d);
            }
        }
    }
    Ipv4GlobalRoutingHelper::PopulateRoutingTables();

    size_t n = src.size();
    g_received.assign(n, 0); g_target.assign(n, 0); g_done.assign(n, -1.0);
    for (size_t i = 0; i < n; ++i) {
        uint16_t port = 10000 + i;
        g_target[i] = (uint64_t)bytes[i];
        PacketSinkHelper sink("ns3::TcpSocketFactory", InetSocketAddress(Ipv4Address::GetAny(), port));
        ApplicationContainer sa = sink.Install(hosts.Get(dst[i]));
        sa.Start(Seconds(0.0));
        sa.Get(0)->TraceConnectWithoutContext("Rx", MakeBoundCallback(&OnRx, (uint32_t)i));
        BulkSendHelper bulk("ns3::TcpSocketFactory", InetSocketAddress(hostAddr[dst[i]], port));
        bulk.SetAttribute("MaxBytes", UintegerValue((uint64_t)bytes[i]));
        bulk.SetAttribute("SendSize", UintegerValue(65536));
        ApplicationContainer ba = bulk.Install(hosts.Get(src[i]));
        ba.Start(Seconds(start[i]));
    }
    Simulator::Stop(Seconds(10.0));
    Simulator::Run();
    Simulator::Destroy();
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = g_done[i] < 0 ? -1.0 : g_done[i] - start[i];
    return out;
}
}  // namespace commsched_ns3
"""

_compiled = False


def ns3_available() -> str | None:
    """None when ns-3's Python bindings import, else why not."""
    try:
        from ns import ns  # noqa: F401
    except Exception as exc:  # ImportError, or a bindings build that fails to load
        return f"ns-3 Python bindings not importable ({type(exc).__name__}: {exc}); pip install ns3"
    return None


def ns3(scn: Scenario, transport: str, seed: int = 1) -> list[float]:
    global _compiled
    from ns import ns

    cppyy = ns.cppyy
    if not _compiled:
        cppyy.cppdef(_CPP)
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
    )
    return list(out)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def compare(quick: bool = False) -> list[dict[str, object]]:
    """One row per (scenario, transport): median and p99 FCT on both sides, their errors, per-flow errors."""
    rows = []
    for scn in scenarios(quick):
        for transport in ("tcp", "dctcp"):
            # spraying is random: pool the flows of several seeds; one switch is deterministic on both sides
            seeds = SEEDS if scn.per_leaf else SEEDS[:1]
            ref = [fct for seed in seeds for fct in ns3(scn, transport, seed)]
            got = [fct for seed in seeds for fct in ours(scn, transport, seed)]
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
    args = parser.parse_args()
    why = ns3_available()
    if why:
        print(why, file=sys.stderr)
        return 2
    rows = compare(args.quick)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
