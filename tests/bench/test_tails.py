"""The round-time harness: its arithmetic on made-up records, and one tiny live run (root) through the switch."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from commsched.bench.tails import (
    Job,
    cpu_ms_per_round,
    datapath_rate,
    posting_ms,
    round_times,
    summarise,
    two_stage_makespan,
    wire_floor_ms,
)
from commsched.bench.tails_report import plot, ratio, ratio_lines
from commsched.bench.tails_run import TailsConfig, partitions, run_tails, scenarios
from commsched.testbed import netns_unavailable_reason, project_objects
from commsched.testbed.switch import SwitchShape, switch_unavailable_reason


def _rank(ends: list[float], comm: list[float], server: bool = False) -> dict:
    return {"ends_s": ends, "comm_starts_s": [e - c for e, c in zip(ends, comm, strict=True)], "server": server}


def test_a_round_ends_with_its_last_sender_and_the_server_is_left_out() -> None:
    ranks = [
        _rank([0.0, 0.1, 0.3, 0.4], [0.05, 0.05, 0.1, 0.02], server=True),  # a dedicated server: not a sender
        _rank([1.0, 1.1, 1.2, 1.35], [0.01, 0.02, 0.03, 0.04]),
        _rank([1.05, 1.15, 1.3, 1.4], [0.02, 0.01, 0.08, 0.01]),
    ]
    times = round_times(ranks, warmup=1)
    # round ends 1.05, 1.15, 1.3, 1.4: timed rounds 1..3 take 100, 150 and 100 ms
    assert times["round_ms"] == pytest.approx([100, 150, 100])
    assert times["comm_ms"] == pytest.approx([20, 80, 40])  # the longest exchange of each timed round
    with pytest.raises(ValueError, match="more than the 4 warm-up rounds"):
        round_times(ranks, warmup=4)


def test_posting_is_each_senders_start_calls_over_the_timed_rounds_and_absent_from_old_records() -> None:
    ranks = [
        {"server": True, "comm_starts_s": [0.0, 0.0], "posted_s": [0.5, 0.5]},  # a server posts nothing timed
        {"comm_starts_s": [1.0, 2.0, 3.0], "posted_s": [1.010, 2.001, 3.003]},
        {"comm_starts_s": [1.0, 2.0, 3.0], "posted_s": [1.020, 2.002, 3.004]},
    ]
    posting = posting_ms(ranks, warmup=1)  # the timed rounds: 1, 3, 2 and 4 ms
    assert posting is not None
    assert posting["p50_ms"] == pytest.approx(2.5) and posting["p99_ms"] == pytest.approx(3.97)
    assert posting_ms([{"comm_starts_s": [1.0], "ends_s": [2.0]}], warmup=0) is None


def test_summaries_are_numpy_percentiles_and_the_datapath_counts_timed_datagrams_per_cpu_second() -> None:
    s = summarise([float(v) for v in range(1, 101)])
    assert s["p50_ms"] == pytest.approx(50.5) and s["p99_ms"] == pytest.approx(99.01) and s["rounds"] == 100
    ranks = [
        {"cpu_s": 2.0, "dlcp": {"timed_sent": 30_000, "timed_received": 10_000}},
        {"cpu_s": 1.0, "dlcp": {"timed_sent": 5_000, "timed_received": 25_000}},
    ]
    assert datapath_rate(ranks) == {"datagrams_per_cpu_s_median": 25_000.0, "datagrams_per_cpu_s_max": 30_000.0}
    assert datapath_rate([{"cpu_s": 1.0}]) is None  # no DLCP link: nothing to say
    # CPU per timed round, every method: the ranks' median and the busiest rank
    assert cpu_ms_per_round(ranks, 100) == {"median": 15.0, "max": 20.0}  # 2 and 1 CPU-s over 100 rounds
    assert cpu_ms_per_round(ranks, 0) is None and cpu_ms_per_round([], 10) is None


def test_partitions_follow_the_model_front_first_or_split_a_given_size_evenly() -> None:
    parts = partitions(TailsConfig(model="cnn", partition_mib=0.5))
    assert sum(parts) == 673_322 and len(parts) >= 2  # every parameter of the cnn, in pieces of about 0.5 MiB
    assert partitions(TailsConfig(grad_mib=2.5, partition_mib=1.0)) == (218_454, 218_453, 218_453)
    assert max(parts) == 294_912  # the cnn's largest tensor, whole
    assert Job("ps1", 10, 2, 5.0, parts, 0.01, 60.0, "/tmp").world(4) == 5  # the dedicated server
    assert Job("dlcp", 10, 2, 5.0, parts, 0.01, 60.0, "/tmp").world(4) == 4


def test_split_tensors_cuts_a_tensor_larger_than_a_partition_as_the_policies_do() -> None:
    whole = partitions(TailsConfig(model="cnn", partition_mib=0.25))
    split = partitions(TailsConfig(model="cnn", partition_mib=0.25, split_tensors=True))
    limit = 2**18 // 4
    assert sum(split) == sum(whole) == 673_322 and max(split) == limit < max(whole)
    # the cnn's tensors of 73,728, 147,456, 294,912 and 131,072 elements: whole pieces, then each one's rest starts
    # the next piece with the small tensors after it (256, 256, 512: 8,192 + 256, 16,384 + 256, 32,768 + 512)
    assert whole == (19_488, 73_728, 256, 147_456, 256, 294_912, 512, 131_072, 5_642)
    assert split == (
        19_488,
        limit,
        8_448,
        limit,
        limit,
        16_640,
        limit,
        limit,
        limit,
        limit,
        33_280,
        limit,
        limit,
        5_642,
    )
    # a tensor exactly as large as the partition leaves no empty piece behind
    assert 0 not in partitions(TailsConfig(model="cnn", partition_mib=0.0625, split_tensors=True))


def test_incast_compares_the_one_server_methods_through_a_shallow_switch_port() -> None:
    config = TailsConfig(queue_pkts=10, buffer_pkts=40)
    by_name = scenarios(config)
    assert list(by_name) == ["lossless", "loss", "incast"]
    assert by_name["incast"].methods == ("ps1", "dlcp_ps") and by_name["lossless"].switch is None
    port = by_name["incast"].switch
    assert port is not None and port.aqm == "virtual" and port.threshold_pkts == 10 and port.limit_pkts == 40
    # DLCP's important packets by layer class (CS4..CS1) in bands 0..3, its unimportant ones (CS0) and TCP last
    assert [port.band_of(d) for d in (32, 24, 16, 8, 0, 46)] == [0, 1, 2, 3, 4, 4] and port.bands == 5
    assert by_name["loss"].link.loss_pct == 1.0 and by_name["loss"].link.rate_bps == 300 * 10**6
    with pytest.raises(ValueError, match="methods: unknown"):
        TailsConfig(methods=("ps", "quic"))
    with pytest.raises(ValueError, match="scenarios: unknown"):
        TailsConfig(scenarios=("wan",))


def _result(p50: float, p99: float) -> dict:
    return {"round": {"p50_ms": p50, "p99_ms": p99}}


def test_ratios_are_baseline_over_method_against_the_targets() -> None:
    results = {
        "loss": {"methods": {"ps1": _result(120, 600), "dlcp_ps": _result(100, 200), "gloo": _result(90, 300)}},
        "lossless": {"methods": {"ps1": _result(100, 110)}},
        "incast": {"methods": {"ps1": _result(150, 550)}},
    }
    assert ratio(results, "loss", "ps1", "dlcp_ps", "p99") == pytest.approx(3.0)
    assert ratio(results, "loss", "gloo", "dlcp", "p99") is None  # dlcp not measured
    lines = ratio_lines(results)
    assert "loss     p99 ps1/dlcp_ps: 3.00x (target >= 1.50x: met)" in lines
    assert "loss     p50 ps1/dlcp_ps: 1.20x (target >= 1.20x: met)" in lines
    assert "loss     p99 of ps1 over its lossless p99 (what the loss costs TCP): 5.45x" in lines
    assert not any("of gloo over its lossless" in line for line in lines)  # gloo ran at loss only
    assert lines[-1].endswith("(what incast costs TCP): 5.00x")


def test_the_wire_floor_is_the_busiest_link_directions_payload_less_the_shapers_burst() -> None:
    parts, rate = (1_000_000, 1_500_000, 500_000), 300 * 10**6  # 3 MB at 300 Mbit/s: 80 ms of wire
    ms = 8 / rate * 1e3  # per byte
    # an all-reduce's link: (n-1)/n of the gradient out in each phase; a bounded push may leave 1 % unsent
    assert wire_floor_ms("gloo", 2, parts, rate, 0.01, 0) == pytest.approx(80.0)
    assert wire_floor_ms("ps", 4, parts, rate, 0.01, 0) == pytest.approx(120.0)
    assert wire_floor_ms("dlcp", 2, parts, rate, 0.01, 0) == pytest.approx(80.0 * 1.99 / 2)
    assert wire_floor_ms("gloo", 2, parts, rate, 0.0, 75_000) == pytest.approx((3_000_000 - 75_000) * ms)
    assert wire_floor_ms("gloo", 2, (1000,), rate, 0.0, 75_000) == 0.0  # all of it within the bucket
    # one server: the pulls of the partition pushed last follow every push in: 2 x (3 MB + the largest, 1.5 MB),
    # less two buckets (in and out)
    assert wire_floor_ms("ps1", 2, parts, rate, 0.01, 75_000) == pytest.approx((9_000_000 - 150_000) * ms)
    # a bounded push leaves 1 % unsent: the smallest first, the largest's pulls after 2 x 2.97 MB in
    assert wire_floor_ms("dlcp_ps", 2, parts, rate, 0.01, 0) == pytest.approx((5_940_000 + 3_000_000) * ms)


def test_the_two_stage_makespan_is_johnsons_order_and_no_order_beats_it() -> None:
    jobs = [(3.0, 6.0), (5.0, 2.0), (1.0, 2.0), (6.0, 6.0), (7.0, 5.0)]
    best = two_stage_makespan(jobs)
    assert best == pytest.approx(24.0)  # (1,2) (3,6) (6,6) (7,5) (5,2): the second machine idles 1 at the start

    def makespan(order: tuple[tuple[float, float], ...]) -> float:
        first = second = 0.0
        for a, b in order:
            first += a
            second = max(second, first) + b
        return second

    assert min(makespan(order) for order in itertools.permutations(jobs)) == pytest.approx(best)
    assert two_stage_makespan([(2.0, 2.0)] * 3) == pytest.approx(8.0)  # equal stages: the sum + the largest
    assert two_stage_makespan([]) == 0.0


def test_the_ceiling_of_a_target_is_the_baseline_over_the_methods_floor() -> None:
    results = {
        "lossless": {"methods": {"gloo": _result(100, 110), "dlcp": _result(101, 104) | {"floor_ms": 90.0}}},
        "loss": {"methods": {"gloo": _result(103, 117), "dlcp": _result(104, 120) | {"floor_ms": 90.0}}},
    }
    lines = ratio_lines(results)
    assert "loss     p99 gloo/dlcp: at most 1.30x at dlcp's floor of 90.0 ms a round (target reachable)" in lines
    assert "loss     p50 gloo/dlcp: at most 1.14x at dlcp's floor of 90.0 ms a round (target reachable)" in lines
    results["loss"]["methods"]["dlcp"]["floor_ms"] = 91.0  # 117 / 91 = 1.29 < 1.3
    assert "loss     p99 gloo/dlcp: at most 1.29x at dlcp's floor of 91.0 ms a round (target out of reach)" in (
        ratio_lines(results)
    )
    assert "loss     p50 of gloo over its lossless p50 (what the loss costs TCP): 1.03x" in lines
    assert "loss     p99 of gloo over its lossless p99 (what the loss costs TCP): 1.06x" in lines
    assert not any("ps1" in line for line in lines)  # ps1 not measured


_REASON = netns_unavailable_reason()


@pytest.mark.netns
@pytest.mark.skipif(_REASON is not None, reason=f"testbed: {_REASON}")
def test_a_tiny_jumbo_frame_incast_of_dlcp_ps_measures_rounds_datagrams_and_the_server_port(tmp_path: Path) -> None:
    port = SwitchShape(rate_bps=300 * 10**6, queue_pkts=10, buffer_pkts=40)
    reason = switch_unavailable_reason(port)
    if reason is not None:
        assert "not installed" not in reason, reason  # a missing nft command is a set-up error
        pytest.skip(f"testbed: {reason}")
    config = TailsConfig(
        senders=2, rounds=4, warmup=2, compute_ms=5.0, grad_mib=0.125, scenarios=("incast",), methods=("dlcp_ps",),
        queue_pkts=10, buffer_pkts=40, timeout_s=30.0, mtu_bytes=9000,
    )  # fmt: skip
    report = run_tails(config, tmp_path, log=lambda message: None)
    entry = report["scenarios"]["incast"]["methods"]["dlcp_ps"]
    assert entry["round"]["rounds"] == 4 and entry["round"]["p50_ms"] >= 5.0  # at least the sleep
    # the floor: the sleep and the server port's 2 x 0.125 MiB of pulls, less the bucket, no round below it
    assert entry["floor_ms"] == pytest.approx(5.0 + wire_floor_ms("dlcp_ps", 2, [2**17], 300 * 10**6, 0.01, 75_000))
    assert entry["floor_ms"] > 5.0 and entry["round"]["p50_ms"] >= entry["floor_ms"]
    assert len(entry["ranks"]) == 3 and entry["ranks"][0]["server"]  # two senders and the server, rank 0
    assert entry["datapath"]["datagrams_per_cpu_s_median"] > 0
    assert 0 < entry["cpu_ms_per_round"]["median"] <= entry["cpu_ms_per_round"]["max"]
    for rank in entry["ranks"]:  # the CPU split into user space and kernel, and the threads' waits
        assert rank["user_s"] + rank["system_s"] > 0 and rank["waits"] > 0 and rank["preempted"] >= 0
    assert 0 < entry["posting"]["p50_ms"] <= entry["posting"]["p99_ms"] < entry["comm"]["p99_ms"]
    # jumbo frames: the server wrote the pushes in datagrams of about 9000 bytes, not 1500
    pushes = 2 * (4 + 2) * 0.125 * 2**20  # bytes into the server: 2 senders, 6 rounds
    assert pushes / 8900 <= entry["ranks"][0]["dlcp"]["written"] < pushes / 1400
    assert entry["server_port"]["sent_pkts"] >= 2 * 4 * 0.125 * 2**20 / 9000  # both senders' pushes crossed it
    assert entry["lost_numel_per_round_max"] <= 0.01 * 0.125 * 2**20 / 4  # within the bound of one push
    saved = json.loads((tmp_path / "tails.json").read_text())
    assert saved["scenarios"]["incast"]["methods"]["dlcp_ps"]["round_ms"] == entry["round_ms"]
    plot(report, tmp_path / "tails.png")
    assert (tmp_path / "tails.png").read_bytes()[:4] == b"\x89PNG"
    assert project_objects(f"csb-{os.getpid()}-") == []
