"""A hypothesis-driven sender of forged and malformed DLCP datagrams, aimed at a training job's ports.

Every datagram it makes must be refused whatever the moment it lands: it is
forged (no MAC, a flipped bit, another job's key), cut short, or carries the
job's key and a field no receive can take (a range off the grid, a wrong
length, rank or dtype, a size no tensor has, a step long finished), or it is
a verbatim copy of a datagram the job already delivered (a duplicate). It
never forges a well-formed datagram for a live transfer: one that carries the
job's key is trusted by design.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import commsched.transport.dlcp.udp as dlcp_udp
from commsched.transport.dlcp.wire import DTYPE_CODES, HEADER, MAGIC, VERSION, Codec, Kind, job_id

KEY = bytes(range(7, 39))
F32 = DTYPE_CODES["float32"]
HUGE = 10**9  # more elements than any tensor of the test model
#: how each kind of datagram is refused: by the codec (counted in ``rejected``) or by the receive it names
REJECTED = ("garbage", "truncated", "flipped", "other_key", "job_field", "off_range", "off_grid", "bad_numel",
            "bad_length", "bad_rank", "bad_dtype", "bad_kind")  # fmt: skip
UNMATCHED = ("stale", "wrong_size", "duplicate")
#: How long a stale example waits for the job to reach a step with older ones behind it.
STALE_WAIT_S = 30.0


class Tap:
    """Copies of every tenth genuine datagram the job sent, with their destinations."""

    def __init__(self) -> None:
        self.captured: list[tuple[bytes, tuple[str, int]]] = []
        self._n = 0


@contextmanager
def tapping(tap: Tap | None) -> Iterator[None]:
    if tap is None:
        yield
        return
    original = dlcp_udp.send_batch

    def send(
        sock: socket.socket, parts: Sequence[bytes | memoryview], tos: int, segment_bytes: int, dest: tuple[str, int]
    ) -> int:
        blob = b"".join(parts)  # one datagram, or a GSO batch of them cut every segment_bytes
        step = segment_bytes or len(blob) or 1
        for start in range(0, len(blob), step):
            tap._n += 1
            if tap._n % 10 == 0 and len(tap.captured) < 500:
                tap.captured.append((blob[start : start + step], dest))
        return original(sock, parts, tos, segment_bytes, dest)

    dlcp_udp.send_batch = send
    try:
        yield
    finally:
        dlcp_udp.send_batch = original


def signed(job: int | None = None, payload: bytes = b"", **fields: int) -> bytes:
    """A datagram under the job's key with any header fields, valid or not."""
    f = dict(magic=MAGIC, version=VERSION, kind=Kind.DATA, job=job_id(KEY) if job is None else job, step=0,
             task=0, phase=0, prio=0, importance=0, dtype=F32, rank=0, seq=0, offset=0, numel=4, total=HUGE,
             stride=4)  # fmt: skip
    f.update(fields)
    body = HEADER.pack(*f.values()) + payload
    return body + Codec(KEY, 2).seal(body)


Address = tuple[str, int]


class Draw:
    """One example's random choices, all drawn up front: what is drawn never depends on the job's state, so
    hypothesis sees the same sequence of draws for the same choices (the job's progress is not replayable)."""

    def __init__(self, data: Any) -> None:
        self.kind: str = data.draw(st.sampled_from([*REJECTED, *UNMATCHED]))
        self.receiver: int = data.draw(st.integers(0, 1))
        self.pick: int = data.draw(st.integers(0, 2**31 - 1))
        self.small: int = data.draw(st.integers(0, 10))
        self.blob: bytes = data.draw(st.binary(max_size=1500))
        self.bits: int = data.draw(st.integers(1, 2**32 - 1))

    def choose(self, options: Sequence[Any]) -> Any:
        return options[self.pick % len(options)]


def build(d: Draw, tap: Tap, step_now: int, tasks: int) -> tuple[bytes, Address | None]:
    """One datagram of ``d.kind``, and where a copy must go (a genuine datagram's own destination) or None."""
    kind, peer = d.kind, 1 - d.receiver
    task = d.pick % max(tasks, 1)
    common = dict(step=step_now + d.small % 3, task=task, phase=d.pick % 2, rank=peer)
    if kind == "garbage":
        return d.blob, None
    if kind in ("truncated", "flipped", "duplicate"):
        if not tap.captured:
            return d.blob[:60], None
        blob, dest = d.choose(tap.captured)
        if kind == "duplicate":
            return blob, dest
        if kind == "truncated":
            return blob[: d.bits % len(blob)], None
        bit = d.bits % (8 * len(blob))
        flipped = bytearray(blob)
        flipped[bit // 8] ^= 1 << (bit % 8)
        return bytes(flipped), None
    if kind == "other_key":
        codec = Codec(bytes(32), 2)
        return codec.encode(Kind.DATA, common["step"], task, 0, peer, dtype=F32, numel=4, total=HUGE, stride=4,
                            payload=bytes(16)), None  # fmt: skip
    if kind == "job_field":
        return signed(job=job_id(KEY) ^ d.bits, payload=bytes(16), **common), None
    if kind == "off_range":
        total = 1 + d.pick % 5000
        return signed(offset=total + d.small, total=total, payload=bytes(16), **common), None
    if kind == "off_grid":
        return signed(offset=1 + d.small % 3, payload=bytes(16), **common), None
    if kind == "bad_numel":
        return signed(numel=d.choose([0, 1, 3, 5, 9]), payload=bytes(16), **common), None
    if kind == "bad_length":
        return signed(payload=bytes(d.choose([0, 4, 15, 17, 64])), **common), None
    if kind == "bad_rank":
        return signed(payload=bytes(16), **{**common, "rank": d.choose([d.receiver, 2, 7, 65535])}), None
    if kind == "bad_dtype":
        return signed(dtype=d.choose([0, 10, 77, 255]), payload=bytes(16), **common), None
    if kind == "bad_kind":
        return signed(kind=d.choose([0, 6, 9, 255]), payload=bytes(16), **common), None
    if kind == "stale":  # an old step of a task no transfer had: an old transfer's key would count as late
        old = {**common, "step": d.pick % max(step_now - 4, 1), "task": tasks + d.small}
        return signed(payload=bytes(16), **old), None
    assert kind == "wrong_size"  # a live or coming transfer's key, with a size no tensor has
    return signed(total=HUGE + d.pick % 1000, payload=bytes(16), **common), None


def start(transport: Any, tap: Tap, examples: int, results: dict[str, Any]) -> threading.Thread:
    """Start the sender on a thread; ``results["sent"]`` counts what it sent, by kind, ``results["errors"]``
    what went wrong making or sending one (an example never fails, so hypothesis never replays: the job's
    progress, which the datagrams follow, cannot be replayed)."""
    peers = transport.link._engine._peers
    exchange = transport.exchange
    sent: Counter[str] = Counter()
    results["sent"] = sent
    results["errors"] = errors = []

    def run() -> None:
        raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

        @settings(max_examples=examples, database=None, deadline=None, derandomize=True, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(st.data())
        def one(data: Any) -> None:
            try:
                send_one(data)
            except Exception as exc:  # reported, not raised
                errors.append(repr(exc))

        def send_one(data: Any) -> None:
            d = Draw(data)
            launches = exchange.launches()
            step_now = max(launches.values(), default=0)
            # nothing is old enough to be stale for sure before step 5: wait for it (a fast host sends every
            # example in the first steps), for a while, and send no stale datagram if training ends first
            deadline = time.monotonic() + STALE_WAIT_S
            while d.kind == "stale" and step_now < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
                launches = exchange.launches()
                step_now = max(launches.values(), default=0)
            if d.kind == "stale" and step_now < 5:
                return
            blob, to = build(d, tap, step_now, len(launches))
            raw.sendto(blob, peers[d.receiver].data[0] if to is None else to)
            sent[d.kind] += 1

        try:
            one()
        finally:
            raw.close()

    thread = threading.Thread(target=run, name="fuzzer", daemon=True)
    thread.start()
    return thread
