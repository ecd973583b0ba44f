"""``commsched.bench.validate``: the simulator's predictions under the gloo runtime's options."""

from __future__ import annotations

import math

from commsched import zoo
from commsched.bench.validate import predict
from commsched.plan.gloo import gloo_options
from commsched.profile import measured_cluster
from commsched.sim import simulate


def test_gloo_options_allow_two_all_reduces_in_flight_and_one_ring_op() -> None:
    workload, cluster = zoo.load("resnet18"), measured_cluster(100e-6, 1e-9, 4)
    ddp = gloo_options(workload, cluster, "ddp")
    assert (ddp.algorithm, ddp.max_concurrent) == ("ring", 2)
    assert gloo_options(workload, cluster, "dear").max_concurrent == 1


def test_predict_is_the_simulated_iteration_time_under_gloo_options() -> None:
    workload, cluster = zoo.load("resnet18"), measured_cluster(100e-6, 1e-9, 4)
    got = predict(workload, cluster, ["ddp", "dear"], iterations=3, warmup=1, knobs={"dear": {"threshold_mb": 10}})
    assert set(got) == {"ddp", "dear"}
    expected = simulate(workload, cluster, "ddp", 3, 1, options={"max_concurrent": 2}).iteration_ms
    assert math.isclose(got["ddp"], expected)
    slower = predict(workload, cluster, ["ddp"], iterations=3, warmup=1, update_ms=50.0)
    assert slower["ddp"] > got["ddp"]
    serial = predict(workload, cluster, ["ddp"], iterations=3, warmup=1, options={"max_concurrent": 1})
    assert serial["ddp"] >= got["ddp"] - 1e-9
