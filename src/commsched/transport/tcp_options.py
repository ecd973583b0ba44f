"""Socket options for the runtime's own TCP connections (the ``ps`` transport, the leader's decisions,
DLCP's control connections), tuned for a cluster's short paths. No torch: DLCP's I/O imports it."""

from __future__ import annotations

import contextlib
import socket
import sys

#: The retransmission timeout's floor on the runtime's own TCP connections, and the delayed-ACK ceiling
#: that keeps a lone segment's ACK near it (where the kernel's tick allows no less, both are one value).
#: Linux's defaults (200 ms for both) suit the internet; on a cluster's sub-millisecond paths a lost segment
#: at the end of a small message (a decision, a push of a bias, a control message) otherwise stalls its
#: receiver 200 ms or more, and longer at each back-off: on the emulated switch at 1 % loss that doubled the
#: median iteration of ``ps``, ``dlcp`` and ``bytescheduler`` (docs/dlcp.md, "Small messages under loss").
#: The kernel rounds both up to its timer tick.
RTO_MIN_US = 8_000
DELACK_MAX_US = 2_000
# Linux's socket options (include/uapi/linux/tcp.h, since 6.15; earlier kernels refuse them and keep
# their defaults); Python's socket module does not name them yet.
_TCP_THIN_LINEAR_TIMEOUTS = 16  # since 2.6.34
_TCP_RTO_MIN_US = 45
_TCP_DELACK_MAX_US = 46


def tune_for_cluster(sock: socket.socket) -> bool:
    """No Nagle delay; where the kernel allows, :data:`RTO_MIN_US` and :data:`DELACK_MAX_US` on ``sock``,
    and linear rather than exponential back-off while few segments are in flight (thin streams).
    Returns whether the retransmission floor was set (False on kernels before 6.15, whose defaults stay,
    and off Linux, where these option numbers mean other things)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_THIN_LINEAR_TIMEOUTS, 1)
    if not _set_at_least(sock, _TCP_RTO_MIN_US, RTO_MIN_US):
        return False
    _set_at_least(sock, _TCP_DELACK_MAX_US, DELACK_MAX_US)
    return True


def _set_at_least(sock: socket.socket, option: int, us: int) -> bool:
    """Set a timer option to ``us``, or to the nearest value above it the kernel takes (a kernel with a 4 ms
    tick refuses 4 ms and less, and takes 5 ms as 8); False when it takes none up to its 200 ms default."""
    while us <= 200_000:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, us)
        except OSError:
            us *= 2
            continue
        return True
    return False
