"""Atomic writes and folder swaps survive a power loss: the new data is on the disk (``fsync``) before the rename, and
the rename after it (``fsync`` of the folder holding it), in one helper (:func:`finecap.utils.files.replace_durably`).

Without the first, a file renamed into place can read back empty after a power loss (the rename reached the disk, its
data did not); without the second, the rename itself can be lost. ``os.fsync`` and ``os.replace`` are recorded here
(each ``fsync`` by the inode it synced), and the order is checked: every file of what is renamed in, then the rename,
then the folder.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
import torch

import finecap.train.run
from finecap.app.cli import main
from finecap.app.models import tiny_main
from finecap.boost.output import link_images
from finecap.config import load
from finecap.train.state import promote, save_tree
from finecap.utils.files import (
    FSYNC_ENV,
    atomic_write_bytes,
    file_mode,
    make_temporary_dir,
    one_folder_sync,
    sync_to_disk,
)
from finecap.utils.folders import FOLDER_MARK, atomic_replace_dir, mark_folder, previous_dir
from helpers.durable_syncs import Recorder


@pytest.fixture(autouse=True)
def durable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite runs without ``fsync`` (``FINECAP_FSYNC=0``, conftest.py); these tests check the durable path."""
    monkeypatch.setenv(FSYNC_ENV, "1")


def test_an_atomic_write_syncs_the_files_data_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    target.write_text("old")
    rec = Recorder(monkeypatch)
    atomic_write_bytes(target, b"new")
    renamed = rec.replaced_at(target)
    assert rec.events[renamed][1].parent == tmp_path and rec.events[renamed][1] != target  # the temporary file
    assert any(i < renamed for i in rec.synced_at(target)), rec.events  # its data before its name
    assert any(i > renamed for i in rec.synced_at(tmp_path)), rec.events  # the new name after
    assert target.read_text() == "new"


def test_one_folder_sync_syncs_each_files_data_before_its_rename_and_the_folder_once_after_all(tmp_path, monkeypatch):
    folder, other = tmp_path / "plots", tmp_path / "other"
    folder.mkdir(), other.mkdir()
    names = ["a.png", "b.png", "c.png"]
    rec = Recorder(monkeypatch)
    with one_folder_sync(folder):
        for name in names:
            atomic_write_bytes(folder / name, name.encode())
        atomic_write_bytes(other / "x.json", b"{}")  # a file of another folder: its folder synced as always
        assert rec.synced_at(folder) == [] and any(i > rec.replaced_at(other / "x.json") for i in rec.synced_at(other))
    renames = [rec.replaced_at(folder / name) for name in names]
    for name, renamed in zip(names, renames, strict=True):
        assert any(i < renamed for i in rec.synced_at(folder / name)), (name, rec.events)  # its data before its name
    (synced,) = rec.synced_at(folder)
    assert synced > max(renames)  # every name, once, after the last
    assert [(folder / name).read_bytes() for name in names] == [b"a.png", b"b.png", b"c.png"]


def test_one_folder_sync_syncs_the_folder_when_an_error_leaves_it(tmp_path, monkeypatch):
    rec = Recorder(monkeypatch)
    with pytest.raises(RuntimeError, match="stopped"), one_folder_sync(tmp_path):
        atomic_write_bytes(tmp_path / "a.png", b"a")
        raise RuntimeError("stopped")
    assert rec.synced_at(tmp_path) and rec.synced_at(tmp_path)[-1] > rec.replaced_at(tmp_path / "a.png")
    atomic_write_bytes(tmp_path / "b.png", b"b")  # the block is over: a rename syncs its folder again
    assert rec.synced_at(tmp_path)[-1] > rec.replaced_at(tmp_path / "b.png")


def test_the_checkpoints_state_files_are_synced_before_their_renames_and_the_folder_after(tmp_path, monkeypatch):
    rec = Recorder(monkeypatch)
    save_tree(tmp_path / "state", "main", {"optimizer": {"m": torch.ones(3)}, "step": 4})
    for name in ("main.safetensors", "main.json"):
        renamed = rec.replaced_at(tmp_path / "state" / name)
        assert any(i < renamed for i in rec.synced_at(tmp_path / "state" / name)), (name, rec.events)
        assert any(i > renamed for i in rec.synced_at(tmp_path / "state")), (name, rec.events)


def _swap_in(tmp_path: Path) -> tuple[Path, Path]:
    final = tmp_path / "best"
    final.mkdir()
    (final / "weights.bin").write_text("old")
    mark_folder(final, "checkpoint")
    tmp = make_temporary_dir(final)
    (tmp / "model").mkdir()
    (tmp / "model" / "weights.bin").write_bytes(b"new" * 1000)
    (tmp / "trainer_state.json").write_text(json.dumps({"step": 4}))
    return tmp, final


def test_a_folder_swap_syncs_every_file_and_folder_before_its_renames_and_the_parent_after(tmp_path, monkeypatch):
    tmp, final = _swap_in(tmp_path)
    rec = Recorder(monkeypatch)
    atomic_replace_dir(tmp, final, kind="checkpoint")
    first = min(i for i, e in enumerate(rec.events) if e[0] == "replace" and e[2] in (final, previous_dir(final)))
    last = rec.replaced_at(final)
    for path in (final / "model" / "weights.bin", final / "trainer_state.json", final / "model", final):
        assert any(i < first for i in rec.synced_at(path)), (path, rec.events)  # before the old one is moved aside
    assert any(i > last for i in rec.synced_at(tmp_path)), rec.events
    assert (final / "model" / "weights.bin").read_bytes() == b"new" * 1000 and not previous_dir(final).exists()


def test_a_resumes_promotion_of_a_checkpoint_is_synced_before_and_after_its_renames(tmp_path, monkeypatch):
    ckpts = tmp_path / "checkpoints"
    old = ckpts / "last.old"
    (old / "state").mkdir(parents=True)
    (old / "trainer_state.json").write_text(json.dumps({"step": 2}))
    rec = Recorder(monkeypatch)
    assert promote(old, tmp_path) == ckpts / "last"
    renamed = rec.replaced_at(ckpts / "last")
    assert any(i < renamed for i in rec.synced_at(ckpts / "last" / "trainer_state.json")), rec.events
    assert any(i > renamed for i in rec.synced_at(ckpts)), rec.events


class _Saves:
    """What ``save_checkpoint`` reads of a captioner: its ``save`` writes its weights as ``save_pretrained`` does,
    with a plain write that nothing syncs."""

    tokenizer = None

    def save(self, out, state_dict=None):
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"weights" * 1000)
        (out / "captioner.json").write_text("{}")


def test_a_checkpoints_files_are_on_the_disk_before_its_trainer_state_says_it_is_complete(tmp_path, monkeypatch):
    # trainer_state.json marks a checkpoint complete (finecap.train.state.is_complete): a resume picks the newest
    # complete one, an unswapped .last.tmp too, and swaps it in over last, which it then removes. Its weights were
    # synced only by that swap, after trainer_state.json: a power loss before it left a .last.tmp "complete" with
    # empty weights, which a resume put in last's place, deleting the good last
    from finecap.train.checkpoint import save_checkpoint

    last = tmp_path / "run" / "checkpoints" / "last"
    rec = Recorder(monkeypatch)
    save_checkpoint(last, model=_Saves(), cfg=load(), info={"step": 3})
    marked = rec.replaced_at(last.with_name(".last.tmp") / "trainer_state.json")
    files = [p for p in last.rglob("*") if p.name != "trainer_state.json"]
    assert {"model.safetensors", "captioner.json", "config.yaml", "README.md", "model", FOLDER_MARK} <= {
        p.name for p in files
    }
    for path in files:
        assert any(i < marked for i in rec.synced_at(path)), (path, rec.events)


def _record_chmods(rec: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.chmod`` recorded among ``rec``'s events too: ``("chmod", inode)``."""
    real = os.chmod

    def chmod(path, mode, *args, **kwargs) -> None:
        st = os.stat(path)
        rec.events.append(("chmod", (st.st_dev, st.st_ino)))
        real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "chmod", chmod)


class _SavesPrivately(_Saves):
    """A save whose weights file is 0600, as safetensors writes it whatever the umask: the swap gives it the umask's
    mode (:func:`finecap.utils.files.apply_umask`)."""

    def save(self, out, state_dict=None):
        super().save(out, state_dict)
        os.chmod(out / "model.safetensors", 0o600)


def test_a_checkpoint_save_syncs_nothing_again_in_its_swap_but_the_renames(tmp_path, monkeypatch):
    # a save synced its folder before trainer_state.json, then its swap synced every file and folder of it again
    # (replace_durably's sync_to_disk) and wrote its mark anew: 17 of a tiny ClipCap's 41 fsync calls a save, for
    # data and entries on the disk already or changed since only by a durable write (trainer_state.json's). The one
    # other change, the modes the swap gives (finecap.utils.files.apply_umask), is made before the first round now
    from finecap.train.checkpoint import save_checkpoint

    last = tmp_path / "run" / "checkpoints" / "last"
    save_checkpoint(last, model=_SavesPrivately(), cfg=load(), info={"step": 2})  # a previous one to swap out
    rec = Recorder(monkeypatch)
    _record_chmods(rec, monkeypatch)
    save_checkpoint(last, model=_SavesPrivately(), cfg=load(), info={"step": 3})
    state_file = rec.replaced_at(last.with_name(".last.tmp") / "trainer_state.json")
    swapped = rec.replaced_at(previous_dir(last))  # the swap's first rename: last aside, to last.old
    synced = [i for i, e in enumerate(rec.events) if e[0] == "fsync"]
    # trainer_state.json's folder (its rename) is the last sync before the swap
    assert [i for i in synced if state_file < i < swapped] == rec.synced_at(last)[-1:], rec.events
    # after the renames: the folder holding them, then last.old, whose trainer_state.json goes first
    assert [i for i in synced if i > swapped] == [rec.synced_at(last.parent)[-1], synced[-1]], rec.events
    for path in last.rglob("*"):
        assert any(i < state_file for i in rec.synced_at(path)) or path.name == "trainer_state.json", path
    weights = last / "model" / "model.safetensors"
    st = os.stat(weights)
    chmodded = max(i for i, e in enumerate(rec.events) if e == ("chmod", (st.st_dev, st.st_ino)))  # 0600, then ours
    assert chmodded < rec.synced_at(weights)[-1] and stat.S_IMODE(st.st_mode) == file_mode()  # its mode synced


def test_a_swap_of_a_folder_its_caller_synced_syncs_only_the_modes_it_gives(tmp_path, monkeypatch):
    tmp, final = _swap_in(tmp_path)
    (tmp / "model" / "weights.bin").chmod(0o600)  # as safetensors writes it
    mark_folder(tmp, "checkpoint")
    sync_to_disk(tmp)
    rec = Recorder(monkeypatch)
    atomic_replace_dir(tmp, final, kind="checkpoint", synced=True)
    first = min(i for i, e in enumerate(rec.events) if e[0] == "replace" and e[2] in (final, previous_dir(final)))
    last = rec.replaced_at(final)
    (weights,) = rec.synced_at(final / "model" / "weights.bin")  # its new mode, before the renames
    assert weights < first and stat.S_IMODE((final / "model" / "weights.bin").stat().st_mode) == file_mode()
    for path in (final / "trainer_state.json", final / "model", final):
        assert rec.synced_at(path) == [], (path, rec.events)  # as the caller synced them
    assert rec.synced_at(tmp_path) and rec.synced_at(tmp_path)[0] > last, rec.events


def test_a_file_system_that_cannot_sync_folders_still_renames(tmp_path, monkeypatch):
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")  # some network and FUSE file systems
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic_write_bytes(tmp_path / "a.txt", b"x")
    assert (tmp_path / "a.txt").read_bytes() == b"x"


def test_a_lost_write_is_raised_and_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    target = tmp_path / "a.txt"
    target.write_text("old")

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")  # the disk could not keep the data

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output"):
        atomic_write_bytes(target, b"new")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_failed_rename_puts_back_only_what_it_moved_aside(tmp_path, monkeypatch):
    from finecap.utils.files import replace_durably

    (tmp_path / "new").mkdir()
    (tmp_path / "aside").mkdir()  # an earlier one, not moved by this call: never renamed into dst
    real = os.replace

    def replace(src, dst) -> None:
        if Path(src).name == "new":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="No space"):
        replace_durably(tmp_path / "new", tmp_path / "dst", previous=tmp_path / "aside")
    assert not (tmp_path / "dst").exists() and (tmp_path / "aside").is_dir()


def test_a_new_tiny_model_folder_is_synced_before_its_rename_and_the_parent_after(tmp_path, monkeypatch):
    # `finecap models tiny` renamed its folder into place with a bare os.replace: no fsync at all
    rec = Recorder(monkeypatch)
    out = tiny_main("clip", tmp_path / "clip")
    renamed = rec.replaced_at(out)
    for path in (out / "model.safetensors", out / "config.json", out):
        assert any(i < renamed for i in rec.synced_at(path)), (path, rec.events)
    assert any(i > renamed for i in rec.synced_at(tmp_path)), rec.events


def test_a_tiny_model_moved_into_an_empty_folder_syncs_each_file_before_its_rename(tmp_path, monkeypatch):
    out = tmp_path / "clip"
    out.mkdir()  # the user's empty folder: kept, the files moved into it one rename each
    rec = Recorder(monkeypatch)
    tiny_main("clip", out)
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in names
    for name in names:
        renamed = rec.replaced_at(out / name)
        assert any(i < renamed for i in rec.synced_at(out / name)), (name, rec.events)
        assert any(i > renamed for i in rec.synced_at(out)), (name, rec.events)


def test_boosts_link_to_the_source_images_is_renamed_in_place_and_its_folder_synced(tmp_path, monkeypatch):
    (tmp_path / "old").mkdir()
    (tmp_path / "images").mkdir()
    out = tmp_path / "boosted"
    out.mkdir()
    (out / "images").symlink_to(tmp_path / "old", target_is_directory=True)  # an earlier run's, elsewhere
    rec = Recorder(monkeypatch)
    link_images(out / "images", tmp_path / "images")
    renamed = rec.replaced_at(out / "images")
    assert any(i > renamed for i in rec.synced_at(out)), rec.events  # the new link is kept across a power loss
    assert os.readlink(out / "images") == str(tmp_path / "images")


def test_fsync_off_keeps_the_atomic_rename_and_skips_every_sync(tmp_path, monkeypatch):
    monkeypatch.setenv(FSYNC_ENV, "0")
    target = tmp_path / "results.json"
    target.write_text("old")
    rec = Recorder(monkeypatch)
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert [e[0] for e in rec.events] == ["replace"]


@pytest.mark.parametrize("value", ["no", "2", "false"])
def test_a_fsync_setting_other_than_0_or_1_is_refused_naming_the_variable(tmp_path, monkeypatch, value):
    monkeypatch.setenv(FSYNC_ENV, value)
    with pytest.raises(ValueError, match=rf"\$FINECAP_FSYNC must be 0 \(no fsync\) or 1.*{value!r}"):
        atomic_write_bytes(tmp_path / "a.json", b"{}")


def test_a_fsync_setting_other_than_0_or_1_stops_a_command_when_it_starts(tmp_path, monkeypatch, capsys):
    # it was named at the first save only: a training's first checkpoint, maybe hours in
    started = []
    monkeypatch.setattr(finecap.train.run, "train", lambda *args, **kwargs: started.append(args))
    monkeypatch.setenv(FSYNC_ENV, "yes")
    assert main(["train", f"run.dir={tmp_path / 'run'}"]) == 2
    assert not started
    assert "$FINECAP_FSYNC must be 0 (no fsync) or 1 (the default), got 'yes'" in capsys.readouterr().err


def test_a_fsync_setting_other_than_0_or_1_stops_a_training_run_before_it_is_set_up(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(finecap.train.run, "_train", lambda *args, **kwargs: started.append(args))
    monkeypatch.setenv(FSYNC_ENV, "true")
    with pytest.raises(ValueError, match=r"^\$FINECAP_FSYNC must be 0 \(no fsync\) or 1 \(the default\), got 'true'"):
        finecap.train.run.train(load(None, [f"run.dir={tmp_path / 'run'}"]))
    assert not started and not (tmp_path / "run").exists()
