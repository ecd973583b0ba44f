"""Thousands of malformed and forged datagrams at a receiving DlcpLink while real transfers run.

The real data must arrive exactly, and every bad datagram the socket
received must be counted by the reason it was refused (the kernel's own
drops on that socket, read from /proc/net/udp, are the only slack).
"""

from __future__ import annotations

import random
import socket
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch
from test_dlcp_link import KEY, data, pair

from commsched.errors import RuntimeCommError
from commsched.transport.dlcp.wire import DTYPE_CODES, HEADER, MAC_BYTES, MAGIC, VERSION, Codec, Kind, job_id
from commsched.transport.links import TransferKey

F32 = DTYPE_CODES["float32"]


def kernel_drops(port: int) -> int:
    """Datagrams the kernel dropped on the UDP socket bound to ``port`` (its receive buffer was full)."""
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            return int(fields[-1])
    return 0


def signed(key: bytes = KEY, payload: bytes = b"", **fields: int) -> bytes:
    f = dict(
        magic=MAGIC, version=VERSION, kind=Kind.DATA, job=job_id(key), step=0, task=0, phase=0, prio=0,
        importance=0, dtype=F32, rank=0, seq=0, offset=0, numel=4, total=1000, stride=4,
    )  # fmt: skip
    f.update(fields)
    body = HEADER.pack(*f.values()) + payload
    return body + Codec(key, 2).seal(body)


def garbage(rng: random.Random, n: int) -> list[tuple[str, bytes]]:
    """(the reason the link must give, the datagram)."""
    codec = Codec(KEY, 2)
    legit = codec.encode(Kind.DATA, 0, 0, 0, 0, dtype=F32, offset=0, numel=4, total=1000, stride=4, payload=bytes(16))
    out: list[tuple[str, bytes]] = []
    for i in range(n):
        kind = i % 10
        if kind == 0:
            blob = rng.randbytes(rng.randrange(0, HEADER.size + MAC_BYTES))
            out.append(("short", blob))
        elif kind == 1:
            out.append(("mac", rng.randbytes(rng.randrange(HEADER.size + MAC_BYTES, 1500))))
        elif kind == 2:
            flipped = bytearray(legit)
            bit = rng.randrange(len(flipped) * 8)
            flipped[bit // 8] ^= 1 << (bit % 8)
            out.append(("mac", bytes(flipped)))
        elif kind == 3:
            out.append(("mac", signed(key=bytes(32), payload=bytes(16))))  # another job's key
        elif kind == 4:
            out.append(("mac", legit[: rng.randrange(HEADER.size + MAC_BYTES, len(legit))]))  # truncated
        elif kind == 5:
            out.append(("range", signed(offset=1000, payload=bytes(16))))  # past the end
        elif kind == 6:
            out.append(("rank", signed(rank=5, payload=bytes(16))))  # no such rank
        elif kind == 7:
            out.append(("rank", signed(rank=1, payload=bytes(16))))  # the receiver's own rank
        elif kind == 8:
            out.append(("dtype", signed(dtype=77, payload=bytes(16))))
        else:  # a well-formed datagram for a posted receive, with the wrong size: a mismatch
            out.append(("mismatch", signed(step=7, task=99, phase=0, total=999_999, payload=bytes(16))))
    return out


def test_forged_and_malformed_datagrams_are_counted_and_never_written() -> None:
    a, b = pair(timeout_s=20.0)
    try:
        target = b._engine._peers[1].data[0]
        rng = random.Random(11)
        bad = garbage(rng, 5000)
        sents = [data(150_000 + i, seed=i) for i in range(4)]
        outs = [torch.full_like(s, float("nan")) for s in sents]
        recvs = [b.recv(0, TransferKey(7, i, 0), out) for i, out in enumerate(outs)]
        target_of_mismatches = b.recv(0, TransferKey(7, 99, 0), torch.full((1000,), float("nan")))

        def flood() -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
                for _reason, blob in bad:
                    raw.sendto(blob, target)

        flooder = threading.Thread(target=flood)
        flooder.start()
        sends = [a.send(1, TransferKey(7, i, 0), s) for i, s in enumerate(sents)]
        flooder.join()
        for recv, out, sent in zip(recvs, outs, sents, strict=True):
            assert recv.wait(20.0).lost == 0
            assert torch.equal(out, sent)
        for send in sends:
            send.wait(20.0)
        # the last datagrams of the flood may still be queued: poke the loop until the counts settle
        expected = Counter(reason for reason, _ in bad)
        stats = b.stats
        for _ in range(200):
            counted = sum(stats.rejected.values()) + stats.mismatch
            if counted >= len(bad) - kernel_drops(target[1]):
                break
            threading.Event().wait(0.01)
        drops = kernel_drops(target[1])
        for reason, count in expected.items():
            got = stats.mismatch if reason == "mismatch" else stats.rejected.get(reason, 0)
            assert count - drops <= got <= count, (reason, got, count, drops)
        assert set(stats.rejected) <= set(expected)
        with pytest.raises(RuntimeCommError, match="cancelled"):
            target_of_mismatches.wait(0.01)
        assert stats.records[-1].lost_numel == 1000
    finally:
        a.close()
        b.close()


def test_junk_and_idle_control_connections_are_cut_off_and_peers_still_get_through() -> None:
    a, b = pair(timeout_s=10.0)
    try:
        control = b._engine._peers[1].control
        first = b.recv(0, TransferKey(0, 9, 0), torch.empty(10))
        a.send(1, TransferKey(0, 9, 0), data(10)).wait(5.0)  # its STOP makes the peer's connection trusted
        first.wait(5.0)
        junk = [socket.create_connection(control, timeout=2.0) for _ in range(6)]
        for i, conn in enumerate(junk):
            conn.sendall((100).to_bytes(4, "big") + bytes(100) if i % 2 else (10**6).to_bytes(4, "big"))
        for conn in junk:
            assert conn.recv(1) == b""  # the link hung up on it
            conn.close()
        assert b.stats.rejected == {"mac": 3, "frame": 3}
        idle = [socket.create_connection(control, timeout=2.0) for _ in range(30)]  # strangers holding slots
        sent = data(20_000)
        out = torch.empty_like(sent)
        recv = b.recv(0, TransferKey(1, 0, 0), out)
        a.send(1, TransferKey(1, 0, 0), sent).wait(10.0)  # the peer's connection is trusted: never evicted
        assert recv.wait(10.0).lost == 0 and torch.equal(out, sent)
        for _ in range(1000):  # the I/O thread accepts what the kernel queued when it gets to it: poll
            if b.stats.connections_refused >= 30 + 1 - 12:
                break
            threading.Event().wait(0.01)
        assert b.stats.connections_refused >= 30 + 1 - 12 and b._engine._control.inbound <= 12
        for conn in idle:
            conn.close()
    finally:
        a.close()
        b.close()
