"""Output safety (issue 32): nothing written through a symbolic link, no output over one of the command's inputs or
over a file finecap did not make (without --force), one training per run folder, no code run from a checkpoint or a
stored configuration, and a world whose files were edited refused by its fingerprint.

Every command is run through the command line (`run_cli`, from tests/helpers/cli.py): a refusal is one
`finecap: error:` line with exit code 2, never a traceback, and the file a planted link points to is unchanged.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from finecap.locks import TRAIN_LOCK, OutputLocked, output_lock
from finecap.outputs import OutputRefused, check_output_file, check_writable, made_by_finecap, write_output
from finecap.utils.files import append_jsonl, atomic_write_text, make_temporary_dir, open_append
from finecap.utils.folders import atomic_replace_dir
from helpers.cli import refused, run_cli

PRECIOUS = b"the user's own file: never to be overwritten\n"


def precious(folder: Path, name: str = "precious.txt") -> Path:
    """A file of the user's, outside the run, that a planted link points to."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(PRECIOUS)
    return path


def plant_link(at: Path, target: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, at)
    return at


@pytest.fixture(scope="module")
def trained(tiny) -> Path:
    """A 2-step tiny ClipCap run (checkpoints best and last)."""
    run = tiny["root"] / "outputs-run"
    code, _, err = run_cli(["train", *tiny["base"], "--out", str(run)])
    assert code == 0, err
    return run


@pytest.fixture()
def eval_files(tmp_path) -> tuple[Path, Path]:
    refs = tmp_path / "refs.jsonl"
    refs.write_text(json.dumps({"id": 1, "image": "1.png", "captions": ["a red circle", "a big red circle"]}) + "\n"
                    + json.dumps({"id": 2, "image": "2.png", "captions": ["a blue square"]}) + "\n")  # fmt: skip
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}, {"image_id": 2, "caption": "a square"}]))
    return preds, refs


def eval_argv(preds: Path, refs: Path, *more: str) -> list[str]:
    return ["eval", "--predictions", str(preds), "--references", str(refs), "--metrics", "bleu", *more]


# --------------------------------------------------------------------------------------------------------------------
# The writers: never through a link
# --------------------------------------------------------------------------------------------------------------------


def test_the_atomic_writers_refuse_a_link_and_leave_its_target(tmp_path):
    target = precious(tmp_path / "user")
    for write in (lambda p: atomic_write_text(p, "x"), lambda p: append_jsonl(p, {"a": 1}),
                  lambda p: open_append(p).close(), lambda p: write_output(p, "x", "scores")):  # fmt: skip
        link = plant_link(tmp_path / "run" / "out.json", target)
        with pytest.raises(OutputRefused, match=f"{link}: is a symbolic link \\(to {target}\\)"):
            write(link)
        assert target.read_bytes() == PRECIOUS and link.is_symlink()
        link.unlink()
    dangling = plant_link(tmp_path / "run" / "new.json", tmp_path / "user" / "would-be-created.txt")
    with pytest.raises(OutputRefused):
        atomic_write_text(dangling, "x")
    assert not (tmp_path / "user" / "would-be-created.txt").exists()
    # a folder swapped into place: a link at its final name or at its .old is refused, named, and left
    user_dir = tmp_path / "user-dir"
    user_dir.mkdir()
    (user_dir / "keep.txt").write_bytes(PRECIOUS)
    for name in ("best", "best.old"):
        link = plant_link(tmp_path / "ckpt" / name, user_dir)
        tmp = make_temporary_dir(tmp_path / "ckpt" / "best")
        with pytest.raises(OutputRefused, match=f"{link}: is a symbolic link"):
            atomic_replace_dir(tmp, tmp_path / "ckpt" / "best")
        assert (user_dir / "keep.txt").read_bytes() == PRECIOUS and link.is_symlink()
        link.unlink()
        shutil.rmtree(tmp)


def test_a_lock_file_is_never_written_through_a_link(tmp_path):
    target = precious(tmp_path / "user")
    plant_link(tmp_path / "run" / TRAIN_LOCK, target)
    with pytest.raises(OutputRefused, match=TRAIN_LOCK), output_lock(tmp_path / "run", name=TRAIN_LOCK, holder="t"):
        pass
    assert target.read_bytes() == PRECIOUS


def test_a_users_file_bearing_the_lock_files_name_is_never_written_or_removed(tmp_path):
    """A file of the user's named .train.lock (not a lock record finecap writes) was truncated, taken over with a
    warning and deleted, even when the run was then refused; a record of finecap's (a run that died) is taken over."""
    run = tmp_path / "run"
    run.mkdir()
    for mine in ("lock\n", '{"note": "my own settings"}', "[1, 2]"):
        (run / TRAIN_LOCK).write_text(mine)
        with (
            pytest.raises(OutputLocked, match="a file finecap did not write holds the name of its lock file"),
            output_lock(run, name=TRAIN_LOCK, holder="finecap train"),
        ):
            pass
        assert (run / TRAIN_LOCK).read_text() == mine
    said = []
    (run / TRAIN_LOCK).write_text('{"pid": 4242, "host": "node7", "started": 0, "command": "finecap train"}')
    with output_lock(run, name=TRAIN_LOCK, holder="finecap train", log=said.append) as record:
        assert json.loads((run / TRAIN_LOCK).read_text())["pid"] == record["pid"]
    assert "taking over the lock of pid 4242 on host node7" in said[0] and not (run / TRAIN_LOCK).exists()


def test_another_users_lock_file_is_named_with_its_owner_and_record(tmp_path, monkeypatch):
    """A lock file another user's dead run left (mode 0600, theirs): flock cannot open it; the error said only
    "cannot take the output folder's lock (Permission denied)". It names the owner, the run that left it and the way
    out."""
    import pwd

    from filelock import FileLock

    run = tmp_path / "run"
    run.mkdir()
    (run / TRAIN_LOCK).write_text('{"pid": 4242, "host": "node7", "started": 0}')

    def refused_open(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(run / TRAIN_LOCK))

    monkeypatch.setattr(FileLock, "acquire", refused_open)
    owner = pwd.getpwuid(os.getuid()).pw_name  # the file is this test's; the process is made another user below
    real_uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 1)
    with pytest.raises(OutputLocked) as e, output_lock(run, name=TRAIN_LOCK, holder="finecap train"):
        pass
    message = str(e.value)
    assert message.startswith(f"{run / TRAIN_LOCK}: cannot take the output folder's lock: the file is {owner}'s")
    assert "pid 4242 on host node7" in message and "choose another --out" in message
    assert (run / TRAIN_LOCK).exists()  # never removed
    # no lock file at all: the folder is not this user's to write (no other user's run is blamed)
    (run / TRAIN_LOCK).unlink()
    with pytest.raises(OutputLocked) as e, output_lock(run, name=TRAIN_LOCK, holder="finecap train"):
        pass
    assert str(e.value) == f"{run}: not writable by this user (Permission denied); choose another --out"


def test_train_never_writes_through_a_link_in_its_run_folder(tiny, trained, tmp_path):
    target = precious(tmp_path / "user")
    # a fresh run folder whose config.yaml is a link
    fresh = tmp_path / "fresh"
    plant_link(fresh / "config.yaml", target)
    refused(["train", *tiny["base"], "--out", str(fresh)], f"{fresh / 'config.yaml'}: is a symbolic link")
    # a shared run folder (tar xf keeps links) resumed: .last.tmp, best and the metrics log are links
    for planted in (Path("checkpoints") / ".last.tmp", Path("checkpoints") / "best", Path("metrics.jsonl")):
        run = tmp_path / f"shared-{planted.name}"
        shutil.copytree(trained, run, symlinks=True)
        victim = run / planted
        if victim.is_dir():
            shutil.rmtree(victim)
        else:
            victim.unlink(missing_ok=True)
        user_dir = tmp_path / f"user-{planted.name}"
        user_dir.mkdir()
        (user_dir / "keep.txt").write_bytes(PRECIOUS)
        plant_link(victim, target if planted.name == "metrics.jsonl" else user_dir)
        refused(["train", *tiny["base"], "--out", str(run), "--resume", "train.max_steps=3"], str(victim),
                "symbolic link")  # fmt: skip
        assert target.read_bytes() == PRECIOUS
        assert sorted(p.name for p in user_dir.iterdir()) == ["keep.txt"]
        assert (user_dir / "keep.txt").read_bytes() == PRECIOUS


def test_caption_eval_and_bags_never_write_through_a_link(tiny, trained, eval_files, tmp_path):
    target = precious(tmp_path / "user")
    preds, refs = eval_files
    out = plant_link(tmp_path / "links" / "scores.json", target)
    refused(eval_argv(preds, refs, "--out", str(out)), f"{out}: is a symbolic link")
    refused(eval_argv(preds, refs, "--per-image", str(out), "--force"), f"{out}: is a symbolic link")
    refused(["caption", "--checkpoint", str(trained), "--out", str(out), "--force"], f"{out}: is a symbolic link")
    world = [o for o in tiny["base"] if o.startswith(("world.", "run.cache_dir"))]
    refused(["bags", "build", *world, "--out", str(out)], f"{out}: is a symbolic link")
    assert target.read_bytes() == PRECIOUS


def test_demo_never_writes_a_stage_done_marker_through_a_link(tiny, tmp_path):
    target = precious(tmp_path / "user")
    world = [o for o in tiny["base"] if o.startswith(("world.", "run.cache_dir"))]
    demo = tmp_path / "demo"
    assert run_cli(["demo", "--quick", "--stages", "world", "--out", str(demo), *world])[0] == 0
    link = plant_link(demo / "mle" / "DONE", target)  # pointing at an existing file: not a finished stage either
    for force in ([], ["--force"]):
        refused(["demo", "--quick", "--stages", "mle", "--out", str(demo), *world, *force], f"{link}: is a symbolic")
    assert target.read_bytes() == PRECIOUS and not (demo / "mle" / "checkpoints").exists()


def test_folder_links_inside_a_demo_or_a_world_are_refused(tiny, tmp_path):
    from finecap.config import WorldConfig
    from finecap.world.make import make_world

    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("000005.png", "000006.png", "mle.json"):
        (victim / name).write_bytes(PRECIOUS)
    out = tmp_path / "world"
    cfg = WorldConfig(n_train=4, n_val=1, n_test=2, image_size=16, seed=3)
    make_world(cfg, out=out, progress=False)
    (out / "world.json").unlink()  # unfinished: completed again by the next make
    shutil.rmtree(out / "images" / "test")
    plant_link(out / "images" / "test", victim)
    argv = ["world", "make", "--out", str(out), "--n-train", "4", "--n-val", "1", "--n-test", "2", "--image-size",
            "16"]  # fmt: skip
    refused([*argv, "--seed", "3"], f"an images folder is a link ({out / 'images' / 'test'} -> ")
    refused([*argv, "--seed", "4", "--force"], f"({out / 'images' / 'test'} -> ")  # nothing removed through it
    world = [o for o in tiny["base"] if o.startswith(("world.", "run.cache_dir"))]
    demo = tmp_path / "demo"
    assert run_cli(["demo", "--quick", "--stages", "world", "--out", str(demo), *world])[0] == 0
    plant_link(demo / "captions", victim)
    refused(["demo", "--quick", "--stages", "world", "--out", str(demo), *world, "--force"],
            f"{demo / 'captions'}: is a symbolic link")  # fmt: skip
    assert sorted(p.name for p in victim.iterdir()) == ["000005.png", "000006.png", "mle.json"]
    assert all(p.read_bytes() == PRECIOUS for p in victim.iterdir())


def test_boost_refuses_a_link_at_its_outputs_before_any_request(tmp_path):
    from finecap.boost.output import check_outputs

    target = precious(tmp_path / "user")
    source = tmp_path / "data" / "d.jsonl"
    source.parent.mkdir()
    source.write_text(json.dumps({"image": "a.png", "captions": ["x"]}) + "\n")
    for name in ("cache.jsonl", "d.jsonl", "boost.json"):
        out = tmp_path / f"out-{name}"
        plant_link(out / name, target)
        with pytest.raises(OutputRefused, match=f"{out / name}: is a symbolic link"):
            check_outputs("jsonl", source, out)
    assert target.read_bytes() == PRECIOUS


def test_resume_refuses_a_tampered_metrics_log(tiny, trained, tmp_path):
    for bad in ('{"x": 1}', "[1]", "garbage"):
        run = shutil.copytree(trained, tmp_path / f"run-{len(bad)}")
        log = run / "metrics.jsonl"
        before = log.read_text() + bad + "\n"
        log.write_text(before)
        refused(["train", *tiny["base"], "--out", str(run), "--resume", "train.max_steps=3"], f"{log}: not finecap's")
        assert log.read_text() == before


def test_world_make_completing_an_unfinished_world_never_writes_through_a_link(tmp_path):
    from finecap.config import WorldConfig
    from finecap.world.make import make_world

    target = precious(tmp_path / "user")
    out = tmp_path / "world"
    cfg = WorldConfig(n_train=4, n_val=1, n_test=1, image_size=16, seed=3)
    make_world(cfg, out=out, progress=False)
    (out / "world.json").unlink()  # unfinished: completed again by the next make
    (out / "images" / "train" / "000001.png").unlink()
    plant_link(out / "images" / "train" / "000001.png", target)
    refused(["world", "make", "--out", str(out), "--n-train", "4", "--n-val", "1", "--n-test", "1",
             "--image-size", "16", "--seed", "3"], "000001.png: is a symbolic link")  # fmt: skip
    assert target.read_bytes() == PRECIOUS


# --------------------------------------------------------------------------------------------------------------------
# Outputs never over inputs, nor over files finecap did not make
# --------------------------------------------------------------------------------------------------------------------


def test_eval_outputs_never_over_its_inputs_even_with_force(eval_files):
    preds, refs = eval_files
    before = preds.read_bytes(), refs.read_bytes()
    refused(eval_argv(preds, refs, "--out", str(preds), "--force"), "--out", "--predictions", "destroy the input")
    refused(eval_argv(preds, refs, "--per-image", str(refs), "--force"), "--per-image", "--references")
    alias = preds.parent / "alias.json"
    os.link(preds, alias)  # a hard link: the same file under another name
    refused(eval_argv(preds, refs, "--out", str(alias), "--force"), "--predictions")
    refused(
        eval_argv(preds, refs, "--out", str(preds.parent / ".." / preds.parent.name / "preds.json")), "--predictions"
    )
    refused(eval_argv(preds, refs, "--out", str(preds.parent / "x.json"), "--per-image", str(preds.parent / "x.json")),
            "--per-image", "--out")  # fmt: skip
    assert (preds.read_bytes(), refs.read_bytes()) == before


def test_eval_outputs_never_in_the_image_folder_even_with_force(eval_files, tmp_path):
    """`finecap eval --images DIR --out DIR/1.png --force` replaced the user's image with the scores, and `--out
    DIR/scores.json` wrote into the folder it reads: the image folder (`--images`, else `data.images`) is an input."""
    preds, refs = eval_files
    images = tmp_path / "photos"
    for name in ("1.png", "2.png"):
        precious(images, name)
    os.symlink(images, tmp_path / "photos-link")
    with_images = ("--images", str(images))
    for option, out in (("--out", images / "1.png"), ("--per-image", images / "new.json"),
                        ("--out", tmp_path / "photos-link" / "2.png"), ("--out", images)):  # fmt: skip
        refused(eval_argv(preds, refs, *with_images, option, str(out), "--force"), option, "--images", str(images))
    refused(eval_argv(preds, refs, f"data.images={images}", "--out", str(images / "1.png"), "--force"),
            "--out", "data.images")  # fmt: skip
    assert sorted(p.name for p in images.iterdir()) == ["1.png", "2.png"]
    assert all(p.read_bytes() == PRECIOUS for p in images.iterdir())


def test_eval_out_and_per_image_naming_one_file_are_refused_as_such(eval_files):
    # both are outputs: "--per-image: s.json is also the command's --out; writing it would destroy the input"
    preds, refs = eval_files
    same = preds.parent / "s.json"
    for per_image in (same, preds.parent / "." / "s.json"):
        line = refused(eval_argv(preds, refs, "--out", str(same), "--per-image", str(per_image), "--force"),
                       f"--out and --per-image are the same file ({per_image}); name two files")  # fmt: skip
        assert "input" not in line
    assert not same.exists()


def test_eval_outputs_never_over_the_inputs_its_configuration_names_even_with_force(eval_files):
    preds, refs = eval_files
    instances, questions = precious(preds.parent, "instances.json"), precious(preds.parent, "questions.jsonl")
    refused(eval_argv(preds, refs, f"eval.instances={instances}", "--out", str(instances), "--force"),
            "--out", "eval.instances", "destroy the input")  # fmt: skip
    refused(eval_argv(preds, refs, f"judge.questions={questions}", "--per-image", str(questions), "--force"),
            "--per-image", "judge.questions")  # fmt: skip
    assert instances.read_bytes() == questions.read_bytes() == PRECIOUS


def test_check_writable_tries_the_nearest_folder_and_makes_nothing(tmp_path, monkeypatch):
    check_writable(tmp_path / "new" / "deeper" / "out.json")  # the folders the write would make: not made here
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("mine")
    with pytest.raises(OutputRefused) as e:
        check_writable(tmp_path / "f" / "out.json", option="--per-image")
    assert (
        str(e.value) == f"--per-image: {tmp_path}/f/out.json: {tmp_path}/f is not a folder; choose another --per-image"
    )

    def denied(*args, **kwargs):  # a folder of another user, as root cannot be shown one
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("finecap.outputs.tempfile.mkstemp", denied)
    with pytest.raises(OutputRefused) as e:
        check_writable(tmp_path / "out.json")
    assert (
        str(e.value)
        == f"--out: {tmp_path}/out.json: cannot write in {tmp_path} (permission denied); choose another --out"
    )
    assert (tmp_path / "f").read_text() == "mine"


def test_an_existing_file_finecap_did_not_make_needs_force(eval_files, tmp_path):
    preds, refs = eval_files
    mine = precious(tmp_path / "user", "scores.json")
    refused(eval_argv(preds, refs, "--out", str(mine)), f"{mine} exists and finecap did not make it", "--force")
    assert mine.read_bytes() == PRECIOUS
    # what finecap wrote it may replace when named again (recognised by content, not by name)
    out = tmp_path / "made" / "scores.json"
    assert run_cli(eval_argv(preds, refs, "--out", str(out)))[0] == 0 and made_by_finecap(out)
    assert run_cli(eval_argv(preds, refs, "--out", str(out)))[0] == 0
    out.write_text(out.read_text().replace("}", ', "mine": 1}'))  # edited by the user since: theirs now
    refused(eval_argv(preds, refs, "--out", str(out)), "finecap did not make it as a scores file (or it was changed")
    assert run_cli(eval_argv(preds, refs, "--out", str(mine), "--force"))[0] == 0  # asked: replaced
    assert "BLEU-4" in json.loads(mine.read_text())
    refused(eval_argv(preds, refs, "--out", str(tmp_path)), "is a directory, but a file is expected here")


def test_caption_and_bags_never_write_over_the_data_set(tiny, trained, tmp_path):
    world = Path(next(o for o in tiny["base"] if o.startswith("world.out=")).split("=", 1)[1])
    before = (world / "dataset.json").read_bytes()
    refused(["caption", "--checkpoint", str(trained), "--out", str(world / "dataset.json"), "--force"],
            "lies inside the command's data set")  # fmt: skip
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"image": str(world / "images" / "test" / "000050.png"), "captions": ["x"]}) + "\n")
    refused(["caption", "--checkpoint", str(trained), "--data", str(data), "--out", str(data), "--force"],
            "is also the command's data set")  # fmt: skip
    refused(["bags", "build", "--data", str(data), "--out", str(data), "--force"], "is also the command's --data")
    assert (world / "dataset.json").read_bytes() == before and "000050" in data.read_text()
    # and a file of the user's beside it: refused, kept
    mine = precious(tmp_path / "user", "captions.json")
    refused(["caption", "--checkpoint", str(trained), "--out", str(mine)], "finecap did not make it")
    assert mine.read_bytes() == PRECIOUS


def test_no_output_over_an_image_beside_the_data_set_even_with_force(tiny, trained, eval_files, tmp_path):
    """The images of a JSONL data set lie beside it, in no folder the command is given: `finecap eval --references
    refs.jsonl --out 1.png --force` (likewise `caption --data` and `bags build --data`) replaced the user's image."""
    preds, refs = eval_files  # refs.jsonl names 1.png and 2.png beside it
    world = Path(next(o for o in tiny["base"] if o.startswith("world.out=")).split("=", 1)[1])
    image = refs.parent / "1.png"
    shutil.copyfile(world / "images" / "test" / "000050.png", image)
    (refs.parent / "2.png").write_bytes(image.read_bytes())
    before = image.read_bytes()
    alias = tmp_path / "alias.png"
    os.link(image, alias)  # the same file under another name, outside the data set's folder
    for out in (image, alias):
        refused(eval_argv(preds, refs, "--out", str(out), "--force"), "--out", "an image of the references",
                str(image))  # fmt: skip
    refused(eval_argv(preds, refs, "--per-image", str(image), "--force"), "--per-image", "an image of the references")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"image": "1.png", "captions": ["x"], "split": "test"}) + "\n"
                    + json.dumps({"image": "2.png", "captions": ["y"], "split": "test"}) + "\n")  # fmt: skip
    refused(["caption", "--checkpoint", str(trained), "--data", str(data), "--out", str(image), "--force"],
            "an image of the data set")  # fmt: skip
    clip = f"retriever.checkpoint={tiny['clip']}"  # a retriever: without the check, the bags were written
    refused(["bags", "build", clip, "--data", str(data), "--sizes", "2", "--out", str(alias), "--force"],
            "an image of", str(image))  # fmt: skip
    assert image.read_bytes() == before


def test_train_never_replaces_the_recipe_nor_a_users_config(tiny, tmp_path):
    exp = tmp_path / "myexp"
    exp.mkdir()
    recipe = exp / "config.yaml"
    recipe.write_text("train:\n  lr: 0.001\nrun:\n  seed: 1\n")
    before = recipe.read_bytes()
    refused(["train", str(recipe), *tiny["base"], "--out", str(exp)], "is also the command's recipe")
    # a config.yaml of the user's in the run folder (not the recipe) is theirs: refused
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_bytes(before)
    refused(["train", str(recipe), *tiny["base"], "--out", str(other)], "finecap did not make it")
    assert recipe.read_bytes() == before and (other / "config.yaml").read_bytes() == before


def test_train_into_a_run_folder_names_the_option_that_chose_it(tiny, trained):
    # `finecap train ... --out DIR` on a run folder said "run.dir: DIR already holds a run; ... choose another run.name
    # / run.dir", options the user never typed
    line = refused(["train", *tiny["base"], "--out", str(trained)],
                   f"--out: {trained} already holds a run; pass --resume", "or choose another --out")  # fmt: skip
    assert "run.dir" not in line and "run.name" not in line
    refused(["train", *tiny["base"], f"run.dir={trained}"],
            f"run.dir: {trained} already holds a run", "choose another run.name / run.dir")  # fmt: skip


def test_train_never_writes_its_run_into_the_data_it_reads(tiny, tmp_path):
    """A run folder inside the world (or a data set folder, data.images) was made and trained into; caption, eval and
    the report refuse such an output."""
    world = tiny["root"] / "world"
    before = sorted(p.relative_to(world) for p in world.rglob("*"))
    for inside in (world / "myrun", world / "images" / "train" / "run"):
        refused(["train", *tiny["base"], "--out", str(inside)], f"--out: {inside} lies inside the command's data")
    refused(["train", *tiny["base"], f"data.images={tmp_path}", "--out", str(tmp_path / "run")],
            "lies inside the command's image folder (data.images)")  # fmt: skip
    assert sorted(p.relative_to(world) for p in world.rglob("*")) == before and not (tmp_path / "run").exists()


def test_demo_refuses_a_folder_of_user_files_and_a_users_config(tiny, tmp_path):
    world = [o for o in tiny["base"] if o.startswith(("world.", "run.cache_dir"))]
    mine = tmp_path / "mine"
    precious(mine, "config.yaml")
    refused(["demo", "--quick", "--stages", "world", "--out", str(mine), *world], "finecap did not make it")
    assert (mine / "config.yaml").read_bytes() == PRECIOUS
    notes = tmp_path / "notes"
    precious(notes, "thesis.tex")
    refused(["demo", "--quick", "--stages", "world", "--out", str(notes), *world], "not a finecap demo's",
            "thesis.tex")  # fmt: skip
    assert sorted(p.name for p in notes.iterdir()) == ["thesis.tex"]
    # the demo's own folder is its own: run twice
    ok = tmp_path / "demo"
    for _ in range(2):
        code, _, err = run_cli(["demo", "--quick", "--stages", "world", "--out", str(ok), *world])
        assert code == 0, err


def test_boost_takes_a_folder_as_its_own_by_content_not_by_name(tmp_path):
    from finecap.boost.output import check_outputs

    source = tmp_path / "data" / "d.jsonl"
    source.parent.mkdir()
    source.write_text(json.dumps({"image": "a.png", "captions": ["x"]}) + "\n")
    out = tmp_path / "out"
    precious(out, "cache.jsonl")
    with pytest.raises(ValueError, match="cache.jsonl is not finecap boost's"):
        check_outputs("jsonl", source, out)
    (out / "cache.jsonl").write_text(json.dumps({"key": "k", "step": "blend", "image_id": 1, "answer": "a"}) + "\n")
    check_outputs("jsonl", source, out)  # what a boost run writes there
    (out / "failures.jsonl").write_text("image_id,step\n1,blend\n")  # a CSV of the user's under that name
    with pytest.raises(ValueError, match="failures.jsonl is not finecap boost's"):
        check_outputs("jsonl", source, out)


def test_a_file_made_by_finecap_is_recognised_by_content_and_kind(tmp_path, monkeypatch):
    out = tmp_path / "x.json"
    write_output(out, '{"a": 1}\n', "scores")
    check_output_file(out, {}, force=False, kind="scores")  # finecap's scores: may be replaced by scores
    with pytest.raises(OutputRefused, match="did not make it as a results file"):
        check_output_file(out, {}, force=False, kind="results")  # not by another kind of output
    other = tmp_path / "y.json"
    other.write_text('{"a": 2}\n')  # the same name pattern, another content: the user's
    with pytest.raises(OutputRefused, match="did not make it"):
        check_output_file(other, {}, force=False, kind="scores")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # never opened (reading it would wait for a writer forever)
    with pytest.raises(OutputRefused, match="not a regular file"):
        check_output_file(fifo, {}, force=True, kind="scores")
    # an unwritable finecap home: the output is written, only the record of it is lost (a warning)
    monkeypatch.setenv("FINECAP_HOME", str(other / "home"))  # under a file: cannot be created
    write_output(tmp_path / "z.json", "{}\n", "scores")
    assert (tmp_path / "z.json").read_text() == "{}\n"
    with pytest.raises(OutputRefused, match="did not make it"):
        check_output_file(tmp_path / "z.json", {}, force=False, kind="scores")


def _record_outputs(kind, start, n):
    from finecap.outputs import remember

    start.wait()
    for i in range(n):
        remember(f"[{i}]\n".encode(), kind)


def test_two_processes_recording_the_same_bytes_as_two_kinds_lose_neither(tmp_path):
    # the record was one file per SHA-256 holding one kind, rewritten in place: the last writer's kind replaced the
    # first's (a lost update, then a refusal without --force), and a reader between its truncation and its write, or
    # a kill or full disk there, found an empty record
    import multiprocessing

    context = multiprocessing.get_context("fork")
    start = context.Event()
    workers = [context.Process(target=_record_outputs, args=(kind, start, 50)) for kind in ("scores", "results")]
    for w in workers:
        w.start()
    start.set()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    for i in range(50):
        out = tmp_path / f"{i}.json"
        out.write_bytes(f"[{i}]\n".encode())
        assert made_by_finecap(out, ("scores",)) and made_by_finecap(out, ("results",)), i
    assert not made_by_finecap(out, ("bags",))


def test_a_record_of_an_earlier_finecap_is_still_read(tmp_path):
    from finecap.home import home
    from finecap.outputs import MADE_DIR, digest

    out = tmp_path / "scores.json"
    out.write_text('{"old": 1}\n')
    (home() / MADE_DIR).mkdir(parents=True, exist_ok=True)
    (home() / MADE_DIR / digest(out.read_bytes())).write_text("scores")  # one file per SHA-256, holding its kind
    assert made_by_finecap(out, ("scores",)) and not made_by_finecap(out, ("results",))


def test_a_command_never_replaces_another_kind_of_finecap_output(trained, tmp_path):
    run = shutil.copytree(trained, tmp_path / "run")
    before = (run / "config.yaml").read_bytes()
    refused(["caption", "--checkpoint", str(run), "--out", str(run / "config.yaml")],
            "did not make it as a results file")  # fmt: skip
    assert (run / "config.yaml").read_bytes() == before


def test_the_recipe_is_an_input_of_every_command(tiny, trained, eval_files, tmp_path):
    preds, refs = eval_files
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("eval:\n  seed: 1\n")
    before = recipe.read_bytes()
    refused(["eval", str(recipe), "--predictions", str(preds), "--references", str(refs), "--metrics", "bleu",
             "--out", str(recipe), "--force"], "is also the command's recipe")  # fmt: skip
    refused(["caption", "--checkpoint", str(trained), str(recipe), "--out", str(recipe), "--force"],
            "is also the command's recipe")  # fmt: skip
    world = [o for o in tiny["base"] if o.startswith(("world.", "run.cache_dir"))]
    refused(["bags", "build", str(recipe), *world, "--out", str(recipe), "--force"], "is also the command's recipe")
    assert recipe.read_bytes() == before


# --------------------------------------------------------------------------------------------------------------------
# One training per run folder
# --------------------------------------------------------------------------------------------------------------------


def test_a_second_training_on_one_run_folder_stops_naming_the_first(tiny, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from finecap.locks import output_lock, TRAIN_LOCK\n"
         f"with output_lock({str(run)!r}, name=TRAIN_LOCK, holder='finecap train'):\n"
         "    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        line = refused(["train", *tiny["base"], "--out", str(run)], "another finecap train is writing to this folder",
                       f"pid {holder.pid}")  # fmt: skip
        assert TRAIN_LOCK in line
    finally:
        holder.kill()
        holder.wait()
    assert not (run / "checkpoints").exists()  # the second wrote nothing


# --------------------------------------------------------------------------------------------------------------------
# No code from data
# --------------------------------------------------------------------------------------------------------------------

EVIL = "import pathlib; pathlib.Path({marker!r}).write_text('ran')\n"


def _cli_subprocess(argv: list[str], stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "finecap", *argv], input=stdin, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})  # fmt: skip


@pytest.mark.slow
def test_a_tampered_checkpoint_runs_no_code_even_with_yes_on_stdin(trained, tmp_path):
    run = shutil.copytree(trained, tmp_path / "tampered")
    lm = run / "checkpoints" / "best" / "model" / "lm"
    marker = tmp_path / "code-ran"
    (lm / "evil_model.py").write_text(EVIL.format(marker=str(marker)))
    config = json.loads((lm / "config.json").read_text())
    config["model_type"] = "evil_gpt2"  # an architecture transformers does not ship: only the checkpoint's code has it
    config["auto_map"] = {"AutoConfig": "evil_model.EvilConfig", "AutoModelForCausalLM": "evil_model.EvilModel"}
    (lm / "config.json").write_text(json.dumps(config))
    done = _cli_subprocess(["caption", "--checkpoint", str(run), "--out", str(tmp_path / "c.json")], stdin="y\ny\n")
    assert not marker.exists(), "the checkpoint's code ran"
    assert done.returncode == 2, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("finecap: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "its own Python code" in errors[0] and "never runs code from a checkpoint" in errors[0]


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


@pytest.mark.slow
def test_a_pickled_weights_file_is_never_unpickled_and_the_advice_is_not_repeated(trained, tmp_path):
    run = shutil.copytree(trained, tmp_path / "pickled")
    lm = run / "checkpoints" / "best" / "model" / "lm"
    marker = tmp_path / "code-ran"
    (lm / "model.safetensors").unlink()
    with open(lm / "pytorch_model.bin", "wb") as f:
        pickle.dump({"transformer.wte.weight": _Payload(str(marker))}, f)
    done = _cli_subprocess(["caption", "--checkpoint", str(run), "--out", str(tmp_path / "c.json")])
    assert not marker.exists(), "the pickle ran"
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "weights_only=False" not in done.stderr, done.stderr
    assert "never unpickles" in done.stderr or "cannot read the weights" in done.stderr, done.stderr


def test_a_stored_configuration_imports_nothing_when_read(trained, tmp_path, monkeypatch):
    """Recipes may name code (`pkg.module:callable`); a run's stored config.yaml read by `finecap caption` never
    imports it (the objective, sampler, rewards and validators of training are not looked up to caption)."""
    run = shutil.copytree(trained, tmp_path / "named-code")
    package = tmp_path / "site"
    package.mkdir()
    marker = tmp_path / "imported"
    (package / "evil_recipe_code.py").write_text(EVIL.format(marker=str(marker)) + "def f(*a, **k):\n    pass\n")
    monkeypatch.syspath_prepend(str(package))
    for config in [run / "config.yaml", *run.glob("checkpoints/*/config.yaml")]:
        text = config.read_text()
        text = text.replace("objective: mle", "objective: evil_recipe_code:f")
        text = text.replace("sampler: random", "sampler: evil_recipe_code:f")
        config.write_text(text)
    assert "evil_recipe_code:f" in (run / "config.yaml").read_text()
    code, _, err = run_cli(["caption", "--checkpoint", str(run), "--out", str(tmp_path / "c.json")])
    assert code == 0, err
    assert not marker.exists() and "evil_recipe_code" not in sys.modules


# --------------------------------------------------------------------------------------------------------------------
# An edited world
# --------------------------------------------------------------------------------------------------------------------


def test_an_edited_world_is_refused_by_its_fingerprint(tiny, tmp_path):
    world = Path(next(o for o in tiny["base"] if o.startswith("world.out=")).split("=", 1)[1])
    copy = shutil.copytree(world, tmp_path / "world-copy")
    base = [o for o in tiny["base"] if not o.startswith("world.out=")] + [f"world.out={copy}"]
    run = tmp_path / "run"
    assert run_cli(["train", *base, "--out", str(run)])[0] == 0
    data = json.loads((copy / "dataset.json").read_text())
    data["images"][0]["sentences"][0]["raw"] = "an edited caption"
    (copy / "dataset.json").write_text(json.dumps(data))
    # the run trained on the world, read against the edited world (same key, other content)
    refused(["caption", "--checkpoint", str(run), "--out", str(tmp_path / "c.json")], "sha256")
    # the edited world used as a world: refused before anything trains on it, or makes it again
    refused(["train", *base, "--out", str(tmp_path / "r")], "dataset.json changed since")
    refused(["world", "make", "--out", str(copy), "--n-train", "40", "--n-val", "8", "--n-test", "8",
             "--image-size", "32"], "dataset.json changed since")  # fmt: skip
    # --force replaces it, as the message says (it was refused whatever was asked): the world of its key again
    (copy / "notes.txt").write_text("mine\n")
    assert run_cli(["world", "make", "--out", str(copy), "--n-train", "40", "--n-val", "8", "--n-test", "8",
                    "--image-size", "32", "--force"])[0] == 0  # fmt: skip
    assert (copy / "dataset.json").read_bytes() == (world / "dataset.json").read_bytes()
    assert (copy / "notes.txt").read_text() == "mine\n"  # a file of the user's beside it stays


def test_demo_takes_a_folder_holding_its_training_stages_runs(tmp_path):
    # `finecap train demo/mle` writes <home>/runs/demo/mle, the demo's mle stage folder (docs/runs-and-home.md): a
    # folder of training-stage runs is the demo's, while a stage-named folder holding no run is still the user's
    from finecap.app.demo import check_demo_dir

    demo = tmp_path / "demo"
    for stage in ("mle", "discritune"):
        (demo / stage).mkdir(parents=True)
        (demo / stage / "config.yaml").write_text("run: {}\n")
    check_demo_dir(demo, recipe=None, force=False)
    (demo / "smile").mkdir()
    with pytest.raises(OutputRefused, match=r"not a finecap demo's \(smile\)"):
        check_demo_dir(demo, recipe=None, force=False)
