"""``commsched profile``, ``commsched profile network`` and ``commsched profile compare-trace`` end to end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import commsched.profile
from commsched.cli import cli
from commsched.cluster import Cluster
from commsched.models import build_model
from commsched.profile import NetworkProbe, ProbeSample, fit_alpha_beta
from commsched.sim import CommModel
from commsched.trace import Trace, TraceEvent
from commsched.workload import Workload


@pytest.fixture(autouse=True)
def keep_threads() -> Iterator[None]:
    """``--threads`` sets torch's thread count for the whole (test) process: put it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _invoke(*args: str, stdout_only: bool = False) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), terminal_width=200)
    return result.exit_code, result.stdout if stdout_only else result.output


def test_profile_a_small_model_prints_a_table_and_writes_the_workload(tmp_path: Path) -> None:
    out = tmp_path / "cnn.cpu.json"
    code, text = _invoke(
        "profile", "--model", "cnn", "--batch", "2", "--repeats", "1", "--warmup", "0", "--threads", "1", "-o", str(out)
    )
    assert code == 0, text
    w = Workload.load(out)
    names = [n for n, _ in build_model("cnn").named_parameters()]
    assert sorted(t.name for t in w.tensors) == sorted(names)
    assert (w.model, w.batch_size, w.device, w.dtype) == ("cnn", 2, "cpu", "fp32")
    assert w.provenance.command is not None and w.provenance.command.startswith("commsched")
    for layer in w.layers:
        assert layer.name in text
    assert "whole iteration without hooks" in text


def test_profile_rejects_an_unknown_model_and_missing_options() -> None:
    code, text = _invoke("profile", "--model", "nope", "--batch", "2")
    assert code == 1 and "no model 'nope'" in text and "resnet5m" in text
    code, text = _invoke("profile", "--model", "cnn")
    assert code == 2 and "--batch" in text
    code, text = _invoke("profile", "--list")
    assert code == 0 and "transformer" in text


def test_compare_trace_reports_errors_as_json(tmp_path: Path) -> None:
    pred, meas = Trace(), Trace()
    for k in range(3):
        pred.add(TraceEvent("bucket0", "all_reduce", 0, k, k + 0.010, 100, k))
        meas.add(TraceEvent("bucket0", "all_reduce", 0, k, k + 0.008, 100, k))
    pred.save(tmp_path / "p.json")
    meas.save_chrome(tmp_path / "m.json")
    args = ("profile", "compare-trace", "-p", str(tmp_path / "p.json"), "-m", str(tmp_path / "m.json"))
    code, text = _invoke(*args, "--json", stdout_only=True)
    assert code == 0, text
    data = json.loads(text)
    assert data["rows"][0]["error_pct"] == pytest.approx(25.0)
    assert data["iteration_ms"]["measured"] == pytest.approx(1000.0)
    code, text = _invoke(*args)
    assert code == 0 and "+25.0" in text


def test_profile_network_prints_alpha_beta_and_writes_a_cluster_that_reproduces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe itself runs in test_profile_network.py; here it returns exact ring times (p=2, α=50 µs, 1 ns/B)."""
    calls: list[tuple[int, list[int]]] = []

    def fake_probe(world: int, sizes: list[int], repeats: int, **kwargs: object) -> NetworkProbe:
        calls.append((world, list(sizes)))
        samples = []
        for n in sizes:
            ring = {"all_reduce": 2 * 50e-6 + n * 1e-9, "reduce_scatter": 50e-6 + n * 0.5e-9}
            ring["all_gather"] = ring["reduce_scatter"]
            samples += [ProbeSample(op, n, world, (t,) * repeats) for op, t in ring.items()]
        fit = fit_alpha_beta(samples)
        return NetworkProbe(fit.alpha_s, fit.beta_s_per_byte, tuple(samples))

    monkeypatch.setattr(commsched.profile, "probe_local", fake_probe)
    yaml_path = tmp_path / "measured.yaml"
    args = ("profile", "network", "--world", "2", "--min-kib", "16", "--max-kib", "1024", "-r", "2")
    code, text = _invoke(*args, "--cluster-out", str(yaml_path), "--json", stdout_only=True)
    assert code == 0, text
    assert calls == [(2, [16 << 10, 64 << 10, 256 << 10, 1024 << 10])]
    data = json.loads(text)
    assert data["alpha_s"] == pytest.approx(50e-6) and data["beta_s_per_byte"] == pytest.approx(1e-9)
    assert data["fits"]["reduce_scatter"]["alpha_s"] == pytest.approx(50e-6)
    cluster = Cluster.load(yaml_path)
    assert cluster.num_workers == 2 and cluster.nodes[0].nic.latency_us == pytest.approx(50.0)
    assert CommModel.from_cluster(cluster).cost_s("all_reduce", 1 << 20) == pytest.approx(100e-6 + (1 << 20) * 1e-9)
    code, text = _invoke(*args)
    assert code == 0 and "alpha = 50.0 µs per ring step" in text and "8.00 Gbit/s" in text
