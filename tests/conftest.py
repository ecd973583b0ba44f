"""Fixtures shared by every test directory."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str) -> ModuleType:
    """Import a script of the repository (``benchmarks/x.py``, ``scripts/y.py``) as a module named after its file.

    It is registered in ``sys.modules`` first: dataclasses look their module up by name while the script runs.
    """
    file = ROOT / path
    spec = importlib.util.spec_from_file_location(file.stem, file)
    assert spec is not None and spec.loader is not None, f"no script at {file}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def script_loader() -> Callable[[str], ModuleType]:
    """:func:`load_script`, for tests that import a repository script."""
    return load_script
