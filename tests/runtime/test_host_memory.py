"""Transports that send from host memory (``ps``, ``dlcp``, ``dlcp_ps``) take CPU tensors only: a model on
another device is refused before any communication, and ``auto`` passes over plans that would use them."""

from __future__ import annotations

import pytest
import torch

from commsched import zoo
from commsched.errors import UnsupportedError
from commsched.runtime.switching import AutoPlanner
from commsched.schedule import NetworkEstimate
from commsched.transport import check_transports
from commsched.transport.base import HOST_MEMORY


@pytest.mark.parametrize("name", sorted(HOST_MEMORY))
def test_a_host_memory_transport_is_refused_for_cuda_parameters_naming_transport_and_device(name: str) -> None:
    check_transports([name], [torch.device("cpu")])  # on the CPU it is fine
    with pytest.raises(UnsupportedError, match=rf"'{name}' send gradients from host memory.*on cuda:1"):
        check_transports(["collective", name], [torch.device("cpu"), torch.device("cuda", 1)])


def test_collectives_are_not_refused_on_cuda() -> None:
    check_transports(["collective"], [torch.device("cuda", 0)])


def test_auto_passes_over_host_memory_plans_when_parameters_are_not_on_the_cpu() -> None:
    workload, network = zoo.load("resnet18"), NetworkEstimate(2, 1.25e9, 20e-6)
    on_cpu = AutoPlanner(1.0, ("ps",))(workload, network, frozenset())
    assert {t.transport for t in on_cpu.tasks} == {"ps"}
    elsewhere = AutoPlanner(1.0, ("ps",), host_memory=False)(workload, network, frozenset())
    assert {t.transport for t in elsewhere.tasks} == {"collective"}  # none left: the warm-up's plan
    runner_up = AutoPlanner(1.0, ("ps", "dear"), host_memory=False)(workload, network, frozenset())
    assert runner_up.policy == "dear"  # the next candidate that runs on collectives
