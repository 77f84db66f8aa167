"""Captions of a captioner trained with SMILE's first-token shifting (``smile.first_token=shift``) are written
without its shift token, through every path that decodes a run's captioner.

Such a captioner learns to start every caption with the shift token (the first token of every training caption,
input and label), and finecap wrote it into the caption's text: a shift id that is a word (``"big"``) read ``"big red
circle"``, a sub-word form ``"##a dog"``. The situation is made directly: the tiny ClipCap of tests/helpers/shapes.py
learnt captions that all start with ``a`` (``"a red circle"``), exactly what a shift run with
``smile.shift_token_id`` = the id of ``a`` learns (the shifted captions are the captions), so a copy of the run whose
stored configuration says so must caption ``"red circle"``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from PIL import Image

from finecap.api import Captioner
from finecap.caption import generate_captions
from finecap.config import DecodeConfig, load_stored
from finecap.runs import find_checkpoint, model_dir, stored_config
from helpers.cli import run_cli
from helpers.shapes import CAPTION, COLORS, caption

pytestmark = pytest.mark.slow

SHIFTED = {color: text.removeprefix("a ") for color, text in CAPTION.items()}  # "red circle"


def shifted_copy(run: Path, out: Path) -> Path:
    """A copy of ``run`` whose stored configurations say it trained with SMILE's first-token shifting, the shift
    token the id of ``a`` (what every caption of the run starts with)."""
    shutil.copytree(run, out)
    tokenizer = Captioner.from_pretrained(run, device="cpu").model.tokenizer
    a = tokenizer.convert_tokens_to_ids("a")
    for path in out.rglob("config.yaml"):
        cfg = yaml.safe_load(path.read_text())
        cfg["train"]["objective"] = "smile"
        cfg["smile"].update(first_token="shift", shift_token_id=a, shift_form="token")
        cfg["run"]["dir"] = str(out)
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert model_dir(find_checkpoint(out)).is_dir()
    return out


@pytest.fixture(scope="module")
def shifted(run, tmp_path_factory) -> Path:
    return shifted_copy(run, tmp_path_factory.mktemp("shifted") / "run")


def test_the_unshifted_run_starts_its_captions_with_a(run, shapes, tmp_path):
    # the control: the same weights under their own configuration caption with the "a" the shifted copy leaves out
    assert caption(run, shapes["new"], out=tmp_path / "new.json") == {f"{c}.png": CAPTION[c] for c in COLORS}


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_caption_images_leaves_the_shift_token_out(shifted, shapes, tmp_path, strategy):
    more = ("decode.strategy=beam", "decode.beam_size=3") if strategy == "beam" else ()
    got = caption(shifted, shapes["new"], out=tmp_path / "new.json", more=more)
    assert got == {f"{c}.png": SHIFTED[c] for c in COLORS}


def test_caption_of_a_split_leaves_the_shift_token_out(shifted, tmp_path):
    out = tmp_path / "val.json"
    code, _, err = run_cli(["caption", "--checkpoint", str(shifted), "--split", "val", "--out", str(out)])
    assert code == 0, err
    texts = [row["caption"] for row in json.loads(out.read_text())]
    assert texts and set(texts) <= set(SHIFTED.values()), texts


def test_the_python_api_leaves_the_shift_token_out(shifted, shapes):
    cap = Captioner.from_pretrained(shifted, device="cpu")
    try:
        got = cap.caption([shapes["new"] / f"{c}.png" for c in COLORS])
    finally:
        cap.close()
    assert got == [SHIFTED[c] for c in COLORS]
    # the captioner still decodes the shift token first (its ids are kept): only the text leaves it out
    batch = cap.model.encoder.preprocess([Image.open(shapes["new"] / "red.png")])
    gen = cap.model.generate({"pixel_values": batch}, DecodeConfig(max_length=6))
    assert gen.sequences[0, 0] == cap.model.tokenizer.convert_tokens_to_ids("a")
    assert gen.texts == [SHIFTED["red"]]


def test_the_stages_best_model_leaves_the_shift_token_out(shifted):
    from finecap.stages.outputs import best_model

    ckpt = find_checkpoint(shifted)
    cfg = load_stored(stored_config(ckpt))
    runner = SimpleNamespace(best_checkpoint=lambda stage: ckpt, stage_config=lambda stage: cfg)
    captions = generate_captions(best_model(runner, "smile"), cfg, "val", progress=False)
    assert captions and {c[0] for c in captions.values()} <= set(SHIFTED.values()), captions


def test_validation_captions_of_a_shifted_run_leave_the_shift_token_out(run, shapes, tmp_path):
    # two steps from the run's weights, trained with the shift token "a": the validation captions the training log
    # keeps are written without it (they read "big blue square" with the shift token "big" before)
    tokenizer = Captioner.from_pretrained(run, device="cpu").model.tokenizer
    out, a = tmp_path / "shift", tokenizer.convert_tokens_to_ids("a")
    code, _, err = run_cli(["train", "data.format=folder", f"data.path={shapes['data']}", "data.val_fraction=0.25",
                            f"model.encoder={shapes['clip']}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
                            "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
                            f"run.cache_dir={shapes['root'] / 'cache'}", f"train.init_from={find_checkpoint(run)}",
                            "train.batch_size=16", "train.lr=1e-6", "train.max_steps=2", "train.eval_samples=8",
                            "decode.max_length=6", "train.objective=smile", "smile.first_token=shift",
                            f"smile.shift_token_id={a}", "--out", str(out)])  # fmt: skip
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    texts = [line.split(": ", 1)[1] for r in rows if "captions" in r.get("text", {})
             for line in r["text"]["captions"].splitlines()]  # fmt: skip
    assert texts and set(texts) <= set(SHIFTED.values()), texts
