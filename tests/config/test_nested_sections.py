"""Nested configuration sections (issue 63): a section field whose type is another section (``data.hf``, the options
only ``data.format=hf`` reads) is set nested in YAML or as ``data.hf.key=value``, refuses unknown keys naming the whole
dotted key, is written nested and read back identically, and is listed key by key; the former flat keys
(``data.image_column``, ...) are read as their new ones, in recipes, overrides and stored configurations."""

from __future__ import annotations

import logging

import pytest

from finecap.config import ConfigError, DataConfig, HfDataConfig, describe, load, load_stored
from finecap.config.fields import option_fields, subsections

FORMER = ("image_column", "caption_column", "split_column", "id_column")


def test_data_hf_is_a_nested_section_set_from_yaml_and_overrides(tmp_path):
    assert subsections(DataConfig) == {"hf": HfDataConfig}
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  format: hf\n  hf:\n    image_column: img\n    caption_column: text\n")
    cfg = load(recipe, ["data.hf.id_column=cocoid", "data.hf.caption_column=sentences"])
    assert cfg.data.hf == HfDataConfig(image_column="img", caption_column="sentences", id_column="cocoid")
    assert cfg.data.format == "hf" and load().data.hf == HfDataConfig()  # defaults: image, captions, none, none
    # A nested mapping as an override's value sets the keys it names; the others keep what lower layers set.
    assert load(recipe, ["data.hf={split_column: part}"]).data.hf.split_column == "part"


def test_layers_below_and_above_a_recipe_merge_a_nested_section_key_by_key(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  hf:\n    caption_column: text\n")
    cfg = load(recipe, base={"data": {"hf": {"image_column": "img", "caption_column": "below"}}},
               over={"data": {"hf": {"id_column": "cocoid"}}})  # fmt: skip
    assert (cfg.data.hf.image_column, cfg.data.hf.caption_column, cfg.data.hf.id_column) == ("img", "text", "cocoid")
    # a mapping option (not a section) is still replaced whole by a higher layer
    bags = load(None, base={"data": {"bag_schedule": {1: 0, 2: 3}}}, over={"data": {"bag_schedule": {3: 5}}})
    assert bags.data.bag_schedule == {3: 5}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["data.hf.image_columm=img"], "override 'data.hf.image_columm=img': unknown key 'data.hf.image_columm' "
                                       "(did you mean 'data.hf.image_column'?); valid keys of [data.hf]: "
                                       "caption_column, id_column, image_column, image_folder_column, "
                                       "questions_column, split_column"),
        (["data.questions_column=q"], "unknown key 'data.questions_column' (did you mean "
                                      "'data.hf.questions_column'?); valid keys of [data]: "),
        (["data.hff.image_column=img"], "override 'data.hff.image_column=img': data.hff is no nested section (did "
                                        "you mean 'data.hf'?)"),
        (["train.lr.x=1"], "override 'train.lr.x=1': train.lr is no nested section; a key looks like section.key"),
        (["data.hf=img"], "override 'data.hf=img': data.hf is a section: expected a mapping of its keys "
                          "(image_column, caption_column, split_column, id_column, questions_column, "
                          "image_folder_column), got 'img'"),
    ],
)  # fmt: skip
def test_what_is_refused_names_the_whole_dotted_key(overrides, expected):
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert expected in str(e.value)


def test_an_unknown_key_inside_the_section_in_a_recipe_names_the_file_and_the_key(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  hf:\n    image_column: img\n    caption_colum: text\n")
    with pytest.raises(ConfigError, match=r"r\.yaml: line 4: unknown key 'data\.hf\.caption_colum' \(did you mean "
                                          r"'data\.hf\.caption_column'\?\)") as e:  # fmt: skip
        load(recipe)
    assert e.value.key == "data.hf.caption_colum"
    recipe.write_text("data:\n  hf:\n    image_column: [a, b]\n")
    with pytest.raises(ConfigError, match=r"r\.yaml: line 3: data\.hf\.image_column: expected a string"):
        load(recipe)


def test_saved_nested_and_read_back_bit_identically(tmp_path):
    cfg = load(None, ["data.format=hf", "data.path=/data/coco", "data.hf.image_column=img",
                      "data.hf.questions_column=questions"])  # fmt: skip
    cfg.save(tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "  hf:\n    image_column: img\n    caption_column: captions\n" in text
    assert "image_column" not in text.split("  hf:\n")[0]  # only nested, never flat
    back = load_stored(tmp_path / "config.yaml")
    assert back == cfg and back.to_yaml() == text


def test_former_flat_keys_are_read_as_their_new_ones_and_said(tmp_path, caplog):
    recipe = tmp_path / "old.yaml"
    recipe.write_text("data:\n  format: hf\n  image_column: img\n  caption_column: text\n")
    with caplog.at_level(logging.WARNING, logger="finecap.config.loading"):
        cfg = load(recipe, ["data.id_column=cocoid"])
    assert (cfg.data.hf.image_column, cfg.data.hf.caption_column, cfg.data.hf.id_column) == ("img", "text", "cocoid")
    assert "data.image_column -> data.hf.image_column" in caplog.text
    assert "override 'data.id_column=cocoid': data.id_column is now data.hf.id_column (read as it)" in caplog.text
    # both spellings with different values cannot be told apart: refused, naming both
    recipe.write_text("data:\n  caption_column: text\n  hf:\n    caption_column: sentences\n")
    with pytest.raises(ConfigError, match="data.caption_column='text' and data.hf.caption_column='sentences' are both "
                                          "set"):  # fmt: skip
        load(recipe)


def test_a_run_config_stored_with_the_former_keys_loads(tmp_path):
    # a run's config.yaml as finecap wrote it before data.hf (the four columns flat in data)
    new = load(None, ["data.format=hf", "data.path=/data/coco", "data.hf.id_column=cocoid",
                      "data.hf.caption_column=sentences"])  # fmt: skip
    old = new.to_yaml().replace(
        "  hf:\n    image_column: image\n    caption_column: sentences\n    split_column: ''\n    id_column: cocoid\n"
        "    questions_column: ''\n    image_folder_column: ''\n",
        "  image_column: image\n  caption_column: sentences\n  split_column: ''\n  id_column: cocoid\n",
    )
    assert "hf:" not in old
    (tmp_path / "config.yaml").write_text(old)
    assert load_stored(tmp_path / "config.yaml") == new


def test_listings_show_the_nested_keys():
    rows = {key: (tp, default) for key, tp, default, _ in describe(DataConfig)}
    assert rows["hf.image_column"] == ("str", "image") and rows["hf.questions_column"] == ("str", "")
    assert "hf" not in rows and "image_column" not in rows
    assert [key for key, _, _ in option_fields(HfDataConfig, "data.hf.")] == [f"data.hf.{k}" for k in FORMER] + [
        "data.hf.questions_column",
        "data.hf.image_folder_column",
    ]


def test_a_nested_section_built_by_hand_is_checked_and_names_its_keys():
    assert HfDataConfig.section_name == "data.hf"
    assert DataConfig(hf=HfDataConfig(image_column="img")).hf.image_column == "img"


def test_a_resumed_run_and_the_trackers_see_the_nested_keys_one_by_one(tmp_path):
    from finecap.train.logging import tracker_config
    from finecap.train.state import config_changes

    cfg = load(None, ["data.format=hf", "data.path=/data/coco", "data.hf.caption_column=sentences"])
    flat = tracker_config(cfg.saved_dict())
    assert flat["data.hf.caption_column"] == "sentences" and "data.hf" not in flat
    # a run stored before data.hf (flat keys, no questions_column): resumed unchanged, nothing is reported changed
    old = cfg.to_yaml().replace(
        "  hf:\n    image_column: image\n    caption_column: sentences\n    split_column: ''\n    id_column: ''\n"
        "    questions_column: ''\n    image_folder_column: ''\n",
        "  image_column: image\n  caption_column: sentences\n  split_column: ''\n  id_column: ''\n",
    )
    (tmp_path / "config.yaml").write_text(old)
    assert config_changes(tmp_path / "config.yaml", cfg.saved_dict()) == []
    changed = load(None, ["data.format=hf", "data.path=/data/coco", "data.hf.caption_column=text"])
    assert config_changes(tmp_path / "config.yaml", changed.saved_dict()) == [
        "data.hf.caption_column: 'sentences' -> 'text'"
    ]


def test_a_format_reads_its_options_from_its_own_nested_section(monkeypatch):
    import helpers
    from finecap.data.formats import Format, format_options
    from finecap.data.records import DataError

    cfg = load(None, ["data.format=hf", "data.hf.caption_column=sentences"])
    assert format_options("hf", cfg)["caption_column"] == "sentences" and format_options("jsonl", cfg) == {}
    # a format of one's own declaring options no section data.<name> holds is refused, naming them
    monkeypatch.setattr(helpers, "LOST_FORMAT", Format("mine", lambda source: [], options=("image_column",)),
                        raising=False)  # fmt: skip
    with pytest.raises(DataError, match=r"its options image_column are no keys of a section data\.mine"):
        format_options("helpers:LOST_FORMAT", cfg)
