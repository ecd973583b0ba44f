"""The mark of tests that inject faults by replacing a function or method of DLCP's data path.

Compiled by mypyc (``python -m commsched.sim.packet.compile``), the data path's callers call the compiled
function, not the replacement, so these tests run from source only.
"""

from __future__ import annotations

import pytest

from commsched.sim.packet import COMPILED

patches_data_path = pytest.mark.skipif(
    COMPILED, reason="replaces a function of DLCP's data path, which runs compiled here (compile --clean to run it)"
)
