"""The runtime's TCP connections take a cluster's timers where the kernel allows it."""

from __future__ import annotations

import contextlib
import socket

from commsched.transport import tcp_options
from commsched.transport.tcp_options import DELACK_MAX_US, RTO_MIN_US, tune_for_cluster


def test_tuning_sets_no_delay_and_where_the_kernel_allows_the_timer_floors_rounded_to_its_tick() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        default_rto = None
        with contextlib.suppress(OSError):
            default_rto = sock.getsockopt(socket.IPPROTO_TCP, tcp_options._TCP_RTO_MIN_US)
        tuned = tune_for_cluster(sock)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert tuned == (default_rto is not None)  # a kernel that reads the option also takes it
        if tuned:
            rto = sock.getsockopt(socket.IPPROTO_TCP, tcp_options._TCP_RTO_MIN_US)
            delack = sock.getsockopt(socket.IPPROTO_TCP, tcp_options._TCP_DELACK_MAX_US)
            assert RTO_MIN_US <= rto <= 4 * RTO_MIN_US, rto  # raised to what the timer tick allows (1-10 ms)
            assert DELACK_MAX_US <= delack <= rto, delack  # a lone segment's ACK no later than a resend
