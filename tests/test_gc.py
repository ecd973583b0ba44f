"""commsched._gc: one full pass, then what is alive kept out of later passes; what comes after still collected."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from commsched.transport import TransportOptions

# In a fresh interpreter: freezing the test process would keep every test's objects from the collector.
_CHILD = textwrap.dedent(
    """
    import gc, weakref
    from commsched._gc import freeze_long_lived

    class Node:
        pass

    kept = Node(); kept.me = kept  # alive at the freeze
    dead = Node(); dead.me = dead; dead_ref = weakref.ref(dead); del dead  # garbage in a cycle before it
    gc.disable()  # no pass but the ones below
    freeze_long_lived()
    assert dead_ref() is None, "the pass before the freeze frees the garbage made before"
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for g in range(3) for o in gc.get_objects(g)), "kept out of the generations"
    later = Node(); later.me = later; later_ref = weakref.ref(later); del later
    gc.collect()
    assert later_ref() is None, "a cycle made after the freeze is still collected"
    print("ok", gc.get_freeze_count())
    """
)


def test_freeze_long_lived_frees_garbage_then_keeps_the_living_out_of_later_passes() -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")


_HOLDS = textwrap.dedent(
    """
    import gc
    from commsched._gc import hold

    first, second = hold(), hold()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    first(); first()  # a second call of one release does nothing
    assert gc.get_freeze_count() >= frozen, "frozen while a hold is open"
    second()
    assert gc.get_freeze_count() == 0, "the last release gives everything back to the collector"
    gc.freeze()  # the process's own freeze, before a hold: left in place
    own = gc.get_freeze_count()
    hold()()
    assert gc.get_freeze_count() >= own > 0
    print("ok")
    """
)


def test_the_freeze_lasts_while_a_hold_is_open_and_leaves_the_processs_own_freeze() -> None:
    done = subprocess.run([sys.executable, "-c", _HOLDS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_transport_options_refuse_a_freeze_gc_that_is_not_a_bool() -> None:
    with pytest.raises(ValueError, match=r"freeze_gc: must be True or False, got 'yes'"):
        TransportOptions(freeze_gc="yes")  # type: ignore[arg-type]
