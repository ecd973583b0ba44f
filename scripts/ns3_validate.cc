// The ns-3 side of scripts/ns3_validate.py: one scenario, compiled on the fly by cppyy.
//
// run(...) builds hosts, one switch or 2 leaves x 2 spines, RED/ECN or drop-tail switch queues and one
// BulkSend per flow, and returns each flow's completion time. counts() then gives what happened in it:
// switch-queue drops, fast recoveries entered, retransmission timeouts, and the most data any sender had
// outstanding beyond its congestion window outside recovery, in segments.
//
// linuxRenoSack: ns-3 3.44 without SACK counts each duplicate ACK as a "reno SACK" of one segment and keeps
// those counts across cumulative ACKs and the end of recovery (TcpTxBuffer::DiscardUpTo moves them to the
// next segment; only a timeout resets them), so BytesInFlight() falls below what is outstanding and the
// sender exceeds its window by the stale count. With linuxRenoSack the count is reset, as Linux's
// tcp_reset_reno_sack does, whenever SND.UNA advances outside recovery and when the sender returns to Open.
#include "ns3/core-module.h"
#include "ns3/network-module.h"
#include "ns3/internet-module.h"
#include "ns3/point-to-point-module.h"
#include "ns3/applications-module.h"
#include "ns3/traffic-control-module.h"
#include <algorithm>
#include <string>
#include <vector>

namespace commsched_ns3 {
using namespace ns3;

static std::vector<uint64_t> g_received;
static std::vector<uint64_t> g_target;
static std::vector<double> g_done;
static std::vector<Ptr<TcpSocketBase>> g_sock;
static std::vector<int> g_state;
static std::vector<uint32_t> g_cwnd;
static bool g_linuxReno = false;
static int g_mss = 1448;
static double g_drops, g_recoveries, g_timeouts, g_overshoot;

static void OnRx(uint32_t i, Ptr<const Packet> p, const Address&) {
    g_received[i] += p->GetSize();
    if (g_done[i] < 0 && g_received[i] >= g_target[i]) g_done[i] = Simulator::Now().GetSeconds();
}

static void OnDrop(Ptr<const QueueDiscItem>) { g_drops += 1; }

static void OnCwnd(uint32_t i, uint32_t, uint32_t cwnd) { g_cwnd[i] = cwnd; }

static void OnCongState(uint32_t i, TcpSocketState::TcpCongState_t, TcpSocketState::TcpCongState_t now) {
    g_state[i] = now;
    if (now == TcpSocketState::CA_RECOVERY) g_recoveries += 1;
    if (now == TcpSocketState::CA_LOSS) g_timeouts += 1;
    if (g_linuxReno && now == TcpSocketState::CA_OPEN) g_sock[i]->GetTxBuffer()->ResetRenoSack();
}

static void OnUna(uint32_t i, SequenceNumber32 before, SequenceNumber32 after) {
    bool recovering = g_state[i] == TcpSocketState::CA_RECOVERY || g_state[i] == TcpSocketState::CA_LOSS;
    if (g_linuxReno && after > before && !recovering) g_sock[i]->GetTxBuffer()->ResetRenoSack();
}

static void OnTx(uint32_t i, Ptr<const Packet> p, const TcpHeader& h, Ptr<const TcpSocketBase>) {
    if (p->GetSize() == 0 || g_state[i] == TcpSocketState::CA_RECOVERY || g_state[i] == TcpSocketState::CA_DISORDER)
        return;
    SequenceNumber32 end = h.GetSequenceNumber() + p->GetSize();
    double outstanding = (double)(end - g_sock[i]->GetTxBuffer()->HeadSequence());
    g_overshoot = std::max(g_overshoot, (outstanding - g_cwnd[i]) / g_mss);
}

static void Watch(uint32_t i, Ptr<Application> app) {
    Ptr<TcpSocketBase> s = DynamicCast<TcpSocketBase>(DynamicCast<BulkSendApplication>(app)->GetSocket());
    g_sock[i] = s;
    s->TraceConnectWithoutContext("CongState", MakeBoundCallback(&OnCongState, i));
    s->TraceConnectWithoutContext("CongestionWindow", MakeBoundCallback(&OnCwnd, i));
    s->TraceConnectWithoutContext("HighestRxAck", MakeBoundCallback(&OnUna, i));
    s->TraceConnectWithoutContext("Tx", MakeBoundCallback(&OnTx, i));
}

std::vector<double> counts() { return {g_drops, g_recoveries, g_timeouts, g_overshoot}; }

std::vector<double> run(int nHosts, int perLeaf, double gbps, double delayUs, bool dctcp, int mss, int iw,
                        double minRto, double initRtt, double clockG, int bufPkts, int kPkts,
                        std::vector<int> src, std::vector<int> dst, std::vector<double> bytes,
                        std::vector<double> start, int seed, bool linuxRenoSack) {
    g_linuxReno = linuxRenoSack;
    g_mss = mss;
    g_drops = g_recoveries = g_timeouts = g_overshoot = 0;
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
        switchTc.Install(d.Get(1)).Get(0)->TraceConnectWithoutContext("Drop", MakeCallback(&OnDrop));
        nextBase();
        Ipv4InterfaceContainer ifc = addr.Assign(d);
        hostAddr[h] = ifc.GetAddress(0);
    }
    if (perLeaf > 0) {
        for (int l = 0; l < leaves; ++l) {
            for (int s = 0; s < 2; ++s) {
                NetDeviceContainer d = p2p.Install(switches.Get(l), spines.Get(s));
                QueueDiscContainer qd = switchTc.Install(d);
                for (uint32_t q = 0; q < qd.GetN(); ++q) qd.Get(q)->TraceConnectWithoutContext("Drop", MakeCallback(&OnDrop));
                nextBase();
                addr.Assign(d);
            }
        }
    }
    Ipv4GlobalRoutingHelper::PopulateRoutingTables();

    size_t n = src.size();
    g_received.assign(n, 0); g_target.assign(n, 0); g_done.assign(n, -1.0);
    g_sock.assign(n, nullptr); g_state.assign(n, TcpSocketState::CA_OPEN); g_cwnd.assign(n, iw * mss);
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
        Simulator::Schedule(Seconds(start[i]) + NanoSeconds(1), &Watch, (uint32_t)i, ba.Get(0));
    }
    Simulator::Stop(Seconds(10.0));
    Simulator::Run();
    Simulator::Destroy();
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = g_done[i] < 0 ? -1.0 : g_done[i] - start[i];
    return out;
}
}  // namespace commsched_ns3
