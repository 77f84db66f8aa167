"""URL options (``doc(url=True)``: ``boost.llm_base_url``, ``boost.vlm_base_url``, ``judge.urls``) refuse a value
holding white space, which is two URLs pasted together or a URL and a word, never one URL: the error names the
option, and the credentials of the URLs it shows are masked."""

from __future__ import annotations

import pytest

from finecap.config import SECTIONS, BoostConfig, ConfigError, load
from finecap.config.fields import option_fields

URL_OPTIONS = ("boost.llm_base_url", "boost.vlm_base_url", "judge.urls")


@pytest.mark.parametrize(
    ("override", "key"),
    [("boost.llm_base_url=http://pw@h/v1 http://x", "boost.llm_base_url"),
     ("boost.vlm_base_url='http://h:8000/v1\thttp://x'", "boost.vlm_base_url"),
     ("boost.llm_base_url='http://h/v1 '", "boost.llm_base_url"),
     ("judge.urls=[http://a/v1, 'http://pw@b/v1 http://c/v1']", r"judge.urls\[1\]")],
)  # fmt: skip
def test_a_url_option_holding_white_space_is_refused_naming_it(override, key):
    with pytest.raises(ConfigError, match=rf"{key}: holds white space .*two URLs pasted together") as e:
        load(None, [override])
    assert "pw@" not in str(e.value)  # the password of the URL shown is masked (***@)


def test_a_url_with_white_space_is_refused_from_a_recipe_and_a_section_built_by_hand(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text('judge:\n  urls: ["http://a/v1 http://b/v1"]\n')
    with pytest.raises(ConfigError, match=r"r.yaml: line 2: judge.urls\[0\]: holds white space"):
        load(recipe)
    with pytest.raises(ConfigError, match="boost.llm_base_url: holds white space"):
        BoostConfig(llm_base_url="http://a/v1\nhttp://b/v1")


def test_urls_without_white_space_still_load():
    cfg = load(None, ["boost.llm_base_url=http://u:p@h:8000/v1", "judge.urls=[http://a/v1, https://b/v1]"])
    assert cfg.boost.llm_base_url == "http://u:p@h:8000/v1" and cfg.judge.urls == ["http://a/v1", "https://b/v1"]


def test_every_url_option_is_declared_one():
    """Every option named or documented as holding a URL is declared ``url=True`` (and is checked), so that a new one
    is too."""
    declared = {key for name, cls in SECTIONS.items() for key, f, _ in option_fields(cls, f"{name}.")
                if f.metadata.get("url")}  # fmt: skip
    looking = {key for name, cls in SECTIONS.items() for key, f, _ in option_fields(cls, f"{name}.")
               if "url" in key.rsplit(".", 1)[-1] or "URL" in f.metadata.get("doc", "")}  # fmt: skip
    assert declared == looking == set(URL_OPTIONS)
