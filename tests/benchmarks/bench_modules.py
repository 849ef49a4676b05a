"""Load a benchmark script as a module for its unit tests (benchmarks/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def loaded(name: str, filename: str) -> Iterator[ModuleType]:
    """``benchmarks/<filename>`` imported as ``name``, removed from ``sys.modules`` after."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
