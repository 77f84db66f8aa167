"""Users' data is sacred, preparation is explicit, and reusable artefacts live in the finecap home (issue 21).

- Every command that takes ``world.out`` refuses a folder of user files, exits non-zero and leaves every file as it
  was, byte for byte; a finecap world with other settings is refused with the settings that differ.
- The world and the world encoder are made or trained only by a command that trains on the world, with one printed
  line saying what and where, and found again (never remade) by later commands from any directory; for a user's data
  set a missing encoder stops the command with an error naming ``finecap retriever train``.
- ``finecap.home``: ``FINECAP_HOME``, else the user cache directory; the quick demo writes nothing into the working
  directory but the run directory it was given.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from finecap.app.cli import main
from finecap.config import load
from finecap.home import cache_dir, home, world_path
from finecap.models.world_encoder_cache import encoder_dir
from finecap.train.prepare import prepare
from finecap.world.make import MARKER, make_world, world_key

USER_FILES = {
    "images/train2014/COCO_1.jpg": b"\xff\xd8\xff\xe0 not really a jpeg, but the user's",
    "dataset.json": json.dumps(
        {
            "images": [
                {
                    "filename": "COCO_1.jpg",
                    "filepath": "train2014",
                    "split": "train",
                    "sentences": [{"raw": "a cat on a mat"}],
                }
            ]
        }
    ).encode(),  # fmt: skip
    "notes.txt": b"my notes\n",
}
WORLD = ("world.n_train=20", "world.n_val=4", "world.n_test=4", "world.image_size=32")
"""A tiny world (28 images)."""
ENCODER = ("retriever.epochs=1", "retriever.batch_size=8", "retriever.batch_size_eval=16")
"""A world encoder trained in two steps."""
CAPTIONER = ("clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
             "train.max_steps=1", "train.batch_size=8", "train.eval_samples=4", "train.log_every=1",
             "decode.max_length=6")  # fmt: skip
"""A tiny ClipCap trained for one step."""


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes); folders listed with ``None``."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture
def user_folder(tmp_path) -> Path:
    folder = tmp_path / "my-data"
    for name, data in USER_FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture
def home_dir(tmp_path, monkeypatch) -> Path:
    """A fresh finecap home for one test."""
    path = tmp_path / "home"
    monkeypatch.setenv("FINECAP_HOME", str(path))
    return path


def commands(world_out: Path, tmp: Path) -> dict[str, list[str]]:
    """Every command that takes ``world.out``, pointed at ``world_out``, writing everything else under ``tmp``."""
    w = f"world.out={world_out}"
    return {
        "world make": ["world", "make", "--out", str(world_out), "--n-train", "20", "--n-val", "4", "--n-test", "4"],
        "world make --force": ["world", "make", "--out", str(world_out), "--force"],
        "train": ["train", w, *WORLD, *ENCODER, *CAPTIONER, f"run.dir={tmp / 'run'}"],
        "demo": ["demo", "--quick", "--run-dir", str(tmp / "demo"), w],
        "retriever train": ["retriever", "train", w, *WORLD, *ENCODER],
        "retriever probe": ["retriever", "probe", "--out", str(tmp / "probe.json"), w, *WORLD, *ENCODER],
        "boost": ["boost", "--out", str(tmp / "boosted"), w, *WORLD],
        "bags build": ["bags", "build", "--out", str(tmp / "bags.json"), w, *WORLD],
    }


COMMANDS = list(commands(Path("x"), Path("y")))


@pytest.mark.parametrize("overwrite", [False, True], ids=["", "overwrite"])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_leaves_a_user_folder_untouched(command, overwrite, user_folder, tmp_path, home_dir,
                                                      monkeypatch, capsys):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    before = snapshot(user_folder)
    argv = commands(user_folder, tmp_path / "out")[command] + (["world.overwrite=true"] if overwrite else [])
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert f"world.out={user_folder}: this folder is not empty and is not a finecap world" in err, err
    assert snapshot(user_folder) == before  # every file byte for byte, and nothing added
    assert not (home_dir / "worlds").exists() and not (home_dir / "cache" / "world_encoder").exists()


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "world make --force"])
def test_every_command_refuses_a_finecap_world_of_other_settings(command, tmp_path, home_dir, monkeypatch, capsys):
    """The issue's `finecap train demo/mle world.out=data/world-quick`: a world with other settings is neither
    regenerated nor trained on; the error lists what differs and the ways out."""
    monkeypatch.chdir(tmp_path)
    world = make_world(load(None, ["world.n_train=6", "world.n_val=2", "world.n_test=2",
                                   "world.image_size=32"]).world, tmp_path / "quick", progress=False)  # fmt: skip
    before = snapshot(world)
    assert main(commands(world, tmp_path / "out")[command]) != 0
    err = capsys.readouterr().err
    assert f"world.out={world} holds another finecap world" in err, err
    assert "world.n_train: 6 -> " in err and "world.overwrite=true" in err and "world.out=DIR" in err
    assert snapshot(world) == before
    assert not (home_dir / "cache" / "world_encoder").exists()  # no encoder trained on anything


def test_training_on_the_world_prepares_it_once_with_one_line_each(tmp_path, home_dir, monkeypatch, capsys):
    cfg = load(None, [*WORLD, *ENCODER])
    world_dir, encoder = home_dir / "worlds" / world_key(cfg.world), encoder_dir(cfg)
    assert world_path(cfg.world) == world_dir and encoder.parent.parent == home_dir / "cache"
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()

    monkeypatch.chdir(tmp_path / "a")
    assert main(["retriever", "train", *WORLD, *ENCODER]) == 0
    out = capsys.readouterr().err  # status lines: the finecap logger, to stderr
    made = [line for line in out.splitlines() if line.startswith("world: making")]
    trained = [line for line in out.splitlines() if line.startswith("retriever: training")]
    assert made == [f"world: making the world {world_key(cfg.world)} (20 train / 4 val / 4 test images, 32 px) in "
                    f"{world_dir}"]  # fmt: skip
    assert len(trained) == 1 and trained[0].endswith(f"into {encoder}") and str(world_dir) in trained[0]
    stamps = {p: p.stat().st_mtime_ns for p in (world_dir / "world.json", encoder / "encoder.json")}
    assert list((tmp_path / "a").iterdir()) == []  # nothing in the working directory

    # Another directory, another run directory, `finecap train` and a demo on the same world: nothing remade.
    monkeypatch.chdir(tmp_path / "b")
    assert main(["train", *WORLD, *ENCODER, *CAPTIONER, f"run.dir={tmp_path / 'c' / 'run'}"]) == 0
    assert main(["demo", "--stages", "world,retriever", "--run-dir", str(tmp_path / "c" / "demo"), *WORLD,
                 *ENCODER]) == 0  # fmt: skip
    out = capsys.readouterr().err
    assert "world: making" not in out and "retriever: training" not in out
    assert f"retriever: {encoder}" in out and f"world: {world_dir}" in out
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert list((tmp_path / "b").iterdir()) == []
    assert (tmp_path / "c" / "run" / "config.yaml").exists()


def test_a_users_data_set_never_gets_a_world_or_encoder_made(tmp_path, home_dir, monkeypatch, capsys):
    """`finecap train` on a Karpathy file with the world encoder as the captioner's encoder: the missing encoder
    stops the run with an error naming the command that trains it; no world is made, nothing trained."""
    monkeypatch.chdir(tmp_path)
    source = make_world(load(None, list(WORLD)).world, tmp_path / "elsewhere", progress=False)
    data = ["data.format=karpathy", f"data.path={source / 'dataset.json'}", f"data.images={source / 'images'}"]
    assert main(["train", *data, *WORLD, *ENCODER, *CAPTIONER, f"run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "world encoder of this configuration" in err and "`finecap retriever train`" in err
    assert "retriever.checkpoint" in err
    assert not home_dir.exists()  # neither a world nor an encoder

    cfg = load(None, [*data, *WORLD, *ENCODER])
    with pytest.raises(FileNotFoundError, match="finecap retriever train"):
        prepare(cfg, {"data", "retriever"})
    with pytest.raises(FileNotFoundError, match="finecap world make"):
        prepare(cfg, {"world"})  # the world itself, for a command whose data is not the world
    assert prepare(cfg, {"data"}).world is None  # a user's data set: nothing to prepare
    assert not home_dir.exists()


def test_reading_commands_never_make_the_world(tmp_path, home_dir, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["boost", "--out", str(tmp_path / "boosted"), *WORLD]) == 2
    assert "`finecap world make`" in capsys.readouterr().err
    assert main(["bags", "build", "--out", str(tmp_path / "bags.json"), *WORLD]) == 2
    assert "`finecap world make`" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no world in the home, no output folder, nothing in the working directory


def test_prepare_rejects_unknown_needs():
    with pytest.raises(ValueError, match=r"unknown need\(s\) \['encoder'\]; valid: data, world, world_encoder"):
        prepare(load(None, []), {"encoder"})


# --------------------------------------------------------------------------------------------------------------------
# The finecap home
# --------------------------------------------------------------------------------------------------------------------


def test_home_is_finecap_home_else_the_user_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "h"))
    assert home() == tmp_path / "h"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FINECAP_HOME", "rel")
    assert home() == tmp_path / "rel"  # absolute: a later chdir does not move it
    monkeypatch.delenv("FINECAP_HOME")
    if sys.platform != "linux":
        pytest.skip("the XDG rules below are Linux's (platformdirs gives the macOS / Windows places)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert home() == tmp_path / "xdg" / "finecap"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert home() == tmp_path / "me" / ".cache" / "finecap"


def test_resolvers_use_the_fields_when_set(tmp_path, home_dir):
    cfg = load(None, [*WORLD])
    assert cfg.world.out == "" and cfg.run.cache_dir == ""
    assert world_path(cfg.world) == home_dir / "worlds" / world_key(cfg.world)
    assert cache_dir(cfg.run) == home_dir / "cache"
    cfg = load(None, [*WORLD, f"world.out={tmp_path / 'w'}", f"run.cache_dir={tmp_path / 'c'}"])
    assert world_path(cfg.world) == tmp_path / "w" and cache_dir(cfg.run) == tmp_path / "c"
    assert not home_dir.exists()  # resolving creates nothing


@pytest.mark.slow
def test_quick_demo_writes_nothing_into_the_working_directory(quick_demo_run, monkeypatch):
    """`finecap demo --quick --run-dir B` from the empty directory A (tests/conftest.py): A holds only B; the world
    and the world encoder are in the finecap home (the demo's own, ``FINECAP_HOME``), keyed by the quick settings."""
    from finecap.app.demo import QUICK, load_demo_config

    finecap_home = quick_demo_run.home
    monkeypatch.setenv("FINECAP_HOME", str(finecap_home))
    run_dir = quick_demo_run.run_dir
    cwd = run_dir.parent
    assert [p.name for p in cwd.iterdir()] == ["run"]
    cfg = load_demo_config(None, [], quick=True)
    assert cfg.world.n_train == QUICK["world"]["n_train"]
    world = finecap_home / "worlds" / world_key(cfg.world)
    assert (world / MARKER).is_file() and (world / "world.json").is_file()
    assert (encoder_dir(cfg) / "encoder.json").is_file() and encoder_dir(cfg).is_relative_to(finecap_home)
    saved = (run_dir / "config.yaml").read_text()
    assert str(cwd / "data") not in saved and "runs/cache" not in saved
    assert os.path.samefile(world_path(cfg.world), world)
