"""Releasing the process groups a run created, so that repeated runs in one process do not pile them up.

Every ``dist.new_group`` on gloo starts three threads (two workers and a TCP
event loop) and keeps its connections until the group is destroyed *and* no
Python object refers to it any more. A process that calls ``parallelize``
again and again (a benchmark running one policy after another, a sweep) kept
every earlier run's groups: a worker of the 2-worker testbed had 622 threads
and 2.3 GB by the ninth of ten repeats of a session (12 runs each), and 64 of
its 76 event loops woke in a 10 s sample.

Destroying a group is not always safe in torch (<= 2.13): a group made with
``use_local_synchronization`` is named by a hash of its ranks and of the
number of live groups, so destroying any group can give a later locally
synchronised group the name, and the stale rendezvous keys, of an earlier
one. Sequentially named groups (``new_group`` over ranks every member calls
it on, without local synchronisation) never reuse a name. So groups are
released only while every live group has a sequential name; otherwise they
are left registered, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.distributed as dist


def names_are_sequential() -> bool:
    """Whether every live process group of this process has a sequential (numeric) name.

    Reads torch's registry of live groups (``distributed_c10d._world.pg_names``); where a torch without
    it is installed, False (nothing is destroyed)."""
    world = getattr(dist.distributed_c10d, "_world", None)
    names = getattr(world, "pg_names", None)
    if names is None:
        return False
    return all(str(name).isdigit() for name in names.values())


def release_groups(groups: Iterable[dist.ProcessGroup | None]) -> bool:
    """Destroy ``groups`` (None entries skipped) when that is safe (the module docstring); True if done.

    The caller must also drop its own references: a destroyed group's threads end only when the last
    reference does. Every op on the groups must have finished on this rank."""
    mine = [g for g in groups if g is not None and g is not dist.GroupMember.NON_GROUP_MEMBER]
    if not mine or not dist.is_initialized() or not names_are_sequential():
        return False
    for group in mine:
        if group in dist.distributed_c10d._world.pg_map:
            dist.destroy_process_group(group)
    return True
