"""Per-packet cost of DLCP's datagram format on one core: encode + MAC, decode + verify.

A float32 DATA datagram filling a 1,500-byte and a 9,000-byte MTU; the median
of 5 runs of 20,000 datagrams each (no sockets: the format alone).

    python benchmarks/dlcp_wire.py
"""

from __future__ import annotations

import statistics
import time

from commsched.transport.dlcp.wire import DTYPE_CODES, Codec, Kind, packet_numel


def measure(mtu_bytes: int, count: int = 20_000, repeats: int = 5) -> tuple[float, float, int]:
    codec = Codec(bytes(range(32)), world=2)
    numel = packet_numel(mtu_bytes, 4)
    payload = memoryview(bytes(numel * 4))
    dtype = DTYPE_CODES["float32"]
    encode_us, decode_us = [], []
    datagram = b""
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(count):
            datagram = codec.encode(
                Kind.DATA, 7, 3, 0, 1, dtype=dtype, seq=i, offset=0, numel=numel, total=1 << 20, stride=numel,
                payload=payload,
            )  # fmt: skip
        encode_us.append((time.perf_counter() - start) / count * 1e6)
        start = time.perf_counter()
        for _ in range(count):
            codec.decode(datagram)
        decode_us.append((time.perf_counter() - start) / count * 1e6)
    return statistics.median(encode_us), statistics.median(decode_us), len(datagram)


def main() -> None:
    print(f"{'MTU':>6} {'datagram':>9} {'encode+MAC':>11} {'':>10} {'decode+verify':>14} {'':>10}")
    for mtu in (1500, 9000):
        enc, dec, nbytes = measure(mtu)
        print(f"{mtu:>6} {nbytes:>8}B {enc:>8.2f} µs {1e6 / enc:>8.0f}/s {dec:>11.2f} µs {1e6 / dec:>8.0f}/s")


if __name__ == "__main__":
    main()
