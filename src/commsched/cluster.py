"""Where training runs: nodes, their GPUs, and the links between them.

A :class:`Cluster` is read from YAML (a shipped preset such as ``64xV100-10GbE``
or a file the user wrote) and validated with messages that name the field and
the value (``nodes[1].nic.bandwidth_gbps: must be > 0, got -3``). Heterogeneous
clusters are first-class: every node has its own NIC, and every device its own
relative speed, optionally per model.

Conventions:

* ``speed`` is compute speed relative to the device a workload was profiled on
  (2.0 = finishes the same work in half the time). ``model_speed`` overrides it
  for named models, for when one number does not fit every model.
  ``model_batch_ms`` gives, per model, the device's measured forward +
  backward milliseconds at two or more local batch sizes: where present,
  compute time follows those points as the batch changes (a fixed cost per
  iteration, a device that gets more efficient with larger batches) instead
  of growing in proportion to the batch (:mod:`commsched.sim.compute`).
  ``overlap_ms_per_mb`` is how much longer the device's compute takes per MiB
  of gradients all-reduced beside it, as measured on its host (the
  communication's CPU work, the kernel's packet processing and whatever else
  the two contend for); where set, the simulator charges it instead of its
  ``cpu_ms_per_mb`` option (:class:`commsched.sim.SimOptions`).
  ``overlap_ms_per_task`` is the same per communication task, whatever its
  size (starting it, handing its completion back to the training process),
  charged instead of ``cpu_per_task_ms``. ``overlap_comm_rate`` is the
  other side of the same contention: the share of its uncontended rate a
  collective keeps while the device's host computes (on a CPU quota the
  communication threads wait for the compute's slice), measured beside a
  backward pass; unset, transfers keep their rate.
* ``bandwidth_gbps`` is the line rate in Gbit/s (10 GbE -> 10). ``latency_us`` is
  the one-way latency of one message; ``per_message_overhead_us`` is the fixed
  software cost of sending one (a collective step, a PS push).
* ``nic`` is a node's link to the other nodes, ``intra`` the GPU-to-GPU link
  inside it (NVLink, PCIe). ``intra`` may be left out on single-device nodes.
* Ranks are assigned node by node, in the order the nodes are listed.

YAML accepts a shorthand for nodes of identical devices, ``count: 4`` with one
``device:``, which is expanded into ``devices``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, StrictBool, ValidationError, ValidationInfo, field_validator, model_validator

from commsched.cluster_parts import BatchCurve, Count, Device, Link, SpecModel
from commsched.errors import SpecError, spec_error_from_pydantic
from commsched.spec_files import read_text

__all__ = [
    "BatchCurve",
    "Cluster",
    "Device",
    "Link",
    "Node",
    "ParameterServers",
    "Worker",
    "list_presets",
    "load_cluster",
]


class Node(SpecModel):
    """One machine: its devices, its NIC, and the link between its devices.

    ``count`` and ``device`` are the input shorthand for ``count`` identical
    devices; after validation they are expanded into ``devices`` and read None.
    """

    name: str = Field(min_length=1)
    devices: tuple[Device, ...] = ()
    count: Count | None = Field(None, exclude=True, repr=False)
    device: Device | None = Field(None, exclude=True, repr=False)
    nic: Link
    intra: Link | None = Field(None, validate_default=True)

    @field_validator("intra")
    @classmethod
    def _intra_when_several_devices(cls, value: Link | None, info: ValidationInfo) -> Link | None:
        n = len(info.data.get("devices") or ()) or info.data.get("count") or 0
        if value is None and n > 1:
            raise ValueError(f"is required: the node has {n} devices")
        return value

    @model_validator(mode="after")
    def _expand_shorthand(self) -> Node:
        shorthand = self.count is not None or self.device is not None
        if shorthand and self.devices:
            raise ValueError("give either `devices` or `count` + `device`, not both")
        if shorthand:
            if self.count is None or self.device is None:
                raise ValueError("`count` and `device` go together: give both, or a `devices` list")
            object.__setattr__(self, "devices", (self.device,) * self.count)
            object.__setattr__(self, "count", None)
            object.__setattr__(self, "device", None)
        if not self.devices:
            raise ValueError("has no devices: give `devices`, or `count` + `device`")
        return self


class ParameterServers(SpecModel):
    """Parameter servers, for PS-based policies.

    Dedicated servers (``colocated: false``) each have their own ``link``.
    Colocated servers run one per node on the first ``count`` nodes and share
    that node's NIC, so ``link`` is left out.
    """

    count: Count
    colocated: StrictBool = False
    link: Link | None = Field(None, validate_default=True)

    @field_validator("link")
    @classmethod
    def _link_iff_dedicated(cls, value: Link | None, info: ValidationInfo) -> Link | None:
        colocated = info.data.get("colocated")
        if colocated is False and value is None:
            raise ValueError("is required for dedicated servers (colocated: false)")
        if colocated and value is not None:
            raise ValueError("must be left out when colocated: a colocated server uses its node's nic")
        return value


@dataclass(frozen=True, slots=True)
class Worker:
    """One training process and the device it drives."""

    rank: int
    node: int
    local_rank: int
    node_name: str
    device: Device
    nic: Link
    intra: Link | None


class Cluster(SpecModel):
    """Nodes (in rank order) and, optionally, parameter servers."""

    name: str = Field(min_length=1)
    description: str = ""
    nodes: tuple[Node, ...]
    servers: ParameterServers | None = None

    @field_validator("nodes")
    @classmethod
    def _nodes_non_empty_and_unique(cls, nodes: tuple[Node, ...]) -> tuple[Node, ...]:
        # (not `min_length`: pydantic would also report it when every node is invalid)
        if not nodes:
            raise ValueError("must list at least one node")
        first: dict[str, int] = {}
        for i, node in enumerate(nodes):
            if node.name in first:
                raise ValueError(f"name {node.name!r} is used by nodes[{first[node.name]}] and nodes[{i}]")
            first[node.name] = i
        return nodes

    @field_validator("servers")
    @classmethod
    def _colocated_fit(cls, servers: ParameterServers | None, info: ValidationInfo) -> ParameterServers | None:
        nodes = info.data.get("nodes")
        if servers is not None and servers.colocated and nodes is not None and servers.count > len(nodes):
            raise ValueError(f"count must be <= {len(nodes)} (one colocated server per node), got {servers.count}")
        return servers

    # ---- derived quantities (cached: the model is frozen) ----

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Cluster:
        """pydantic's copy (not re-validated), minus the cached ``workers``, which ``update`` may have made stale."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("workers", None)
        return copy

    @cached_property
    def workers(self) -> tuple[Worker, ...]:
        """One Worker per device; ranks go node by node, in listed order."""
        out: list[Worker] = []
        for ni, node in enumerate(self.nodes):
            for li, device in enumerate(node.devices):
                out.append(Worker(len(out), ni, li, node.name, device, node.nic, node.intra))
        return tuple(out)

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def is_homogeneous(self) -> bool:
        """Every device, every NIC and every intra-node link is the same."""
        first = self.nodes[0]
        multi = [node.intra for node in self.nodes if len(node.devices) > 1]
        return (
            all(w.device == first.devices[0] for w in self.workers)
            and all(node.nic == first.nic for node in self.nodes)
            and all(intra == multi[0] for intra in multi)
        )

    def worker_speed(self, rank: int, model: str | None = None) -> float:
        """Relative compute speed of ``rank``, for ``model`` if its device lists one."""
        if not 0 <= rank < self.num_workers:
            raise IndexError(f"rank {rank} is out of range: the cluster has {self.num_workers} workers")
        return self.workers[rank].device.speed_for(model)

    def worker_speeds(self, model: str | None = None) -> tuple[float, ...]:
        """``worker_speed`` of every rank, in rank order."""
        return tuple(w.device.speed_for(model) for w in self.workers)

    def worker_batch_curves(self, model: str | None = None) -> tuple[BatchCurve, ...]:
        """Every rank's measured ``(batch, ms)`` points for ``model``, sorted by batch; ``()`` where none."""
        return tuple(w.device.batch_curve_for(model) for w in self.workers)

    def worker_overlap_ms_per_mb(self) -> tuple[float | None, ...]:
        """Every rank's device ``overlap_ms_per_mb`` (``None`` where the spec leaves it to the simulator)."""
        return tuple(w.device.overlap_ms_per_mb for w in self.workers)

    def worker_overlap_ms_per_task(self) -> tuple[float | None, ...]:
        """Every rank's device ``overlap_ms_per_task`` (``None`` where the spec leaves it to the simulator)."""
        return tuple(w.device.overlap_ms_per_task for w in self.workers)

    def worker_overlap_comm_rate(self) -> tuple[float | None, ...]:
        """Every rank's device ``overlap_comm_rate`` (``None`` where transfers keep their rate beside compute)."""
        return tuple(w.device.overlap_comm_rate for w in self.workers)

    @property
    def bottleneck_nic_gbps(self) -> float:
        """The slowest node NIC: what caps a collective that crosses every node."""
        return min(node.nic.bandwidth_gbps for node in self.nodes)

    @property
    def ring_bottleneck_gbps(self) -> float:
        """The slowest link a ring over all workers crosses (NICs if >1 node, intra links of multi-device nodes)."""
        links = [node.intra for node in self.nodes if len(node.devices) > 1 and node.intra is not None]
        if self.num_nodes > 1:
            links.extend(node.nic for node in self.nodes)
        return min((link.bandwidth_gbps for link in links), default=math.inf)

    @property
    def server_links(self) -> tuple[Link, ...]:
        """Each parameter server's link (its own, or its host node's NIC if colocated); () without servers."""
        if self.servers is None:
            return ()
        if self.servers.colocated:
            return tuple(self.nodes[i].nic for i in range(self.servers.count))
        assert self.servers.link is not None  # enforced by validation
        return (self.servers.link,) * self.servers.count

    @property
    def total_memory_gib(self) -> float:
        return sum(w.device.memory_gib for w in self.workers)

    # ---- (de)serialisation ----

    def to_dict(self) -> dict[str, Any]:
        """Plain data, defaults left out; nodes of identical devices use the ``count`` shorthand."""
        data = self.model_dump(exclude_defaults=True)
        for node, raw in zip(self.nodes, data["nodes"], strict=True):
            devices = raw.pop("devices")
            if all(d == node.devices[0] for d in node.devices):
                extra = {"count": len(devices), "device": devices[0]}
            else:
                extra = {"devices": devices}
            nic, intra = raw.pop("nic"), raw.pop("intra", None)
            raw.update(extra, nic=nic)
            if intra is not None:
                raw["intra"] = intra
        return data

    def to_yaml(self) -> str:
        return yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False, width=100)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())

    @classmethod
    def from_dict(cls, data: object, source: str = "cluster") -> Cluster:
        if not isinstance(data, dict):
            raise SpecError(source, [f"<root>: must be a mapping of cluster fields, got {type(data).__name__}"])
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise spec_error_from_pydantic(source, exc) from None

    @classmethod
    def from_yaml(cls, text: str, source: str = "cluster") -> Cluster:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(source, [_yaml_problem(exc)]) from None
        return cls.from_dict(data, source)

    @classmethod
    def load(cls, path: str | Path) -> Cluster:
        return cls.from_yaml(read_text(path), source=str(path))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "<yaml>"
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    return f"{where}: not valid YAML ({problem}{f', {context}' if context else ''})"


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors and aliases: every node written out in full."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# ---- presets ----


def _preset_dir() -> Any:
    return resources.files("commsched").joinpath("presets")


def list_presets() -> tuple[str, ...]:
    """Names of the shipped cluster presets, sorted."""
    return tuple(sorted(p.name[: -len(".yaml")] for p in _preset_dir().iterdir() if p.name.endswith(".yaml")))


def load_cluster(preset_or_path: str | Path) -> Cluster:
    """A shipped preset by name (``"64xV100-10GbE"``) or a YAML file by path.

    An existing file wins over a preset of the same name. Raises SpecError for
    an unknown name (listing the presets), an unreadable file, invalid YAML
    (with its line) or an invalid cluster.
    """
    text = str(preset_or_path)
    path = Path(text)
    if path.is_file():
        return Cluster.load(path)
    if text in list_presets():
        resource = _preset_dir().joinpath(f"{text}.yaml")
        return Cluster.from_yaml(resource.read_text(), source=f"preset {text}")
    if path.suffix in (".yaml", ".yml") or "/" in text:
        raise SpecError(text, ["<file>: no such file"])
    raise SpecError(
        "cluster",
        [f"{text!r} is neither a preset nor a file; presets: {', '.join(list_presets())}"],
    )
