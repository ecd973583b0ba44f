"""The kernel's UDP drop counters, read from /proc files (here: recorded copies)."""

from __future__ import annotations

from pathlib import Path

from commsched.transport.dlcp.kernel import udp_rcvbuf_errors, udp_socket_drops

SNMP = """Ip: Forwarding DefaultTTL
Ip: 1 64
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 78072 0 12 78073 9 0 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 5 0 0 0 0
"""
UDP = """   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  101: 0100007F:A1B2 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000 17
  102: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000 4
"""  # noqa: E501
UDP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  7: 00000000000000000000000001000000:A1B3 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000 2
"""  # noqa: E501


def test_rcvbuf_errors_add_udp_and_udp6_but_not_udplite(tmp_path: Path) -> None:
    (tmp_path / "snmp").write_text(SNMP)
    assert udp_rcvbuf_errors(tmp_path) == 9
    (tmp_path / "snmp6").write_text("Udp6InDatagrams 5\nUdp6RcvbufErrors                \t3\n")
    assert udp_rcvbuf_errors(tmp_path) == 12


def test_socket_drops_sum_the_sockets_on_the_given_ports(tmp_path: Path) -> None:
    (tmp_path / "udp").write_text(UDP)
    (tmp_path / "udp6").write_text(UDP6)
    assert udp_socket_drops({0xA1B2, 0xA1B3}, tmp_path) == 19
    assert udp_socket_drops({9}, tmp_path) == 0


def test_unreadable_counters_are_none(tmp_path: Path) -> None:
    assert udp_rcvbuf_errors(tmp_path) is None and udp_socket_drops({1}, tmp_path) is None
    assert udp_rcvbuf_errors() is not None  # this machine's own /proc
