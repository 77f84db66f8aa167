"""The repository's scripts (``benchmarks/*.py``, ``docs/gen_config_reference.py``) loaded as modules, for the tests
that call their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def script_module(path: Path | str, *, neighbours: bool = False) -> ModuleType:
    """The script at ``path`` (relative to the repository's root, or absolute) as a fresh module, executed anew at
    each call, registered in ``sys.modules`` as ``<stem>_under_test`` (dataclasses resolve their annotations
    through it). ``neighbours=True`` puts the script's folder on ``sys.path`` first, as ``python <path>`` does, for
    a script that imports the modules beside it (``benchmarks/effects.py`` imports ``paired_difference``)."""
    path = ROOT / path
    if neighbours and str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"{path.stem}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def benchmark(name: str, *, neighbours: bool = False) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (:func:`script_module`)."""
    return script_module(Path("benchmarks") / f"{name}.py", neighbours=neighbours)
