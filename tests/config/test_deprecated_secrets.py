"""The deprecated ``boost.llm_api_key`` / ``boost.vlm_api_key`` (docs/boost.md: "still work for old configurations
but are deprecated"; replaced by the environment variable ``boost.*_api_key_env`` names) are warned about once when
set, naming the replacement, never the key."""

from __future__ import annotations

import logging

import pytest

from finecap.config import load, loading
from finecap.utils.once import SaidOnce

SECRET = "sk-deprecated-0123456789"


@pytest.fixture
def deprecations(caplog, monkeypatch):
    """The deprecation warnings logged meanwhile (none warned before the test: a command of its own)."""
    monkeypatch.setattr(loading, "_DEPRECATED_SAID", SaidOnce())
    caplog.set_level(logging.WARNING, logger="finecap.config")
    return lambda: [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]


def test_a_deprecated_key_set_by_an_override_is_warned_about_once_naming_its_replacement(deprecations):
    for _ in range(2):  # a command loading its configuration twice warns once
        assert load(None, [f"boost.llm_api_key={SECRET}"]).boost.llm_api_key == SECRET
    said = deprecations()
    assert len(said) == 1 and "boost.llm_api_key is deprecated" in said[0] and "boost.llm_api_key_env" in said[0]
    assert SECRET not in said[0]


def test_a_deprecated_key_set_by_a_recipe_is_warned_about(deprecations, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"boost:\n  vlm_api_key: {SECRET}\n")
    load(recipe)
    assert [m for m in deprecations() if "boost.vlm_api_key is deprecated" in m and "vlm_api_key_env" in m]


def test_unset_or_read_back_masked_it_is_not_warned_about(deprecations, caplog, monkeypatch, tmp_path):
    stored = tmp_path / "config.yaml"
    load(None, [f"boost.llm_api_key={SECRET}"]).save(stored)  # written masked: ***
    monkeypatch.setattr(loading, "_DEPRECATED_SAID", SaidOnce())
    caplog.clear()
    assert load(stored).boost.llm_api_key == "" and load(None, ["boost.llm_api_key_env=MY_KEY"])
    assert deprecations() == []
