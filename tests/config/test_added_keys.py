"""Keys added after configurations were first stored (``ADDED_KEYS``): a run stored before such a key existed reads
it as the behaviour of the finecap that wrote it, not as today's default (``data.jpeg_draft``: full-size JPEGs)."""

from __future__ import annotations

import logging

import yaml

from finecap.config import ADDED_KEYS, load, load_stored
from finecap.train.state import config_changes


def _stored_without(tmp_path, option):
    """A run's ``config.yaml`` as finecap stores it, with ``option`` left out (written before it existed)."""
    path = tmp_path / "run" / "config.yaml"
    load(None, ["run.dir=" + str(tmp_path / "run")]).save(path)
    data = yaml.safe_load(path.read_text())
    section, key = option.split(".")
    del data[section][key]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_every_added_key_is_an_option_whose_default_is_not_the_former_behaviour():
    defaults = load(None).to_dict()
    assert ADDED_KEYS  # the table is read: an empty one would make the tests below vacuous
    for option, before in ADDED_KEYS.items():
        section, key = option.split(".")
        assert key in defaults[section], option
        assert defaults[section][key] != before, option  # else the entry changes nothing


def test_a_run_stored_before_jpeg_draft_reads_it_as_full_size_decoding(tmp_path, caplog):
    assert load(None).data.jpeg_draft is True  # today's default
    path = _stored_without(tmp_path, "data.jpeg_draft")
    with caplog.at_level(logging.INFO, logger="finecap.config.stored"):
        cfg = load_stored(path)
    assert cfg.data.jpeg_draft is False  # as the run was trained: JPEGs decoded in full
    assert "data.jpeg_draft=False" in caplog.text and str(path) in caplog.text
    assert load_stored(path, ["data.jpeg_draft=true"]).data.jpeg_draft is True  # an override still wins
    # a resume with a recipe (today's default) is told that the option changes
    run = ["run.dir=" + str(tmp_path / "run")]
    assert config_changes(path, load(None, run).to_dict()) == ["data.jpeg_draft: False -> True"]


def test_a_run_stored_with_the_key_keeps_its_value(tmp_path):
    path = tmp_path / "run" / "config.yaml"
    load(None, ["data.jpeg_draft=true"]).save(path)
    assert load_stored(path).data.jpeg_draft is True
    load(None, ["data.jpeg_draft=false"]).save(path)
    assert load_stored(path).data.jpeg_draft is False
    assert config_changes(path, load(None, ["data.jpeg_draft=false"]).to_dict()) == []  # run.dir unset in both


def test_a_stored_file_without_the_section_keeps_the_defaults(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"run": {"seed": 3}}))
    assert load_stored(path).data.jpeg_draft is True
