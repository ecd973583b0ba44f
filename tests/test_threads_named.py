"""commsched._threads: the runtime's threads carry a name the kernel shows (per-thread CPU tells them apart)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from commsched._threads import kernel_name, kernel_named


def test_long_names_are_shortened_to_what_the_kernel_keeps() -> None:
    assert kernel_name("commsched-watch-r0") == "cs-watch-r0"
    assert kernel_name("commsched-tcp-server-r12") == "cs-tcp-server-r"  # 15 bytes
    assert kernel_name("dlcp-io-3") == "dlcp-io-3"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names in /proc are Linux's")
def test_a_thread_started_through_kernel_named_shows_its_name_in_proc() -> None:
    seen: list[str] = []

    def body(extra: str) -> None:
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip() + extra)

    t = threading.Thread(target=kernel_named(body, "commsched-watch-r0"), args=("!",))
    t.start()
    t.join()
    assert seen == ["cs-watch-r0!"]
    here = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()
    assert here != "cs-watch-r0"  # only the started thread was renamed
