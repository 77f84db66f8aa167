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


def train_shapes(run: Path, shapes: dict, out: Path, *settings: str) -> Path:
    """``finecap train`` of two steps at a learning rate too small to change a caption (1e-6) from the shapes
    ``run``'s checkpoint, or from ``train.init_from`` among ``settings``, which must succeed; ``out``."""
    start = (
        [] if any(s.startswith("train.init_from=") for s in settings) else [f"train.init_from={find_checkpoint(run)}"]
    )
    code, _, err = run_cli(["train", "data.format=folder", f"data.path={shapes['data']}", "data.val_fraction=0.25",
                            f"model.encoder={shapes['clip']}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
                            "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
                            f"run.cache_dir={shapes['root'] / 'cache'}", *start, "train.batch_size=16",
                            "train.lr=1e-6", "train.max_steps=2", "train.eval_samples=8", "decode.max_length=6",
                            *settings, "--out", str(out)])  # fmt: skip
    assert code == 0, err
    return out


def validation_captions(out: Path) -> list[str]:
    """The validation captions the training log of the run ``out`` keeps."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [line.split(": ", 1)[1] for r in rows if "captions" in r.get("text", {})
            for line in r["text"]["captions"].splitlines()]  # fmt: skip


@pytest.fixture(scope="module")
def smile_run(run, shapes, tmp_path_factory) -> Path:
    """A SMILE run of two steps from the shapes ``run``'s weights, trained with the shift token ``a`` (its captions'
    first word, so the weights emit it first as a shifted captioner does)."""
    tokenizer = Captioner.from_pretrained(run, device="cpu").model.tokenizer
    a = tokenizer.convert_tokens_to_ids("a")
    out = tmp_path_factory.mktemp("smile") / "shift"
    return train_shapes(run, shapes, out, "train.objective=smile", "smile.first_token=shift",
                        f"smile.shift_token_id={a}")  # fmt: skip


def test_validation_captions_of_a_shifted_run_leave_the_shift_token_out(smile_run):
    # the validation captions the training log keeps are written without the shift token (they read "big blue
    # square" with the shift token "big" before)
    texts = validation_captions(smile_run)
    assert texts and set(texts) <= set(SHIFTED.values()), texts


def test_a_shifted_run_records_its_shift_beside_its_weights(smile_run, run):
    # the fact travels with the weights (captioner.json), not only in the run's configuration
    a = Captioner.from_pretrained(run, device="cpu").model.tokenizer.convert_tokens_to_ids("a")
    meta = json.loads((model_dir(find_checkpoint(smile_run)) / "captioner.json").read_text())
    assert meta["first_token_shift"] == {"form": "token", "token_id": a}
    # a run without shifting records nothing (its captioner.json is as before)
    assert "first_token_shift" not in json.loads((model_dir(find_checkpoint(run)) / "captioner.json").read_text())


@pytest.mark.parametrize("objective", ["reinforce", "sle"])
def test_an_rl_run_from_a_shifted_checkpoint_leaves_the_shift_token_out(smile_run, run, shapes, tmp_path, objective):
    """An RL stage started from a shifted SMILE checkpoint (train.init_from, as the demo's stages chain) samples
    from weights that emit the shift token first: its rollouts, rewards and validation captions read "red circle",
    not "a red circle" (the shift token written as a word), and so do ``finecap caption`` and the API on its own
    checkpoint, whose configuration names only the RL objective."""
    more = ("rl.samples=2",) if objective == "sle" else ()
    out = train_shapes(run, shapes, tmp_path / objective, f"train.objective={objective}",
                       f"train.init_from={find_checkpoint(smile_run)}", *more)  # fmt: skip
    texts = validation_captions(out)
    assert texts and set(texts) <= set(SHIFTED.values()), texts
    got = caption(out, shapes["new"], out=tmp_path / "new.json")
    assert got == {f"{c}.png": SHIFTED[c] for c in COLORS}
    # a run started from that RL checkpoint in turn (its configuration names no SMILE at all) still knows
    again = train_shapes(run, shapes, tmp_path / f"{objective}2", f"train.objective={objective}",
                         f"train.init_from={find_checkpoint(out)}", *more)  # fmt: skip
    assert set(validation_captions(again)) <= set(SHIFTED.values())


def test_an_rl_run_from_a_shifted_checkpoint_recorded_before_2026_11_28_reads_its_configuration(
    shifted, run, shapes, tmp_path
):
    """A shifted checkpoint whose captioner.json records no shift (finecap before 2026-11-28: ``shifted`` is one,
    its configuration saying so) is known by its stored configuration when a run starts from it, and the RL run
    records the shift in its own checkpoints."""
    out = train_shapes(run, shapes, tmp_path / "rl", "train.objective=reinforce",
                       f"train.init_from={find_checkpoint(shifted)}")  # fmt: skip
    assert set(validation_captions(out)) <= set(SHIFTED.values())
    assert "first_token_shift" in json.loads((model_dir(find_checkpoint(out)) / "captioner.json").read_text())


def test_grpo_rollouts_from_a_shifted_checkpoint_are_rewarded_without_the_shift_token(smile_run, run, shapes,
                                                                                      tmp_path):  # fmt: skip
    """The texts an RL objective rewards are its rollouts' (here GRPO's, kept in the checkpoint mid-cycle with
    grpo.iterations=3; sampled at T=0.01, so as the greedy captions): from a shifted checkpoint they read "red
    circle", the shift token "a" left out ("a red circle" before)."""
    out = train_shapes(run, shapes, tmp_path / "grpo", "train.objective=grpo", "grpo.iterations=3",
                       "grpo.policy_loss=clipped", "rl.samples=2", "rl.temperature=0.01",
                       f"train.init_from={find_checkpoint(smile_run)}")  # fmt: skip
    kept = [json.loads(p.read_text()) for p in (out / "checkpoints" / "last").rglob("*.json")]
    texts = [t for tree in kept for t in rollout_texts(tree)]
    assert texts and set(texts) <= set(SHIFTED.values()), texts


def rollout_texts(tree) -> list[str]:
    """Every string under a ``"texts"`` key of a JSON tree (the kept rollouts of a GRPO checkpoint)."""
    if isinstance(tree, dict):
        found = [t for k, v in tree.items() if k == "texts" and isinstance(v, list) for t in v if isinstance(t, str)]
        return found + [t for k, v in tree.items() if k != "texts" for t in rollout_texts(v)]
    if isinstance(tree, list):
        return [t for v in tree for t in rollout_texts(v)]
    return []


def test_a_teacher_forced_run_from_a_shifted_checkpoint_writes_its_first_token(smile_run, run, shapes, tmp_path):
    """MLE (or SMILE without shifting) from a shifted checkpoint trains the first token on the captions as they are
    (here "a red circle", whose "a" is a word again): the shift is not carried on, and the run's captions are written
    as decoded, its checkpoint records no shift."""
    out = train_shapes(run, shapes, tmp_path / "mle", "train.objective=mle",
                       f"train.init_from={find_checkpoint(smile_run)}")  # fmt: skip
    assert set(validation_captions(out)) <= set(CAPTION.values())
    assert "first_token_shift" not in json.loads((model_dir(find_checkpoint(out)) / "captioner.json").read_text())


def test_an_export_of_a_shifted_run_carries_its_shift(smile_run, shapes, tmp_path):
    """``finecap export --merged`` writes the shift into the export's captioner.json: finecap's loaders of the
    exported folder (the API, ``finecap caption``), which has no run configuration, leave the shift token out."""
    out = tmp_path / "export"
    code, _, err = run_cli(["export", str(smile_run), "--merged", str(out)])
    assert code == 0, err
    cap = Captioner.from_pretrained(out, device="cpu")
    try:
        assert cap.caption([shapes["new"] / f"{c}.png" for c in COLORS]) == [SHIFTED[c] for c in COLORS]
    finally:
        cap.close()
    got = caption(out, shapes["new"], out=tmp_path / "new.json")
    assert got == {f"{c}.png": SHIFTED[c] for c in COLORS}
    assert "first_token_shift" in json.loads((out / "captioner.json").read_text())


def test_an_export_of_a_shifted_checkpoint_recorded_before_2026_11_28_carries_its_shift(shifted, shapes, tmp_path):
    """A shifted checkpoint whose captioner.json records no shift (finecap before 2026-11-28: ``shifted``, its
    configuration saying so) is exported with the shift its configuration names: ``finecap caption`` of the source
    leaves the shift token out, so must the export, which has no configuration (it wrote "a red circle")."""
    assert "first_token_shift" not in json.loads((model_dir(find_checkpoint(shifted)) / "captioner.json").read_text())
    out = tmp_path / "export"
    code, _, err = run_cli(["export", str(shifted), "--merged", str(out)])
    assert code == 0, err
    got = caption(out, shapes["new"], out=tmp_path / "new.json")
    assert got == {f"{c}.png": SHIFTED[c] for c in COLORS}


def test_a_malformed_shift_record_is_refused_naming_the_file(smile_run, tmp_path):
    from finecap.runs import CheckpointError

    out = tmp_path / "run"
    shutil.copytree(smile_run, out)
    meta_file = model_dir(find_checkpoint(out)) / "captioner.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "first_token_shift": {"form": "token", "token_id": "a"}}))
    with pytest.raises(CheckpointError, match=r"captioner\.json: first_token_shift is .*'token_id': 'a'"):
        Captioner.from_pretrained(out, device="cpu")


def test_boosts_world_visual_expert_leaves_the_shift_token_out(smile_run, shapes):
    """The world visual expert (boost.vlm_model) loading a shifted checkpoint writes its captions without the
    shift token: its VisualCap captions are what HolisticCap merges."""
    from finecap.boost.world_backend import WorldVLM

    ckpt = find_checkpoint(smile_run)
    expert = WorldVLM(ckpt, load_stored(stored_config(ckpt)))
    pixels = expert.model.encoder.preprocess([Image.open(shapes["new"] / f"{c}.png") for c in COLORS])
    got = expert.model.generate({"pixel_values": pixels}, expert.decode).texts
    assert got == [SHIFTED[c] for c in COLORS]
    assert "first_token_shift" in expert.identity()  # its cached answers are told from an unshifted expert's
