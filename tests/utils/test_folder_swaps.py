"""Folder swaps and data loss (issue 48): finecap swaps a folder into place only over a folder it made.

Every folder finecap swaps into place (:func:`finecap.utils.folders.atomic_replace_dir`: checkpoints, merged exports,
world encoders) carries finecap's mark (:data:`finecap.utils.folders.FOLDER_MARK`, holding the folder's kind). Whatever
else is at the swap's names (``OUT``, ``OUT.old``, the temporary ``.OUT.tmp``) is refused with one line naming it and
left as it was: a folder of the user's, a file, a link, an empty folder, a folder marked as another kind, a forged
mark. Tested at the helper and through every caller: ``finecap export``, the checkpoint writer, training
(``--resume``), the world encoder's cache. ``finecap export --force`` into a run's checkpoint folders is refused; the
checkpoints a kill leaves (``.last.tmp``, ``last.old``) are still recovered (tests/train/test_run_safety.py).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from finecap.config import ClipCapBackboneConfig, load
from finecap.models import lora
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm, save_tiny_clip
from finecap.models.vision import VisionEncoder
from finecap.train.checkpoint import save_checkpoint
from finecap.train.state import CHECKPOINT_KIND
from finecap.utils.files import OutputRefused, make_temporary_dir
from finecap.utils.folders import (
    FOLDER_MARK,
    atomic_replace_dir,
    check_own_folder,
    folder_mark_text,
    is_finecap_folder,
    mark_folder,
    previous_dir,
    remove_own_folder,
)
from helpers.cli import refused, run_cli
from helpers.user_folders import PRECIOUS, snapshot, user_folder

INFO = {"step": 7, "epoch": 1, "total_steps": 10}


def plant(variant: str, at: Path, outside: Path) -> None:
    """Put at ``at`` what a user (or an attacker) may have there; ``outside``: a folder for link targets."""
    outside.mkdir(parents=True, exist_ok=True)
    if variant == "user-folder":
        user_folder(at)
    elif variant == "user-file":
        at.write_bytes(PRECIOUS)
    elif variant == "empty-folder":
        at.mkdir()
    elif variant == "link-to-folder":
        os.symlink(user_folder(outside / f"target-{at.name}"), at)
    elif variant == "dangling-link":
        os.symlink(outside / "missing", at)
    elif variant == "other-kind":  # finecap's, but another kind of folder: an export never replaces a checkpoint
        user_folder(at)
        mark_folder(at, "some-other-kind")
    elif variant == "forged-mark":  # the mark's name, not its content
        user_folder(at)
        (at / FOLDER_MARK).write_text("made by finecap, honestly\n")
    else:
        raise AssertionError(variant)


VARIANTS = ["user-folder", "user-file", "empty-folder", "link-to-folder", "dangling-link", "other-kind", "forged-mark"]
NOT_EMPTY = [v for v in VARIANTS if v != "empty-folder"]


# --------------------------------------------------------------------------------------------------------------------
# The helper
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("where", ["OUT", "OUT.old"])
def test_the_folder_swap_replaces_only_a_folder_finecap_marked(tmp_path, where, variant):
    area = tmp_path / "area"
    area.mkdir()
    final = area / "OUT"
    plant(variant, area / where, tmp_path / "outside")
    tmp = make_temporary_dir(final)
    (tmp / "new.txt").write_text("new")
    before, outside = snapshot(area), snapshot(tmp_path / "outside")
    with pytest.raises(OutputRefused) as e:
        atomic_replace_dir(tmp, final, kind="export")
    message = str(e.value)
    assert str(area / where) in message and "\n" not in message
    assert snapshot(area) == before and snapshot(tmp_path / "outside") == outside  # nothing moved, removed or marked


@pytest.mark.parametrize("variant", VARIANTS)
def test_removing_a_temporary_folder_removes_only_finecaps(tmp_path, variant):
    at = tmp_path / "area" / ".last.tmp"
    at.parent.mkdir()
    plant(variant, at, tmp_path / "outside")
    before = snapshot(tmp_path)
    with pytest.raises(OutputRefused, match=re.escape(str(at))):
        remove_own_folder(at, CHECKPOINT_KIND)
    assert snapshot(tmp_path) == before


def test_the_folder_swap_replaces_finecaps_own_folder_and_the_old_one_a_kill_left(tmp_path):
    final = tmp_path / "OUT"
    for folder in (final, previous_dir(final)):  # the last swap's result, and an .old a kill left behind
        folder.mkdir()
        (folder / "weights.bin").write_text("old")
        mark_folder(folder, "export")
    tmp = make_temporary_dir(final)
    (tmp / "weights.bin").write_text("new")
    atomic_replace_dir(tmp, final, kind="export")
    assert (final / "weights.bin").read_text() == "new" and is_finecap_folder(final, "export")
    assert (final / FOLDER_MARK).read_text() == folder_mark_text("export")
    assert not previous_dir(final).exists() and not tmp.exists()
    assert not is_finecap_folder(final, CHECKPOINT_KIND)  # its kind, and only it


# --------------------------------------------------------------------------------------------------------------------
# finecap export
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two run directories of a tiny ClipCap with LoRA adapters: ``source`` (a best checkpoint) and ``target`` (a
    best checkpoint and a resumable last one with its ``state/``)."""
    root = tmp_path_factory.mktemp("export-runs")
    clip = save_tiny_clip(root / "clip", image_size=16, patch_size=8)
    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2)
    encoder = VisionEncoder.from_pretrained(clip)
    model = ClipCap(lm, tok, encoder.feature_dim, ClipCapBackboneConfig(prefix_length=2), encoder=encoder)
    cfg = load(None, ["lora.rank=4", "lora.alpha=8", "lora.lm=true", "run.name=loss-test"])
    lora.configure_training(model, cfg)
    saved = sys.argv
    sys.argv = ["finecap", "train"]
    try:
        for run, which in (("source", "best"), ("target", "best"), ("target", "last")):
            save_checkpoint(root / run / "checkpoints" / which, model=model, cfg=cfg, info=INFO)
    finally:
        sys.argv = saved
    state = root / "target" / "checkpoints" / "last" / "state"
    state.mkdir()
    (state / "main.json").write_text("{}\n")  # what makes last resumable (its bytes are never read here)
    (root / "target" / "metrics.jsonl").write_text('{"step": 7, "split": "train", "values": {"loss": 1.0}}\n')
    return {"root": root, "source": root / "source", "target": root / "target"}


def export_argv(runs: dict[str, Path], out: Path, *more: str) -> list[str]:
    return ["export", str(runs["source"]), "--merged", str(out), *more]


@pytest.mark.parametrize("variant", NOT_EMPTY)
@pytest.mark.parametrize("sibling", ["OUT.old", ".OUT.tmp"])
def test_export_never_removes_what_is_beside_out(runs, tmp_path, sibling, variant):
    out = tmp_path / "OUT"
    plant(variant, tmp_path / sibling, tmp_path / "outside")
    before = snapshot(tmp_path)
    refused(export_argv(runs, out), str(tmp_path / sibling))
    assert snapshot(tmp_path) == before and not out.exists()
    refused(export_argv(runs, out, "--force"), str(tmp_path / sibling))  # --force names OUT, never its siblings
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("variant", ["user-folder", "legacy-captioner", "checkpoint-marked", "forged-mark"])
def test_export_force_replaces_only_an_earlier_export(runs, tmp_path, variant):
    out = tmp_path / "OUT"
    if variant == "legacy-captioner":  # a model folder without finecap's mark: an older export, or the user's own
        shutil.copytree(runs["source"] / "checkpoints" / "best" / "model", out)
        (out / "notes.txt").write_bytes(PRECIOUS)
    elif variant == "checkpoint-marked":
        user_folder(out)
        mark_folder(out, CHECKPOINT_KIND)
    else:
        plant(variant, out, tmp_path / "outside")
    before = snapshot(tmp_path)
    refused(export_argv(runs, out, "--force"), str(out), "export into a new folder")
    assert snapshot(tmp_path) == before


def test_export_replaces_its_own_export_and_the_old_one_a_kill_left(runs, tmp_path):
    out = tmp_path / "OUT"
    assert run_cli(export_argv(runs, out))[0] == 0
    assert is_finecap_folder(out, "export")
    refused(export_argv(runs, out), str(out), "--force")  # an earlier export: replaced only when asked
    shutil.copytree(out, previous_dir(out))  # a kill between the swap's two renames leaves OUT.old
    (out / "stale.txt").write_text("from the earlier export")
    assert run_cli(export_argv(runs, out, "--force"))[0] == 0
    assert not previous_dir(out).exists() and not (out / "stale.txt").exists() and (out / "captioner.json").is_file()
    empty = tmp_path / "EMPTY"  # an empty folder made for the export is fine (nothing in it to lose)
    empty.mkdir()
    assert run_cli(export_argv(runs, empty))[0] == 0 and (empty / "captioner.json").is_file()


CHECKPOINT_TARGETS = {
    "best": "checkpoints/best",
    "best-model": "checkpoints/best/model",
    "last": "checkpoints/last",
    "last-model": "checkpoints/last/model",
    "last-lm": "checkpoints/last/model/lm",
    "last.old": "checkpoints/last.old",
    ".last.tmp": "checkpoints/.last.tmp",
    "new-in-checkpoints": "checkpoints/merged",
    "checkpoints": "checkpoints",
    "dotdot": "checkpoints/merged/../last/model",
}


@pytest.mark.parametrize("name", list(CHECKPOINT_TARGETS))
def test_export_force_never_writes_into_a_runs_checkpoints(runs, name):
    target = runs["target"]
    before = snapshot(target)
    out = target / CHECKPOINT_TARGETS[name]
    refused(export_argv(runs, out, "--force"), "only training writes")
    assert snapshot(target) == before


def test_export_force_never_replaces_a_checkpoint_copied_or_linked_elsewhere(runs, tmp_path):
    copy = tmp_path / "copied-checkpoint"
    shutil.copytree(runs["target"] / "checkpoints" / "last", copy)
    link = tmp_path / "model-link"
    os.symlink(runs["target"] / "checkpoints" / "last" / "model", link)
    before, target = snapshot(tmp_path), snapshot(runs["target"])
    for out, expected in ((copy, "only training writes"), (copy / "model", "only training writes"),
                          (link, "symbolic link")):  # fmt: skip
        refused(export_argv(runs, out, "--force"), str(out), expected)
    assert snapshot(tmp_path) == before and snapshot(runs["target"]) == target


# --------------------------------------------------------------------------------------------------------------------
# The checkpoint writer, training, the world encoder's cache
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", NOT_EMPTY)
@pytest.mark.parametrize("where", ["best", "best.old", ".best.tmp"])
def test_the_checkpoint_writer_never_removes_a_folder_it_did_not_make(runs, tmp_path, where, variant):
    from finecap.models.backbones import load_captioner

    model = load_captioner(runs["source"] / "checkpoints" / "best" / "model")
    cfg = load(None, ["run.name=loss-test"])
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    plant(variant, checkpoints / where, tmp_path / "outside")
    before = snapshot(tmp_path)
    with pytest.raises(OutputRefused, match=re.escape(str(checkpoints / where))):
        save_checkpoint(checkpoints / "best", model=model, cfg=cfg, info=INFO)
    assert snapshot(tmp_path) == before


def test_the_checkpoint_writer_replaces_checkpoints_written_before_folders_were_marked(runs, tmp_path):
    """A run from before the mark resumes and saves as it did: a checkpoint folder holding only checkpoint files
    (no mark) at best, best.old or .best.tmp is finecap's."""
    from finecap.models.backbones import load_captioner

    model = load_captioner(runs["source"] / "checkpoints" / "best" / "model")
    cfg = load(None, ["run.name=loss-test"])
    checkpoints = tmp_path / "run" / "checkpoints"
    for name in ("best", "best.old", ".best.tmp"):
        shutil.copytree(runs["source"] / "checkpoints" / "best", checkpoints / name)
        (checkpoints / name / FOLDER_MARK).unlink()
    save_checkpoint(checkpoints / "best", model=model, cfg=cfg, info={**INFO, "step": 9})
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best"]
    assert is_finecap_folder(checkpoints / "best", CHECKPOINT_KIND)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A 2-step tiny ClipCap run (``finecap train``) and the overrides it was trained with."""
    from finecap.config import WorldConfig
    from finecap.world.make import make_world

    root = tmp_path_factory.mktemp("trained")
    make_world(WorldConfig(n_train=40, n_val=8, n_test=8, image_size=32, seed=0), out=root / "world", progress=False)
    clip = save_tiny_clip(root / "clip", image_size=32, patch_size=16)
    base = [f"world.out={root / 'world'}", "world.n_train=40", "world.n_val=8", "world.n_test=8",
            "world.image_size=32", f"model.encoder={clip}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
            "clipcap.tiny_heads=2", "clipcap.prefix_length=2", f"run.cache_dir={root / 'cache'}",
            "train.batch_size=16", "train.warmup_steps=2", "train.eval_samples=8", "decode.max_length=10",
            "train.max_steps=2"]  # fmt: skip
    run = root / "run"
    code, _, err = run_cli(["train", *base, "--out", str(run)])
    assert code == 0, err
    return {"root": root, "base": base, "run": run}


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["user-folder", "user-file", "link-to-folder", "forged-mark"])
@pytest.mark.parametrize("where", ["last.old", ".last.tmp"])  # best is saved only when better: its writer's test
def test_resumed_training_never_removes_a_folder_it_did_not_make(trained, tmp_path, where, variant):
    run = tmp_path / "run"
    shutil.copytree(trained["run"], run, symlinks=True)
    plant(variant, run / "checkpoints" / where, tmp_path / "outside")
    before = snapshot(tmp_path)
    refused(["train", *trained["base"], "--out", str(run), "--resume", "train.max_steps=3"],
            str(run / "checkpoints" / where))  # fmt: skip
    after = snapshot(tmp_path)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert not {k for k in changed if k.startswith(f"run/checkpoints/{where}") or k.startswith("outside")}, changed


@pytest.mark.parametrize("variant", NOT_EMPTY)
@pytest.mark.parametrize("where", ["encoder", "encoder.old"])
def test_the_world_encoder_cache_never_replaces_a_folder_it_did_not_make(tmp_path, where, variant):
    from finecap.models.world_encoder_cache import encoder_dir
    from finecap.train.world_encoder import train_world_encoder

    cfg = load(None, [f"run.cache_dir={tmp_path / 'cache'}"])
    out = encoder_dir(cfg)
    out.parent.mkdir(parents=True)
    at = out if where == "encoder" else previous_dir(out)
    plant(variant, at, tmp_path / "outside")
    before = snapshot(tmp_path)
    with pytest.raises(OutputRefused, match=re.escape(str(at))):
        train_world_encoder(cfg, tmp_path / "no-world")  # refused before the world is read
    assert snapshot(tmp_path) == before


def test_made_folder_removes_only_the_empty_folders_it_made_when_the_block_fails(tmp_path):
    from finecap.utils.folders import made_folder

    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(RuntimeError), made_folder(mine / "runs" / "a") as out:
        assert out.is_dir()
        raise RuntimeError("the command failed before writing")
    assert list(mine.iterdir()) == []  # runs/ and runs/a were made here and are gone; the user's folder stays
    with pytest.raises(RuntimeError), made_folder(mine / "runs" / "b") as out:
        (out / "config.yaml").write_text("run: {}\n")  # written before the failure: kept, and so are its parents
        raise RuntimeError("failed later")
    assert (mine / "runs" / "b" / "config.yaml").is_file()
    with made_folder(mine / "runs" / "c") as out:  # no failure: kept
        pass
    assert out.is_dir()
    with pytest.raises(RuntimeError), made_folder(mine) as out:  # an existing (empty) folder is never removed
        raise RuntimeError("x")
    assert mine.is_dir()


def test_a_training_or_boost_that_fails_before_writing_leaves_no_empty_output_folder(tmp_path, monkeypatch):
    from finecap.app import boost as boost_app
    from finecap.config import load
    from finecap.train import run as train_run

    def fails(*args, **kwargs):
        raise RuntimeError("could not build the model")

    monkeypatch.setattr(train_run, "_train", fails)
    with pytest.raises(RuntimeError, match="could not build"):
        train_run.train(load(None, [f"run.dir={tmp_path / 'runs' / 'badq'}"]))
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(boost_app, "make_backend", fails)
    monkeypatch.setattr(boost_app, "prepare", lambda *args, **kwargs: None)
    (tmp_path / "source").mkdir()
    data = tmp_path / "source" / "data.jsonl"
    data.write_text('{"image": "a.png", "id": 1, "captions": ["a red circle"], "split": "train"}\n')
    (tmp_path / "source" / "a.png").write_bytes(b"")
    cfg = load(None, ["data.format=jsonl", f"data.path={data}"])
    with pytest.raises(RuntimeError, match="could not build"):
        boost_app.main(cfg, out=tmp_path / "boosted" / "holistic", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["source"]


def test_made_folder_never_removes_a_parent_another_process_made_meanwhile(tmp_path, monkeypatch):
    """Between finding which levels are missing and making them, another process makes one: it is not this call's,
    so a failure leaves it (the first version listed the missing levels first and removed them all)."""
    import pathlib

    from finecap.utils.folders import made_folder

    real_mkdir = pathlib.Path.mkdir
    shared = tmp_path / "shared"

    def racing_mkdir(self, *args, **kwargs):
        if self == shared and not shared.exists():
            os.mkdir(shared)  # another user's process, just before this one
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", racing_mkdir)
    with pytest.raises(RuntimeError), made_folder(shared / "run") as out:
        assert out.is_dir()
        raise RuntimeError("failed before writing")
    assert shared.is_dir() and not (shared / "run").exists()  # ours removed, theirs kept


@pytest.mark.parametrize(("kind", "said"), [("export", "an export"), ("checkpoint", "a checkpoint")])
def test_the_refusal_names_the_kind_with_its_article(tmp_path, kind, said):
    (tmp_path / "mine").mkdir()
    with pytest.raises(OutputRefused, match=rf"no \.finecap-folder of {said}\) is where finecap swaps {said} folder"):
        check_own_folder(tmp_path / "mine", kind)
