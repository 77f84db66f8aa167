"""Paths in stored configurations (issue 21, item 3): finecap writes them absolute; a relative path found in a stored
file is read relative to that file; paths the user types stay relative to the working directory."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from finecap.config import PATH_KEYS, absolute_paths, load, load_stored


def test_path_keys_are_made_absolute_names_are_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clip").mkdir()  # a local checkpoint: model.encoder=clip means this folder
    cfg = load(None, ["world.out=data/w", "data.images=imgs", "run.dir=runs/x", "train.init_from=runs/y/best",
                      "model.encoder=clip", "clipcap.lm=gpt2", "retriever.checkpoint=openai/clip-vit-base-patch32",
                      "boost.prompts=prompts.yaml", "run.cache_dir=cache"])  # fmt: skip
    out = absolute_paths(cfg)
    assert out.world.out == str(tmp_path / "data" / "w")  # path keys: always (the world may not exist yet)
    assert (out.data.images, out.run.dir) == (str(tmp_path / "imgs"), str(tmp_path / "runs" / "x"))
    assert (out.train.init_from, out.boost.prompts) == (str(tmp_path / "runs/y/best"), str(tmp_path / "prompts.yaml"))
    assert out.run.cache_dir == str(tmp_path / "cache")
    assert out.model.encoder == str(tmp_path / "clip")  # name-or-path that exists here: a path
    assert (out.clipcap.lm, out.retriever.checkpoint) == ("gpt2", "openai/clip-vit-base-patch32")  # Hub names
    assert absolute_paths(load(None, ["model.encoder=world"])).model.encoder == "world"  # finecap's keyword
    (tmp_path / "world").mkdir()  # ... even when a folder of that name exists
    assert absolute_paths(load(None, ["model.encoder=world"])).model.encoder == "world"
    assert absolute_paths(load(None, ["data.path="])).data.path == ""  # empty = unset
    hub = load(None, ["data.format=hf", "data.path=org/coco"])
    assert absolute_paths(hub).data.path == "org/coco"  # a Hub data set name with data.format=hf
    assert absolute_paths(cfg, "/elsewhere").world.out == "/elsewhere/data/w"  # another base
    assert absolute_paths(out) == out  # absolute paths are kept


def test_every_path_key_is_a_config_key():
    cfg = load(None).to_dict()
    for dotted in PATH_KEYS:
        section, key = dotted.split(".")
        assert key in cfg[section], dotted


def test_saved_config_holds_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    load(None, ["world.out=data/w", "run.dir=runs/x"]).save(tmp_path / "runs" / "config.yaml")
    raw = yaml.safe_load((tmp_path / "runs" / "config.yaml").read_text())
    assert raw["world"]["out"] == str(tmp_path / "data" / "w") and raw["run"]["dir"] == str(tmp_path / "runs/x")
    stored_paths = [raw[s][k] for s, k in (d.split(".") for d, kind in PATH_KEYS.items() if kind == "path")]
    assert all(Path(p).is_absolute() for p in stored_paths if p)
    # Read back from anywhere: the same configuration.
    monkeypatch.chdir("/")
    stored = load_stored(tmp_path / "runs" / "config.yaml")
    assert stored.world.out == str(tmp_path / "data" / "w")


def test_relative_paths_in_a_stored_file_are_relative_to_it(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"world": {"out": "../../data/w"}, "data": {"images": "imgs"},
                                                     "decode": {"beam_size": 3}}))  # fmt: skip
    (run / "clip").mkdir()
    monkeypatch.chdir(tmp_path / "runs")
    stored = load_stored(run / "config.yaml", ["model.encoder=x/clip", "decode.strategy=beam"])
    assert stored.world.out == os.path.normpath(tmp_path / "data" / "w")  # from the file's folder
    assert stored.data.images == str(run / "imgs")
    assert stored.model.encoder == "x/clip"  # the user's override: relative to the working directory, as typed
    assert (stored.decode.strategy, stored.decode.beam_size) == ("beam", 3)  # stored keys kept, given ones replaced
