"""Environment variables in a configuration are not expanded (docs/configuration.md, "No environment variables in a
recipe"): a value that reads like a reference to one (``${DATA_DIR}``, ``$HOME``) is used as written and warned
about, naming where it was set, never repeating a secret-named option's value. It was kept without a word: a recipe's
``data.path: ${DATA_DIR}/coco.json`` failed later on a folder named ``${DATA_DIR}``, and an API key written
``${OPENAI_API_KEY}`` was sent as those characters."""

from __future__ import annotations

import logging

import pytest

from finecap.config import load

SECRET = "sk-env-5ecret-q7z"


def warnings_of(caplog, recipe=None, overrides=()) -> tuple[object, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="finecap.config"):
        cfg = load(recipe, list(overrides))
    return cfg, [r.getMessage() for r in caplog.records if "expands no environment variables" in r.getMessage()]


def test_a_reference_in_a_recipe_is_kept_as_written_and_named_with_its_line(caplog, tmp_path, monkeypatch):
    monkeypatch.setenv("DATA_DIR", str(tmp_path))  # set, and still not expanded: the rule, not a missing variable
    recipe = tmp_path / "r.yaml"
    recipe.write_text("run:\n  seed: 3\ndata:\n  path: ${DATA_DIR}/coco.json\n  images: $HOME/images\n")
    cfg, said = warnings_of(caplog, recipe)
    assert (cfg.data.path, cfg.data.images) == ("${DATA_DIR}/coco.json", "$HOME/images")
    assert said == [
        f"{recipe}: line 4: data.path: '${{DATA_DIR}}' is used as written: finecap expands no environment variables "
        "in a configuration (docs/configuration.md#no-environment-variables-in-a-recipe); write the value itself, or "
        'set it on the command line, where the shell expands it: data.path="${DATA_DIR}/coco.json"',
        f"{recipe}: line 5: data.images: '$HOME' is used as written: finecap expands no environment variables in a "
        "configuration (docs/configuration.md#no-environment-variables-in-a-recipe); write the value itself, or set "
        'it on the command line, where the shell expands it: data.images="$HOME/images"',
    ]


def test_an_override_is_named_as_it_was_given(caplog):
    # single-quoted on the command line, the shell left it for finecap, which expands nothing either
    cfg, said = warnings_of(caplog, None, ["run.root=${oc.env:RUNS}/x"])
    assert cfg.run.root == "${oc.env:RUNS}/x"
    assert said == [
        "override 'run.root=${oc.env:RUNS}/x': run.root: '${oc.env:RUNS}' is used as written: finecap expands no "
        "environment variables in a configuration (docs/configuration.md#no-environment-variables-in-a-recipe); write "
        'the value itself, or set it on the command line, where the shell expands it: run.root="${oc.env:RUNS}/x"'
    ]


@pytest.mark.parametrize(
    ("text", "advice"),
    [
        ("boost:\n  llm_api_key: ${OPENAI_API_KEY}" + SECRET + "\n", "name it in boost.llm_api_key_env"),
        ("boost:\n  llm_api_key_env: ${OPENAI_API_KEY}\n", "boost.llm_api_key_env=OPENAI_API_KEY"),
    ],
)
def test_a_secret_named_option_is_warned_about_without_its_value(caplog, tmp_path, text, advice):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    _, said = warnings_of(caplog, recipe)
    assert len(said) == 1 and said[0].startswith(f"{recipe}: line 2: boost.llm_api_key")
    assert "the value is used as written" in said[0] and advice in said[0]
    assert SECRET not in said[0] and "${OPENAI_API_KEY}" not in said[0]


def test_text_that_names_no_variable_is_not_warned_about(caplog, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("run:\n  name: price-$5\ndata:\n  path: a/$lower/b.json\n")  # no ${...}, no $CAPITALS
    _, said = warnings_of(caplog, recipe, ["vlm.prompt=Describe the image, $ and all"])
    assert said == []
