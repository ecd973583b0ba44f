"""Small hand-built workloads and clusters for simulator tests."""

from __future__ import annotations

from collections.abc import Sequence

from commsched.cluster import Cluster
from commsched.workload import Workload


def make_workload(
    forward_ms: Sequence[float],
    backward_ms: Sequence[float],
    numel: Sequence[int],
    *,
    tensors_per_layer: int = 1,
    batch_size: int = 32,
    model: str = "synthetic",
) -> Workload:
    """Layers in forward order, each with ``tensors_per_layer`` tensors sharing ``numel[l]`` elements.

    Gradient-ready times are left out, so every tensor of a layer is ready when
    that layer's backward ends: r_l = Σ_{j >= l} b_j.
    """
    layers = []
    for li, (f, b, n) in enumerate(zip(forward_ms, backward_ms, numel, strict=True)):
        sizes = [n // tensors_per_layer] * tensors_per_layer
        sizes[-1] += n - sum(sizes)
        tensors = [{"name": f"l{li}.t{k}", "numel": s} for k, s in enumerate(sizes) if s > 0]
        layers.append({"name": f"l{li}", "tensors": tensors, "forward_ms": f, "backward_ms": b})
    return Workload.from_dict(
        {
            "model": model,
            "batch_size": batch_size,
            "device": "test",
            "layers": layers,
            "provenance": {"kind": "estimated", "source": "test"},
        }
    )


def make_cluster(
    workers: int = 2,
    gbps: float = 8.0,
    latency_us: float = 0.0,
    overhead_us: float = 0.0,
    *,
    speeds: Sequence[float] | None = None,
    per_node: int = 1,
    intra_gbps: float = 100.0,
    intra_latency_us: float = 0.0,
    servers: int = 0,
) -> Cluster:
    """``workers`` devices, ``per_node`` per node; ``speeds`` per rank (default 1.0)."""
    speeds = list(speeds) if speeds is not None else [1.0] * workers
    assert len(speeds) == workers and workers % per_node == 0
    nic = {"bandwidth_gbps": gbps, "latency_us": latency_us, "per_message_overhead_us": overhead_us}
    nodes = []
    for n in range(workers // per_node):
        devices = [
            {"name": f"gpu{speeds[r]:g}", "speed": speeds[r], "memory_gib": 16}
            for r in range(n * per_node, (n + 1) * per_node)
        ]
        node: dict[str, object] = {"name": f"n{n}", "devices": devices, "nic": nic}
        if per_node > 1:
            node["intra"] = {"bandwidth_gbps": intra_gbps, "latency_us": intra_latency_us}
        nodes.append(node)
    spec: dict[str, object] = {"name": f"test-{workers}", "nodes": nodes}
    if servers:
        spec["servers"] = {"count": servers, "colocated": False, "link": nic}
    return Cluster.from_dict(spec)
