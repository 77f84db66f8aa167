"""``finecap caption --images`` (issue 34): images without references captioned from any folder a checkpoint loads
from, ids from file names, bad images named or skipped and counted, outputs refused where they would replace what
finecap did not make; and the folder errors of :func:`finecap.runs.find_checkpoint`.

The captioner: a tiny ClipCap (random frozen CLIP) trained for 120 steps on an image folder with one ``.txt`` caption
per image and no split (``data.val_fraction`` holds a quarter out): noisy solid colours, ``a red circle`` for red, ``a
blue square`` for blue, and so on, which it learns; so new images of those colours must get their colour's caption,
and a caption given to the wrong id shows."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from finecap.app.caption import main, resolve
from finecap.data.records import DataError
from finecap.inference import image_files
from finecap.runs import checkpoint_dir, find_checkpoint, model_dir
from helpers.cli import run_cli
from helpers.image_files import BROKEN
from helpers.refusals import refuse_tiny_images
from helpers.shapes import CAPTION, COLORS, caption, results


def one_line_error(code: int, err: str) -> str:
    """The command's one error line (exit code 2, no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith("finecap: error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def error_of(argv: list[str]) -> str:
    """The one error line of ``finecap ARGV``, which must fail."""
    code, _, err = run_cli(argv)
    return one_line_error(code, err)


# --------------------------------------------------------------------------------------------------------------------
# Folders without references, end to end
# --------------------------------------------------------------------------------------------------------------------


def test_new_images_get_the_caption_of_what_they_show(run, shapes, tmp_path):
    got = caption(run, shapes["new"], out=tmp_path / "new.json")
    assert got == {f"{color}.png": CAPTION[color] for color in COLORS}
    assert [row["image_id"] for row in json.loads((tmp_path / "new.json").read_text())] == sorted(got)  # file order


def test_a_nested_folder_gets_relative_path_ids(run, shapes, tmp_path):
    photos = tmp_path / "photos"
    expected = {}
    for i, color in enumerate(COLORS):
        rel = f"{'a' if i % 2 else 'b/c'}/photo {i}.PNG"  # nested, a space, an upper-case suffix
        (photos / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shapes["new"] / f"{color}.png", photos / rel)
        expected[rel] = CAPTION[color]
    (photos / "notes.txt").write_text("not an image")  # not an image name: not read
    (photos / ".hidden.png").write_bytes(b"")  # hidden: not read
    assert caption(run, photos, out=tmp_path / "photos.json") == expected


def test_numbered_file_names_give_integer_ids(run, shapes, tmp_path):
    coco = tmp_path / "coco"
    names = {"000000391895.jpg": "red", "COCO_val2014_000000000042.png": "blue", "sub/7.png": "green"}
    for name, color in names.items():
        (coco / name).parent.mkdir(parents=True, exist_ok=True)
        Image.open(shapes["new"] / f"{color}.png").save(coco / name, quality=100)
    assert caption(run, coco, out=tmp_path / "coco.json") == {391895: CAPTION["red"], 42: CAPTION["blue"],
                                                              7: CAPTION["green"]}  # fmt: skip


def test_the_split_and_the_folder_caption_alike(run, shapes, tmp_path):
    # The run's val split (records of the folder data set, captioned through the frozen-feature cache) and the same
    # folder given to --images (its ids are the data set's: relative paths; decoded from pixels) agree.
    out = tmp_path / "val.json"
    assert run_cli(["caption", "--checkpoint", str(run), "--split", "val", "--out", str(out)])[0] == 0
    val = results(out)
    assert 0 < len(val) < 24 and all(c == CAPTION[i.split("/")[0]] for i, c in val.items())
    everything = caption(run, shapes["data"], out=tmp_path / "all.json")
    assert len(everything) == 24 and {i: everything[i] for i in val} == val


def test_files_named_one_by_one_and_overrides_after_them(run, shapes, tmp_path):
    files = [shapes["new"] / "red.png", shapes["new"] / "blue.png"]
    assert caption(run, *files, out=tmp_path / "files.json") == {
        "red.png": CAPTION["red"],
        "blue.png": CAPTION["blue"],
    }
    # --images takes every argument after it: a key=value among them is an override, not an image
    after = caption(run, *files, "decode.max_length=2", out=tmp_path / "after.json")
    before = caption(run, *files, out=tmp_path / "before.json", more=("decode.max_length=2",))
    assert after == before == {"red.png": "a red", "blue.png": "a blue"}


def test_sampled_captions_depend_on_the_seed_and_the_image_only(run, shapes, tmp_path):
    # finecap caption with decode.strategy=sample drew from torch's global generator, unseeded: two runs of one
    # command gave other captions, and a batch size or process count changed them; images now draw from per-image
    # seeds of (run.seed, their place), as RL rollouts do (hot: temperature 5, so that samples vary)
    hot = ("decode.strategy=sample", "decode.temperature=5")

    def sampled(name: str, *more: str) -> dict:
        return caption(run, shapes["data"], out=tmp_path / f"{name}.json", more=(*hot, *more))

    first = sampled("first")
    assert sampled("again") == first  # the same command, the same captions
    assert sampled("batch1", "decode.batch_size=1") == first  # another batch size: the same samples per image
    other = sampled("other", "run.seed=1")
    assert other.keys() == first.keys() and other != first  # another seed, other samples
    assert len(set(first.values())) > len(set(CAPTION.values()))  # not the trained captions alone: they vary
    split = tmp_path / "split.json"
    argv = ["caption", "--checkpoint", str(run), "--split", "val", "--out", str(split), *hot]
    assert run_cli(argv)[0] == 0 and run_cli([*argv[:-3], str(tmp_path / "split2.json"), *hot])[0] == 0
    assert results(split) == results(tmp_path / "split2.json")  # a data set's split too


# --------------------------------------------------------------------------------------------------------------------
# The folders a checkpoint loads from
# --------------------------------------------------------------------------------------------------------------------


def test_run_checkpoint_and_model_folders_caption_alike(run, shapes, tmp_path):
    best = checkpoint_dir(run, "best")
    got = []
    for i, folder in enumerate((run, best, model_dir(best))):
        assert find_checkpoint(folder) == best
        setup = resolve(folder)
        assert setup.config_file == best / "config.yaml" and setup.cfg.decode.max_length == 6  # the run's, not 24
        got.append(caption(folder, shapes["new"], out=tmp_path / f"{i}.json"))
    assert got[0] == got[1] == got[2] == {f"{color}.png": CAPTION[color] for color in COLORS}


def test_the_model_folder_captions_the_runs_split(run, tmp_path):
    # The issue: `--checkpoint RUN/checkpoints/best/model` fell back to the default world, naming a world file that
    # does not exist. It is the checkpoint's model folder: its configuration and data are the run's.
    outs = [tmp_path / "run.json", tmp_path / "model.json"]
    for folder, out in zip((run, model_dir(checkpoint_dir(run, "best"))), outs, strict=True):
        code, _, err = run_cli(["caption", "--checkpoint", str(folder), "--split", "val", "--out", str(out)])
        assert code == 0, err
    assert results(outs[0]) == results(outs[1]) and len(results(outs[0])) > 0


def test_a_bare_model_folder_needs_the_data_named(run, shapes, tmp_path):
    bare = tmp_path / "exported"
    shutil.copytree(model_dir(checkpoint_dir(run, "best")), bare)  # no config.yaml anywhere near it
    out = tmp_path / "bare.json"
    line = error_of(["caption", "--checkpoint", str(bare), "--out", str(out)])
    assert f"{bare}: a model folder with no stored configuration" in line and "--images" in line and "--data" in line
    assert not out.exists()
    # --images needs no data set; decoding follows the folder's generation_config.json: the run's (max_length 6,
    # not the library's 24; issue 49: an export captions like its run)
    assert resolve(bare).cfg.decode.max_length == 6
    assert resolve(bare, overrides=["decode.max_length=9"]).cfg.decode.max_length == 9  # the command line wins
    assert caption(bare, shapes["new"], out=out) == {f"{color}.png": CAPTION[color] for color in COLORS}


def test_other_folders_are_errors_naming_the_folder_to_pass(run, tmp_path):
    best = checkpoint_dir(run, "best")
    runs = tmp_path / "runs"
    (runs / "old").mkdir(parents=True)
    (runs / "mine").symlink_to(run)
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        run / "checkpoints": f"a run's checkpoints folder; pass the run directory {run} or one checkpoint, {best}",
        model_dir(best) / "lm": f"not a checkpoint folder; pass the model folder {model_dir(best)}, which holds it",
        model_dir(best) / "captioner.json": f"not a checkpoint folder; pass the model folder {model_dir(best)}, which "
        "holds it",
        best / "config.yaml": f"not a checkpoint folder; pass the checkpoint folder {best}, which holds it",
        runs: f"not a checkpoint folder, but it holds 1: pass one of {runs / 'mine'}",
        empty: "not a checkpoint folder; pass a run directory (holding checkpoints/best), a checkpoint folder "
        "(holding model/ and config.yaml) or a model folder (holding captioner.json)",
    }
    for given, expected in cases.items():
        with pytest.raises(FileNotFoundError) as e:
            find_checkpoint(given)
        assert str(e.value) == f"{given}: {expected}"
        out = tmp_path / "never.json"
        code, _, err = run_cli(["caption", "--checkpoint", str(given), "--images", str(empty), "--out", str(out)])
        assert one_line_error(code, err) == f"finecap: error: {given}: {expected}" and not out.exists()


# --------------------------------------------------------------------------------------------------------------------
# Image ids
# --------------------------------------------------------------------------------------------------------------------


def _png(path: Path, color: str = "red") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 32), COLORS[color]).save(path)
    return path


def test_the_id_rule(tmp_path):
    coco = tmp_path / "coco"
    for name in ("000000391895.jpg", "COCO_val2014_000000000042.jpg", "sub/7.png"):
        _png(coco / name)
    found = [(f.image_id, f.path.relative_to(coco).as_posix()) for f in image_files([coco])]
    assert found == [(391895, "000000391895.jpg"), (42, "COCO_val2014_000000000042.jpg"), (7, "sub/7.png")]
    mixed = tmp_path / "mixed"
    for name in ("1.png", "cat.png", "b/2.PNG"):
        _png(mixed / name)
    # one name that is no number: every id is the relative path (never a mix of types)
    assert [f.image_id for f in image_files([mixed])] == ["1.png", "b/2.PNG", "cat.png"]
    # a file named on its own: its file name
    assert [f.image_id for f in image_files([mixed / "cat.png", mixed / "b" / "2.PNG"])] == ["cat.png", "2.PNG"]


def test_numbers_shared_by_two_images_give_path_ids(tmp_path):
    classes = tmp_path / "classes"  # a common layout: <class>/<n>.png
    for name in ("red/0.png", "red/1.png", "blue/0.png"):
        _png(classes / name)
    assert [f.image_id for f in image_files([classes])] == ["blue/0.png", "red/0.png", "red/1.png"]
    flat = tmp_path / "flat"
    _png(flat / "1.png")
    _png(flat / "001.jpg")  # one number twice
    assert [f.image_id for f in image_files([flat])] == ["001.jpg", "1.png"]


def test_numbered_names_turned_into_paths_are_named_in_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="finecap")
    coco = tmp_path / "coco"
    for name in ("000123.jpg", "000124.jpg", "cover.jpg"):
        _png(coco / name)
    assert [f.image_id for f in image_files([coco])] == ["000123.jpg", "000124.jpg", "cover.jpg"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "not its number ('000123.jpg', not 123)" in warning and f"are no number ({coco / 'cover.jpg'})" in warning
    caplog.clear()
    flat = tmp_path / "flat"
    for name in ("1.png", "001.jpg", "2.png"):
        _png(flat / name)
    image_files([flat])
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"name several files ({flat / '001.jpg'} and {flat / '1.png'} (both 1))" in warning
    caplog.clear()  # no number at all, or every number once: nothing to say
    image_files([tmp_path / "coco" / "cover.jpg"])
    image_files([tmp_path / "coco" / "000123.jpg", tmp_path / "flat" / "2.png"])
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_two_images_with_one_id_are_an_error_naming_both(run, tmp_path):
    a, b = _png(tmp_path / "a" / "x.png"), _png(tmp_path / "b" / "x.png")
    expected = (f"{a} and {b} both have the image id 'x.png' (the same name relative to the folders named); pass the "
                "folder holding both instead")  # fmt: skip
    out = tmp_path / "out.json"
    for sources in ([tmp_path / "a", tmp_path / "b"], [a, b]):  # two folders, two files
        with pytest.raises(DataError) as e:
            image_files(sources)
        assert str(e.value) == expected
        line = error_of(["caption", "--checkpoint", str(run), "--images", *map(str, sources), "--out", str(out)])
        assert line == f"finecap: error: {expected}" and not out.exists()


def test_an_image_name_that_is_not_utf8_is_refused_naming_it(run, tmp_path):
    # its id was written as "caf\udce9.png", a lone surrogate: no UTF-8 text, and not the file's name in any encoding
    photos = tmp_path / "photos"
    _png(photos / "a.png")
    latin1 = _png(Path(os.fsdecode(bytes(photos) + b"/caf\xe9.png")))
    out = tmp_path / "out.json"
    for source in (photos, latin1):  # in a folder, named as a file
        line = error_of(["caption", "--checkpoint", str(run), "--images", str(source), "--out", str(out)])
        expected = "the file name is not UTF-8 (its image id could not be written as JSON text): rename it"
        assert line == f"finecap: error: {photos}/caf\\xe9.png: {expected}" and not out.exists()


def test_missing_and_empty_sources_are_named(run, tmp_path):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "notes.txt").write_text("x")
    out = tmp_path / "out.json"
    for source, expected in ((tmp_path / "nowhere", "no such image file or folder"),
                             (empty, "no image files in this folder or below it")):  # fmt: skip
        code, _, err = run_cli(["caption", "--checkpoint", str(run), "--images", str(source), "--out", str(out)])
        assert one_line_error(code, err).startswith(f"finecap: error: {source}: {expected}") and not out.exists()


def test_a_link_out_of_the_folder_is_refused_unless_allowed(run, tmp_path):
    photos = tmp_path / "photos"
    _png(photos / "a.png")
    outside = _png(tmp_path / "private" / "b.png", "blue")
    (photos / "b.png").symlink_to(outside)
    out = tmp_path / "out.json"
    code, _, err = run_cli(["caption", "--checkpoint", str(run), "--images", str(photos), "--out", str(out)])
    line = one_line_error(code, err)
    assert "outside the data set's image folder" in line and "data.allow_outside_paths" in line and not out.exists()
    assert run_cli(["caption", "--checkpoint", str(run), "--images", str(photos), "--out", str(out),
                    "data.allow_outside_paths=true"])[0] == 0  # fmt: skip
    assert sorted(results(out)) == ["a.png", "b.png"]


# --------------------------------------------------------------------------------------------------------------------
# Bad images
# --------------------------------------------------------------------------------------------------------------------


def test_bad_images_are_named_or_skipped_and_counted(run, shapes, tmp_path, caplog):
    photos = tmp_path / "photos"
    photos.mkdir()
    good = {"red.png": CAPTION["red"], "blue.png": CAPTION["blue"]}
    for name in good:
        shutil.copy(shapes["new"] / name, photos / name)
    bad = [BROKEN[kind][0](photos / f"{kind}.png") for kind in ("empty", "truncated", "text")]
    out = tmp_path / "out.json"
    line = error_of(["caption", "--checkpoint", str(run), "--images", str(photos), "--out", str(out)])
    assert line.startswith(f"finecap: error: {bad[0]}: not an image: the file is empty") and not out.exists()
    caplog.set_level(logging.WARNING, logger="finecap")
    assert caption(run, photos, out=out, more=("--skip-bad-images",)) == good
    warning = next(r.getMessage() for r in caplog.records if "skipped" in r.getMessage())
    assert warning.startswith("caption: skipped 3 of 5 images: ") and all(str(b) in warning for b in bad)
    # the full list beside --out, named by the warning: past the few the warning shows, every image and its reason
    listed = tmp_path / "out.json.skipped.json"
    assert f"every one, with its reason, in {listed}" in warning
    skipped = json.loads(listed.read_text())
    assert skipped["results"] == str(out) and skipped["images"] == 5
    assert [(row["image_id"], row["path"]) for row in skipped["skipped"]] == [(b.name, str(b)) for b in sorted(bad)]
    assert all(row["reason"].startswith(f"{row['path']}: ") for row in skipped["skipped"])
    # a file of that name finecap did not write is never replaced (refused before the work), but with --force
    listed.write_text("my notes")
    line = error_of(["caption", "--checkpoint", str(run), "--images", str(photos), "--out", str(out),
                     "--skip-bad-images"])  # fmt: skip
    assert line.startswith(f"finecap: error: --out: {listed} exists and finecap did not make it") and "--force" in line
    assert listed.read_text() == "my notes"
    # nothing skipped: no list, and the one an earlier run wrote (finecap's own) is gone, never describing new results
    listed.unlink()
    caption(run, photos, out=out, more=("--skip-bad-images",))
    for b in bad:
        b.unlink()
    assert caption(run, photos, out=out, more=("--skip-bad-images",)) == good and not listed.exists()
    # ... but a file of that name the user made is never removed, skipped images or none
    listed.write_text("my notes")
    line = error_of(["caption", "--checkpoint", str(run), "--images", str(photos), "--out", str(out),
                     "--skip-bad-images"])  # fmt: skip
    assert line.startswith(f"finecap: error: --out: {listed} exists and finecap did not make it")
    assert listed.read_text() == "my notes"
    listed.unlink()
    # every image bad: an error, not an empty results file
    only_bad = tmp_path / "only_bad"
    only_bad.mkdir()
    BROKEN["truncated"][0](only_bad / "1.png")
    line = error_of(["caption", "--checkpoint", str(run), "--images", str(only_bad), "--out",
                     str(tmp_path / "none.json"), "--skip-bad-images"])  # fmt: skip
    assert "none of the 1 images decodes" in line and not (tmp_path / "none.json").exists()


def test_images_the_model_refuses_are_named_or_skipped_and_listed(run, shapes, tmp_path, monkeypatch, caplog):
    """An image that decodes but that the model's preprocessing refuses (ImageRefused: Mistral 3 refuses an image of
    one image token) stopped `caption --skip-bad-images`, which sorted out only the images that do not decode: it is
    now left out, counted and listed with its reason as they are, the rest of its batch captioned; without the
    option it is still the error naming it. The refusal is stood in for on this ClipCap's encoder (a Mistral 3
    captioner is too slow to caption here), in the batch as the VLM's own check raises it."""
    why = refuse_tiny_images(monkeypatch)
    photos = tmp_path / "photos"
    photos.mkdir()
    good = {"blue.png": CAPTION["blue"], "red.png": CAPTION["red"]}
    for name in good:
        shutil.copy(shapes["new"] / name, photos / name)
    refused = [photos / "a_tiny.png", photos / "z_tiny.png"]  # first and last of the batch (file order)
    for path in refused:
        Image.new("RGB", (8, 8), "green").save(path)
    out = tmp_path / "out.json"
    line = error_of(["caption", "--checkpoint", str(run), "--images", str(photos), "--out", str(out)])
    assert line == f"finecap: error: {refused[0]}: {why}" and not out.exists()
    caplog.set_level(logging.WARNING, logger="finecap")
    assert caption(run, photos, out=out, more=("--skip-bad-images",)) == good
    warning = next(r.getMessage() for r in caplog.records if "skipped" in r.getMessage())
    # the warning called them 'images that do not decode', which they do (the model refuses them): now 'images',
    # each reason saying why its image was left out
    assert warning.startswith(f"caption: skipped 2 of 4 images: {refused[0]}: {why}; {refused[1]}: {why} (data.")
    skipped = json.loads((tmp_path / "out.json.skipped.json").read_text())
    assert skipped["results"] == str(out) and skipped["images"] == 4
    assert [(row["image_id"], row["path"], row["reason"]) for row in skipped["skipped"]] == [
        (p.name, str(p), f"{p}: {why}") for p in refused
    ]
    # every image refused: an error, not an empty results file
    for name in good:
        (photos / name).unlink()
    none = tmp_path / "none.json"
    line = error_of(["caption", "--checkpoint", str(run), "--images", str(photos), "--out", str(none),
                     "--skip-bad-images"])  # fmt: skip
    assert "none of the 2 images" in line and f"{refused[0]}: {why}" in line and not none.exists()


def test_a_splits_skipped_images_are_listed_beside_out_as_the_images_ones(run, shapes, tmp_path, caplog):
    # a data set's split (--data, --split) left its bad images out with a warning showing the first five only, and
    # no list: past those five, which images the results lack and why was nowhere
    photos = tmp_path / "photos"
    photos.mkdir()
    good = {f"{color}.png": CAPTION[color] for color in COLORS}
    for name in good:
        shutil.copy(shapes["new"] / name, photos / name)
    bad = sorted(BROKEN[kind][0](photos / f"{kind}{i}.png") for kind in ("empty", "truncated", "text") for i in (1, 2))
    out = tmp_path / "split.json"
    command = ["caption", "--checkpoint", str(run), "--data", str(photos), "--split", "train", "--out", str(out),
               "--skip-bad-images"]  # fmt: skip
    listed = tmp_path / "split.json.skipped.json"
    listed.write_text("my notes")  # a file of that name finecap did not write is refused before the work
    line = error_of(command)
    assert line.startswith(f"finecap: error: --out: {listed} exists and finecap did not make it") and "--force" in line
    assert listed.read_text() == "my notes" and not out.exists()
    listed.unlink()
    caplog.set_level(logging.WARNING, logger="finecap")
    code, _, err = run_cli(command)
    assert code == 0, err
    assert results(out) == good
    [warning] = skip_warnings(caplog)  # one, not the split's read's before it too
    assert warning.startswith("caption: skipped 6 of 10 images of split 'train': ")
    assert warning.endswith(f"; ... (data.skip_bad_images=true); every one, with its reason, in {listed}")
    skipped = json.loads(listed.read_text())  # all six, where the warning shows five
    assert skipped["results"] == str(out) and skipped["images"] == 10
    assert [(row["image_id"], row["path"]) for row in skipped["skipped"]] == [(b.name, str(b)) for b in bad]
    assert all(row["reason"].startswith(f"{row['path']}: ") for row in skipped["skipped"])
    for b in bad:  # nothing skipped now: the list an earlier run wrote is gone
        b.unlink()
    assert run_cli(command)[0] == 0 and results(out) == good and not listed.exists()


def skip_warnings(caplog) -> list[str]:
    """The warnings of a run that name ``data.skip_bad_images`` (those of the images it left out)."""
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "skip_bad_images" in r.getMessage()]  # fmt: skip


def photos_with_refused(shapes, tmp_path):
    """``tmp_path/photos``: the new shapes (``good``: name -> the caption they get), two 8 x 8 images a model
    refusing tiny images refuses (``refused``, paths) and one truncated PNG (``broken``)."""
    photos = tmp_path / "photos"
    photos.mkdir()
    good = {f"{color}.png": CAPTION[color] for color in COLORS}
    for name in good:
        shutil.copy(shapes["new"] / name, photos / name)
    refused = [photos / "a_tiny.png", photos / "z_tiny.png"]
    for path in refused:
        Image.new("RGB", (8, 8), "green").save(path)
    return photos, good, refused, BROKEN["truncated"][0](photos / "truncated.png")


def test_a_splits_images_the_model_refuses_are_skipped_and_listed(run, shapes, tmp_path, monkeypatch, caplog):
    # --data/--split: the images that do not decode were left out up front (load_records), but one the model
    # refuses stopped the run; now it is left out and listed with them, the rest of its batch captioned
    why = refuse_tiny_images(monkeypatch)
    photos, good, refused, broken = photos_with_refused(shapes, tmp_path)
    out = tmp_path / "split.json"
    command = ["caption", "--checkpoint", str(run), "--data", str(photos), "--split", "train", "--out", str(out)]
    assert error_of(command).startswith(f"finecap: error: {broken}: damaged image")  # without the option
    broken.unlink()
    named = [f"image of record {p.name!r} ({p}): {why}" for p in refused]  # as the data set's images are named
    assert error_of(command) == f"finecap: error: {named[0]}" and not out.exists()
    broken = BROKEN["truncated"][0](photos / "truncated.png")
    caplog.set_level(logging.WARNING, logger="finecap")
    code, _, err = run_cli([*command, "--skip-bad-images"])
    assert code == 0, err
    assert results(out) == good
    [warning] = skip_warnings(caplog)  # one for the images left out up front and those refused when preprocessed
    assert warning.startswith(f"caption: skipped 3 of 7 images of split 'train': {broken}: ")
    assert all(f"; {reason}" in warning for reason in named)
    skipped = json.loads((tmp_path / "split.json.skipped.json").read_text())
    assert skipped["results"] == str(out) and skipped["images"] == 7
    listed = [(p.name, str(p)) for p in (broken, *refused)]  # those that do not decode, then those refused
    assert [(row["image_id"], row["path"]) for row in skipped["skipped"]] == listed
    assert [row["reason"] for row in skipped["skipped"]][1:] == named
    # every image that decodes refused: an error, not an empty results file
    for name in good:
        (photos / name).unlink()
    line = error_of([*command, "--skip-bad-images", "--force"])
    assert "none of the 2 images of split 'train' is left to caption" in line and named[0] in line


def test_a_splits_images_a_declaring_encoder_refuses_are_listed(run, shapes, tmp_path, monkeypatch, caplog):
    # an encoder that declares its refusals (refuses_images: Mistral 3's) is asked about every image when the split
    # is read (finecap.data.datasets.refused_images), as training and validation ask it: the refused images are left
    # out there, warned of with those that do not decode, and listed with them in the split's order
    why = refuse_tiny_images(monkeypatch, declared=True)
    photos, good, refused, broken = photos_with_refused(shapes, tmp_path)
    out = tmp_path / "split.json"
    command = ["caption", "--checkpoint", str(run), "--data", str(photos), "--split", "train", "--out", str(out)]
    caplog.set_level(logging.WARNING, logger="finecap")
    code, _, err = run_cli([*command, "--skip-bad-images"])
    assert code == 0, err
    assert results(out) == good
    # the split is read before the model loads (1 does not decode) and with the model (3 left out): one warning,
    # at the end, where it said each read's (two), then the list's (three)
    [warning] = skip_warnings(caplog)
    assert warning.startswith("caption: skipped 3 of 7 images of split 'train': ")
    assert why in warning and f"{broken}: " in warning
    skipped = json.loads((tmp_path / "split.json.skipped.json").read_text())
    assert skipped["images"] == 7
    listed = [(p.name, str(p)) for p in (refused[0], broken, refused[1])]  # the split's order
    assert [(row["image_id"], row["path"]) for row in skipped["skipped"]] == listed
    named = f"image of record {refused[0].name!r} ({refused[0]}): {why}"
    assert skipped["skipped"][0]["reason"] == named


@pytest.mark.slow
def test_worker_processes_read_the_images_alike(run, shapes, tmp_path):
    # data.num_workers=2: images decoded and preprocessed in DataLoader workers; a bad image there is the same error
    expected = {f"{color}.png": CAPTION[color] for color in COLORS}
    assert caption(run, shapes["new"], out=tmp_path / "w.json", more=("data.num_workers=2",)) == expected
    photos = tmp_path / "photos"
    shutil.copytree(shapes["new"], photos)
    BROKEN["truncated"][0](photos / "truncated.png")
    line = error_of(["caption", "--checkpoint", str(run), "--images", str(photos), "--out", str(tmp_path / "x.json"),
                     "data.num_workers=2"])  # fmt: skip
    assert line.startswith(f"finecap: error: {photos / 'truncated.png'}: damaged image")


# --------------------------------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_outputs_never_replace_what_finecap_did_not_make(run, shapes, tmp_path):
    photos = tmp_path / "photos"
    shutil.copytree(shapes["new"], photos)
    argv = ["caption", "--checkpoint", str(run), "--images", str(photos)]
    mine = tmp_path / "mine.json"
    mine.write_text("my notes\n")
    line = error_of([*argv, "--out", str(mine)])
    assert f"--out: {mine} exists and finecap did not make it" in line and "--force" in line
    assert mine.read_text() == "my notes\n"
    assert run_cli([*argv, "--out", str(mine), "--force"])[0] == 0 and len(results(mine)) == 4
    assert run_cli([*argv, "--out", str(mine)])[0] == 0  # finecap's own results now: replaced without --force
    # never an input, with or without --force: an image, a file inside the images folder, the checkpoint
    image = photos / "red.png"
    before = image.read_bytes()
    for out, what in ((image, "is also the command's --images; writing it would destroy the input"),
                      (photos / "captions.json", f"lies inside the command's --images ({photos}), which it reads"),
                      (checkpoint_dir(run, "best") / "c.json", "lies inside the command's --checkpoint")):  # fmt: skip
        for force in ([], ["--force"]):
            images = [str(photos / "blue.png"), str(image)] if out == image else [str(photos)]
            line = error_of(["caption", "--checkpoint", str(run), "--images", *images, "--out", str(out), *force])
            assert what in line
    assert image.read_bytes() == before and not (photos / "captions.json").exists()
    assert not (checkpoint_dir(run, "best") / "c.json").exists()


def test_an_out_that_cannot_be_written_is_refused_before_the_model_loads(run, shapes, tmp_path, monkeypatch):
    # it was refused only when the captions were written, after every image of the folder had been captioned
    def no_loading(*args, **kwargs):
        raise AssertionError("the captioner loaded: the work began before --out was checked")

    monkeypatch.setattr("finecap.app.caption.load_for_captioning", no_loading)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    out = notes / "results" / "out.json"  # a typo through a file
    for argv in (["--images", str(shapes["new"])], ["--split", "val"]):
        line = error_of(["caption", "--checkpoint", str(run), *argv, "--out", str(out)])
        assert line == f"finecap: error: --out: {out}: {notes} is not a folder; choose another --out"
    assert notes.read_text() == "mine\n"


def test_images_exclude_data_and_split(run, shapes, tmp_path):
    for extra in (["--split", "val"], ["--data", str(shapes["data"])]):
        line = error_of(["caption", "--checkpoint", str(run), "--images", str(shapes["new"]), *extra, "--out",
                         str(tmp_path / "x.json")])  # fmt: skip
        assert "--images captions image files, --data and --split a data set's split" in line


def test_main_returns_and_writes_for_library_callers(run, shapes, tmp_path):
    out = main(checkpoint=run, images=[shapes["new"] / "green.png", shapes["new"] / "yellow.png"],
               out=tmp_path / "lib.json")  # fmt: skip
    assert results(out) == {"green.png": CAPTION["green"], "yellow.png": CAPTION["yellow"]}


def test_captions_that_decode_to_no_text_are_written_and_said(run, shapes, tmp_path, monkeypatch):
    """A real VLM can end its caption at once (a tiny Qwen3-VL did): the empty caption is written as it is, and the
    command says how many and which; before, nothing was said."""
    import finecap.app.caption as command

    real = command.caption_images

    def first_decodes_to_nothing(*args, **kwargs):
        result = real(*args, **kwargs)
        result.captions[0] = [""]
        return result

    monkeypatch.setattr(command, "caption_images", first_decodes_to_nothing)
    code, _, err = run_cli(["caption", "--checkpoint", str(run), "--out", str(tmp_path / "out.json"), "--images",
                            str(shapes["new"])])  # fmt: skip
    assert code == 0, err
    got = results(tmp_path / "out.json")
    first = sorted(got)[0]
    assert got[first] == "" and all(got[k] for k in got if k != first)
    assert f"caption: 1 of the captions (of {len(got)}) are empty, e.g. image ids ['{first}'] (they decoded to no " \
           "text)" in err  # fmt: skip


def test_a_best_saved_while_it_is_captioned_never_lends_its_settings_to_the_earlier_weights(tmp_path, monkeypatch):
    # finecap caption of a run still training read the best's config.yaml (its decoding, its load options) and its
    # fingerprints, then loaded the weights under the run's swap guard: a best swapped in between was read with the
    # settings of the save before it (max_length 5 of step 7 on step 9's weights); the checkpoint is now held from its
    # config.yaml to its weights, and the run's swap waits
    import finecap.app.caption as caption
    from finecap.train.checkpoint import load_info
    from helpers.swaps import FIRST, NextSave, clipcap_run, weight_sum

    run_dir, model, save_next = clipcap_run(tmp_path)
    first = weight_sum(model)
    Image.new("RGB", (16, 16), (200, 30, 30)).save(tmp_path / "red.png")
    loaded = []
    real_check, real_load = caption.check_run, caption.load_for_captioning

    def load(checkpoint, cfg, device):
        model = real_load(checkpoint, cfg, device)
        loaded.append((cfg.decode.max_length, weight_sum(model)))
        return model

    with NextSave(save_next) as next_save:  # the run saves its next best once the command has read this configuration
        monkeypatch.setattr(caption, "check_run", next_save.after(real_check))
        monkeypatch.setattr(caption, "load_for_captioning", load)
        main(checkpoint=run_dir, images=[tmp_path / "red.png"], out=tmp_path / "captions.json")
    assert loaded == [(FIRST, first)]  # the configuration and the weights of one save: step 7's
    assert next_save.waited and load_info(checkpoint_dir(run_dir, "best"))["step"] == 9  # the save went through after
    assert list(results(tmp_path / "captions.json")) == ["red.png"]
