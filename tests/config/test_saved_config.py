"""What :meth:`~finecap.config.Config.save` writes: the configuration with its paths absolute and its secrets masked
(:meth:`~finecap.config.Config.saved_dict`), as YAML (:meth:`~finecap.config.Config.to_yaml`), rendered once for the
same data, since a run writes it with each of its checkpoints, and again for any change, however small."""

from __future__ import annotations

import os

import yaml

from finecap.config import absolute_paths, load
from finecap.recipes import list_recipes
from helpers.config_yaml import count_renders, rendered_afresh


def test_every_recipe_is_saved_as_its_paths_made_absolute_and_its_secrets_masked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "clip").mkdir(parents=True)  # a relative model.encoder that is a folder here
    edges = [
        ["run.name=Café ☕ 日本語 — ünïcödé"],  # written escaped
        ["run.name=" + "a long run name with spaces " * 12],  # folded over lines
        ["run.name=: - # &a *b !t {x} [y] 'yes'"],  # quoted
        ["boost.llm_api_key=sk-secret-1", "boost.llm_base_url=http://user:pw@host/v1?api_key=zz"],  # masked
        ["world.out=data/w", "run.root=runs", "model.encoder=models/clip", "clipcap.lm=models/gpt2"],  # paths
        ["train.weight_decay=-0.0", "data.bag_schedule={1: 2, 5: 4}"],
    ]
    configs = [load(recipe) for recipe in list_recipes()] + [load(None, edge) for edge in edges]
    for cfg in configs:
        data = cfg.saved_dict()
        assert repr(data) == repr(absolute_paths(cfg).to_dict(redact=True)), cfg.run.name  # types and order too
        assert cfg.to_yaml() == rendered_afresh(cfg), cfg.run.name
    texts = [cfg.to_yaml() for cfg in configs[-len(edges) :]]
    assert "\\xE9" in texts[0] and "\n    spaces a long run name" in texts[1] and "sk-secret" not in texts[3]
    assert f"encoder: {tmp_path / 'models' / 'clip'}" in texts[4] and "lm: models/gpt2" in texts[4]  # a Hub name
    assert "weight_decay: -0.0" in texts[5]


def test_the_same_configuration_is_rendered_once(tmp_path, monkeypatch):
    renders = count_renders(monkeypatch)
    cfg = load(None, [f"run.dir={tmp_path / 'run'}"])  # a configuration no other test rendered
    for name in ("a.yaml", "b.yaml", "c.yaml"):
        cfg.save(tmp_path / name)
    again = load(None, [f"run.dir={tmp_path / 'run'}"])  # another object holding the same data
    assert again.to_yaml() == (tmp_path / "a.yaml").read_text(encoding="utf-8")
    assert len(renders) == 1
    assert {(tmp_path / n).read_bytes() for n in ("a.yaml", "b.yaml", "c.yaml")} == {rendered_afresh(cfg).encode()}


def test_any_change_to_what_is_saved_is_rendered_again(tmp_path, monkeypatch):
    """Each change below leaves the configuration equal (``==``), the same object, or its values the same, yet
    changes the text; each text must be what a fresh rendering writes."""
    monkeypatch.chdir(tmp_path)
    cfg = load(None, ["world.out=data/w", "model.encoder=models/clip", "train.weight_decay=0.0"])
    seen = [cfg.to_yaml()]

    def saved_now() -> str:
        text = cfg.to_yaml()
        assert text == rendered_afresh(cfg) and text not in seen  # what it writes now, and changed
        seen.append(text)
        return text

    cfg.train.weight_decay = -0.0  # == 0.0: an equality-keyed cache would write 0.0
    assert saved_now().count("weight_decay: -0.0") == 1
    cfg.run.seed = True  # == 1 (the seed), written `true`
    assert "seed: true" in saved_now()
    cfg.judge.urls.append("http://h/v1")  # the same object, changed in place
    assert "- http://h/v1" in saved_now()
    (tmp_path / "models" / "clip").mkdir(parents=True)  # model.encoder now reads as a folder here: made absolute
    assert f"encoder: {tmp_path / 'models' / 'clip'}" in saved_now()
    os.mkdir(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")  # the relative world.out is another folder from here
    assert f"out: {tmp_path / 'elsewhere' / 'data' / 'w'}" in saved_now()
    other = load(None)  # another configuration saved in between, then this one again
    assert other.to_yaml() == rendered_afresh(other) and cfg.to_yaml() == seen[-1] == rendered_afresh(cfg)
    assert yaml.safe_load(seen[-1])["run"]["seed"] is True
