"""A send posted on an idle link leaves from its poster's thread; nothing ends there (DlcpLink on 127.0.0.1)."""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _data_path import patches_data_path
from test_dlcp_link import pair

from commsched.errors import RuntimeCommError
from commsched.transport.dlcp import link as link_module
from commsched.transport.dlcp import udp
from commsched.transport.dlcp.link import DlcpLink
from commsched.transport.links import TransferKey as K

NUMEL = 50_000


@pytest.fixture
def links() -> Iterator[list[DlcpLink]]:
    both = pair(timeout_s=10.0)
    yield both
    for link in both:
        link.close()


@patches_data_path
def test_the_first_datagrams_of_a_send_on_an_idle_link_leave_from_the_posting_thread(
    links: list[DlcpLink], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = links
    senders: list[threading.Thread] = []
    real = udp.send_batch

    def recording(sock: Any, parts: Any, *args: Any) -> int:
        if sum(len(p) for p in parts) > 1000:  # data, not control
            senders.append(threading.current_thread())
        return real(sock, parts, *args)

    monkeypatch.setattr(udp, "send_batch", recording)
    from_poster = 0
    for step in range(20):
        out = torch.zeros(NUMEL)
        recv = b.recv(0, K(step, 0, 0), out)
        senders.clear()
        send = a.send(1, K(step, 0, 0), torch.full((NUMEL,), float(step)))
        from_poster += bool(senders) and senders[0] is threading.current_thread()
        send.wait(5.0)
        assert recv.wait(5.0).lost == 0 and bool((out == step).all())
    # each send found the link idle; its poster sends unless the I/O thread is in a turn just then
    assert from_poster >= 10, from_poster


@patches_data_path
def test_a_send_that_fails_while_its_poster_sends_is_ended_by_the_io_thread(
    links: list[DlcpLink], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its callbacks may take locks the poster holds: the poster never ends a transfer."""
    a, _ = links
    ended_on: list[str] = []
    finish = link_module.DlcpTransfer.finish

    def recording(self: link_module.DlcpTransfer, *args: Any, **kwargs: Any) -> None:
        if not self.is_completed():
            ended_on.append(threading.current_thread().name)
        finish(self, *args, **kwargs)

    def too_large(*_args: Any) -> int:
        raise OSError(errno.EMSGSIZE, "Message too long")

    monkeypatch.setattr(link_module.DlcpTransfer, "finish", recording)
    monkeypatch.setattr(udp, "send_batch", too_large)
    send = a.send(1, K(0, 0, 0), torch.ones(NUMEL))
    with pytest.raises(RuntimeCommError, match="do not fit the path MTU"):
        send.wait(5.0)
    assert ended_on == ["dlcp-io-0"]
    assert not a._engine.outbound.sends and not a._engine.outbound.deferring
