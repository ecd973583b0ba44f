"""``plan_heterogeneous``: per-rank batches, memory limits, per-bucket sync, never worse than even DP."""

from __future__ import annotations

from pathlib import Path

import pytest

from commsched import zoo
from commsched.cluster import load_cluster
from commsched.plan import simulate_candidate
from commsched.plan.batches import balanced_split, even_split, proportional_split, rank_compute_fn
from commsched.plan.hetero import plan_heterogeneous
from commsched.plan.memory import GIB, InfeasibleError, MemoryModel
from commsched.schedule import CommPlan
from commsched.sim import simulate
from commsched.workload import Workload


def _with_activations(name: str, bytes_per_sample: float) -> Workload:
    w = zoo.load(name)
    return w.model_copy(update={"extra": {**w.extra, "activation_bytes_per_sample": bytes_per_sample}})


def test_balanced_split_sums_to_the_global_batch_and_balances_compute() -> None:
    workload, cluster = zoo.load("resnet152"), load_cluster("hetero-8")
    compute_s = rank_compute_fn(workload, cluster)
    for global_batch in (8, 100, 256, 1001):
        split = balanced_split(global_batch, [10**9] * 8, compute_s, 8)
        assert sum(split) == global_batch and min(split) >= 1
        times = [compute_s(r, b) for r, b in enumerate(split)]
        # moving one sample off the slowest rank cannot lower the maximum
        slowest = max(range(8), key=lambda r: times[r])
        for r in range(8):
            if r != slowest and split[slowest] > 1:
                assert compute_s(r, split[r] + 1) >= max(times) - 1e-12


def test_balanced_split_respects_memory_caps() -> None:
    workload, cluster = zoo.load("resnet152"), load_cluster("hetero-8")
    caps = [40, 40, 10, 10, 10, 10, 30, 30]
    split = balanced_split(170, caps, rank_compute_fn(workload, cluster), 8)
    assert sum(split) == 170 and all(b <= c for b, c in zip(split, caps, strict=True))


def test_proportional_split_uses_largest_remainders_and_keeps_the_sum() -> None:
    assert proportional_split(10, [1.0, 1.0, 1.0]) == (4, 3, 3)
    assert proportional_split(512, [1.0, 1.0, 0.72, 0.72, 0.72, 0.72, 0.592, 0.592]) == (
        84, 84, 61, 61, 61, 61, 50, 50,
    )  # fmt: skip
    # every share of the whole batch, not one sample each first and the rest in proportion (32/8/8 here)
    assert proportional_split(48, [1.0, 0.238, 0.226]) == (33, 8, 7)


def test_proportional_split_gives_every_rank_one_sample_taken_from_the_largest_shares() -> None:
    assert proportional_split(10, [100.0, 1.0, 1.0]) == (8, 1, 1)
    assert proportional_split(3, [100.0, 1.0, 1.0]) == (1, 1, 1)
    assert proportional_split(12, [50.0, 50.0, 1.0]) == (6, 5, 1)
    assert even_split(10, 4) == (3, 3, 2, 2)


def test_plan_never_exceeds_a_devices_memory() -> None:
    # 300 MB of activations per sample: a V100 (16 GiB, 10 % margin) holds about 46 samples, a 1080 Ti 31
    workload = _with_activations("resnet152", 300e6)
    cluster = load_cluster("hetero-8")
    plan = plan_heterogeneous(workload, cluster, global_batch=256, budget_s=3, trials=2)
    assert sum(plan.batch_sizes) == 256
    for m, b in zip(plan.memory, plan.batch_sizes, strict=True):
        assert m.used_bytes <= m.usable_bytes and b <= m.max_batch
    # even DP (32 each) fits everywhere; a larger batch does not fit evenly
    tight = plan_heterogeneous(workload, cluster, global_batch=270, budget_s=3, trials=2)
    assert not tight.baseline("even_allreduce").fits
    assert all(m.used_bytes <= m.usable_bytes for m in tight.memory)


def test_nothing_fits_is_an_error_naming_the_device_and_the_shortfall() -> None:
    workload = _with_activations("resnet152", 11 * GIB)
    with pytest.raises(InfeasibleError, match=r"rank 2 \(GTX-1080Ti on node gtx1080ti-1\).*short by \d+\.\d\d GiB"):
        plan_heterogeneous(workload, load_cluster("hetero-8"), budget_s=1)
    with pytest.raises(InfeasibleError, match="does not fit: the devices hold at most"):
        plan_heterogeneous(_with_activations("resnet152", 1 * GIB), load_cluster("hetero-8"), budget_s=1)


def test_adam_state_of_a_large_model_is_counted_per_device() -> None:
    memory = MemoryModel(optimizer_states=2)
    workload = zoo.load("bert_large")
    assert memory.state_bytes(workload) == workload.total_bytes * 5


def test_planner_is_never_worse_than_even_dp_under_its_own_simulator() -> None:
    for model, cluster_name in (("resnet18", "hetero-8"), ("resnet18", "8xV100-10GbE"), ("vgg16", "hetero-8")):
        workload, cluster = zoo.load(model), load_cluster(cluster_name)
        plan = plan_heterogeneous(workload, cluster, budget_s=2, trials=2)
        even = plan.baseline("even_allreduce")
        assert plan.iteration_ms <= even.iteration_ms * (1 + 1e-9), (model, cluster_name)
        again = simulate_candidate(
            workload, cluster, plan.policy, plan.knobs, sync=plan.sync, batch_sizes=plan.batch_sizes
        )
        assert abs(again.iteration_ms - plan.iteration_ms) <= 1e-9 * plan.iteration_ms


def test_heterogeneous_plan_beats_even_dp_when_devices_differ() -> None:
    plan = plan_heterogeneous(zoo.load("vgg19"), load_cluster("hetero-8"), budget_s=2, trials=2)
    assert plan.speedup_over("even_allreduce") > 1.1
    assert plan.batch_sizes[0] > plan.batch_sizes[-1]  # V100s get more than P100s


def test_tasks_sent_by_parameter_server_cost_what_the_ps_algorithm_costs() -> None:
    workload, cluster = zoo.load("resnet18"), load_cluster("ec2-ps-3gbps")
    by_transport = simulate_candidate(workload, cluster, "ddp", sync="ps", iterations=5)
    by_algorithm = simulate(workload, cluster, "ddp", 5, options={"algorithm": "ps"}, trace=False)
    assert by_transport.iteration_ms == pytest.approx(by_algorithm.iteration_ms, rel=1e-12)
    assert by_transport.plan is not None and {t.transport for t in by_transport.plan.tasks} == {"ps"}
    assert by_transport.iteration_ms != simulate(workload, cluster, "ddp", 5, trace=False).iteration_ms


def test_plan_chooses_a_sync_per_bucket_where_the_cluster_has_servers() -> None:
    plan = plan_heterogeneous(zoo.load("resnet18"), load_cluster("ec2-ps-3gbps"), budget_s=3, trials=2)
    assert {b.name for b in plan.baselines} == {"even_allreduce", "even_ps", "proportional_allreduce"}
    assert set(plan.transports) <= {"collective", "ps"}
    assert plan.iteration_ms <= min(b.iteration_ms for b in plan.baselines) * (1 + 1e-9)


def test_saved_plan_carries_the_per_rank_batches_and_nothing_is_written_beside_it(tmp_path: Path) -> None:
    plan = plan_heterogeneous(zoo.load("resnet18"), load_cluster("hetero-8"), budget_s=1, trials=1)
    written = plan.save(tmp_path / "plan.json")
    loaded = CommPlan.load(written)
    assert loaded.batch_sizes == plan.batch_sizes and loaded.global_batch == plan.global_batch
    assert loaded.tasks == plan.plan.tasks and loaded.policy == plan.policy
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]
    weights = [r["gradient_weight"] for r in plan.ranks()]
    assert weights == [b / plan.global_batch for b in plan.batch_sizes]


@pytest.mark.parametrize("sync", ["collective", "ps", "cheaper"])
def test_a_push_or_pull_keeps_its_parameter_server_transport_under_any_sync(sync: str) -> None:
    workload, cluster = zoo.load("resnet18"), load_cluster("ec2-ps-3gbps")
    result = simulate_candidate(workload, cluster, "ps", sync=sync, iterations=3)
    assert result.plan is not None and {t.transport for t in result.plan.tasks} == {"ps"}
    assert result.gradient_bytes == workload.total_bytes
