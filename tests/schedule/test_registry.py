"""The registry's views of the policies."""

from __future__ import annotations


def test_policies_by_where_they_update_split_the_registry_in_two() -> None:
    from commsched.schedule import POLICIES, policy_class, updating_at, updating_like

    step, forward = updating_at("step"), updating_at("forward")
    assert set(step) | set(forward) == set(POLICIES) and not set(step) & set(forward)
    assert "ddp" in step and "dear" in forward
    assert all(policy_class(p).update_mode == "forward" for p in forward)
    assert updating_like({"dear"}) == frozenset(forward) and updating_like(["ddp", "wfbp"]) == frozenset(step)
    assert updating_like({"ddp", "dear"}) == frozenset(POLICIES) and updating_like(()) == frozenset()
