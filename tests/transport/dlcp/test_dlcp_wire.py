"""DLCP datagrams: round trips, sizes that fit the MTU, and every malformed kind rejected with a reason."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.errors import WireError
from commsched.transport.dlcp.wire import (
    DTYPE_CODES,
    DTYPES,
    HEADER,
    HOLE,
    MAC_BYTES,
    MAGIC,
    MAX_HOLES,
    NONCE_BYTES,
    TAG_BYTES,
    VERSION,
    Codec,
    Kind,
    check_holes,
    decode_ack,
    encode_holes,
    job_id,
    packet_numel,
)

KEY = bytes(range(32))
WORLD = 4
CODEC = Codec(KEY, WORLD)
F32 = DTYPE_CODES["float32"]


def sign(body: bytes, key: bytes = KEY) -> bytes:
    """A datagram with a correct MAC over arbitrary header and payload bytes."""
    return body + Codec(key, WORLD).seal(body)


def raw(**fields: int) -> bytes:
    """A header with every field settable (defaults: a valid float32 DATA of 4 elements at offset 8)."""
    f = dict(
        magic=MAGIC, version=VERSION, kind=Kind.DATA, job=job_id(KEY), step=3, task=2, phase=1, prio=0,
        importance=1, dtype=F32, rank=1, seq=9, offset=8, numel=4, total=16, stride=4,
    )  # fmt: skip
    f.update(fields)
    return HEADER.pack(*f.values())


def data(offset: int = 8, numel: int = 4, total: int = 16, stride: int = 4, payload: bytes | None = None) -> bytes:
    body = payload if payload is not None else bytes(range(numel * 4))
    return CODEC.encode(
        Kind.DATA, 3, 2, 1, 1, importance=1, dtype=F32, seq=9, offset=offset, numel=numel, total=total,
        stride=stride, payload=body,
    )  # fmt: skip


def test_data_round_trip_keeps_every_field_and_the_payload() -> None:
    d = CODEC.decode(data())
    assert (d.kind, d.step, d.task, d.phase, d.rank, d.seq) == (Kind.DATA, 3, 2, 1, 1, 9)
    assert (d.offset, d.numel, d.total, d.stride, d.dtype, d.importance) == (8, 4, 16, 4, F32, 1)
    assert bytes(d.payload) == bytes(range(16))


def test_control_round_trips() -> None:
    stop = CODEC.decode(CODEC.encode(Kind.STOP, 1, 2, 0, 3, dtype=F32, offset=90, total=100))
    assert (stop.kind, stop.offset, stop.total, stop.rank) == (Kind.STOP, 90, 100, 3)
    probe = CODEC.decode(CODEC.encode(Kind.PROBE, 1, 2, 0, 3, dtype=F32, seq=5, total=100))
    assert (probe.kind, probe.seq) == (Kind.PROBE, 5)
    holes = ((0, 10), (20, 30), (99, 100))
    bitmap = CODEC.decode(
        CODEC.encode(Kind.BITMAP, 1, 2, 0, 3, dtype=F32, seq=5, total=100, payload=encode_holes(holes))
    )
    assert check_holes(bitmap.payload, bitmap.total) == holes
    ack = CODEC.decode(CODEC.encode(Kind.ACK, 0, 0, 0, 2, payload=struct.pack("!QQQQ", 10, 8, 1, 9)))
    assert decode_ack(ack) == (10, 8, 1, 9)


@pytest.mark.parametrize("mtu", [576, 1500, 9000])
@pytest.mark.parametrize("dtype", sorted(DTYPE_CODES))
def test_a_full_datagram_fits_the_mtu(mtu: int, dtype: str) -> None:
    itemsize = DTYPES[DTYPE_CODES[dtype]][1]
    numel = packet_numel(mtu, itemsize)
    wire = CODEC.encode(
        Kind.DATA, 0, 0, 0, 0, dtype=DTYPE_CODES[dtype], offset=0, numel=numel, total=numel * 3, stride=numel,
        payload=bytes(numel * itemsize),
    )  # fmt: skip
    assert len(wire) + 28 <= mtu < len(wire) + 28 + itemsize


def test_an_mtu_too_small_for_one_element_is_refused() -> None:
    with pytest.raises(WireError, match="mtu"):
        packet_numel(90, 8)


def test_keys_shorter_than_16_bytes_are_refused() -> None:
    with pytest.raises(WireError) as err:
        Codec(b"short", 2)
    assert err.value.reason == "key"


def reason(datagram: bytes) -> str:
    with pytest.raises(WireError) as err:
        CODEC.decode(datagram)
    return err.value.reason


def test_another_jobs_key_fails_the_mac() -> None:
    other = Codec(bytes(32), WORLD)
    assert reason(other.encode(Kind.STOP, 0, 0, 0, 0, dtype=F32, total=1)) == "mac"


def test_every_datagram_has_a_fresh_nonce_and_every_codec_of_the_job_verifies_it() -> None:
    first, second = data(), data()  # the same message twice
    assert first[:-MAC_BYTES] == second[:-MAC_BYTES]
    nonces = {first[-MAC_BYTES:-TAG_BYTES], second[-MAC_BYTES:-TAG_BYTES]}
    assert len(nonces) == 2 and all(len(n) == NONCE_BYTES for n in nonces)
    assert first[-TAG_BYTES:] != second[-TAG_BYTES:]
    peer = Codec(KEY, WORLD)  # another rank of the job: a nonce range of its own, the same key
    assert CODEC.decode(peer.encode(Kind.STOP, 0, 0, 0, 2, dtype=F32, total=1)).rank == 2
    assert peer.decode(first).seq == 9
    swapped = first[:-MAC_BYTES] + second[-MAC_BYTES:-TAG_BYTES] + first[-TAG_BYTES:]  # another nonce, same tag
    assert reason(swapped) == "mac"


@given(st.binary(max_size=2000))
@settings(max_examples=400, deadline=None)
def test_random_bytes_are_rejected_as_short_or_forged(blob: bytes) -> None:
    assert reason(blob) in ("short", "mac")


@given(st.data())
@settings(max_examples=300, deadline=None)
def test_any_bit_flip_is_rejected(draw: st.DataObject) -> None:
    good = bytearray(data())
    bit = draw.draw(st.integers(0, len(good) * 8 - 1))
    good[bit // 8] ^= 1 << (bit % 8)
    assert reason(bytes(good)) == "mac"


@pytest.mark.parametrize("cut", [0, 1, HEADER.size, HEADER.size + MAC_BYTES - 1, HEADER.size + 5, -1])
def test_truncation_is_rejected(cut: int) -> None:
    good = data()
    assert reason(good[:cut]) in ("short", "mac")


@pytest.mark.parametrize(
    ("fields", "payload", "why"),
    [
        ({"magic": 0xBEEF}, bytes(16), "version"),
        ({"version": 1}, bytes(16), "version"),  # the BLAKE2b format
        ({"version": VERSION + 1}, bytes(16), "version"),
        ({"kind": 9}, bytes(16), "kind"),
        ({"job": 1}, bytes(16), "job"),
        ({"rank": WORLD}, bytes(16), "rank"),
        ({"dtype": 0}, bytes(16), "dtype"),
        ({"dtype": 200}, bytes(16), "dtype"),
        ({"total": 0, "offset": 0}, bytes(16), "range"),
        ({"offset": 17}, bytes(16), "range"),
        ({"offset": 16}, bytes(16), "range"),  # at the end: no packet starts there
        ({"offset": 6}, bytes(16), "range"),  # off the grid
        ({"stride": 0}, bytes(16), "range"),
        ({"numel": 3}, bytes(12), "range"),  # short of the grid's packet
        ({"offset": 12, "numel": 8, "stride": 8, "total": 20}, bytes(32), "range"),  # runs past total
        ({"importance": 2}, bytes(16), "range"),
        ({}, bytes(15), "length"),
        ({}, bytes(20), "length"),
        ({"kind": Kind.STOP}, bytes(1), "length"),
        ({"kind": Kind.ACK}, bytes(32), "length"),  # an ACK names no transfer
        ({"kind": Kind.BITMAP, "total": 100}, HOLE.pack(5, 5), "holes"),
        ({"kind": Kind.BITMAP, "total": 100}, HOLE.pack(0, 101), "holes"),
        ({"kind": Kind.BITMAP, "total": 100}, HOLE.pack(10, 20) + HOLE.pack(15, 30), "holes"),
        ({"kind": Kind.BITMAP, "total": 100}, bytes(17), "holes"),
        ({"kind": Kind.BITMAP, "total": 10**9}, HOLE.pack(0, 1) * (MAX_HOLES + 1), "holes"),
    ],
)
def test_a_correct_mac_over_bad_fields_is_rejected(fields: dict[str, int], payload: bytes, why: str) -> None:
    assert reason(sign(raw(**fields) + payload)) == why


@given(
    kind=st.integers(0, 255),
    rank=st.integers(0, 2**16 - 1),
    dtype=st.integers(0, 255),
    importance=st.integers(0, 255),
    offset=st.integers(0, 2**64 - 1),
    numel=st.integers(0, 2**32 - 1),
    total=st.integers(0, 2**64 - 1),
    stride=st.integers(0, 2**32 - 1),
    payload=st.binary(max_size=300),
)
@settings(max_examples=500, deadline=None)
def test_signed_datagrams_with_any_fields_decode_only_within_range(
    kind: int, rank: int, dtype: int, importance: int, offset: int, numel: int, total: int, stride: int, payload: bytes
) -> None:
    blob = sign(
        raw(kind=kind, rank=rank, dtype=dtype, importance=importance, offset=offset, numel=numel, total=total,
            stride=stride) + payload
    )  # fmt: skip
    try:
        d = CODEC.decode(blob)
    except WireError:
        return
    assert d.rank < WORLD
    if d.kind == Kind.DATA:
        assert d.offset + d.numel <= d.total and d.numel >= 1
        assert len(d.payload) == d.numel * DTYPES[d.dtype][1]
