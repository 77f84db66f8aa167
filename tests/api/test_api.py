"""The Python API (issue 34): ``finecap.Captioner`` on paths and PIL images, sharing ``finecap caption --images``'s
captioning; ``finecap.evaluate`` against the metric suite and pycocoevalcap; ``import finecap`` stays free of torch.
The captioner is the tiny ClipCap of tests/helpers/shapes.py (shared with tests/app/test_caption_images.py), which has
learnt a caption per colour."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import finecap
from finecap import Captioner, evaluate
from finecap.api import usable_device
from finecap.config import ConfigError
from finecap.data.images import load_image
from finecap.data.records import DataError
from finecap.inference import upright_rgb
from finecap.metrics import suite
from finecap.runs import checkpoint_dir, model_dir
from helpers.cli import run_cli
from helpers.shapes import CAPTION, COLORS, caption


@pytest.fixture(scope="module")
def cap(run) -> Captioner:
    return Captioner.from_pretrained(run, device="cpu")


@pytest.fixture(scope="module")
def files(shapes) -> list[Path]:
    return [shapes["new"] / f"{color}.png" for color in COLORS]


EXPECTED = [CAPTION[color] for color in COLORS]


# --------------------------------------------------------------------------------------------------------------------
# Captioner
# --------------------------------------------------------------------------------------------------------------------


def test_paths_and_pil_images_get_their_captions(cap, files):
    assert cap.caption(files) == EXPECTED
    assert cap.caption([Image.open(f) for f in files]) == EXPECTED
    assert cap.caption([str(files[0]), Image.open(files[1])]) == EXPECTED[:2]  # mixed, str paths too
    assert cap.caption(files[2]) == [EXPECTED[2]]  # one image: a list of one
    assert cap.caption(Image.open(files[3])) == [EXPECTED[3]]
    assert cap.caption([]) == []
    assert cap.device == torch.device("cpu") and {p.device.type for p in cap.model.parameters()} == {"cpu"}


def test_the_api_and_the_command_share_their_captions(cap, run, files, tmp_path):
    beam = {"strategy": "beam", "beam_size": 3, "max_length": 3}
    for options, overrides in (({}, ()), (beam, tuple(f"decode.{k}={v}" for k, v in beam.items()))):
        cli = caption(run, *files, out=tmp_path / "cli.json", more=overrides)
        assert cap.caption(files, **options) == [cli[f.name] for f in files]


def test_sampled_captions_with_the_runs_seed_are_the_commands(cap, run, files, tmp_path):
    """``finecap caption`` samples from per-image seeds of ``run.seed``; ``caption(seed=...)`` draws the same, in any
    batch size, and leaves torch's generator alone (there was no way to get the command's samples: the API drew from
    torch's global generator, batch by batch, and a ``seed`` keyword was an unknown decoding option)."""
    sample = {"strategy": "sample", "temperature": 3.0, "max_length": 4}  # hot: the samples differ from seed to seed
    cli = caption(run, *files, out=tmp_path / "cli.json", more=tuple(f"decode.{k}={v}" for k, v in sample.items()))
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    ours = cap.caption(files, seed=cap.cfg.run.seed, **sample)
    assert torch.equal(torch.rand(3), expected)  # the per-image seeds draw nothing from torch's generator
    assert ours == [cli[f.name] for f in files]
    assert cap.caption(files, seed=cap.cfg.run.seed, batch_size=1, **sample) == ours
    assert cap.caption_all(files, seed=cap.cfg.run.seed, **sample) == [[c] for c in ours]
    assert cap.caption(files, seed=cap.cfg.run.seed + 1, **sample) != ours  # the seed decides the samples
    for bad in ("0", 1.5, True):
        with pytest.raises(TypeError, match="seed: expected an integer"):
            cap.caption(files, seed=bad, **sample)


def test_progress_is_a_boolean(cap, files, capsys):
    """``progress="no"`` (truthy) drew a progress bar; now a TypeError naming ``progress``, before any decoding."""
    for bad in ("no", 0, None):
        for method in (cap.caption, cap.caption_all):
            with pytest.raises(TypeError, match=rf"^progress must be True or False, got {bad!r}$"):
                method(files, progress=bad)
    assert cap.caption(files[:1], progress=False) == EXPECTED[:1]


def test_a_with_block_closes_the_captioners_engine(run, files, monkeypatch):
    closed = []
    with Captioner.from_pretrained(run, device="cpu") as captioner:
        assert captioner.caption(files[:1]) == EXPECTED[:1]
        engine = captioner._engine
        monkeypatch.setattr(engine, "close", lambda: closed.append(engine))
    assert closed == [engine] and captioner._engine is None  # the engine freed, the model kept
    assert captioner.caption(files[:1]) == EXPECTED[:1]  # a later call opens one again


def test_the_captioner_drops_its_engine_when_its_close_raises(run, files, monkeypatch):
    # close kept the engine when its close raised (vLLM's shutdown failing half-way): the next caption() reused it
    captioner = Captioner.from_pretrained(run, device="cpu")
    assert captioner.caption(files[:1]) == EXPECTED[:1]
    engine = captioner._engine

    def fails():
        raise RuntimeError("the engine's shutdown failed")

    monkeypatch.setattr(engine, "close", fails)
    with pytest.raises(RuntimeError, match="shutdown failed"):
        captioner.close()
    assert captioner._engine is None
    captioner.close()  # nothing left to close
    assert captioner.caption(files[:1]) == EXPECTED[:1] and captioner._engine is not engine


def test_batches_do_not_change_captions(cap, files):
    # decode.batch_size counts sequences: 1 -> one image per batch; 3 with 3 beams -> one image per batch too
    assert cap.caption(files * 3, batch_size=1) == cap.caption(files * 3) == EXPECTED * 3
    beams = cap.caption(files, strategy="beam", beam_size=3, batch_size=3)
    assert beams == cap.caption(files, strategy="beam", beam_size=3)


def test_greedy_and_beam_captions_leave_the_callers_random_stream_alone(cap, files):
    """A notebook seeds torch, captions, then draws: its draws are those it would have had without the captions (the
    images' DataLoader drew its workers' base seed from torch's global generator, one draw per call)."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    for options in ({}, {"strategy": "beam", "beam_size": 3}):
        torch.manual_seed(0)
        cap.caption(files, **options)
        assert torch.equal(torch.rand(3), expected), options


def test_loading_a_captioner_leaves_the_callers_random_streams_alone(run):
    """A notebook seeds, loads a captioner, then draws: its draws are those it would have had without the load
    (building the ClipCap's modules drew their initial weights from torch's global generator before the checkpoint's
    replaced them: the draws after ``from_pretrained`` were other ones)."""
    import random

    def draws_after(action) -> tuple:
        torch.manual_seed(0)
        np.random.seed(0)
        random.seed(0)
        action()
        return torch.rand(3), np.random.rand(3), random.random()

    expected = draws_after(lambda: None)
    drawn = draws_after(lambda: Captioner.from_pretrained(run, device="cpu"))
    assert torch.equal(drawn[0], expected[0]) and np.array_equal(drawn[1], expected[1]) and drawn[2] == expected[2]


def test_decode_options(cap, files):
    assert cap.caption(files[:2], max_length=2) == ["a red", "a blue"]
    assert cap.cfg.decode.max_length == 6  # the run's setting, not changed by a call
    with pytest.raises(ValueError, match=r"unknown decoding option 'beam' \(did you mean 'beam_size'\?\)"):
        cap.caption(files, beam=3)
    with pytest.raises(ConfigError, match="decode.beam_size"):
        cap.caption(files, strategy="beam", beam_size=0)
    for bad in ("five", 5.7, None):  # checked as a recipe's value (a TypeError deep in decoding, or a torch sampler's)
        with pytest.raises(ConfigError, match=r"decode.max_length: expected an integer"):
            cap.caption(files, max_length=bad)
    for whole in (2.0, "2"):  # a whole number, however written, is the integer (config.loading.INTEGER_RULE)
        assert cap.caption(files[:2], max_length=whole) == ["a red", "a blue"]
    with pytest.raises(ValueError, match="use caption_all"):
        cap.caption(files, strategy="beam", num_return_sequences=2)
    every = cap.caption_all(files, strategy="beam", beam_size=3, num_return_sequences=3)
    assert [len(c) for c in every] == [3] * 4 and all(len(set(c)) == 3 for c in every)
    assert [c[0] for c in every] == cap.caption(files, strategy="beam", beam_size=3)  # best first


def test_a_loading_argument_given_to_caption_says_where_it_belongs(cap, files):
    """``caption(img, device="cpu")`` said only "unknown decoding option 'device'"; ``device`` is where
    ``Captioner.from_pretrained`` loads the model, and the error now says so, still listing the decoding options."""
    belongs = (r"^unknown decoding option 'device' \(device is an argument of Captioner.from_pretrained, which loads "
               r"the model: Captioner.from_pretrained\(path, device=\.\.\.\)\); valid: engine, ")  # fmt: skip
    for call in (cap.caption, cap.caption_all):
        with pytest.raises(ValueError, match=belongs):
            call(files[:1], device="cpu")
    with pytest.raises(ValueError, match=r"^unknown decoding option 'devise'; valid: engine, "):  # no such argument
        cap.caption(files[:1], devise="cpu")


@pytest.mark.parametrize(
    "name, told",
    [("num_beams", "Hugging Face's num_beams is 'beam_size' here; read with decode.strategy=beam"),
     ("max_new_tokens", "Hugging Face's max_new_tokens is 'max_length' here; generated tokens"),
     ("do_sample", "Hugging Face's do_sample=true is 'strategy=sample' here")],
)  # fmt: skip
def test_a_hugging_face_decoding_name_is_told_finecaps_keyword(cap, files, name, told):
    """``caption(img, num_beams=3)`` was told the closest decoding option by spelling, ``finished_beams``, and
    ``max_new_tokens=30`` or ``do_sample=True`` nothing. Now the keyword of finecap meant (config.hf_names), still
    refused: one spelling per option."""
    for call in (cap.caption, cap.caption_all):
        with pytest.raises(ValueError, match=rf"^unknown decoding option '{name}' \({re.escape(told)}"):
            call(files[:1], **{name: 3})


@pytest.mark.parametrize("typo, meant", [("progres", "progress"), ("sed", "seed"), ("Seed", "seed")])
def test_a_misspelt_keyword_of_caption_is_suggested_as_it(cap, files, typo, meant):
    """``caption(img, progres=True)`` said "unknown decoding option 'progres'" and listed only the decoding options:
    ``progress`` and ``seed``, caption's own keywords, were neither suggested nor named. Now the closest of them is
    suggested and the listing names them; nothing is decoded."""
    said = (rf"^unknown decoding option '{typo}' \(did you mean '{meant}'\? an argument of caption\(\) and "
            r"caption_all\(\)\); valid: engine, .*, batch_size \(and caption\(\)'s own progress and "
            r"seed\)$")  # fmt: skip
    for call in (cap.caption, cap.caption_all):
        with pytest.raises(ValueError, match=said):
            call(files[:1], **{typo: 1})


def test_the_runs_autocast_is_used(cap, files):
    # A linear layer of the decoder computes in bfloat16 under the run's train.mixed_precision=bf16 (CPU autocast).
    dtypes = []
    layer = next(m for m in cap.model.modules() if isinstance(m, torch.nn.Linear))
    handle = layer.register_forward_hook(lambda module, args, output: dtypes.append(output.dtype))
    try:
        cap.caption(files[:1])
        train = dataclasses.replace(cap.cfg.train, mixed_precision="bf16")
        bf16 = Captioner(cap.model, dataclasses.replace(cap.cfg, train=train))
        assert bf16.caption(files[:1]) == EXPECTED[:1]
    finally:
        handle.remove()
    assert dtypes and set(dtypes[: len(dtypes) // 2]) == {torch.float32}
    assert set(dtypes[len(dtypes) // 2 :]) == {torch.bfloat16}


def test_a_device_that_cannot_hold_the_weights_is_named(run):
    """``device=`` that torch does not know, the meta device, or an accelerator this machine lacks is a ValueError
    naming it before anything is read (it was torch's AssertionError 'Torch not compiled with CUDA enabled', a
    RuntimeError listing device types, or 'Tensor.item() cannot be called on meta tensors', after the weights)."""
    with pytest.raises(ValueError, match=r"^device='gpu': not a device torch knows"):
        Captioner.from_pretrained(run, device="gpu")
    with pytest.raises(ValueError, match=r"^device='meta': the meta device holds no weights"):
        Captioner.from_pretrained(run, device="meta")
    missing = f"cuda:{torch.cuda.device_count()}"  # one GPU more than this machine has (cuda:0 without a GPU)
    with pytest.raises(ValueError, match=rf"^device='{missing}': not usable on this machine"):
        Captioner.from_pretrained(run, device=missing)
    assert Captioner.from_pretrained(run, device=torch.device("cpu")).device == torch.device("cpu")


def test_an_accelerator_index_or_a_value_of_another_type_is_named(run, monkeypatch):
    """``device=0`` (an accelerator's index) on a machine without one was "not a device torch knows", with torch's
    "Cannot access accelerator device when none is available"; ``device=1.5`` quoted torch's list of overloads."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^device=0: not usable on this machine \(an integer names an accelerator, "
                                         r"and it has no accelerator torch can use\); pass 'cpu'$"):  # fmt: skip
        Captioner.from_pretrained(run, device=0)
    for bad, kind in ((1.5, "float"), (True, "bool"), (None, "NoneType")):
        with pytest.raises(ValueError, match=rf"^device={bad!r}: not a device torch knows \(expected 'cpu', .*got "
                                             rf"{kind}\)$"):  # fmt: skip
            usable_device(bad)


def test_every_checkpoint_folder_loads(run, files, tmp_path, monkeypatch):
    best = checkpoint_dir(run, "best")
    for folder in (run, best, model_dir(best)):
        loaded = Captioner.from_pretrained(folder)
        assert loaded.checkpoint == best and loaded.cfg.decode.max_length == 6
        assert loaded.caption(files) == EXPECTED
    with pytest.raises(FileNotFoundError, match=rf"pass the run directory {run} or one checkpoint, {best}"):
        Captioner.from_pretrained(run / "checkpoints")
    # a run named as `finecap caption --checkpoint` names it: relative, under the runs root (run.root), as
    # finecap.train("demo/mle") writes <home>/runs/demo/mle (from_pretrained("demo/mle") was not found)
    monkeypatch.setattr("finecap.home.runs_root", lambda run_cfg: run.parent)
    monkeypatch.chdir(tmp_path)
    assert Captioner.from_pretrained(run.name).checkpoint == best
    with pytest.raises(FileNotFoundError, match=r"^path no-such-run: checkpoint or run directory not found \(looked"):
        Captioner.from_pretrained("no-such-run")


def test_a_jpeg_file_is_decoded_at_the_runs_draft_size_as_a_split_decodes_it(cap, tmp_path, monkeypatch):
    # Captioner and finecap caption --images decoded JPEG files whole while a split (training, --split, the feature
    # cache) decodes them at data.jpeg_draft's reduced size: the same file reached the encoder as other pixels
    from finecap import inference
    from finecap.data.images import DEFAULT_LIMITS
    from finecap.data.loading import encoder_draft

    path = tmp_path / "big.jpg"
    Image.new("RGB", (960, 720), (200, 30, 30)).save(path, quality=95)
    whole = inference._Images([path], [0], False, DEFAULT_LIMITS)[0]["image"]
    drafted = inference._Images([path], [0], False, DEFAULT_LIMITS, draft=224)[0]["image"]
    assert whole.size == (960, 720) and drafted.size == load_image(path, draft=224).size == (480, 360)
    seen = []
    real = inference.caption_images
    monkeypatch.setattr(inference, "caption_images", lambda *a, **k: seen.append(k["draft"]) or real(*a, **k))
    cap.caption([path])
    assert seen == [encoder_draft(cap.model.encoder, cap.cfg.data)] and seen[0] is not None


def test_pil_images_are_read_as_their_files_are(tmp_path):
    # EXIF orientation and odd modes: upright_rgb(PIL image) gives the pixels load_image gives for its file.
    stored = Image.new("RGB", (4, 2), (30, 30, 200))
    stored.paste(Image.new("RGB", (2, 2), (200, 30, 30)), (0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    stored.save(tmp_path / "rotated.jpg", quality=100, exif=exif)
    palette = Image.new("P", (4, 4), 1)
    palette.putpalette([0, 0, 0, 30, 200, 30] + [0] * 762)
    palette.save(tmp_path / "palette.png", transparency=0)
    Image.new("I;16", (4, 4), 40000).save(tmp_path / "grey16.png")
    Image.new("CMYK", (4, 4), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg", quality=100)
    for name in ("rotated.jpg", "palette.png", "grey16.png", "cmyk.jpg"):
        ours, theirs = upright_rgb(Image.open(tmp_path / name)), load_image(tmp_path / name)
        assert ours.mode == "RGB" and np.array_equal(np.asarray(ours), np.asarray(theirs)), name
    assert upright_rgb(Image.open(tmp_path / "rotated.jpg")).size == (2, 4)  # turned upright


def test_a_bad_file_is_named(cap, files, tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(DataError, match=rf"^{tmp_path / 'empty.png'}: not an image: the file is empty"):
        cap.caption([files[0], tmp_path / "empty.png"])
    with pytest.raises(TypeError, match="expected a PIL image, a path, or a list of them"):
        cap.caption(42)
    # items were not checked: a TypeError deep in pathlib (bytes split into integers, None, a nested list)
    for bad, message in ((bytes(files[0]), "images: expected"), ([files[0], None], r"images\[1\]: expected"),
                         ([[files[0]]], r"images\[0\]: expected a PIL image or a path, got list")):  # fmt: skip
        with pytest.raises(TypeError, match=message):
            cap.caption(bad)
    with pytest.raises(DataError, match=r"empty image \(0 x 5 pixels\)"):  # a crop of nothing: a ZeroDivisionError
        cap.caption(Image.new("RGB", (0, 5)))


def test_an_array_and_an_empty_path_are_refused_with_what_to_pass(cap, files, tmp_path, monkeypatch):
    """A numpy array or a torch tensor (what a notebook holds) is a TypeError that says how to make the PIL image it
    stands for (its scale and channel order are the caller's to say); an empty path ``""``, which reads as the working
    directory (": cannot read image: a folder"), is a ValueError naming its place. Nothing is decoded."""
    monkeypatch.chdir(tmp_path)
    pixels = np.asarray(Image.open(files[0]))
    for bad in (pixels, pixels / 255.0, torch.tensor(pixels).permute(2, 0, 1), [files[0], pixels]):
        with pytest.raises(
            TypeError, match=r"got (ndarray|Tensor); .*: pass PIL.Image.fromarray\(a\) of an H x W x 3"
        ):
            cap.caption(bad)
    for bad, where in (("", "images[0]"), ([files[0], ""], "images[1]")):
        with pytest.raises(ValueError, match=rf"^{re.escape(where)}: an empty path"):
            cap.caption(bad)
    assert cap.caption(Image.fromarray(pixels)) == cap.caption(files[0])  # the hint's image: the file's caption


@pytest.mark.parametrize("how", ["path", "str", "keyword", "device"])
def test_the_constructor_given_a_path_names_from_pretrained(cap, run, how):
    """``Captioner(path)`` (loading with the constructor) was Python's "missing 1 required positional argument:
    'cfg'"; now a TypeError naming ``Captioner.from_pretrained(path)``, with ``device=`` too. The real constructor,
    a loaded model and its Config, wraps them as before, and ``help``/``inspect`` show its arguments."""
    import inspect

    calls = {"path": lambda: Captioner(run), "str": lambda: Captioner(str(run)),
             "keyword": lambda: Captioner(model=run), "device": lambda: Captioner(run, device="cpu")}  # fmt: skip
    with pytest.raises(TypeError) as refused:
        calls[how]()
    assert str(refused.value).startswith(f"Captioner({str(run)!r}): a checkpoint loads with "
                                         f"Captioner.from_pretrained({str(run)!r})")  # fmt: skip
    wrapped = Captioner(cap.model, cap.cfg, cap.checkpoint)
    assert (wrapped.model, wrapped.cfg, wrapped.checkpoint) == (cap.model, cap.cfg, cap.checkpoint)
    assert list(inspect.signature(Captioner).parameters) == ["model", "cfg", "checkpoint"]


def test_a_subclass_with_its_own_constructor_is_not_checked_as_captioner_and_shows_its_own_signature(run):
    """The constructor's path check and the signature shown were Captioner's for every subclass: one whose own
    ``__init__`` takes a path was refused ("a checkpoint loads with Captioner.from_pretrained") and ``inspect`` showed
    ``(model, cfg, checkpoint)``. A subclass keeping Captioner's constructor keeps both."""
    import inspect

    class Mine(Captioner):
        def __init__(self, path, extra=1):
            self.path, self.extra = path, extra

    class Plain(Captioner):
        pass

    assert Mine(run).path == run and str(inspect.signature(Mine)) == "(path, extra=1)"
    with pytest.raises(TypeError, match=r"Captioner.from_pretrained"):
        Plain(run)
    assert list(inspect.signature(Plain).parameters) == ["model", "cfg", "checkpoint"]


def test_a_folder_is_refused_with_the_call_listing_its_images_as_the_command_does(cap, files, tmp_path, monkeypatch):
    """``caption("photos/")`` said "cannot read image: a folder" (after decoding the images before it), though
    ``finecap caption --images photos`` takes a folder. caption() returns one caption per item, in order, which a
    folder does not give: it is a DataError naming its place and the call that lists the folder's images as the
    command does (:func:`finecap.inference.image_files`: sorted, below it, hidden files and other files left out).
    Nothing is decoded; the call it gives captions those images."""
    import shutil

    photos = tmp_path / "photos"
    shutil.copytree(files[0].parent, photos / "shapes")
    (photos / ".hidden.png").write_bytes(files[0].read_bytes())  # left out, as by the command
    (photos / "captions.txt").write_text("not an image\n")
    from finecap import inference

    decoded, load = [], inference.load_image
    monkeypatch.setattr(inference, "load_image", lambda *a, **k: decoded.append(a) or load(*a, **k))
    for bad, where in ((photos, "images[0]"), (f"{photos}/", "images[0]"), ([files[0], str(photos)], "images[1]")):
        with pytest.raises(DataError) as refused:
            cap.caption(bad)
        said = str(refused.value)
        folder = str(bad[1] if isinstance(bad, list) else bad)
        assert said.startswith(f"{where}: {folder} is a folder; caption() takes image files and PIL images")
        assert f"finecap.inference.image_files([{folder!r}])" in said and "captioner.caption(files)" in said
    assert not decoded
    listed = [f.path for f in inference.image_files([str(photos)])]  # the call the message gives
    assert listed == sorted(photos / "shapes" / f.name for f in files)
    by_file = dict(zip(files, EXPECTED, strict=True))
    assert cap.caption(listed) == [by_file[files[0].parent / p.name] for p in listed]


# --------------------------------------------------------------------------------------------------------------------
# evaluate
# --------------------------------------------------------------------------------------------------------------------

PREDS = ["a red circle on the left", "two dogs play in the grass", "a small blue square"]
REFS = [["a red circle on the left side", "a big red circle"], ["two dogs playing on grass", "dogs in a field"],
        ["a blue square", "a small square that is blue", "blue square"]]  # fmt: skip


def test_evaluate_is_the_suites_scores_in_every_accepted_form():
    names = "bleu,rouge,cider,length,vocab"
    by_id = suite.evaluate(dict(enumerate(PREDS)), dict(enumerate(REFS)), metrics=names)
    assert set(by_id) >= {"BLEU-4", "ROUGE-L", "CIDEr-D", "Length"}
    assert evaluate(PREDS, REFS, metrics=names) == by_id
    ids = ["x", 7, "z"]
    assert (
        evaluate(dict(zip(ids, PREDS, strict=True)), dict(zip(ids, REFS, strict=True)), metrics=names.split(","))
        == by_id
    )
    # one reference as a bare string; extra reference ids are ignored
    assert evaluate({1: "a red circle"}, {1: "a red circle", 2: ["other"]}, metrics="bleu") == suite.evaluate(
        {1: "a red circle"}, {1: ["a red circle"]}, metrics="bleu")  # fmt: skip
    # an id as an int on one side and as its string on the other is one image, as `finecap eval` reads it
    as_strings = {str(i): r for i, r in enumerate(REFS)}
    assert evaluate(dict(enumerate(PREDS)), as_strings, metrics=names) == by_id
    assert evaluate({str(i): c for i, c in enumerate(PREDS)}, dict(enumerate(REFS)), metrics=names) == by_id
    with pytest.raises(ValueError, match=r"no references for 1 image\(s\), e.g. \['--1'\]"):  # no int: int() raised
        evaluate({"--1": "a red circle"}, {1: ["a red circle"]}, metrics="bleu")


def test_evaluate_equals_pycocoevalcap_and_a_hand_count():
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider

    # Already lower-case, unpunctuated and space-separated: the PTB tokenizer leaves them as they are.
    gts, res = dict(enumerate(REFS)), {i: [p] for i, p in enumerate(PREDS)}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocoevalcap's Bleu prints
        bleu, _ = Bleu(4).compute_score(gts, res)
    cider, _ = Cider().compute_score(gts, res)
    ours = evaluate(PREDS, REFS, metrics="bleu,cider")
    assert np.allclose([ours[f"BLEU-{k}"] for k in range(1, 5)], bleu, rtol=0, atol=1e-9)
    assert abs(ours["CIDEr-D"] - cider) <= 1e-9
    # By hand: "a red square" against "a red circle": 2 of 3 unigrams match, same length (brevity penalty 1).
    assert abs(evaluate(["a red square"], [["a red circle"]], metrics="bleu")["BLEU-1"] - 2 / 3) <= 1e-6


def test_evaluate_defaults(monkeypatch):
    from finecap.api import default_metrics
    from finecap.metrics import meteor, spice

    available = {
        "meteor": meteor.meteor_unavailable_reason() is None,
        "spice": spice.spice_unavailable_reason() is None,
    }
    assert default_metrics(True) == [m for m in suite.CAPTION_METRICS if available.get(m, True)]
    assert default_metrics(False) == ["length", "vocab"]
    # Where Java's metrics cannot run, the default leaves them out (no warning, no METEOR / SPICE key); running
    # METEOR itself is tested in tests/metrics (tens of seconds of Java here).
    monkeypatch.setattr(meteor, "meteor_unavailable_reason", lambda *a, **k: "no Java")
    monkeypatch.setattr(spice, "spice_unavailable_reason", lambda *a, **k: "no Java")
    assert default_metrics(True) == ["bleu", "rouge", "cider"]
    assert evaluate(PREDS, REFS) == suite.evaluate(dict(enumerate(PREDS)), dict(enumerate(REFS)),
                                                   metrics="bleu,rouge,cider")  # fmt: skip
    assert evaluate(PREDS) == suite.evaluate(dict(enumerate(PREDS)), None, metrics="length,vocab")


def test_evaluate_defaults_follow_the_configured_meteor_backend(monkeypatch):
    """The default set asks the same question as ``finecap eval`` (:func:`finecap.metrics.suite.unavailable_reason`):
    with ``eval.meteor_backend=java`` and no Java, METEOR is left out; the Python backend needs no Java."""
    from finecap.api import default_metrics
    from finecap.config import load
    from finecap.metrics import meteor

    monkeypatch.setattr(meteor, "java_unavailable_reason", lambda *a, **k: "no Java")
    assert "meteor" not in default_metrics(True, load(None, ["eval.meteor_backend=java"]))
    python = meteor.meteor_unavailable_reason() is None  # pycocoevalcap's data installed
    assert ("meteor" in default_metrics(True, load(None, ["eval.meteor_backend=python"]))) is python


def test_evaluate_computes_the_configured_metrics_as_finecap_eval_does(tmp_path):
    """A recipe's ``eval.metrics`` are what ``finecap eval RECIPE`` computes; ``evaluate(cfg=...)`` computed the
    default five instead (BLEU, METEOR, ROUGE-L, CIDEr-D for ``eval.metrics: [bleu, cider]``). ``metrics=`` wins."""
    from finecap.config import load

    (tmp_path / "recipe.yaml").write_text("eval:\n  metrics: [bleu, cider]\n")
    cfg = load(str(tmp_path / "recipe.yaml"))
    (tmp_path / "preds.json").write_text(json.dumps([{"image_id": i, "caption": c} for i, c in enumerate(PREDS)]))
    (tmp_path / "refs.jsonl").write_text("".join(json.dumps({"image_id": i, "image": f"{i}.png", "captions": r}) + "\n"
                                                 for i, r in enumerate(REFS)))  # fmt: skip
    code, out, err = run_cli(["eval", str(tmp_path / "recipe.yaml"), "--predictions", str(tmp_path / "preds.json"),
                              "--references", str(tmp_path / "refs.jsonl"), "--format", "json"])  # fmt: skip
    assert code == 0, err
    assert evaluate(PREDS, REFS, cfg=cfg) == json.loads(out)
    assert set(json.loads(out)) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "CIDEr-D"}
    assert set(evaluate(PREDS, REFS, cfg=cfg, metrics="rouge")) == {"ROUGE-L"}


def test_a_metric_asked_for_by_name_that_cannot_run_here_is_an_error_as_in_finecap_eval(monkeypatch, tmp_path):
    """``finecap eval --metrics spice`` without SPICE's jars exits 2 naming what is missing; ``evaluate(metrics=
    ["spice"])`` returned ``{}`` with a warning (the suite skips such a group), so a notebook asking for SPICE got no
    key and went on. The default set still leaves METEOR and SPICE out where they cannot run."""
    from finecap.config import load
    from finecap.metrics import spice

    monkeypatch.setattr(spice, "spice_unavailable_reason", lambda *a, **k: "no Java (a stand-in)")
    (tmp_path / "preds.json").write_text(json.dumps([{"image_id": i, "caption": c} for i, c in enumerate(PREDS)]))
    (tmp_path / "refs.jsonl").write_text("".join(json.dumps({"image_id": i, "image": f"{i}.png", "captions": r}) + "\n"
                                                 for i, r in enumerate(REFS)))  # fmt: skip
    code, _, err = run_cli(["eval", "--predictions", str(tmp_path / "preds.json"), "--references",
                            str(tmp_path / "refs.jsonl"), "--metrics", "bleu,spice", "--format", "json"])  # fmt: skip
    assert code == 2 and "metric 'spice' cannot run here: no Java (a stand-in)" in err, err
    with pytest.raises(ValueError, match=r"^metrics: metric 'spice' cannot run here: no Java \(a stand-in\)$"):
        evaluate(PREDS, REFS, metrics="bleu,spice")
    (tmp_path / "recipe.yaml").write_text("eval:\n  metrics: [spice]\n")
    with pytest.raises(ValueError, match=r"^eval.metrics: metric 'spice' cannot run here"):
        evaluate(PREDS, REFS, cfg=load(str(tmp_path / "recipe.yaml")))
    assert "SPICE" not in evaluate(PREDS, REFS, metrics="bleu") and "BLEU-4" in evaluate(PREDS, REFS)


def test_evaluate_refuses_what_it_does_not_accept():
    with pytest.raises(ValueError, match="references: 2 items for 3 predictions"):
        evaluate(PREDS, REFS[:2], metrics="bleu")
    with pytest.raises(TypeError, match="references: give a list"):
        evaluate(PREDS, dict(enumerate(REFS)), metrics="bleu")
    with pytest.raises(TypeError, match="predictions: expected a list of captions"):
        evaluate("a red circle", REFS, metrics="bleu")
    with pytest.raises(TypeError, match=r"one caption \(str\) per image; image 0 has a list"):
        evaluate([["a", "b"]], [["a"]], metrics="bleu")
    with pytest.raises(ValueError, match=r"no references for 1 image"):
        evaluate({1: "a", 2: "b"}, {1: ["a"], 2: []}, metrics="bleu")
    with pytest.raises(ValueError, match="unknown metric"):
        evaluate(PREDS, REFS, metrics="bleu,cidr")
    # a reference list's items were not checked: TypeErrors inside the tokenizer or a comprehension
    for refs, message in (([None, *REFS[1:]], "references of image 0: expected a list of captions .* got NoneType"),
                          ([[1, 2], *REFS[1:]], "references of image 0: .* got list holding a int"),
                          ((r for r in REFS), "references: expected a list or a dict, got generator")):  # fmt: skip
        with pytest.raises(TypeError, match=message):
            evaluate(PREDS, refs, metrics="bleu")


def test_evaluate_refuses_a_cfg_that_is_no_config():
    """``cfg`` is a :class:`finecap.config.Config`: a recipe's name or a dict of sections (what a notebook passes
    first) is a TypeError naming ``cfg`` and how to read a recipe; it was "'str' object has no attribute 'eval'"."""
    for cfg in ("demo/mle", {"eval": {"metrics": ["bleu"]}}):
        with pytest.raises(TypeError, match=rf"^cfg: expected a finecap.config.Config .*, got {type(cfg).__name__}$"):
            evaluate(PREDS, REFS, metrics="bleu", cfg=cfg)


def test_evaluate_refuses_two_predictions_for_one_image():
    """An int id and its string name one image: predictions for both (``{1: ..., "1": ...}``, in either order) are a
    ValueError naming the two ids; it was "metric 'bleu': no references for 1 image(s), e.g. ['1']" while the
    references held image 1. One spelling on each side still names one image."""
    for preds in ({1: "a red circle", "1": "a blue square"}, {"1": "a blue square", 1: "a red circle"}):
        with pytest.raises(ValueError, match=r"^predictions: 1 image\(s\) keyed twice, e\.g\. (1 and '1'|'1' and 1) "):
            evaluate(preds, {1: ["a red circle"], 2: ["a blue square"]}, metrics="bleu")
    one = evaluate({"1": "a red circle", 2: "a blue square"}, {1: ["a red circle"], "2": ["a blue square"]},
                   metrics="bleu")  # fmt: skip
    assert one == evaluate(["a red circle", "a blue square"], [["a red circle"], ["a blue square"]], metrics="bleu")


def test_evaluate_aligns_ids_mixed_on_each_side_and_refuses_references_keyed_twice():
    """finecap.evaluate's alignment was checked with one type of id on each side. Ids mixed within each mapping score
    as ids of one type; a zero-padded id is not the integer's image (it was: "007" took image 7's references); and
    references keyed by 1 and "1" were scored as two images, their rows two that a JSON file writes under one key
    "1": now refused, as the data readers refuse such a data set."""
    names = "bleu,rouge,cider,length"
    want = evaluate(PREDS, REFS, metrics=names)
    preds, refs = {0: PREDS[0], "1": PREDS[1], 2: PREDS[2]}, {"0": REFS[0], 1: REFS[1], "2": REFS[2]}
    assert evaluate(preds, refs, metrics=names) == want
    with pytest.raises(ValueError, match=r"no references for 1 image\(s\), e\.g\. \['007'\]"):
        evaluate({"007": PREDS[0]}, {7: REFS[0]}, metrics="bleu")
    for preds in ({1: "a red circle", "1": "two dogs"}, {1: "a red circle"}, {"1": "two dogs"}):
        with pytest.raises(ValueError, match=r"^references: 1 image\(s\) keyed twice, e\.g\. 1 and '1' \(an int id"):
            evaluate(preds, {1: ["a red circle"], "1": ["two dogs"], 2: ["a cat"]}, metrics="bleu")


# --------------------------------------------------------------------------------------------------------------------
# Import cost
# --------------------------------------------------------------------------------------------------------------------


def test_import_finecap_and_evaluate_import_no_torch():
    code = (
        "import sys, json, finecap\n"
        "state = {'import': 'torch' in sys.modules}\n"
        "from finecap import evaluate\n"
        "evaluate(['a red circle'], [['a red circle']], metrics='bleu,cider')\n"
        "state['evaluate'] = 'torch' in sys.modules or 'transformers' in sys.modules\n"
        "finecap.Captioner\n"
        "state['Captioner'] = 'torch' in sys.modules\n"
        "print(json.dumps(state))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"import": False, "evaluate": False, "Captioner": False}
    assert {"Captioner", "evaluate"} <= set(dir(finecap)) and finecap.Captioner is Captioner
    with pytest.raises(AttributeError, match="has no attribute 'Captoner'"):
        finecap.Captoner  # noqa: B018


# --------------------------------------------------------------------------------------------------------------------
# finecap.train
# --------------------------------------------------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs"


def docs_train_example() -> str:
    """The Python block under ``<!-- finecap.train example -->`` in docs/training.md."""
    text = (DOCS / "training.md").read_text()
    after = text.split("<!-- finecap.train example -->", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_finecap_train_runs_the_documented_example(tmp_path, monkeypatch, capsys):
    """The notebook cell of docs/training.md, run as written in an empty folder with an empty finecap home: it trains
    two steps, returns the run directory (``run.dir``), resumes it for two more with its own settings (the first
    call's keywords) and the new ``train.max_steps``, and the captioner it saved captions an image."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "home"))
    scope: dict = {}
    exec(compile(docs_train_example(), "docs/training.md", "exec"), scope)
    run_dir = scope["run_dir"]
    assert run_dir.resolve() == (tmp_path / "notebook" / "run").resolve()  # run.dir as given (here relative)
    saved = (run_dir / "config.yaml").read_text()
    assert "max_steps: 4" in saved and "n_train: 40" in saved  # the stored settings, the resume's keyword on top
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in events if e["split"] == "train"]
    assert steps == sorted(steps) and 2 in steps and steps[-1] == 4  # the first call's step 2 kept, then 3 and 4
    printed = capsys.readouterr().out
    assert str(run_dir) in printed and "[" in printed  # the caption list printed beside the run directory


def test_finecap_train_is_the_callable_training_package():
    """``finecap.train`` is the API function and the package of the training library at once: calling it calls
    :func:`finecap.api.train`, its modules import and resolve by attribute as before."""
    import finecap.train.engine as engine

    assert callable(finecap.train) and finecap.train.engine is engine
    assert "train" in finecap.__all__ and "train" in dir(finecap)


def test_help_on_finecap_train_gives_the_functions_contract():
    """What a notebook asks of ``finecap.train`` (``help``, ``finecap.train?``, ``inspect.signature``) is the API
    function's signature and docstring, then the package's: they gave the package alone (its modules, no keyword,
    no example) and a signature ``(recipe_or_config, /, **kwargs)`` without ``resume`` and ``overwrite``."""
    import inspect
    import pydoc

    from finecap import api

    assert inspect.signature(finecap.train) == inspect.signature(api.train)
    text = pydoc.render_doc(finecap.train, renderer=pydoc.plaintext)
    assert "overwrite: 'bool' = False" in text and "train__max_steps=2" in text and "Example" in text
    assert "library pieces of training" in text  # the package's own docstring follows


def test_finecap_train_sets_a_subsections_key_as_the_command_line_does(monkeypatch):
    """``data__hf__caption_column`` is ``data.hf.caption_column=...`` (it was refused as an unknown key
    ``data.hf.caption_column``); a subsection given as a table takes more keys, the caller's table unchanged."""
    seen = []
    monkeypatch.setattr("finecap.train.run.train", lambda cfg, **kwargs: seen.append(cfg))
    finecap.train("demo/mle", data__hf__caption_column="sentences", data__hf__id_column="cocoid", train__max_steps=2)
    hf = {"image_column": "img", "caption_column": "sentences"}
    finecap.train("demo/mle", data__hf=hf, data__hf__caption_column="text")
    finecap.train("demo/mle", data__hf__caption_column="text", data__hf=hf)  # the order of keywords is no matter
    assert (seen[0].data.hf.caption_column, seen[0].data.hf.id_column, seen[0].train.max_steps) == (
        "sentences", "cocoid", 2)  # fmt: skip
    assert (seen[1].data.hf.image_column, seen[1].data.hf.caption_column) == ("img", "text")
    assert (seen[2].data.hf.image_column, seen[2].data.hf.caption_column) == ("img", "text")
    assert hf == {"image_column": "img", "caption_column": "sentences"}
    for keywords in (
        {"train__max_steps": 2, "train__max_steps__x": 1},
        {"train__max_steps__x": 1, "train__max_steps": 2},
    ):
        with pytest.raises(TypeError, match="sets a key inside 'max_steps'"):
            finecap.train("demo/mle", **keywords)


def test_finecap_train_takes_a_path_as_its_text(monkeypatch, tmp_path):
    """``run__dir=tmp_path / "run"`` (what a notebook holds: ``save_tiny_clip`` returns a ``Path``) is ``run.dir`` set
    to that path's text, as on the command line; it was a ConfigError "run.dir: expected a string, got PosixPath"."""
    seen = []
    monkeypatch.setattr("finecap.train.run.train", lambda cfg, **kwargs: seen.append(cfg))
    finecap.train("demo/mle", run__dir=tmp_path / "run", model__encoder=tmp_path / "clip", train__max_steps=2)
    assert (seen[0].run.dir, seen[0].model.encoder) == (str(tmp_path / "run"), str(tmp_path / "clip"))
    with pytest.raises(ConfigError, match="finecap.train keywords: train.max_steps: expected an integer"):
        finecap.train("demo/mle", train__max_steps=tmp_path)  # a path where no text goes is still refused


def test_finecap_train_refuses_a_keyword_that_is_no_option(tmp_path):
    """A keyword that is not ``section__key`` is a TypeError naming the form; an unknown key is the configuration's
    own error (as on the command line), before anything is made."""
    with pytest.raises(TypeError, match="section__key=value"):
        finecap.train("demo/mle", max_steps=2)
    with pytest.raises(ConfigError, match="max_stepz"):
        finecap.train("demo/mle", train__max_stepz=2, run__dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError):
        finecap.train("no-such-recipe")
    # a bad keyword value is the keyword's, not the packaged recipe's (".../recipes/demo/mle.yaml: train.max_steps")
    with pytest.raises(ConfigError, match=r"^finecap.train keywords: train.max_steps: expected an integer, got 'two'"):
        finecap.train("demo/mle", train__max_steps="two", run__dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "keyword, meant",
    [("overwrte", "'overwrite'"), ("Resume", "'resume'"), ("max_steps", "'train__max_steps'"),
     ("train_max_steps", "'train__max_steps'"), ("lr", "'retriever__lr' or 'train__lr'"),
     ("preset", "'retriever__preset'")],
)  # fmt: skip
def test_a_keyword_that_is_no_option_names_the_one_meant(monkeypatch, keyword, meant):
    """A misspelt ``overwrite`` (or ``resume``) was told "an option is written section__key=value", as if it were an
    option, and a key without its section (or joined by one underscore) was not told which option it names. Now
    the error suggests the options of that name, else the keyword of finecap.train meant, else the closest option,
    and names finecap.train's own keywords; nothing trains. An option's own name close to a keyword (``preset``,
    ``resume``) was told the keyword, not the option it names."""
    seen = []
    monkeypatch.setattr("finecap.train.run.train", lambda cfg, **kwargs: seen.append(cfg))
    said = (rf"^finecap.train: unexpected keyword '{keyword}' \(did you mean {meant}\?\); its own keywords are resume "
            r"and overwrite, and an option is written section__key=value ")  # fmt: skip
    with pytest.raises(TypeError, match=said):
        finecap.train("demo/mle", **{keyword: True})
    assert not seen


@pytest.mark.parametrize(
    "call, said",
    [
        (lambda tmp: evaluate(["a red circle"], [["a red circle"]], metric="bleu"),
         "finecap.evaluate: unexpected keyword 'metric' (did you mean 'metrics'?); its keywords are predictions, "
         "references, metrics and cfg"),
        (lambda tmp: evaluate(["a red circle"], reference=[["a red circle"]]),
         "finecap.evaluate: unexpected keyword 'reference' (did you mean 'references'?); its keywords are "
         "predictions, references, metrics and cfg"),
        # the folder does not exist: the keyword is refused before anything is read (no FileNotFoundError)
        (lambda tmp: Captioner.from_pretrained(tmp / "no-run", devce="cpu"),
         "Captioner.from_pretrained: unexpected keyword 'devce' (did you mean 'device'?); its keywords are path and "
         "device"),
        (lambda tmp: Captioner(None, None, chekpoint=tmp),
         "Captioner: unexpected keyword 'chekpoint' (did you mean 'checkpoint'?); its keywords are model, cfg and "
         "checkpoint"),
    ],
)  # fmt: skip
def test_a_misspelt_keyword_of_evaluate_or_the_loader_names_the_one_meant(tmp_path, call, said):
    """``finecap.evaluate(..., metric="bleu")`` and ``Captioner.from_pretrained(path, devce="cpu")`` were Python's
    own "evaluate() got an unexpected keyword argument 'metric'", which suggests nothing, where finecap.train and
    caption() name the keyword meant. Now the same words (finecap.api.unknown_keyword), before the call runs."""
    with pytest.raises(TypeError) as refused:
        call(tmp_path)
    assert str(refused.value) == said


@pytest.mark.parametrize(
    "keyword, told",
    [("max_length", "(max_length is a decoding option of caption() and caption_all(), not of loading: "
                    "captioner.caption(images, max_length=...))"),
     ("strategy", "(strategy is a decoding option of caption() and caption_all(), not of loading: "
                  "captioner.caption(images, strategy=...))"),
     ("seed", "(seed is an argument of caption() and caption_all(), not of loading: captioner.caption(images, "
              "seed=...))"),
     ("num_beams", "(Hugging Face's num_beams is 'beam_size' here; read with decode.strategy=beam; transformers' rule "
                   "of finished beams is decode.finished_beams=set_aside; a decoding option of caption() and "
                   "caption_all(), not of loading: captioner.caption(images, beam_size=...))"),
     ("do_sample", "a decoding option of caption() and caption_all(), not of loading: "
                   "captioner.caption(images, strategy='sample'))")],
)  # fmt: skip
def test_a_decoding_keyword_given_to_the_loader_names_caption(tmp_path, keyword, told):
    """``Captioner.from_pretrained(path, max_length=5)`` was told only "unexpected keyword 'max_length'; its keywords
    are path and device": nothing said that decoding settings are caption()'s (the checkpoint's ``decode`` section is
    the default, each call replaces some). Now the call that takes it, with finecap's name for a Hugging Face one;
    refused before anything is read (the folder does not exist)."""
    with pytest.raises(TypeError) as refused:
        Captioner.from_pretrained(tmp_path / "no-run", **{keyword: 5})
    said = str(refused.value)
    assert said.startswith(f"Captioner.from_pretrained: unexpected keyword {keyword!r} (")
    assert said.endswith(f"{told}; its keywords are path and device")


@pytest.mark.parametrize(
    "typo, meant, what",
    [("max_lenght", "max_length", "a decoding option"), ("beamsize", "beam_size", "a decoding option"),
     ("sed", "seed", "an argument")],
)  # fmt: skip
def test_a_misspelt_decoding_keyword_given_to_the_loader_is_suggested_as_captions(tmp_path, typo, meant, what):
    """``Captioner.from_pretrained(path, max_lenght=5)`` was told no suggestion ("unexpected keyword 'max_lenght'; its
    keywords are path and device": only the loader's own keywords were matched). Now the decoding option (or
    caption()'s argument) it is close to, with the call that takes it; a name close to the loader's own keyword is
    still suggested as it (``devce``: ``device``, tested above)."""
    with pytest.raises(TypeError) as refused:
        Captioner.from_pretrained(tmp_path / "no-run", **{typo: 5})
    said = (
        f"Captioner.from_pretrained: unexpected keyword {typo!r} (did you mean {meant}, {what} of caption() and "
        f"caption_all(), not of loading? captioner.caption(images, {meant}=...)); its keywords are path and device"
    )
    assert str(refused.value) == said


def test_the_checked_entries_keep_their_signatures():
    # help() and inspect show the entries' own keywords, not the check's (*args, **kwargs)
    import inspect

    assert list(inspect.signature(evaluate).parameters) == ["predictions", "references", "metrics", "cfg"]
    assert list(inspect.signature(Captioner.from_pretrained).parameters) == ["path", "device"]
    assert list(inspect.signature(Captioner).parameters) == ["model", "cfg", "checkpoint"]


@pytest.mark.parametrize(
    "keyword, told",
    [("learning_rate", "Hugging Face's learning_rate is 'train__lr' here)"),
     ("gradient_accumulation_steps", "Hugging Face's gradient_accumulation_steps is 'train__grad_accum_steps' here)"),
     ("num_generations", "TRL's num_generations is 'rl__samples' here)")],
)  # fmt: skip
def test_a_hugging_face_training_keyword_is_told_finecaps_option(monkeypatch, keyword, told):
    """``finecap.train(recipe, learning_rate=1e-4)`` was told no option (nothing is close by spelling to
    ``learning_rate`` or ``num_generations``; ``gradient_accumulation_steps`` was told ``train__grad_accum_steps``
    only by chance of spelling). Now the option meant, written as a keyword (config.hf_names); nothing trains."""
    seen = []
    monkeypatch.setattr("finecap.train.run.train", lambda cfg, **kwargs: seen.append(cfg))
    with pytest.raises(TypeError, match=rf"^finecap.train: unexpected keyword '{keyword}' \({re.escape(told)}; its "):
        finecap.train("demo/mle", **{keyword: 1})
    assert not seen


@pytest.mark.parametrize("more", [({"train__max_steps": 2},), (["train.max_steps=2"],), ("train.max_steps=2", "x")])
def test_overrides_given_beside_the_recipe_say_they_are_keywords(monkeypatch, more):
    """A dict of overrides (or the command line's ``key=value`` list) passed beside the recipe was Python's
    "_TrainPackage.__call__() takes 2 positional arguments but 3 were given": a class the user never wrote, counting
    its ``self``. Now a TypeError saying the overrides are keywords and how to pass a dict of them; nothing trains."""
    seen = []
    monkeypatch.setattr("finecap.train.run.train", lambda cfg, **kwargs: seen.append(cfg))
    with pytest.raises(TypeError) as refused:
        finecap.train("demo/mle", *more)
    said = str(refused.value)
    assert said.startswith(f"finecap.train takes one positional argument, the recipe or a Config, got {len(more)} ")
    assert "_TrainPackage" not in said and "finecap.train(recipe, **overrides)" in said and not seen
    finecap.train("demo/mle", **{"train__max_steps": 2})  # what the message says to write
    assert seen[0].train.max_steps == 2


@pytest.mark.parametrize("train", [{"best_metric": "cider_d"}, {"validators": ["captoins"]}, {"objective": "mel"}])
def test_a_config_is_checked_as_a_recipe_is_with_or_without_keywords(monkeypatch, tmp_path, train):
    """A ``Config`` built in Python (``dataclasses.replace`` of a loaded one) is checked as a recipe is, keywords or
    not: a ``train.best_metric`` no validator gives, an unknown validator or objective is the ConfigError a keyword
    gets, before training starts. Without keywords it went to training unchecked: a wrong best_metric failed there
    after the world was made and the run's config.yaml written (a second try needed overwrite=True)."""
    from finecap.config import load

    seen = []
    monkeypatch.setattr("finecap.train.run.train", lambda cfg, **kwargs: seen.append(cfg))
    cfg = load("demo/mle", overrides=[f"run.dir={tmp_path / 'run'}"])
    bad = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))
    ((key, _),) = train.items()
    for keywords in ({}, {"train__max_steps": 2}):
        with pytest.raises(ConfigError, match=rf"^train.{key}: "):
            finecap.train(bad, **keywords)
    assert not seen
    finecap.train(cfg)  # a good one trains as it is
    assert seen == [cfg]


def test_an_empty_recipe_or_checkpoint_is_refused_not_read_as_the_working_directory(run, monkeypatch, tmp_path):
    """``""`` is ``Path(".")`` to pathlib: ``finecap.train("")`` said ".: is a directory", with ``resume=True`` it
    resumed the run in the working directory, and ``Captioner.from_pretrained("")`` loaded the checkpoint there. Each
    is now a ValueError saying the path is empty and what to name, before anything is read; ``"."`` still names the
    working directory."""
    import shutil

    seen = []
    monkeypatch.setattr("finecap.train.run.train", lambda cfg, **kwargs: seen.append(kwargs))
    monkeypatch.chdir(shutil.copytree(run, tmp_path / "run"))  # a finished run: its config.yaml and checkpoints
    for resume in (False, True):
        with pytest.raises(ValueError, match=r'^finecap.train: an empty path \(""\); name a recipe \(a YAML file or a '
                                             r"packaged recipe's name, \"demo/mle\"\) or, with resume=True, a run "
                                             r'directory \("\." is the working directory\)$'):  # fmt: skip
            finecap.train("", resume=resume)
    loading = r'^Captioner.from_pretrained: an empty path \(""\); name a run directory, a checkpoint folder or a '
    with pytest.raises(ValueError, match=loading + r'model folder \("\." is the working directory\)$'):
        Captioner.from_pretrained("", device="cpu")
    assert not seen
    finecap.train(".", resume=True)  # the folder, named
    assert seen == [{"resume": True, "overwrite": False, "recipe": None}]
    assert Captioner.from_pretrained(".", device="cpu").checkpoint.resolve().is_relative_to(tmp_path / "run")


@pytest.fixture
def callers_state():
    """This process's accelerate ``PartialState`` emptied for the test (a notebook that has made none yet) and given
    back afterwards (other tests made it)."""
    from accelerate.state import PartialState

    theirs = dict(PartialState._shared_state)
    PartialState._reset_state()
    try:
        yield PartialState
    finally:
        PartialState._shared_state.clear()
        PartialState._shared_state.update(theirs)


def test_a_callers_accelerate_state_on_another_device_than_train_cpu_is_refused(tmp_path, monkeypatch, callers_state):
    """accelerate holds one device per process and finecap.train keeps a caller's state: ``train__cpu=True`` after
    the notebook's ``Accelerator()`` on a GPU trained on the GPU (and ``train__cpu=False`` after ``PartialState(
    cpu=True)`` on the CPU), silently. Now a ValueError naming both devices and the train.cpu that agrees, before
    anything is made; a state on the device asked for, or none, trains. A GPU machine is stood for by torch's
    accelerator answers and the caller's state's device (on a CPU machine no GPU state can be made)."""
    seen = []
    monkeypatch.setattr("finecap.train.run.train", lambda cfg, **kwargs: seen.append(cfg))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    run_dir = tmp_path / "run"
    finecap.train("demo/mle", run__dir=run_dir, train__cpu=True)  # no state of the caller's: its own device
    callers_state(cpu=True)  # the notebook's, on the CPU
    with pytest.raises(ValueError) as refused:
        finecap.train("demo/mle", run__dir=run_dir)  # train.cpu=false: this machine's GPU
    said = str(refused.value)
    assert said.startswith("train.cpu=false asks for cuda, but this process's accelerate state (a PartialState or "
                           "Accelerator made before finecap.train) is on cpu")  # fmt: skip
    assert "the run would train on cpu. Set train__cpu=True to train there" in said
    finecap.train("demo/mle", run__dir=run_dir, train__cpu=True)  # what it says: agrees
    callers_state._shared_state["device"] = torch.device("cuda", 0)  # the notebook's Accelerator() on the GPU
    with pytest.raises(ValueError, match=r"^train.cpu=true asks for cpu, but .* is on cuda:0, .*the run would train "
                                         r"on cuda:0. Set train__cpu=False to train there"):  # fmt: skip
        finecap.train("demo/mle", run__dir=run_dir, train__cpu=True)
    finecap.train("demo/mle", run__dir=run_dir)
    assert [cfg.train.cpu for cfg in seen] == [True, True, False] and not run_dir.exists()


@pytest.mark.parametrize("flags", [{"overwrite": "no"}, {"resume": "yes"}, {"overwrite": 0}, {"resume": None}])
def test_finecap_train_takes_its_flags_as_booleans_only(tmp_path, monkeypatch, flags):
    """``resume`` and ``overwrite`` are ``True`` or ``False``: ``overwrite="no"`` (truthy) replaced the finished run it
    was meant to keep, ``resume="yes"`` resumed; now a TypeError naming the flag, before anything is read or made."""
    seen = []
    monkeypatch.setattr("finecap.train.run.train", lambda cfg, **kwargs: seen.append(kwargs))
    ((name, value),) = flags.items()
    with pytest.raises(TypeError, match=rf"^finecap.train: {name} must be True or False, got {value!r}$"):
        finecap.train("demo/mle", run__dir=str(tmp_path / "run"), **flags)
    assert not seen and not (tmp_path / "run").exists()
    finecap.train("demo/mle", run__dir=str(tmp_path / "run"), overwrite=True, resume=False)  # booleans: as before
    assert seen == [{"resume": False, "overwrite": True, "recipe": seen[0]["recipe"]}]


def test_a_notebooks_second_run_says_what_a_fresh_process_would(shapes, tmp_path, caplog):
    """Two ``finecap.train`` calls in one process on the same data say the same notes: the images
    ``data.skip_bad_images`` left out and how the unsplit data was split. They were said once per process, so the
    second run said nothing of the bad image (only its last line still counted it)."""
    from helpers.image_files import corrupt_png

    data = tmp_path / "data"
    shutil.copytree(shapes["data"], data)
    corrupt_png(data / "red" / "broken.png")
    (data / "red" / "broken.txt").write_text(CAPTION["red"] + "\n")
    keywords = dict(data__format="folder", data__path=data, data__val_fraction=0.25, data__skip_bad_images=True,
                    model__encoder=shapes["clip"], clipcap__tiny_layers=1, clipcap__tiny_hidden=32,
                    clipcap__tiny_heads=2, clipcap__prefix_length=2, run__cache_dir=tmp_path / "cache",
                    train__batch_size=8, train__max_steps=1, train__eval_samples=4, decode__max_length=3)  # fmt: skip
    notes = []
    for run in ("first", "second"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="finecap"):
            finecap.train("demo/mle", run__dir=tmp_path / run, **keywords)
        notes.append([r.getMessage() for r in caplog.records if r.getMessage().startswith("data: ")])
    assert any(n.startswith("data: skipped 1 of ") and "broken.png" in n for n in notes[0])
    assert any("name no split" in n for n in notes[0])
    assert notes[1] == notes[0]


def test_each_call_warns_of_a_deprecated_key_it_is_given(tmp_path, caplog):
    """A deprecated secret key is warned about in every ``finecap.train`` call given it, as in every command (it was
    once per process: a notebook's second call said nothing)."""
    (tmp_path / "notes.txt").write_text("mine")
    for _ in range(2):
        with pytest.raises(ValueError, match="^run.dir: "):  # refused after the configuration is read
            finecap.train("demo/mle", boost__llm_api_key="sk-0123", run__dir=tmp_path / "notes.txt")
    said = [r.getMessage() for r in caplog.records if "boost.llm_api_key is deprecated" in r.getMessage()]
    assert len(said) == 2


@pytest.mark.parametrize("where", ["notes.txt", "notes.txt/run"])
def test_a_run_dir_naming_a_file_is_the_options_error(tmp_path, where):
    """``run__dir`` naming a file the user has (or a path through one) is an ``OutputRefused`` naming ``run.dir``
    and the file, before anything is read; it was mkdir's bare ``[Errno 17] File exists: ...`` (or ``[Errno 20] Not
    a directory``) from deep inside training. The file is left as it was."""
    from finecap.utils.files import OutputRefused

    (tmp_path / "notes.txt").write_text("mine")
    refused = rf"^run.dir: .*: {re.escape(str(tmp_path / 'notes.txt'))} is not a folder; choose another run.dir$"
    with pytest.raises(OutputRefused, match=refused):
        finecap.train("demo/mle", run__dir=tmp_path / where, model__encoder=str(tmp_path / "no-clip"))
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]  # nothing made beside it


@pytest.mark.parametrize("url", ["https://example.com/cat.jpg", Path("http://example.com/cat.jpg"), "s3://b/cat.png"])
def test_a_url_is_refused_as_one(cap, url, tmp_path, monkeypatch):
    """finecap downloads no image: a URL given to ``caption`` (as a string, or as a ``Path``, which keeps one slash)
    is a DataError that says it is a URL and to download the image first; it said only ``cannot read image: no such
    file``, as for a typo in a file name; ``finecap caption --images URL`` says it too. A missing file's error says
    nothing of URLs, nor does a drive letter's."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"cannot read image: no such file; it is a URL: .* downloads none: download"):
        cap.caption(url)
    for missing in ("nope.png", "C:/nope.png"):
        with pytest.raises(DataError, match=r"cannot read image: no such file$"):
            cap.caption(missing)
    from finecap.inference import image_files  # finecap caption --images URL: the same note

    with pytest.raises(DataError, match=r"^https://example.com/cat.jpg: no such image file or folder; it is a URL"):
        image_files(["https://example.com/cat.jpg"])


def test_a_pil_image_that_cannot_be_read_is_named(cap, files, tmp_path):
    """A PIL image whose pixels cannot be read is a DataError naming its place in the list and why: one closed before
    its pixels were read (the ``with Image.open(path) as image:`` block left: PIL's bare, empty ``AssertionError``
    from inside the data loader; ``image.close()``: PIL's ``ValueError``), a lazily opened file that does not decode
    (PIL's ``OSError``). A floating-point image is named by its place too (it was "the image"). One read inside its
    block, then closed, is captioned as its file."""
    with Image.open(files[0]) as unread:
        pass
    closed = Image.open(files[0])
    closed.close()
    data = files[0].read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    cut = Image.open(tmp_path / "cut.png")  # the header reads; the pixels do not
    flat = Image.fromarray(np.full((32, 32), 0.5, dtype=np.float32))
    shut, broken = "the image is closed", "the image does not decode"
    for bad, why in ((unread, shut), (closed, shut), (cut, broken), (flat, "floating-point image")):
        with pytest.raises(DataError, match=rf"^image 1 of the list \(a PIL image\): {why}"):
            cap.caption([files[1], bad], max_length=3)
    with Image.open(files[0]) as read:
        read.load()
    assert cap.caption(read, max_length=3) == cap.caption(files[0], max_length=3)


def test_a_missing_encoder_folder_is_refused_before_the_world_is_made(tmp_path, monkeypatch):
    """``model__encoder`` naming a folder that is not there (an absolute path, or ``./...``) is a ConfigError naming
    ``model.encoder`` before anything is made; it was transformers' "Repo id must be in the form 'repo_name' or
    'namespace/repo_name'" once the demo's world (11,500 images by default: minutes) and its features were made."""
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for missing in (tmp_path / "no-clip", "./no-clip"):
        with pytest.raises(ConfigError, match=rf"^model.encoder: {re.escape(str(missing))}: no such folder"):
            finecap.train("demo/mle", model__encoder=missing, world__n_train=8, world__n_val=4, world__n_test=4,
                          world__image_size=32, train__max_steps=1, run__dir=tmp_path / "run")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no world, no home, no run folder


def test_a_best_saved_while_it_loads_never_lends_its_settings_to_the_earlier_weights(tmp_path, monkeypatch):
    # Captioner.from_pretrained of a run still training read the best's config.yaml and fingerprints, then loaded
    # the weights under the run's swap guard: a best swapped in between gave the captioner step 7's configuration
    # (max_length 5) and step 9's weights; the checkpoint is now held from its config.yaml to its weights
    import finecap.train.fingerprint as fingerprint
    from finecap.train.checkpoint import load_info
    from helpers.swaps import FIRST, NextSave, clipcap_run, weight_sum

    run_dir, model, save_next = clipcap_run(tmp_path)
    first = weight_sum(model)
    with NextSave(save_next) as next_save:  # the run saves its next best once the captioner's configuration is read
        monkeypatch.setattr(fingerprint, "check_run", next_save.after(fingerprint.check_run))
        cap = Captioner.from_pretrained(run_dir, device="cpu")
    assert (cap.cfg.decode.max_length, weight_sum(cap.model)) == (FIRST, first)  # one save's: step 7's
    assert next_save.waited and load_info(checkpoint_dir(run_dir, "best"))["step"] == 9  # the save went through after
