"""A run folder is data, never code: a dotted path (``pkg.module:attr``) that a stored ``config.yaml`` names is
imported only when the user names it too (an override, the recipe, or ``FINECAP_TRUSTED_CODE``); a tampered or
shared run folder is refused before any import, naming the file, the option and how to name it."""

from __future__ import annotations

import sys

import pytest

from finecap.config import ConfigError, load, load_stored
from finecap.registry import LEGACY_TRUST_ENV, TRUST_ENV

PLANTED = "planted_engine_module:Engine"


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """A stored config naming a module that would record its import, on ``sys.path``."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    monkeypatch.delenv(LEGACY_TRUST_ENV, raising=False)
    (tmp_path / "planted_engine_module.py").write_text("import sys\nsys.planted_imported = True\nEngine = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "config.yaml"
    load(None, [f"decode.engine={PLANTED}", "eval.metrics=[bleu, 'planted_metric:M']",
                "train.objective=planted_objective:O"]).save(path)  # fmt: skip
    yield path
    assert not hasattr(sys, "planted_imported")  # loading a configuration never imports what it names


@pytest.mark.parametrize("option", ["decode.engine", "eval.metrics"])
def test_a_stored_dotted_path_the_user_did_not_name_is_refused(stored, option):
    keep = {"decode.engine": ["eval.metrics=[bleu]"], "eval.metrics": ["decode.engine=finecap"]}[option]
    with pytest.raises(ConfigError, match=rf"{stored}: {option} names '.*', code of one's own, which finecap imports "
                                          rf"only when you name it .*{TRUST_ENV}=") as e:  # fmt: skip
        load_stored(stored, keep)
    assert e.value.key == option


def test_a_stored_dotted_path_loads_when_named_in_an_override_the_recipe_or_the_environment(stored, monkeypatch):
    both = [f"decode.engine={PLANTED}", "eval.metrics=[bleu, 'planted_metric:M']"]
    assert load_stored(stored, both).decode.engine == PLANTED
    recipe = stored.parent / "mine.yaml"
    recipe.write_text(f"decode:\n  engine: {PLANTED}\neval:\n  metrics: [bleu, 'planted_metric:M']\n")
    assert load_stored(stored, recipe=recipe).decode.engine == PLANTED
    assert load_stored(stored, ["decode.engine=finecap", "eval.metrics=[bleu]"]).decode.engine == "finecap"
    with pytest.raises(ConfigError, match="decode.engine names"):  # the name inside another option's value is not it
        load_stored(stored, ["eval.metrics=[bleu, 'planted_metric:M']", "run.name=x_planted_engine_module:Engine"])
    monkeypatch.setenv(LEGACY_TRUST_ENV, f"x.y:Z, {PLANTED}")  # the former name of the variable is still read
    monkeypatch.setenv(TRUST_ENV, "planted_metric:M")
    cfg = load_stored(stored)  # train.objective, only training imports, is no stored code to refuse
    assert (cfg.decode.engine, cfg.train.objective) == (PLANTED, "planted_objective:O")
