"""How bytes move for one task: a transport per task, chosen by the plan.

A :class:`~commsched.schedule.base.CommTask` names its transport
(``task.transport``); the runtime opens the transports its plan needs with
:func:`open_transports` and starts each task with ``transport.start(task, buffer)``,
which returns a :class:`Handle` at once. The transports of :data:`TRANSPORTS`:
``"collective"`` (gloo/NCCL all-reduce, ring reduce-scatter/all-gather:
:mod:`commsched.transport.collectives`) and ``"ps"`` (a parameter server on
every rank, :mod:`commsched.transport.exchange` over the authenticated TCP
mesh of :mod:`commsched.transport.tcp`); a bounded-loss transport registers a
factory there and nothing else changes.

A transport knows nothing of policies. It may give up on at most
``task.loss_bound`` of a task's bytes (0 for every transport today).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from commsched._lazy import lazy_getattr

if TYPE_CHECKING:
    from commsched.transport.base import (
        TRANSPORTS,
        TaskBuffer,
        Transport,
        TransportOptions,
        check_transports,
        open_transports,
        prepare_transport,
    )
    from commsched.transport.collectives import Collectives
    from commsched.transport.handles import Handle

#: Where each public name lives. Imported on first use (PEP 562), so that the torch-free
#: state machines under this package (``transport.dlcp.protocol``, ``rate``) load without torch,
#: as the packet-level simulator needs.
_HOMES = {
    "TRANSPORTS": "base",
    "TaskBuffer": "base",
    "Transport": "base",
    "TransportOptions": "base",
    "check_transports": "base",
    "open_transports": "base",
    "prepare_transport": "base",
    "Collectives": "collectives",
    "Handle": "handles",
}


__getattr__ = lazy_getattr(__name__, _HOMES)


__all__ = [
    "TRANSPORTS",
    "Collectives",
    "Handle",
    "TaskBuffer",
    "Transport",
    "TransportOptions",
    "check_transports",
    "open_transports",
    "prepare_transport",
]
