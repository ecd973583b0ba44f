"""DLCP datagrams: a self-describing header, a payload, a keyed MAC.

Every datagram, data or control, is::

    header (50 bytes, network order) | payload | nonce (12 bytes) | tag (16 bytes)

The header (:data:`HEADER`) is magic ``0xD1C9``, version, kind
(:class:`Kind`), job id, step, task, phase, layer priority class, importance
class, dtype code, sender rank, sequence number, offset, numel, total numel and
stride of the transfer. ``offset``/``numel``/``total``/``stride`` count
elements, never bytes: a transfer of ``total`` elements is cut on a fixed grid
of ``stride`` elements, so packet ``i`` holds elements ``[i·stride,
min((i+1)·stride, total))`` and can be written at its offset in any order.
A DATA payload is those elements' bytes, little-endian. A PROBE carries no
elements; its ``numel`` is the sender's next DATA sequence number toward the
receiver (what it had sent before the probe). A BITMAP's payload is its hole
list; its ``seq`` echoes the probe it answers, or is 0 for a report the
receiver sent unasked, whose ``numel`` is the sequence number before which
every DATA datagram not arrived is lost and whose ``offset`` is how many
elements the receive may miss.

The MAC is AES-GMAC (AES-256-GCM with an empty plaintext, header and
payload as its associated data, from the ``cryptography`` package) under a
key derived from the job's key; its 16-byte tag follows the 12-byte nonce it
was made with. GCM must never see one nonce twice under one key: each
:class:`Codec` counts its nonces up from a random 96-bit start, so two
codecs (ranks, links, restarts) overlap only with probability about
``messages² / 2⁹⁶``.

:meth:`Codec.decode` checks the MAC (the library compares in constant time)
before it reads any field, then every field: version, kind, job, rank,
dtype, the range and grid of the elements, the payload length, the hole list
of a BITMAP. Anything wrong raises :class:`~commsched.errors.WireError` whose
``reason`` the caller counts; a datagram that decodes can be written at
``offset`` of a buffer of ``total`` elements of its dtype without further
checks.

Why GMAC and not BLAKE2b or HMAC: the MAC was most of the data path's cost
at 9,000-byte frames. One core of the development machine (CPython 3.11,
AES-NI and PCLMULQDQ), a 9,000-byte datagram: keyed BLAKE2b 6.9 µs,
HMAC-SHA256 6.6 µs, Poly1305 2.6 µs, ChaCha20-Poly1305 1.3 µs, AES-GMAC 0.85
µs. Whole datagrams (``python benchmarks/dlcp_wire.py``, median of 5 ×
20,000): encode + MAC 7.6 → 1.8 µs and decode + verify 8.1 → 2.1 µs at
9,000 bytes, 1.9 → 1.3 and 2.5 → 1.8 µs at 1,500 bytes (BLAKE2b → GMAC).
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import struct
from enum import IntEnum
from typing import NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from commsched.errors import WireError

MAGIC = 0xD1C9
VERSION = 2  # 1: a BLAKE2b MAC
#: magic, version, kind, job, step, task, phase, prio, importance, dtype, rank, seq, offset, numel, total, stride
HEADER = struct.Struct("!HBBIIIBBBBHIQIQI")
NONCE_BYTES = 12
TAG_BYTES = 16
#: What the MAC adds to a datagram: its nonce and its tag.
MAC_BYTES = NONCE_BYTES + TAG_BYTES
_NONCES = 2**96
#: A BITMAP's payload: ``(start, stop)`` element ranges, at most :data:`MAX_HOLES` of them.
HOLE = struct.Struct("!QQ")
MAX_HOLES = 4000  # so that every message fits one datagram
#: An ACK's payload: cumulative DATA datagrams the sender sent (highest sequence + 1), received, received with
#: CE; and the sequence number of the datagram that triggered it (:data:`NO_ECHO`: a timer sent it;
#: :data:`NO_SAMPLE`: it repeats the last ACK, which gives no round-trip sample).
ACK = struct.Struct("!QQQQ")
NO_ECHO = 2**32
NO_SAMPLE = 2**32 + 1
#: IPv4 + UDP headers; IPv6 + UDP is 48.
IPV4_UDP_BYTES = 28
IPV6_UDP_BYTES = 48
MAX_DATAGRAM_BYTES = 65507
U32 = 2**32


class Kind(IntEnum):
    DATA = 1  # sender -> receiver, over UDP
    STOP = 2  # receiver -> sender: the receive is finished, send nothing more
    PROBE = 3  # sender -> receiver: everything was sent once; which elements are missing?
    BITMAP = 4  # receiver -> sender: the holes (answers a PROBE, ``seq`` echoes it)
    ACK = 5  # receiver -> sender, per peer: delivery and CE counts for rate control


#: dtype code -> (name as in ``torch.<name>``, bytes per element). Code 0: no data (ACK).
DTYPES: dict[int, tuple[str, int]] = {
    1: ("float32", 4),
    2: ("float64", 8),
    3: ("float16", 2),
    4: ("bfloat16", 2),
    5: ("int64", 8),
    6: ("int32", 4),
    7: ("int16", 2),
    8: ("int8", 1),
    9: ("uint8", 1),
}  # the codes of the TCP link's frames (commsched.transport.wire), so a capture reads the same
DTYPE_CODES: dict[str, int] = {name: code for code, (name, _) in DTYPES.items()}

# the decoder's hot path compares plain ints
_ITEMSIZE = {code: itemsize for code, (_, itemsize) in DTYPES.items()}
_DATA, _BITMAP, _ACK = int(Kind.DATA), int(Kind.BITMAP), int(Kind.ACK)
_TRANSFER_KINDS = frozenset((int(Kind.DATA), int(Kind.STOP), int(Kind.PROBE), int(Kind.BITMAP)))
_HEADER_BYTES = HEADER.size
_MIN_BYTES = HEADER.size + MAC_BYTES
_unpack = HEADER.unpack_from


#: A datagram's payload: a view into the buffer it was read into. Named in the module, not ``memoryview``
#: directly: a class mypyc compiles resolves a NamedTuple's field types in the module's own names.
Payload = memoryview


class Datagram(NamedTuple):
    """A decoded, verified datagram. ``payload`` is a view into the buffer it was decoded from."""

    kind: int
    step: int
    task: int
    phase: int
    prio: int
    importance: int
    dtype: int
    rank: int
    seq: int
    offset: int
    numel: int
    total: int
    stride: int
    payload: Payload


def job_id(key: bytes) -> int:
    """The 32-bit job id every datagram of the job carries (a digest of the key: not a secret)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=4, person=b"commsched.job").digest(), "big")


def packet_numel(mtu_bytes: int, itemsize: int, ip_udp_bytes: int = IPV4_UDP_BYTES) -> int:
    """Elements per DATA datagram so that one fits the path MTU: ``(mtu - IP/UDP - header - MAC) // itemsize``."""
    room = min(mtu_bytes - ip_udp_bytes, MAX_DATAGRAM_BYTES) - HEADER.size - MAC_BYTES
    if room < itemsize:
        raise WireError("mtu", f"an MTU of {mtu_bytes} bytes leaves no room for one {itemsize}-byte element")
    return room // itemsize


class Codec:
    """Encodes and decodes the datagrams of one job: its key, its job id, its world size."""

    __slots__ = ("_gcm", "_nonces", "_start", "job", "world")

    def __init__(self, key: bytes, world: int) -> None:
        if not 16 <= len(key) <= 64:
            raise WireError("key", f"a job key must have 16 to 64 bytes, got {len(key)}")
        self._gcm = AESGCM(hashlib.blake2b(key, digest_size=32, person=b"commsched.mac").digest())
        self._start = int.from_bytes(secrets.token_bytes(NONCE_BYTES), "big")
        self._nonces = itertools.count()  # next() is atomic: threads that share a codec never share a nonce
        self.job = job_id(key)
        self.world = world

    def seal(self, body: bytes | memoryview) -> bytes:
        """The MAC that follows ``body`` (a header and its payload): a fresh nonce and the tag over ``body``."""
        nonce = ((self._start + next(self._nonces)) % _NONCES).to_bytes(NONCE_BYTES, "big")
        return nonce + self._gcm.encrypt(nonce, b"", body)

    def encode(
        self,
        kind: int,
        step: int,
        task: int,
        phase: int,
        rank: int,
        *,
        prio: int = 0,
        importance: int = 0,
        dtype: int = 0,
        seq: int = 0,
        offset: int = 0,
        numel: int = 0,
        total: int = 0,
        stride: int = 0,
        payload: bytes | memoryview = b"",
    ) -> bytes:
        """One datagram: header, ``payload``, MAC. Fields out of their wire range raise struct.error."""
        header = HEADER.pack(
            MAGIC, VERSION, kind, self.job, step, task, phase, prio, importance, dtype, rank,
            seq % U32, offset, numel, total, stride,
        )  # fmt: skip
        body = header + payload
        return body + self.seal(body)

    def data_parts(
        self, step: int, task: int, phase: int, rank: int, prio: int, importance: int, dtype: int, seq: int,
        offset: int, numel: int, total: int, stride: int, payload: bytes | memoryview,
    ) -> tuple[bytes, bytes]:  # fmt: skip
        """A DATA datagram as ``(header + payload, MAC)``, as :meth:`encode` makes it, left in two pieces for a
        scatter-gather send. The MAC reads header and payload as one buffer, so the payload is copied once."""
        body = b"".join((HEADER.pack(
            MAGIC, VERSION, _DATA, self.job, step, task, phase, prio, importance, dtype, rank, seq % U32, offset,
            numel, total, stride,
        ), payload))  # fmt: skip
        return body, self.seal(body)

    def decode(self, data: bytes | bytearray | memoryview) -> Datagram:
        """Verify and parse one datagram; WireError(reason) if anything is wrong. Reads no field before the MAC."""
        view = memoryview(data)
        n = len(view)
        if n < _MIN_BYTES:
            raise WireError("short", f"{n} bytes, fewer than a header and a MAC ({_MIN_BYTES})")
        if n > MAX_DATAGRAM_BYTES:
            raise WireError("long", f"{n} bytes, more than a datagram can hold")
        end = n - MAC_BYTES
        try:
            self._gcm.decrypt(view[end : end + NONCE_BYTES], view[end + NONCE_BYTES :], view[:end])
        except InvalidTag:
            raise WireError("mac", "the MAC does not match (forged, corrupted, or another job's key)") from None
        (magic, version, kind, job, step, task, phase, prio, importance, dtype, rank, seq, offset, numel, total,
         stride) = _unpack(view)  # fmt: skip
        payload = view[_HEADER_BYTES:end]
        if magic != MAGIC or version != VERSION:
            raise WireError("version", f"magic {magic:#x} version {version}, expected {MAGIC:#x} version {VERSION}")
        if job != self.job:
            raise WireError("job", f"job id {job:#x}, expected {self.job:#x}")
        if rank >= self.world:
            raise WireError("rank", f"sender rank {rank}, world size {self.world}")
        if kind == _ACK:
            if dtype or total or end - _HEADER_BYTES != ACK.size:
                raise WireError("length", f"an ACK carries {ACK.size} bytes and no transfer, got {len(payload)}")
            return Datagram(kind, step, task, phase, prio, importance, dtype, rank, seq, offset, numel, total, stride,
                            payload)  # fmt: skip
        if kind not in _TRANSFER_KINDS:
            raise WireError("kind", f"unknown message kind {kind}")
        itemsize = _ITEMSIZE.get(dtype)
        if itemsize is None:
            raise WireError("dtype", f"unknown dtype code {dtype}")
        if total < 1 or offset > total:
            raise WireError("range", f"offset {offset} of a transfer of {total} elements")
        if importance > 1:
            raise WireError("range", f"importance class {importance}, expected 0 or 1")
        if kind == _DATA:
            if stride < 1 or offset % stride or offset >= total:
                raise WireError("range", f"offset {offset} is not on the grid of {stride} elements below {total}")
            if numel != min(stride, total - offset):
                raise WireError("range", f"{numel} elements at offset {offset}, expected {min(stride, total - offset)}")
            if end - _HEADER_BYTES != numel * itemsize:
                raise WireError("length", f"{len(payload)} payload bytes for {numel} elements of {itemsize} bytes")
        elif kind == _BITMAP:
            check_holes(payload, total)
        elif end != _HEADER_BYTES:
            raise WireError("length", f"a {Kind(kind).name} carries no payload, got {len(payload)} bytes")
        return Datagram(kind, step, task, phase, prio, importance, dtype, rank, seq, offset, numel, total, stride,
                        payload)  # fmt: skip


def encode_holes(holes: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> bytes:
    """A BITMAP payload: the first :data:`MAX_HOLES` ranges."""
    return b"".join(HOLE.pack(a, b) for a, b in holes[:MAX_HOLES])


def check_holes(payload: memoryview, total: int) -> tuple[tuple[int, int], ...]:
    """The ranges of a BITMAP payload: sorted, disjoint, non-empty, within ``[0, total)``; else WireError."""
    if len(payload) % HOLE.size or len(payload) > MAX_HOLES * HOLE.size:
        raise WireError("holes", f"a hole list of {len(payload)} bytes")
    holes = tuple(HOLE.iter_unpack(payload))
    previous = 0
    for start, stop in holes:
        if not previous <= start < stop <= total:
            raise WireError("holes", f"hole [{start}, {stop}) after {previous} in a transfer of {total} elements")
        previous = stop
    return holes


def decode_ack(d: Datagram) -> tuple[int, int, int, int]:
    """An ACK's cumulative (sent, received, CE-marked) datagram counts and the sequence number it echoes."""
    sent, received, ce, echo = ACK.unpack(d.payload)
    return sent, received, ce, echo
