"""Fixtures of the tests under ``tests/models/``: the tiny decoder-only VLMs of every family
(tests/models/test_vlm.py, tests/models/test_vlm_shared_prompt.py)."""

from pathlib import Path

import pytest

from finecap.models.presets import VLM_FAMILIES


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory) -> dict[str, Path]:
    """A tiny random VLM of every family saved to a folder (:func:`finecap.models.presets.save_tiny_vlm`), once per
    test module: ``{family: folder}``."""
    from finecap.models.presets import save_tiny_vlm

    root = tmp_path_factory.mktemp("vlm")
    return {f: save_tiny_vlm(root / f, f, std=0.2) for f in VLM_FAMILIES}


@pytest.fixture(params=VLM_FAMILIES)
def family(request) -> str:
    """Each VLM family in turn."""
    return request.param
