import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from finecap.app.world import main
from finecap.config import WorldConfig, load
from finecap.data.formats import read_dataset
from finecap.world.captions import vocabulary
from finecap.world.facts import faithfulness, scene_facts
from finecap.world.make import load_scene_records, load_scenes, make_world, world_key
from finecap.world.render import render
from finecap.world.scene import VARIANTS, sample_family, scene_diff


def _cfg(**kw) -> WorldConfig:
    base = dict(n_train=30, n_val=10, n_test=10, image_size=40, seed=3)
    return WorldConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[WorldConfig, Path]:
    cfg = _cfg(families=3)
    out = make_world(cfg, tmp_path_factory.mktemp("world") / "w", progress=False)
    return cfg, out


def test_layout(world):
    cfg, out = world
    for name in ("dataset.json", "dense.json", "scenes.jsonl", "world.json"):
        assert (out / name).is_file()
    data = json.loads((out / "dataset.json").read_text())
    images = data["images"]
    assert [im["imgid"] for im in images] == list(range(50))
    assert [im["split"] for im in images] == ["train"] * 30 + ["val"] * 10 + ["test"] * 10
    sentids = [s["sentid"] for im in images for s in im["sentences"]]
    assert sentids == list(range(250))
    for im in images:
        assert im["filename"] == f"{im['imgid']:06d}.png" and im["filepath"] == im["split"]
        assert (out / "images" / im["split"] / im["filename"]).is_file()
        assert len(im["sentences"]) == 5
        for s in im["sentences"]:
            assert s["tokens"] == s["raw"].split() and s["imgid"] == im["imgid"]
    meta = json.loads((out / "world.json").read_text())
    assert meta["key"] == world_key(cfg) and meta["counts"] == {"train": 30, "val": 10, "test": 10}
    assert meta["config"]["families"] == 3 and "out" not in meta["config"]
    assert meta["vocabulary"] == vocabulary()
    assert set(json.loads((out / "dense.json").read_text())) == {str(i) for i in range(50)}


def test_images_captions_and_scene_graphs_agree(world):
    cfg, out = world
    scenes = load_scenes(out)
    dense = json.loads((out / "dense.json").read_text())
    records = read_dataset("world", out)
    assert len(records) == len(scenes) == 50
    for r in records:
        scene = scenes[r.image_id]
        assert scene.id == r.image_id
        for c in r.captions:  # reference captions are true of the scene graph
            assert faithfulness(c, scene).precision == 1.0, c
        f = faithfulness(dense[str(r.image_id)], scene)
        assert (f.precision, f.recall) == (1.0, 1.0)
    for imgid in (0, 17, 33, 49):  # re-render a few scenes from scenes.jsonl and compare pixels
        r = records[imgid]
        saved = np.asarray(Image.open(r.path).convert("RGB"))
        assert saved.shape == (40, 40, 3)
        assert np.array_equal(saved, np.asarray(render(scenes[imgid], cfg.image_size)))


def test_captions_do_not_fit_other_scenes(world):
    _, out = world
    scenes = load_scenes(out)
    records = read_dataset("world", out / "dataset.json")
    # captions of scene i judged against scene i+1 (a different scene): many hallucinate
    wrong = sum(faithfulness(c, scenes[(r.image_id + 1) % 50]).precision < 1 for r in records for c in r.captions)
    assert wrong > 0.5 * 250


def test_families_differ_in_exactly_one_detail(world):
    _, out = world
    groups = defaultdict(list)
    for r in load_scene_records(out):
        groups[r["family"]].append(r)
    # 30 train -> 10 families of 3; 10 val -> 3 families of 3 + one of 1; same for test
    assert sorted(len(g) for g in groups.values()) == [1, 1] + [3] * 16
    for members in groups.values():
        assert len({m["split"] for m in members}) == 1
        base = members[0]
        assert base["variant"] == "base"
        for m in members[1:]:
            diff = scene_diff(base["scene"], m["scene"])
            assert len(diff) == 1 and diff[0].split(":")[0] == m["variant"], diff
            _assert_one_fact_level_detail(base["scene"], m["scene"], m["variant"])


def _assert_one_fact_level_detail(a, b, variant: str) -> None:
    """The changed facts (symmetric difference of the scenes' recall facts) concern one detail of one object."""
    changed = scene_facts(a) ^ scene_facts(b)
    shapes = {f.shape for f in changed if f.shape is not None}
    kinds = {f.kind for f in changed}
    if variant == "background":
        assert kinds == {"background"} and len(changed) == 2
    elif variant in ("add", "remove"):
        # one object's facts (object, colour, size, position, maybe pattern) and the two counts
        assert len(shapes) == 1 and {"object", "count"} <= kinds and len(changed) in (6, 7)
    elif variant == "shape":
        # every fact of the object moves from the old shape to the new one: 4 or 5 facts each
        assert len(shapes) == 2 and len(changed) in (8, 10) and "count" not in kinds
    elif variant == "pattern":
        assert kinds == {"pattern"} and len(shapes) == 1 and len(changed) in (1, 2)  # plain <-> patterned: 1
    else:
        assert kinds == {variant} and len(shapes) == 1 and len(changed) == 2  # old value out, new value in


def test_reuse_and_rebuild(tmp_path):
    cfg = _cfg(n_train=4, n_val=2, n_test=2)
    out = make_world(cfg, tmp_path / "w", progress=False)
    stamp = (out / "images" / "train" / "000000.png").stat().st_mtime_ns
    assert make_world(cfg, out, progress=False) == out
    assert (out / "images" / "train" / "000000.png").stat().st_mtime_ns == stamp  # skipped
    first = (out / "dataset.json").read_text()
    cfg2 = _cfg(n_train=4, n_val=2, n_test=2, seed=4)
    assert world_key(cfg2) != world_key(cfg)
    make_world(cfg2, out, progress=False)
    assert (out / "dataset.json").read_text() != first
    assert sorted(p.name for p in (out / "images" / "train").iterdir()) == [f"{i:06d}.png" for i in range(4)]
    # the key ignores the output folder only
    assert world_key(_cfg(n_train=4, n_val=2, n_test=2, out="elsewhere")) == world_key(cfg)


def test_same_config_gives_identical_files(tmp_path):
    cfg = _cfg(n_train=5, n_val=1, n_test=1)
    a = make_world(cfg, tmp_path / "a", progress=False)
    b = make_world(cfg, tmp_path / "b", progress=False)
    for name in ("dataset.json", "dense.json", "scenes.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "images/train/000003.png").read_bytes() == (b / "images/train/000003.png").read_bytes()


def test_main_uses_the_world_section(tmp_path, capsys):
    cfg = load(None, [f"world.out={tmp_path / 'cli'}", "world.n_train=3", "world.n_val=1", "world.n_test=1"])
    out = main(cfg)
    assert out == tmp_path / "cli" and len(load_scenes(out)) == 5
    assert "5 scenes (3 train / 1 val / 1 test)" in capsys.readouterr().out
    main(cfg)
    assert "up to date" in capsys.readouterr().out


def test_load_scene_records_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="finecap world make"):
        load_scenes(tmp_path)
    (tmp_path / "scenes.jsonl").write_text('{"imgid": 0, "scene": {"id": 0, "background": "lava", "objects": []}}\n')
    with pytest.raises(ValueError, match=r"scenes.jsonl, line 1: invalid scene record"):
        load_scenes(tmp_path)


def test_every_variant_kind_is_one_fact_level_detail():
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        members = sample_family(rng, 3, 0, 1, 4, 0.3)
        for scene, variant in members[1:]:
            _assert_one_fact_level_detail(members[0][0], scene, variant)
            seen.add(variant)
    assert seen == set(VARIANTS)
