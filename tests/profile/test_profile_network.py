"""α-β fitting, the measured cluster, and the probe across two local gloo processes."""

from __future__ import annotations

import math

import pytest

from commsched import zoo
from commsched.errors import SpecError
from commsched.profile import ProbeSample, fit_alpha_beta, measured_cluster, probe_local
from commsched.sim import CommModel, simulate

SIZES = (4096, 65536, 1 << 20, 16 << 20)


def _ring_samples(p: int, alpha_s: float, beta: float) -> list[ProbeSample]:
    """Exact ring times (the formulas of sim/costs.py) for every op at every size."""
    out = []
    for n in SIZES:
        ar = 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * n * beta
        half = (p - 1) * alpha_s + (p - 1) / p * n * beta
        out += [
            ProbeSample("all_reduce", n, p, (ar, ar * 1.01, ar * 0.99)),
            ProbeSample("reduce_scatter", n, p, (half,)),
            ProbeSample("all_gather", n, p, (half,)),
        ]
    return out


@pytest.mark.parametrize("p", [2, 4, 16])
def test_fit_recovers_the_per_step_alpha_and_per_byte_beta_of_an_exact_ring(p: int) -> None:
    samples = _ring_samples(p, alpha_s=40e-6, beta=1e-9)
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        fit = fit_alpha_beta(samples, op)
        assert math.isclose(fit.alpha_s, 40e-6, rel_tol=1e-6), op
        assert math.isclose(fit.beta_s_per_byte, 1e-9, rel_tol=1e-6), op
        assert math.isclose(fit.bandwidth_gbps, 8.0, rel_tol=1e-6)
        assert fit.relative_residual < 1e-9 and fit.world_size == p


def test_fit_refits_a_negative_intercept_through_the_origin() -> None:
    # times proportional to size, minus a little: an unconstrained line would cross below zero
    samples = [ProbeSample("all_reduce", n, 2, (n * 1e-9 - 1e-6,)) for n in SIZES]
    fit = fit_alpha_beta(samples)
    assert fit.alpha_s == 0.0 and fit.intercept_s == 0.0
    assert fit.beta_s_per_byte > 0


def test_fit_needs_two_sizes_and_a_world_of_two() -> None:
    with pytest.raises(SpecError, match="two message sizes"):
        fit_alpha_beta([ProbeSample("all_reduce", 4096, 2, (1e-3,))])
    with pytest.raises(SpecError, match="world size >= 2"):
        fit_alpha_beta([ProbeSample("all_reduce", n, 1, (1e-3,)) for n in SIZES])


@pytest.mark.parametrize("p", [2, 4, 64])
def test_measured_cluster_makes_the_simulator_reproduce_the_fit(p: int) -> None:
    samples = _ring_samples(p, alpha_s=25e-6, beta=2.5e-9)
    fits = {op: fit_alpha_beta(samples, op) for op in ("all_reduce", "reduce_scatter")}
    cluster = measured_cluster(fits["all_reduce"].alpha_s, fits["all_reduce"].beta_s_per_byte, p)
    assert cluster.num_workers == p and cluster.num_nodes == p
    assert cluster.worker_speeds() == (1.0,) * p
    model = CommModel.from_cluster(cluster)
    for n in SIZES:
        for op, fit in fits.items():
            assert math.isclose(model.cost_s(op, n), fit.predict_s(n), rel_tol=1e-9), (op, n)


def test_measured_cluster_rejects_a_non_positive_beta() -> None:
    with pytest.raises(SpecError, match="beta_s_per_byte"):
        measured_cluster(1e-5, 0.0, 2)


@pytest.mark.multiproc
def test_probe_on_two_local_gloo_processes_fits_a_cluster_the_simulator_accepts() -> None:
    lines: list[str] = []
    # Sizes three decades apart, 5 repeats: on a loaded 2-core machine a 16x step (4 MiB vs 256 KiB) with 3
    # repeats was seen to fit a negative slope.
    probe = probe_local(2, (16 << 10, 1 << 20, 16 << 20), repeats=5, warmup=1, timeout_s=120, progress=lines.append)
    alpha_s, beta, samples = probe
    assert alpha_s >= 0 and beta > 0  # on loopback the per-step cost can fit to zero (a fit through the origin)
    assert {s.op for s in samples} == {"all_reduce", "reduce_scatter", "all_gather"}
    assert all(len(s.seconds) == 5 and s.median_s > 0 for s in samples)
    assert len(lines) == 3  # one progress line per size
    for op in ("reduce_scatter", "all_gather"):
        assert probe.fit(op).beta_s_per_byte > 0
    cluster = probe.cluster()
    result = simulate(zoo.load("resnet18"), cluster, "ddp", iterations=2, warmup=1)
    assert result.num_workers == 2 and result.iteration_ms > 0


def test_the_probe_times_the_parameter_server_transport_when_asked_and_fits_its_cpu_work() -> None:
    from commsched.profile.network import OPS, PS_OP
    from commsched.profile.probe_fit import fit_cpu

    probe = probe_local(2, (16 << 10, 1 << 20, 4 << 20), repeats=3, warmup=1, timeout_s=120, ops=(*OPS, PS_OP))
    ps = [s for s in probe.samples if s.op == PS_OP]
    assert [s.nbytes for s in ps] == [16 << 10, 1 << 20, 4 << 20]
    assert all(len(s.seconds) == 3 and s.median_s > 0 and len(s.cpu_seconds) == 3 for s in ps)
    # 4 MiB pushed and pulled take longer than 16 KiB (on loopback too: the bytes are copied and summed); the
    # fastest of each, as a busy host's stalls only add time (a 4 ms stall once made 16 KiB's median the larger)
    assert min(ps[-1].seconds) > min(ps[0].seconds)
    fit = fit_cpu(probe.samples, PS_OP)
    assert fit is not None and fit.op == PS_OP and fit.per_op_s >= 0 and fit.per_byte_s >= 0
    assert fit.per_op_s + fit.per_byte_s * (4 << 20) > 0
