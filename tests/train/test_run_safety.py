"""A run folder is data: resume never unpickles, never deletes, recovers from every state a kill can leave, and a
diverging run stops with a non-zero exit instead of saving NaN weights as 'best'."""

import json
import os
import pickle
import re
import shutil
import tempfile

import numpy as np
import pytest
import torch

from finecap.app.cli import main as cli
from finecap.config import ConfigError
from finecap.home import run_path
from finecap.models.clipcap import ClipCap
from finecap.runs import checkpoint_dir, model_dir, temporary_dir
from finecap.train.engine import TrainingDiverged
from finecap.train.run import train
from finecap.train.state import (
    CheckpointError,
    find_resumable,
    foreign_run_files,
    load_tree,
    prepare_run_dir,
    save_tree,
)
from finecap.utils.folders import FOLDER_MARK

COMMON = ("train.max_steps=4", "train.save_every=2", "train.eval_every=2")


def snapshot(folder):
    """Every file under ``folder`` with its bytes."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def step_of(folder):
    return json.loads((folder / "trainer_state.json").read_text())["step"]


class Exploit:
    """Unpickling this object writes a marker file (what an attacker's pickle would do, harmlessly)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# ------------------------------------------------------------------------------------------------------------------
# No pickle from a run folder
# ------------------------------------------------------------------------------------------------------------------


def test_state_trees_round_trip_without_pickle(tmp_path):
    tree = {"a": 1, "b": [1.5, float("nan"), None, "x"], "t": torch.arange(3), "tuple": (1, (2, 3)),
            "int_keys": {0: {"m": torch.ones(2)}, 7: 2}, "np": np.arange(4, dtype="uint32")}  # fmt: skip
    save_tree(tmp_path, "s", tree)
    back = load_tree(tmp_path, "s")
    assert back["a"] == 1 and back["b"][0] == 1.5 and back["b"][1] != back["b"][1] and back["b"][2:] == [None, "x"]
    assert torch.equal(back["t"], torch.arange(3)) and back["tuple"] == (1, (2, 3))
    assert list(back["int_keys"]) == [0, 7] and torch.equal(back["int_keys"][0]["m"], torch.ones(2))
    assert back["np"].dtype.name == "uint32" and back["np"].tolist() == [0, 1, 2, 3]
    assert {p.suffix for p in tmp_path.iterdir()} == {".json", ".safetensors"}
    with pytest.raises(TypeError, match="without pickle"):
        save_tree(tmp_path, "bad", {"f": object()})


def test_state_trees_that_share_memory_are_saved_and_load_as_tensors_of_their_own(tmp_path):
    # A reward whose part is its total (self-retrieval's log_prob), a view into another tensor, the same tensor under
    # three paths, an empty tensor twice: safetensors refuses shared memory, so each is stored as its own copy.
    total = torch.tensor([0.5, -1.25, 3.0])
    flat = torch.arange(6.0)
    empty = torch.zeros(0)
    tree = {"rewards": total, "parts": {"retrieval": total, "retrieval/log_prob": total}, "flat": flat,
            "halves": list(flat.split(3)), "row": flat.view(2, 3)[1], "empty": [empty, empty]}  # fmt: skip
    save_tree(tmp_path, "s", tree)
    back = load_tree(tmp_path, "s")
    for values in (back["rewards"], *back["parts"].values()):
        assert values.tolist() == [0.5, -1.25, 3.0]
    assert back["halves"][0].tolist() == [0.0, 1.0, 2.0] and back["halves"][1].tolist() == back["row"].tolist()
    assert back["row"].tolist() == [3.0, 4.0, 5.0] and back["flat"].tolist() == list(range(6))
    assert [e.shape for e in back["empty"]] == [(0,), (0,)]
    back["parts"]["retrieval"][0] = 9.0  # loaded back, no two share memory
    assert back["rewards"][0] == 0.5 and back["parts"]["retrieval/log_prob"][0] == 0.5
    assert total.tolist() == [0.5, -1.25, 3.0] and tree["parts"]["retrieval"] is total  # the tree is not changed


def test_a_state_tree_nested_too_deeply_to_rebuild_names_its_json_file(tmp_path):
    # json reads a nesting of 900 levels, rebuilding it ran out of stack: the RecursionError escaped load_tree and the
    # command line named the tree's .safetensors file, not the .json one at fault (json itself may refuse the depth
    # on another interpreter: either way the .json file is named)
    save_tree(tmp_path, "process_0", {"logger": [1], "t": torch.ones(2)})
    encoded = json.loads((tmp_path / "process_0.json").read_text())
    encoded["logger"] = json.loads("[" * 900 + "]" * 900)
    (tmp_path / "process_0.json").write_text(json.dumps(encoded))
    with pytest.raises(CheckpointError, match=r"process_0\.json: corrupt state file"):
        load_tree(tmp_path, "process_0")


def test_resume_never_unpickles_a_planted_file(make_cfg, tmp_path):
    cfg = make_cfg(*COMMON)
    train(cfg)
    last = checkpoint_dir(run_path(cfg.run), "last")
    assert not list(run_path(cfg.run).rglob("*.pkl")) and not list(run_path(cfg.run).rglob("*.bin"))
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Exploit(marker))
    # an attacker plants pickles where accelerate used to look, and in place of a state file
    (last / "accelerate").mkdir()
    (last / "accelerate" / "custom_checkpoint_0.pkl").write_bytes(payload)
    resumed = make_cfg("train.max_steps=6", "train.save_every=2", "train.eval_every=2")
    train(resumed, resume=True)  # the planted pickle is never opened
    assert not marker.exists() and step_of(checkpoint_dir(run_path(cfg.run), "last")) == 6

    (last / "state" / "main.safetensors").write_bytes(payload)
    with pytest.raises(CheckpointError, match=r"state/main\.safetensors: corrupt or truncated"):
        train(make_cfg("train.max_steps=8", "train.save_every=2", "train.eval_every=2"), resume=True)
    assert not marker.exists()
    assert cli(["train", *[f"{k}" for k in _overrides(make_cfg, "train.max_steps=8")], "--resume"]) == 2
    assert not marker.exists()


def _overrides(make_cfg, *extra):
    """The command-line form of ``make_cfg(*extra)``'s overrides (world, encoder, run folder, ...)."""
    cfg = make_cfg(*COMMON, *extra)
    keys = (
        "world.out",
        "world.n_train",
        "world.n_val",
        "world.n_test",
        "world.image_size",
        "model.encoder",
        "run.dir",
        "run.cache_dir",
    )
    flat = [f"{k}={getattr(getattr(cfg, k.split('.')[0]), k.split('.')[1])}" for k in keys]
    return [*flat, "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2",
            "clipcap.prefix_length=2", "train.batch_size=16", *COMMON, *extra]  # fmt: skip


# ------------------------------------------------------------------------------------------------------------------
# Resume recovers or refuses, never deletes
# ------------------------------------------------------------------------------------------------------------------


def _run_with_checkpoints(make_cfg):
    """A finished 4-step run whose last checkpoint is at step 4 and a copy of its step-2 checkpoint."""
    cfg = make_cfg("train.max_steps=2", "train.save_every=2", "train.eval_every=2")
    train(cfg)
    old = checkpoint_dir(run_path(cfg.run), "last")
    step2 = run_path(cfg.run).parent / "step2"
    shutil.copytree(old, step2)
    train(make_cfg(*COMMON), resume=True)
    return run_path(cfg.run), step2


@pytest.mark.slow
@pytest.mark.parametrize("kill_state", ["between_renames", "tmp_finished", "tmp_unfinished", "old_only"])
def test_resume_picks_the_newest_complete_checkpoint(make_cfg, kill_state):
    run, step2 = _run_with_checkpoints(make_cfg)
    last = checkpoint_dir(run, "last")
    tmp, old = temporary_dir(last), last.with_name("last.old")
    if kill_state == "between_renames":  # last -> last.old done, .last.tmp -> last not: the newest is .last.tmp
        os.replace(last, tmp)
        shutil.copytree(step2, old)
        expected = 4
    elif kill_state == "tmp_finished":  # the new checkpoint was complete but not yet swapped in
        os.replace(last, tmp)
        shutil.copytree(step2, last)
        expected = 4
    elif kill_state == "tmp_unfinished":  # killed while writing: .last.tmp has no trainer_state.json
        shutil.copytree(last, tmp)
        (tmp / "trainer_state.json").unlink()
        expected = 4
    else:  # only last.old survives
        os.replace(last, old)
        expected = 4
    best_before = snapshot(checkpoint_dir(run, "best"))
    assert step_of(find_resumable(run)) == expected
    train(make_cfg("train.max_steps=6", "train.save_every=2", "train.eval_every=2"), resume=True)
    assert step_of(last) == 6
    assert checkpoint_dir(run, "best").is_dir() and best_before  # best is kept (replaced only by a better one)


def _fake_checkpoint(folder, step: int | None) -> None:
    """A checkpoint folder of finecap's: complete at ``step``, or cut short by a kill (``step=None``)."""
    from finecap.train.state import new_checkpoint_folder

    new_checkpoint_folder(folder)
    (folder / "model").mkdir()
    if step is not None:
        (folder / "state").mkdir()
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}))


def test_a_second_fault_sets_the_newer_incomplete_last_aside_and_never_a_users_folder(tmp_path):
    """Resume after two faults in a row: the first promotion set an incomplete ``last`` aside as
    ``.last.incomplete``; the second replaces that (it failed "Directory not empty"). A folder of the user's by that
    name is refused and kept."""
    from finecap.train.state import promote

    ckpts = tmp_path / "checkpoints"
    for fault, old_step in enumerate((2, 4)):
        _fake_checkpoint(ckpts / "last", None)
        _fake_checkpoint(ckpts / "last.old", old_step)
        assert find_resumable(tmp_path) == ckpts / "last.old"
        assert promote(ckpts / "last.old", tmp_path) == ckpts / "last" and step_of(ckpts / "last") == old_step
        assert (ckpts / ".last.incomplete" / "model").is_dir() and not (ckpts / "last.old").exists(), fault
        shutil.rmtree(ckpts / "last")
    shutil.rmtree(ckpts / ".last.incomplete")
    (ckpts / ".last.incomplete").mkdir()
    (ckpts / ".last.incomplete" / "mine.txt").write_text("mine")
    _fake_checkpoint(ckpts / "last", None)
    _fake_checkpoint(ckpts / "last.old", 6)
    with pytest.raises(ValueError, match=r"\.last\.incomplete: a folder finecap did not make"):
        promote(ckpts / "last.old", tmp_path)
    assert (ckpts / ".last.incomplete" / "mine.txt").read_text() == "mine" and step_of(ckpts / "last.old") == 6


def test_resume_renames_back_a_best_a_kill_left_as_best_old_and_nothing_of_the_users(tmp_path):
    """A kill between the two renames of best's swap leaves only ``best.old``: it was read with a warning, and kept so,
    until a better validation replaced it. A resume finishes the swap: ``best.old`` is ``best`` again. A folder of the
    user's named ``best.old`` is left where it is."""
    from finecap.train.state import prepare_run_dir

    ckpts = tmp_path / "checkpoints"
    _fake_checkpoint(ckpts / "last", 4)
    _fake_checkpoint(ckpts / "best.old", 2)
    assert prepare_run_dir(tmp_path, resume=True, overwrite=False) == ckpts / "last"
    assert step_of(ckpts / "best") == 2 and not (ckpts / "best.old").exists()

    mine = tmp_path / "mine"
    (mine / "checkpoints" / "best.old").mkdir(parents=True)
    (mine / "checkpoints" / "best.old" / "notes.txt").write_text("mine")
    _fake_checkpoint(mine / "checkpoints" / "last", 4)
    prepare_run_dir(mine, resume=True, overwrite=False)
    assert (mine / "checkpoints" / "best.old" / "notes.txt").read_text() == "mine"
    assert not (mine / "checkpoints" / "best").exists()


def test_a_save_killed_while_marking_its_folder_neither_stops_the_resumed_runs_saves_nor_an_overwrite(make_cfg):
    """A save's first file is its folder's mark, written atomically (a temporary file, then a rename): killed in
    between, ``.last.tmp`` holds only the mark's temporary file. The resumed run's next save removes that unfinished
    folder of its own; it refused it as "a folder finecap did not make", so the run could never save again (found by
    SIGKILL-ing a run at each point of a save). A file of the user's beside it is still refused, and kept."""
    cfg = make_cfg("train.max_steps=2", "train.save_every=2", "train.eval_every=2")
    run = train(cfg)
    tmp = temporary_dir(checkpoint_dir(run, "last"))
    tmp.mkdir()
    fd, left = tempfile.mkstemp(dir=tmp, prefix=f".{FOLDER_MARK}.", suffix=".tmp")  # as atomic_write_bytes names it
    os.write(fd, b"finec")  # the kill came mid-write
    os.close(fd)
    assert foreign_run_files(run) == []  # an overwrite would remove it as finecap's
    train(make_cfg(*COMMON), resume=True)
    assert step_of(checkpoint_dir(run, "last")) == 4 and not tmp.exists()

    tmp.mkdir()
    (tmp / ".notes.txt.x1y2.tmp").write_text("mine")  # the same shape of name, of no file a checkpoint holds
    assert foreign_run_files(run) == [tmp / ".notes.txt.x1y2.tmp"]
    with pytest.raises(ValueError, match=r"\.last\.tmp: a folder finecap did not make"):
        train(make_cfg("train.max_steps=6", "train.save_every=2", "train.eval_every=2"), resume=True)
    assert (tmp / ".notes.txt.x1y2.tmp").read_text() == "mine"


def test_resume_with_nothing_resumable_refuses_and_deletes_nothing(make_cfg):
    run, _ = _run_with_checkpoints(make_cfg)
    shutil.rmtree(checkpoint_dir(run, "last"))  # the user deleted last
    before = snapshot(run)
    with pytest.raises(
        CheckpointError,
        match=r"no complete resumable checkpoint \(found: best \(the best model, without optimizer state",
    ) as e:
        train(make_cfg(*COMMON), resume=True)
    assert f"Start again from its best checkpoint with train.init_from={checkpoint_dir(run, 'best')}" in str(e.value)
    assert snapshot(run) == before  # best, metrics.jsonl and config.yaml survive byte for byte


def test_resume_of_a_run_killed_before_any_checkpoint_refuses_without_pointing_at_a_best_it_lacks(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 10, "split": "train", "values": {"loss": 1.0}}\n')
    with pytest.raises(CheckpointError) as e:
        prepare_run_dir(tmp_path, resume=True, overwrite=False)
    assert "(found: no checkpoints/ folder); nothing was deleted. Start again in another run.dir" in str(e.value)
    assert "init_from" not in str(e.value) and (tmp_path / "metrics.jsonl").exists()
    with pytest.raises(CheckpointError) as e:  # the folder came from the command line's --out: that is named
        prepare_run_dir(tmp_path, resume=True, overwrite=False, option="--out")
    assert "Start again in another --out" in str(e.value) and "run.dir" not in str(e.value)


def test_resume_in_an_empty_folder_starts_fresh(make_cfg):
    cfg = make_cfg("train.max_steps=2")
    run_dir = train(cfg, resume=True)
    assert step_of(checkpoint_dir(run_dir, "last")) == 2


USER_FILES = {  # a file of the user's where finecap's run files go -> what the error names
    "checkpoints/my-model.safetensors": "checkpoints/my-model.safetensors",
    "checkpoints/epoch3/weights.bin": "checkpoints/epoch3",
    "checkpoints/.last/weights.bin": "checkpoints/.last",  # close to finecap's names, but none of them
    "checkpoints/best/my-notes.txt": "checkpoints/best/my-notes.txt",  # inside finecap's own checkpoint
    "metrics.jsonl": "metrics.jsonl",  # the user's CSV by that name in place of the event log
    "trackers/notes.txt": "trackers",  # in a run folder without finecap's config.yaml
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(USER_FILES))
def test_overwrite_refuses_a_file_finecap_did_not_make_and_deletes_nothing(make_cfg, name):
    """Overwriting a run removes finecap's run files only; one of the user's where they go stops it, untouched."""
    cfg = make_cfg("train.max_steps=1")
    run = train(cfg)
    path = run / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"accuracy,0.93\n")
    if name.startswith("trackers"):  # a run folder without finecap's config.yaml (a user's one is refused first)
        (run / "config.yaml").unlink()
    before = snapshot(run)
    named = re.escape(str(run / USER_FILES[name]))
    with pytest.raises(ValueError, match=rf"holds files finecap did not make .*\({named}\).*nothing was deleted"):
        train(cfg, overwrite=True)
    assert snapshot(run) == before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("start", "read"),
    [
        ("checkpoints/last", "checkpoints/last"),
        ("checkpoints/last/model", "checkpoints/last"),
        (".", "checkpoints/best"),
    ],
)
def test_overwrite_refuses_a_start_inside_the_run_it_would_delete(make_cfg, start, read):
    """A new run overwriting a folder whose own checkpoint (or the folder itself) is its train.init_from: refused
    before anything is deleted (the checkpoint was removed, then not found, and nothing trained). The message names
    the checkpoint the start stands for (a run directory its best, a model folder its checkpoint)."""
    run = train(make_cfg("train.max_steps=1"))
    before = snapshot(run)
    init = os.path.normpath(run / start)
    checkpoint = re.escape(os.path.normpath(run / read))
    with pytest.raises(ValueError, match=rf"train.init_from={checkpoint}: .*would delete first; nothing was"):
        train(make_cfg("train.max_steps=1", f"train.init_from={init}"), overwrite=True)
    assert snapshot(run) == before


def test_prepare_run_dir_names_the_option_that_reads_a_removed_file(tmp_path):
    """The check itself, for every option it is given (an empty one skipped, one outside the run left alone)."""
    model = tmp_path / "checkpoints" / "last" / "model"
    model.mkdir(parents=True)
    reads = {"train.init_from": "", "retriever.checkpoint": str(model)}
    with pytest.raises(ValueError, match=rf"^retriever.checkpoint={re.escape(str(model))}: the new run reads it"):
        prepare_run_dir(tmp_path, resume=False, overwrite=True, reads=reads)
    assert model.is_dir()
    other = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    assert prepare_run_dir(tmp_path, resume=False, overwrite=True, reads={"train.init_from": other}) is None
    assert not (tmp_path / "checkpoints").exists()


def test_an_overwrite_killed_while_removing_the_old_run_leaves_nothing_a_resume_picks(tmp_path, monkeypatch):
    """An overwrite (a forced retrain) killed while it removes the old run's ``checkpoints/``: its ``rmtree`` had
    deleted part of ``last/model/`` and left every ``trainer_state.json``, so the next run (the stage runner without
    force continues what it finds) resumed the broken ``last``, or the old run's ``last.old``. Every checkpoint is
    now made incomplete before any is deleted."""
    from helpers.killed_removal import Killed, KilledRmtree

    ckpts = tmp_path / "checkpoints"
    _fake_checkpoint(ckpts / "last", 4)
    _fake_checkpoint(ckpts / "last.old", 2)
    for name in ("last", "last.old"):
        (ckpts / name / "model" / "model.safetensors").write_text("weights")
    assert find_resumable(tmp_path) == ckpts / "last"
    kill = KilledRmtree()
    monkeypatch.setattr(shutil, "rmtree", kill)
    with pytest.raises(Killed):
        prepare_run_dir(tmp_path, resume=False, overwrite=True)
    monkeypatch.undo()
    assert kill.killed_in is not None and (ckpts / "last" / "state").is_dir()  # killed half-way through it
    assert find_resumable(tmp_path) is None


@pytest.mark.slow
@pytest.mark.parametrize("left", [".last.tmp", ".best.tmp", "last.old", "best.old", ".last.incomplete"])
def test_overwrite_replaces_finecaps_own_run_files(make_cfg, left):
    """The same folder with only what finecap leaves (checkpoints, what a kill while saving leaves, an event log whose
    last line a kill cut short, trackers) is replaced, and files of the user's beside them are kept."""
    cfg = make_cfg("train.max_steps=2", "train.save_every=1", "train.eval_every=1")
    run = train(cfg)
    shutil.copytree(checkpoint_dir(run, "last"), run / "checkpoints" / left)
    (run / "trackers").mkdir()
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "epoch": 0.2, "spl')  # a kill while appending an event
    (run / "notes.txt").write_text("kept\n")
    train(make_cfg("train.max_steps=1"), overwrite=True)
    assert step_of(checkpoint_dir(run, "last")) == 1 and not (run / "checkpoints" / left).exists()
    assert not (run / "trackers").exists()
    assert {json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()} == {1}
    assert (run / "notes.txt").read_text() == "kept\n"


# ------------------------------------------------------------------------------------------------------------------
# Divergence stops the run
# ------------------------------------------------------------------------------------------------------------------


def test_divergence_stops_with_the_step_and_the_last_good_checkpoint(make_cfg):
    cfg = make_cfg("train.lr=1e10", "train.warmup_steps=0", "train.max_steps=8", "train.save_every=1",
                   "train.eval_every=1", "train.grad_clip=0")  # fmt: skip
    with pytest.raises(TrainingDiverged, match=r"at step \d+; training stopped \(last good checkpoint: .*last"):
        train(cfg)
    run = run_path(cfg.run)
    best = checkpoint_dir(run, "best")
    if best.exists():  # a best checkpoint was only ever saved with a finite value
        info = json.loads((best / "trainer_state.json").read_text())
        assert info["best_value"] == info["best_value"] and abs(info["best_value"]) != float("inf")
        model = ClipCap.from_checkpoint(model_dir(best))
        assert all(torch.isfinite(t).all() for t in model.state_dict().values() if t.is_floating_point())


def test_divergence_exits_non_zero_on_the_command_line(make_cfg, capsys):
    argv = ["train", *_overrides(make_cfg, "train.lr=1e10", "train.warmup_steps=0", "train.grad_clip=0")]
    assert cli(argv) == 2
    assert "training stopped" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["inf", "nan", ".inf", "-inf"])
def test_non_finite_numbers_are_refused(make_cfg, value):
    with pytest.raises(ConfigError, match="train.lr: must be a finite number"):
        make_cfg(f"train.lr={value}")


def test_init_from_non_finite_weights_is_refused(make_cfg):
    cfg = make_cfg("train.max_steps=1")
    train(cfg)
    best = checkpoint_dir(run_path(cfg.run), "best")
    model = ClipCap.from_checkpoint(model_dir(best))
    with torch.no_grad():
        next(p for p in model.parameters() if p.is_floating_point()).fill_(float("nan"))
    model.save(model_dir(best))
    with pytest.raises(CheckpointError, match="non-finite values"):
        train(make_cfg(f"train.init_from={best}", "train.max_steps=1", run="second"))


def test_fsdp_and_deepspeed_are_refused(make_cfg, monkeypatch):
    """accelerate's FSDP and DeepSpeed plugins are refused, naming the supported routes (DDP, or finecap's own FSDP2
    through train.strategy=fsdp)."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from finecap.train import engine

    for kind in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        fake = SimpleNamespace(distributed_type=kind, num_processes=1)
        monkeypatch.setattr(engine, "Accelerator", lambda fake=fake, **kw: fake)
        with pytest.raises(ValueError, match="not supported by finecap.*train.strategy=fsdp"):
            engine.make_accelerator(make_cfg().train)


def test_caption_refuses_non_finite_weights(make_cfg, tmp_path, capsys):
    cfg = make_cfg("train.max_steps=1")
    train(cfg)
    best = checkpoint_dir(run_path(cfg.run), "best")
    model = ClipCap.from_checkpoint(model_dir(best))
    with torch.no_grad():
        next(p for p in model.parameters() if p.is_floating_point()).fill_(float("inf"))
    model.save(model_dir(best))
    out = tmp_path / "captions.json"
    assert cli(["caption", "--checkpoint", str(best), "--out", str(out)]) == 2
    assert "non-finite values" in capsys.readouterr().err and not out.exists()


def test_default_run_directory_is_in_the_home_not_the_working_directory(make_cfg, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = [a for a in _overrides(make_cfg, "train.max_steps=2") if not a.startswith("run.dir=")]
    assert cli(["train", *argv]) == 0
    assert list(work.iterdir()) == []  # nothing written into the working directory
    from finecap.home import home

    run = home() / "runs" / "run"
    assert (run / "checkpoints" / "best").is_dir() and str(run) in capsys.readouterr().err  # the summary line


def test_accumulation_survives_training_the_world_encoder_first(make_cfg):
    """Preparing the world encoder trains it with an Accelerator of its own; accelerate keeps one accumulation state
    per process, so the run's accelerator must be made after it (else the run would accumulate 1 micro-batch)."""
    cfg = make_cfg("model.encoder=world", "retriever.epochs=1", "retriever.batch_size=8", "train.grad_accum_steps=2",
                   "train.batch_size=8", "train.max_steps=2")  # fmt: skip
    run_dir = train(cfg)
    assert step_of(checkpoint_dir(run_dir, "last")) == 2


def test_continue_unfinished_resumes_restarts_or_refuses(tmp_path, caplog):
    """The one policy of the runners that re-run unfinished runs (the demo's stages, the paper-tables runner)."""
    from finecap.train.state import continue_unfinished

    def case(name: str, files: dict[str, str]):
        run = tmp_path / name
        run.mkdir()
        for rel, text in files.items():
            (run / rel).parent.mkdir(parents=True, exist_ok=True)
            (run / rel).write_text(text)
        return run

    event = '{"step": 10, "split": "train", "values": {"loss": 1.0}}\n'
    go = {"what": "stage x", "ways_out": "do this"}
    assert continue_unfinished(tmp_path / "missing", **go) == (False, False)  # nothing there: a fresh start
    assert continue_unfinished(case("empty", {}), **go) == (False, False)
    resumable = {"metrics.jsonl": event, "checkpoints/last/trainer_state.json": '{"step": 3}',
                 "checkpoints/last/state/loop.json": "{}"}  # fmt: skip
    assert continue_unfinished(case("resumable", resumable), **go) == (True, False)
    assert continue_unfinished(case("early", {"metrics.jsonl": event}), **go) == (False, True)
    torn = {"metrics.jsonl": event, "checkpoints/.last.tmp/model/config.json": "{}"}  # killed saving the first one
    assert continue_unfinished(case("torn", torn), **go) == (False, True)
    assert caplog.text.count("stage x: its earlier run in") == 2
    best_only = case("best", {"metrics.jsonl": event, "checkpoints/best/model/config.json": "{}"})
    with pytest.raises(CheckpointError) as e:
        continue_unfinished(best_only, **go)
    assert str(e.value).startswith(f"stage x: {best_only} holds an unfinished run with no checkpoint to resume from")
    assert str(e.value).endswith("nothing was deleted. To train it again from the start, do this")


@pytest.mark.parametrize(
    ("name", "mine"),
    [("config.yaml", "my: own notes\n"),
     # a recipe of one's own with run: and train: sections, once read as finecap's and replaced: not enough now
     ("config.yaml", "# my experiment, v7\nrun:\n  seed: 3\ntrain:\n  lr: 0.0003\n"),
     ("fingerprints.json", '{"my": "precious"}')],  # replaced by any run into the folder
)  # fmt: skip
def test_a_users_file_where_a_run_writes_its_own_is_never_replaced(make_cfg, name, mine):
    # with overwrite=True (the demo's --force) a user's config.yaml in the run folder was replaced by the run's
    cfg = make_cfg("train.max_steps=1")
    run = run_path(cfg.run)
    run.mkdir(parents=True)
    (run / name).write_text(mine)
    for kw in ({}, {"resume": True}, {"overwrite": True}):
        with pytest.raises(ValueError, match=rf"{name} exists and finecap did not make it"):
            train(cfg, **kw)
        assert (run / name).read_text() == mine
    assert not (run / "checkpoints").exists()


def test_a_runs_own_fingerprints_json_is_replaced_by_the_next_run(make_cfg):
    cfg = make_cfg("train.max_steps=1")
    run = train(cfg)
    written = json.loads((run / "fingerprints.json").read_text())
    (run / "fingerprints.json").write_text(json.dumps({**written, "data": None}))  # finecap's layout, other content
    train(cfg, overwrite=True)
    assert json.loads((run / "fingerprints.json").read_text()) == written  # written again by the next run


def test_a_runs_own_config_yaml_left_by_a_removed_run_is_replaced_whatever_the_home(make_cfg, tmp_path, monkeypatch):
    # a run folder whose run files were removed (an overwrite, or a forced stage retrain, killed before the new run
    # wrote) keeps its config.yaml and fingerprints.json; with the finecap home's record of outputs gone (another
    # $FINECAP_HOME, a cleared cache: it lives in the user cache directory), the next run into the folder refused
    # the run's own config.yaml as "finecap did not make it", as it did a stored configuration of the user's
    cfg = make_cfg("train.max_steps=1", f"run.dir={tmp_path / 'outside'}")  # a folder outside the home
    run = train(cfg)
    prepare_run_dir(run, resume=False, overwrite=True)  # the old run removed, then the new training killed
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "fingerprints.json"]
    left = (run / "config.yaml").read_text()
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "another-home"))
    assert train(cfg) == run and (run / "checkpoints" / "last").is_dir()
    assert (run / "config.yaml").read_text() == left  # written again by the new run (the same configuration)
    # a stored configuration with no run file of finecap's beside it and no record is still the user's
    prepare_run_dir(run, resume=False, overwrite=True)
    (run / "fingerprints.json").unlink()
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "a-third-home"))
    with pytest.raises(ValueError, match=r"config.yaml exists and finecap did not make it"):
        train(cfg)
    assert (run / "config.yaml").read_text() == left and not (run / "checkpoints").exists()


def test_a_missing_split_is_named_before_any_model_is_loaded(make_cfg, tmp_path):
    """A data set without a val split stopped only after the language model had loaded (a new user's run spent 51 s
    retrying the Hub for clipcap.lm=gpt2 and reported that, not the data); the splits are read first."""
    from PIL import Image

    lines = []
    for i in range(3):
        Image.new("RGB", (32, 32), (80 * i, 30, 160)).save(tmp_path / f"p{i}.png")
        lines.append(json.dumps({"image": f"p{i}.png", "captions": ["a red circle"]}))
    data = tmp_path / "captions.jsonl"
    data.write_text("\n".join(lines) + "\n")
    cfg = make_cfg("data.format=jsonl", f"data.path={data}", f"clipcap.lm={tmp_path / 'no-such-lm'}")
    with pytest.raises(ValueError, match=r"captions.jsonl: no records in split 'val'"):
        train(cfg)


@pytest.mark.slow
def test_a_resume_asked_with_overwrite_resumes_beside_a_users_file_and_removes_nothing(make_cfg):
    """A resume removes nothing, so ``overwrite=True`` beside it refuses nothing of the user's (prepare_run_dir
    resumes first): the check of what an overwrite may remove refused such a resume once it ran before training."""
    run = train(make_cfg("train.max_steps=1", "train.save_every=1"))
    mine = run / "checkpoints" / "my-notes.txt"
    mine.write_text("accuracy,0.93\n")
    assert train(make_cfg("train.max_steps=2", "train.save_every=1"), resume=True, overwrite=True) == run
    assert mine.read_text() == "accuracy,0.93\n" and step_of(checkpoint_dir(run, "last")) == 2
