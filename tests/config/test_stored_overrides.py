"""A stored configuration (a run's ``config.yaml``, read back on resume, caption and eval) read with overrides on
top: an override of a key rescues the stored value it replaces (and only that one), and a key the file stores under a
former name (:data:`finecap.config.sections.MOVED_KEYS`) is read with one warning naming the file, the former key and
the new one, its errors naming the former key."""

from __future__ import annotations

import logging

import pytest

from finecap.config import ConfigError, load_stored


def test_an_override_of_a_stored_key_rescues_its_value_and_only_that(tmp_path):
    # a run stored `decode.beam_size: 100000` (a newer finecap bounds it at 100): `decode.beam_size=5` was refused
    # anyway, the stored file being checked alone before the override applied
    stored = tmp_path / "config.yaml"
    stored.write_text("decode:\n  strategy: beam\n  beam_size: 100000\nworld:\n  image_size: 8\n")
    cfg = load_stored(stored, ["decode.beam_size=5", "world.image_size=32"])
    assert (cfg.decode.beam_size, cfg.world.image_size) == (5, 32)
    cfg = load_stored(stored, ["world.image_size=32"], over={"decode": {"beam_size": 4}}, over_source="keywords: ")
    assert cfg.decode.beam_size == 4
    with pytest.raises(ConfigError, match=rf"^{stored}: line 3: decode.beam_size: must be <= 100, got 100000"):
        load_stored(stored, ["world.image_size=32"])  # an override of another key rescues nothing
    with pytest.raises(ConfigError, match=rf"^{stored}: line 5: world.image_size: must be in \[16, 1024\], got 8"):
        load_stored(stored, ["decode.beam_size=5"])
    with pytest.raises(ConfigError, match=r"^override 'decode.beam_size=500': decode.beam_size: must be <= 100"):
        load_stored(stored, ["decode.beam_size=500", "world.image_size=32"])  # the override's own value is checked


def test_a_stored_former_key_warns_once_naming_both_keys_and_the_file(tmp_path, caplog):
    # `rl: {alpha: 0.5}` in a run stored before the split of rl was read as sle.alpha without a word, and an error
    # about it named sle.alpha, which the file does not hold
    stored = tmp_path / "config.yaml"
    stored.write_text("rl:\n  alpha: 0.5\ndata:\n  image_column: img\n")
    with caplog.at_level(logging.WARNING, logger="finecap.config.stored"):
        cfg = load_stored(stored)
        load_stored(stored)  # a command reading the run's configuration twice warns once
    assert (cfg.sle.alpha, cfg.data.hf.image_column) == (0.5, "img")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"{stored}: written before these keys moved, read under their new names: rl.alpha -> "
                        "sle.alpha, data.image_column -> data.hf.image_column"]  # fmt: skip
    stored.write_text("rl:\n  alpha: 1.5\n")
    with pytest.raises(ConfigError, match=rf"^{stored}: line 2: sle.alpha: .*got 1.5 \({stored} sets it as rl.alpha, "
                                          r"its former name\)$"):  # fmt: skip
        load_stored(stored)
    assert load_stored(stored, ["sle.alpha=0.5"]).sle.alpha == 0.5  # an override of it rescues it, as any key's


def test_a_stored_former_model_key_warns_naming_its_backbone_key(tmp_path, caplog):
    stored = tmp_path / "config.yaml"
    stored.write_text("model:\n  kind: clipcap\n  prefix_length: 0\n")
    former = rf"clipcap.prefix_length: .*\({stored} sets it as model.prefix_length"
    with caplog.at_level(logging.WARNING, logger="finecap.config.stored"), pytest.raises(ConfigError, match=former):
        load_stored(stored)
    assert "model.prefix_length -> clipcap.prefix_length" in caplog.text
