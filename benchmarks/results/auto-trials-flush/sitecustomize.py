"""Sets the interpreter's switch interval from CS_SWITCH (seconds) in every process that starts with
this directory on PYTHONPATH; nothing without it."""

import os
import sys

_VALUE = os.environ.get("CS_SWITCH")
if _VALUE:
    sys.setswitchinterval(float(_VALUE))
