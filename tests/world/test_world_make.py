import json
import logging
import random
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from finecap.app.world import main
from finecap.config import WorldConfig, load
from finecap.data.formats import read_dataset
from finecap.home import world_path
from finecap.world.captions import vocabulary
from finecap.world.facts import faithfulness, scene_facts
from finecap.world.make import (
    MARKER,
    WorldFolderError,
    check_world_folder,
    is_complete,
    load_scene_records,
    load_scenes,
    make_world,
    world_key,
    world_record,
)
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


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_world_is_reused(tmp_path):
    cfg = _cfg(n_train=4, n_val=2, n_test=2)
    out = make_world(cfg, tmp_path / "w", progress=False)
    assert json.loads((out / MARKER).read_text())["key"] == world_key(cfg)  # the folder is marked finecap's
    stamp = (out / "images" / "train" / "000000.png").stat().st_mtime_ns
    assert check_world_folder(cfg, out) is True
    assert make_world(cfg, out, progress=False) == out
    assert (out / "images" / "train" / "000000.png").stat().st_mtime_ns == stamp  # skipped
    # the key ignores the output folder and the overwrite switch only
    assert world_key(_cfg(n_train=4, n_val=2, n_test=2, out="elsewhere", overwrite=True)) == world_key(cfg)


def test_other_world_is_refused_with_the_settings_that_differ(tmp_path):
    out = make_world(_cfg(n_train=4, n_val=2, n_test=2), tmp_path / "w", progress=False)
    before = _snapshot(out)
    other = _cfg(n_train=6, n_val=2, n_test=2, seed=4)
    with pytest.raises(WorldFolderError) as e:
        make_world(other, out, progress=False)
    message = str(e.value)
    assert f"world.out={out} holds another finecap world" in message
    assert "world.n_train: 4 -> 6" in message and "world.seed: 3 -> 4" in message
    assert "world.image_size" not in message  # only what differs
    assert "world.out=DIR" in message and "--force" in message and "world.overwrite=true" in message
    assert _snapshot(out) == before  # nothing touched


def test_overwrite_removes_only_the_files_finecap_made(tmp_path):
    out = make_world(_cfg(n_train=4, n_val=2, n_test=2), tmp_path / "w", progress=False)  # imgids 0-7
    user = {"notes.txt": b"my notes\n", "images/train/mine.jpg": b"\xff\xd8 jpeg", "images/extra/x.png": b"png",
            "images/val/cat.png": b"not finecap's"}  # fmt: skip
    for name, data in user.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    new = _cfg(n_train=2, n_val=1, n_test=1, seed=4)  # imgids 0-3
    assert make_world(new, out, progress=False, overwrite=True) == out
    for name, data in user.items():
        assert (out / name).read_bytes() == data, name
    assert sorted(p.name for p in (out / "images" / "train").iterdir()) == ["000000.png", "000001.png", "mine.jpg"]
    assert sorted(p.name for p in (out / "images" / "val").iterdir()) == ["000002.png", "cat.png"]
    assert sorted(p.name for p in (out / "images" / "test").iterdir()) == ["000003.png"]
    assert json.loads((out / "world.json").read_text())["key"] == world_key(new)
    assert json.loads((out / MARKER).read_text())["key"] == world_key(new)
    assert len(read_dataset("world", out)) == 4
    assert check_world_folder(new, out) is True
    # world.overwrite in the configuration does the same as the argument
    back = _cfg(n_train=4, n_val=2, n_test=2, overwrite=True)
    make_world(back, out, progress=False)
    assert len(read_dataset("world", out)) == 8 and (out / "notes.txt").read_bytes() == user["notes.txt"]


def test_folder_finecap_did_not_make_is_refused_even_with_overwrite(tmp_path):
    folder = tmp_path / "mine"
    (folder / "images" / "train2014").mkdir(parents=True)
    (folder / "images" / "train2014" / "COCO_1.jpg").write_bytes(b"\xff\xd8 a photo")
    (folder / "dataset.json").write_text('{"images": []}')
    before = _snapshot(folder)
    for overwrite in (False, True):
        with pytest.raises(WorldFolderError, match="not empty and is not a finecap world"):
            make_world(_cfg(n_train=2, n_val=1, n_test=1), folder, progress=False, overwrite=overwrite)
    assert _snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == ["dataset.json", "images"]
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(WorldFolderError, match="a file, not a folder"):
        make_world(_cfg(n_train=2, n_val=1, n_test=1), tmp_path / "a-file", progress=False)
    assert (tmp_path / "a-file").read_text() == "x"


def test_world_whose_images_link_elsewhere_is_never_written(tmp_path):
    """A `finecap boost` copy of a world links its images to the source world: replacing or completing it would write
    (and remove) the source's images through the link."""
    source = make_world(_cfg(n_train=2, n_val=1, n_test=1), tmp_path / "source", progress=False)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("dataset.json", "scenes.jsonl", "dense.json", "world.json"):
        (copy / name).write_bytes((source / name).read_bytes())
    (copy / "images").symlink_to(source / "images", target_is_directory=True)
    before = _snapshot(source)
    assert check_world_folder(_cfg(n_train=2, n_val=1, n_test=1), copy) is True  # reading it is fine
    with pytest.raises(WorldFolderError, match="images folder is a link"):
        make_world(_cfg(n_train=3, n_val=1, n_test=1), copy, progress=False, overwrite=True)
    (copy / "dataset.json").unlink()  # incomplete: completing it would write through the link too
    with pytest.raises(WorldFolderError, match="images folder is a link"):
        make_world(_cfg(n_train=2, n_val=1, n_test=1), copy, progress=False)
    assert _snapshot(source) == before


def test_empty_folder_is_made(tmp_path):
    (tmp_path / "empty").mkdir()
    cfg = _cfg(n_train=2, n_val=1, n_test=1)
    assert check_world_folder(cfg, tmp_path / "empty") is False
    assert check_world_folder(cfg, tmp_path / "missing") is False
    assert is_complete(make_world(cfg, tmp_path / "empty", progress=False), world_key(cfg))


def test_interrupted_world_is_finecap_s_and_completed(tmp_path, monkeypatch):
    import finecap.world.make as wm

    cfg = _cfg(n_train=3, n_val=1, n_test=1)
    calls = []

    def render_then_fail(scene, size):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(scene.id)
        return render(scene, size)

    monkeypatch.setattr(wm, "render", render_then_fail)
    with pytest.raises(KeyboardInterrupt):
        make_world(cfg, tmp_path / "w", progress=False)
    monkeypatch.undo()
    out = tmp_path / "w"
    assert (out / MARKER).exists() and not (out / "world.json").exists()  # marker first, world.json last
    assert check_world_folder(cfg, out) is False  # the same world, unfinished: make_world completes it
    other = _cfg(n_train=2, n_val=1, n_test=1)
    with pytest.raises(WorldFolderError, match="world.n_train: 3 -> 2"):  # still a finecap world, another one
        make_world(other, out, progress=False)
    make_world(cfg, out, progress=False)
    assert is_complete(out, world_key(cfg)) and len(read_dataset("world", out)) == 5


def _make_world_killed_at_third_image(cfg, out):
    import os
    import signal

    import finecap.utils.files as files

    renames = []

    def rename_or_die(src, dst, **kwargs):
        renames.append(dst)
        if len(renames) == 4:  # the marker, two images, then the third image's temporary file: SIGKILL, as a job's end
            os.kill(os.getpid(), signal.SIGKILL)
        return replace_durably(src, dst, **kwargs)

    replace_durably = files.replace_durably
    files.replace_durably = rename_or_die
    make_world(cfg, out, progress=False)


def test_a_world_whose_writer_was_killed_is_completed_without_its_temporary_files(tmp_path):
    # a writer SIGKILLed mid-write left ".000002.png.<random>.tmp" in images/train for good: the process completing
    # the world (holding its lock) never removed it
    import multiprocessing

    cfg = _cfg(n_train=4, n_val=1, n_test=1)
    out = tmp_path / "w"
    killed = multiprocessing.get_context("fork").Process(target=_make_world_killed_at_third_image, args=(cfg, out))
    killed.start()
    killed.join(60)
    assert killed.exitcode == -9
    left = [p.name for p in (out / "images" / "train").iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and left[0].startswith(".000002.png.")  # the kill's leftover, as a real kill leaves it
    mine = [out / "images" / "train" / ".notes.png.abc.tmp", out / "images" / ".000001.png.abc.tmp",
            out / ".mine.json.abc.tmp"]  # fmt: skip
    for path in mine:  # the user's files, though named like temporaries: not of a world's file, or not in its folder
        path.write_text("keep")
    make_world(cfg, out, progress=False)
    assert is_complete(out, world_key(cfg)) and len(read_dataset("world", out)) == 6
    assert not [p for p in out.rglob("*.tmp") if p not in mine]
    assert all(path.read_text() == "keep" for path in mine)


def test_world_made_before_markers_is_recognised(tmp_path):
    cfg = _cfg(n_train=2, n_val=1, n_test=1)
    out = make_world(cfg, tmp_path / "w", progress=False)
    (out / MARKER).unlink()  # as written by finecap before the marker existed: world.json names the world
    assert world_record(out)["key"] == world_key(cfg)
    assert make_world(cfg, out, progress=False) == out and not (out / MARKER).exists()  # reused as it is
    with pytest.raises(WorldFolderError, match="world.seed: 3 -> 5"):
        make_world(_cfg(n_train=2, n_val=1, n_test=1, seed=5), out, progress=False)
    (out / "notes.txt").write_text("keep")
    make_world(_cfg(n_train=2, n_val=1, n_test=1, seed=5), out, progress=False, overwrite=True)
    assert (out / "notes.txt").read_text() == "keep" and world_record(out)["config"]["seed"] == 5


def test_default_folder_is_in_the_finecap_home(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="finecap")
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    cfg = load(None, ["world.n_train=2", "world.n_val=1", "world.n_test=1"])
    assert cfg.world.out == ""
    out = main(cfg)
    assert out == tmp_path / "home" / "worlds" / world_key(cfg.world) == world_path(cfg.world)
    assert is_complete(out, world_key(cfg.world))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # nothing in the working directory
    assert any(str(out) in m for m in caplog.messages)


def test_cli_force_replaces_a_finecap_world(tmp_path, capsys):
    from finecap.app.cli import main as cli

    out = tmp_path / "w"
    args = ["world", "make", "--out", str(out), "--n-train", "2", "--n-val", "1", "--n-test", "1"]
    assert cli(args) == 0
    (out / "notes.txt").write_text("keep")
    assert cli([*args, "--seed", "9"]) == 2
    err = capsys.readouterr().err
    assert "world.seed: 0 -> 9" in err and "--force" in err
    assert world_record(out)["config"]["seed"] == 0
    assert cli([*args, "--seed", "9", "--force"]) == 0
    assert world_record(out)["config"]["seed"] == 9 and (out / "notes.txt").read_text() == "keep"


def test_out_names_a_folder_or_is_refused(tmp_path, monkeypatch, capsys):
    """``--out null`` (or ``~``, ``none``, empty) was read as a path option's "no path": the world went to the
    default folder under the finecap home, not where the user pointed, and said nothing; it is refused now. Any other
    text is the folder's name as typed, not YAML (``--out [a]`` was refused as a list). The same flag helper serves
    ``finecap train --out``."""
    from finecap.app.cli import main as cli

    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    args = ["world", "make", "--n-train", "2", "--n-val", "1", "--n-test", "1"]
    for name in ("null", "~", "None", " "):
        assert cli([*args, "--out", name]) == 2
        assert f"--out {name!r} names no folder" in capsys.readouterr().err
    assert cli(["train", "--out", "null"]) == 2 and "--out 'null' names no folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing made, the default folder neither
    assert cli([*args, "--out", "[a]"]) == 0
    assert is_complete(tmp_path / "[a]", world_record(tmp_path / "[a]")["key"])


def test_same_config_gives_identical_files(tmp_path):
    cfg = _cfg(n_train=5, n_val=1, n_test=1)
    a = make_world(cfg, tmp_path / "a", progress=False)
    b = make_world(cfg, tmp_path / "b", progress=False)
    for name in ("dataset.json", "dense.json", "scenes.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "images/train/000003.png").read_bytes() == (b / "images/train/000003.png").read_bytes()


def test_main_uses_the_world_section(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="finecap")
    cfg = load(None, [f"world.out={tmp_path / 'cli'}", "world.n_train=3", "world.n_val=1", "world.n_test=1"])
    out = main(cfg)
    assert out == tmp_path / "cli" and len(load_scenes(out)) == 5
    assert "5 scenes (3 train / 1 val / 1 test)" in caplog.text
    caplog.clear()
    main(cfg)
    assert "up to date" in caplog.text


def test_load_scene_records_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="finecap world make"):
        load_scenes(tmp_path)
    (tmp_path / "scenes.jsonl").write_text('{"imgid": 0, "scene": {"id": 0, "background": "lava", "objects": []}}\n')
    with pytest.raises(ValueError, match=r"scenes.jsonl, line 1: invalid scene record"):
        load_scenes(tmp_path)


@pytest.mark.parametrize(
    "line, says",
    [
        ('{"imgid": 0, "scene": {"id": 0, "background": "grass", "objects": [{"shape": "circle", "color": "red", '
         '"size": "large", "row": "1", "col": 1}]}}', r"cell \('1', 1\): row and col must be integers"),
        ('{"imgid": 0, "scene": {"id": 0, "background": "grass", "objects": [{"shape": "circle", "color": "red", '
         '"size": "large", "row": null, "col": 1}]}}', r"cell \(None, 1\): row and col must be integers"),
        ("[1, 2]", "a JSON object with an integer 'imgid'"),
        ('{"scene": {"id": 0, "background": "grass", "objects": []}}', "a JSON object with an integer 'imgid'"),
    ],
)  # fmt: skip
def test_a_scene_record_of_the_wrong_type_names_its_file_and_line(tmp_path, line, says):
    # A string or null row raised TypeError ('<=' not supported), a line that is a list TypeError (list indices), a
    # line without imgid KeyError in load_scenes: tracebacks naming neither the file nor the line
    (tmp_path / "scenes.jsonl").write_text("\n" + line + "\n")
    with pytest.raises(ValueError, match=r"scenes.jsonl, line 2: invalid scene record: .*" + says):
        load_scenes(tmp_path)


def test_a_float_cell_is_refused_not_read_as_a_cell_of_its_own(tmp_path):
    # row 1.0 was accepted: the object's cell was 4.0, and every fact check then failed on CELLS[4.0] (TypeError)
    (tmp_path / "scenes.jsonl").write_text(
        '{"imgid": 0, "scene": {"id": 0, "background": "grass", "objects": [{"shape": "circle", "color": "red", '
        '"size": "large", "row": 1.0, "col": 1}]}}\n'
    )
    with pytest.raises(ValueError, match=r"line 1: invalid scene record: scene 0: cell \(1.0, 1\): row and col"):
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


def test_a_float_setting_given_as_an_int_is_the_same_world():
    # WorldConfig(pattern_prob=1) hashed to another key than 1.0: the same world made twice, or refused in world.out
    from finecap.world.key import world_key

    assert world_key(WorldConfig(pattern_prob=1)) == world_key(WorldConfig(pattern_prob=1.0))
    assert world_key(WorldConfig(pattern_prob=1)) != world_key(WorldConfig(pattern_prob=0.5))


def test_two_makers_of_one_folder_write_one_after_the_other(tmp_path):
    """Two commands making a world into one folder at once (two terminals, a job array on a fresh home): the second
    waits for the first and then finds its world (the same settings) or refuses it (other settings); it never took
    the first's half-made folder for the user's, nor mixed its images into the first's world."""
    import threading

    from finecap.world import make as world_make

    small = dict(n_train=6, n_val=2, n_test=2, image_size=16)
    first, same, other = WorldConfig(seed=1, **small), WorldConfig(seed=1, **small), WorldConfig(seed=2, **small)
    out = tmp_path / "world"
    out.mkdir()
    # the first maker's folder just after it began: its lock and its marker's temporary file, nothing else
    (out / world_make.LOCK).touch()
    (out / f".{world_make.MARKER}.abcd1234.tmp").write_text("{")
    assert world_make.check_world_folder(same, out) is False  # a world being made, not a folder of the user's
    (out / f".{world_make.MARKER}.abcd1234.tmp").unlink()
    outcomes: dict[str, object] = {}

    def second(name, cfg):
        try:
            outcomes[name] = world_make.make_world_said(cfg, out, progress=False)
        except Exception as e:  # noqa: BLE001 - recorded and asserted below
            outcomes[name] = e

    with world_make.making_lock(out):  # the first maker, writing
        threads = [threading.Thread(target=second, args=(n, c)) for n, c in (("same", same), ("other", other))]
        for t in threads:
            t.start()
        time.sleep(0.5)
        assert outcomes == {}  # both wait for the first
        world_make._write_world(first, out, progress=False)
    for t in threads:
        t.join(30)
    assert outcomes["same"] == (out, False)  # found complete: reused, not written again (and said so)
    assert isinstance(outcomes["other"], world_make.WorldFolderError)
    assert "holds another finecap world" in str(outcomes["other"])
    assert world_make.world_record(out)["key"] == world_make.world_key(first) and world_make.is_complete(
        out, world_make.world_key(first)
    )
    assert not world_make.edited_files(out)
