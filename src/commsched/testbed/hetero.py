"""A testbed whose workers differ: per-worker CPU speed (cgroups) and per-worker link shapes.

Heterogeneous clusters on one machine: each worker its own share of the CPU
(:class:`~commsched.testbed.cgroups.CpuShare`: cores and a quota) and its own
link (:class:`~commsched.testbed.LinkShape`, both directions)::

    shares = [CpuShare(cpus=(0,)), CpuShare(cpus=(1,), quota=0.5), CpuShare(cpus=(1,), quota=0.5)]
    links = [LinkShape(rate_bps=10**10), LinkShape(rate_bps=10**9), LinkShape(rate_bps=10**9)]
    with HeteroTestbed(NetnsTestbed(3), cpu=shares, links=links) as bed:
        run_workers(bed, argv, log_dir=logs, timeout_s=600)

Everything it made is removed when it closes, as with the testbed it wraps.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from commsched.testbed.base import Log, Testbed
from commsched.testbed.cgroups import CpuCgroups, CpuShare
from commsched.testbed.commands import LinkShape, worker_shaping_commands
from commsched.testbed.netns import NetnsTestbed
from commsched.testbed.system import TestbedError, _stderr, run_command


class HeteroTestbed(Testbed):
    """``inner`` (a :class:`NetnsTestbed` or the loopback fallback) with per-worker CPU and link shapes.

    ``cpu``: one :class:`CpuShare` per worker (cgroups; needs root). ``links``:
    one :class:`LinkShape` per worker link, both directions (needs
    :class:`NetnsTestbed`). ``cpu_priority``: see :class:`CpuCgroups`. Closing
    it kills the workers, removes the cgroups, then closes ``inner``.
    """

    def __init__(
        self,
        inner: Testbed,
        *,
        cpu: Sequence[CpuShare] | None = None,
        links: Sequence[LinkShape] | None = None,
        cpu_priority: bool = True,
        log: Log = _stderr,
    ) -> None:
        super().__init__(inner.workers)
        self.inner = inner
        self.isolation = inner.isolation
        self.links: list[LinkShape] | None = None
        self.cgroups: CpuCgroups | None = None
        try:
            for what, items in (("cpu", cpu), ("links", links)):
                if items is not None and len(items) != inner.workers:
                    raise TestbedError(f"{what}: expected one per worker ({inner.workers}), got {len(items)}")
            if cpu is not None:
                self.cgroups = CpuCgroups(cpu, priority=cpu_priority, log=log)
            if links is not None:
                self.set_links(links)
        except BaseException:
            self.close()
            raise

    def command(self, rank: int, argv: list[str]) -> list[str]:
        inner = self.inner.command(rank, argv)
        return inner if self.cgroups is None else self.cgroups.wrap(rank, inner)

    def env(self, slot: int, rank: int, world: int, master_slot: int, port: int) -> dict[str, str]:
        return self.inner.env(slot, rank, world, master_slot, port)

    def master_port(self, launch: int) -> int:
        return self.inner.master_port(launch)

    def set_shape(self, shape: LinkShape) -> None:
        """The same shape on every link (replaces per-worker shapes)."""
        self.inner.set_shape(shape)
        self.shape = shape
        self.links = None

    def set_links(self, links: Sequence[LinkShape]) -> None:
        """Worker ``r``'s link shaped as ``links[r]``, both directions."""
        if not isinstance(self.inner, NetnsTestbed):
            if any(s.shaped for s in links):
                raise TestbedError(f"links: per-worker shaping needs network namespaces ({self.inner.describe()})")
            return
        for shape in links:
            self.inner.check_shape(shape)
        self.inner.clear_shaping()
        self.links = None
        for r, shape in enumerate(links):
            for argv in worker_shaping_commands(self.inner.layout, r, shape):
                run_command(argv)
        self.inner.set_link_loss({r: shape.loss_pct for r, shape in enumerate(links)})
        self.links = list(links)

    def spawn(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
        return self.inner.spawn(argv, env, log_path)

    def kill_workers(self, grace_s: float = 3.0) -> None:
        self.inner.kill_workers(grace_s)

    def describe(self) -> str:
        parts = [self.inner.describe()]
        if self.links is not None:
            parts.append("links " + ", ".join(f"w{r} {s.description}" for r, s in enumerate(self.links)))
        if self.cgroups is not None:
            parts.append("CPU " + self.cgroups.describe())
        return "; ".join(parts)

    def close(self) -> None:
        try:
            self.inner.kill_workers()
            if self.cgroups is not None:
                self.cgroups.close()
        finally:
            self.inner.close()
