"""``finecap export RUN --merged OUT`` and the model card every checkpoint carries (``model/README.md``)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import yaml

from finecap.app.cli import main
from finecap.app.export import export_card
from finecap.config import ClipCapBackboneConfig, load
from finecap.models import lora
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm, save_tiny_clip
from finecap.models.vision import VisionEncoder
from finecap.train.checkpoint import save_checkpoint

INFO = {"step": 7, "epoch": 1, "total_steps": 10, "metric": "cider", "values": {"cider": 0.5, "bleu4": 0.25}}
FINGERPRINTS = {"data": {"id": "abc123def456", "sha256": "f" * 64}}


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run directory whose best checkpoint is a ClipCap with random (non-zero) LoRA adapters on its LM, saved by
    the checkpoint writer from a command line holding a secret override."""
    monkeypatch.setattr(sys, "argv", ["finecap", "train", "coco/x.yaml", "boost.llm_api_key=sk-very-secret"])
    clip = save_tiny_clip(tmp_path / "clip", image_size=16, patch_size=8)
    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2)
    encoder = VisionEncoder.from_pretrained(clip)
    model = ClipCap(lm, tok, encoder.feature_dim, ClipCapBackboneConfig(prefix_length=2), encoder=encoder)
    cfg = load(None, ["lora.rank=4", "lora.alpha=8", "lora.lm=true", "run.name=card-test", "train.objective=sle"])
    lora.configure_training(model, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    run_dir = tmp_path / "run"
    save_checkpoint(run_dir / "checkpoints" / "best", model=model, cfg=cfg, info=INFO, fingerprints=FINGERPRINTS)
    return run_dir, model.eval()


def features(model: ClipCap) -> dict:
    g = torch.Generator().manual_seed(3)
    return {"features": torch.randn(2, model.feature_dim, generator=g),
            "input_ids": torch.tensor([[5, 6, 2], [7, 2, 0]]),
            "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}  # fmt: skip


def test_every_checkpoint_has_a_model_card_from_what_the_run_recorded(run):
    run_dir, _ = run
    card = (run_dir / "checkpoints" / "best" / "model" / "README.md").read_text()
    # ClipCap's folder (lm/, the mapper) is no transformers model at its top: no library_name for the Hub's snippet
    assert card.startswith("---\npipeline_tag: image-to-text\n") and "library_name" not in card
    for expected in ("# SLE captioner on clipcap", "**Run**: `card-test`", "**Objective**: `sle`", "`abc123def456`",
                     "step 7 of 10",
                     "| cider | 0.5000 |", "| bleu4 | 0.2500 |", "LoRA adapters on lm", "coco/x.yaml",
                     # lm/ alone is the untrained language model: the card says where the adapter is
                     "`lm/` holds the base weights of the language model and `lm_lora/` its LoRA"):  # fmt: skip
        assert expected in card, expected
    assert "sk-very-secret" not in card and "boost.llm_api_key=***" in card  # no secret ever reaches a file


class _Bare:
    tokenizer = None  # what save_checkpoint reads of a captioner besides save (no weights are needed here)

    def save(self, out, state_dict=None):
        out.mkdir(parents=True)


@pytest.mark.parametrize("old_form", [False, True])
def test_the_export_card_shows_a_non_finite_validation_value_as_the_checkpoint_recorded_it(tmp_path, old_form):
    # the card of a merged export is made from the checkpoint's trainer_state.json: written strictly, a value that is
    # no number is null there with its kind under "nonfinite", which the card must read back (inf, not None);
    # one written before with bare tokens still reads
    best = tmp_path / "run" / "checkpoints" / "best"
    info = {**INFO, "values": {"cider": 0.5, "loss": float("inf"), "spice": float("nan")}}
    save_checkpoint(best, model=_Bare(), cfg=load(), info=info)
    if old_form:
        (best / "trainer_state.json").write_text(json.dumps(info))
    card = export_card(best, best / "model", {}, "")
    for expected in ("| cider | 0.5000 |", "| loss | inf |", "| spice | nan |"):
        assert expected in card, expected


@pytest.mark.parametrize(("kind", "keys"), [("clipcap", {"pipeline_tag": "image-to-text"}),
                                           ("vlm", {"library_name": "transformers",
                                                    "pipeline_tag": "image-text-to-text"})])  # fmt: skip
def test_the_export_of_a_bare_folder_gives_its_older_card_the_hub_keys_of_its_backbone(tmp_path, kind, keys):
    """A source with no run configuration keeps its card; one finecap wrote before said ``library_name: peft``
    (with a whole-model adapter) or ``transformers`` and ``pipeline_tag: image-to-text`` whatever the backbone."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "README.md").write_text('---\nlibrary_name: peft\nbase_model: ["a/b"]\npipeline_tag: image-to-text\n'
                                     'tags: ["finecap"]\n---\n\n# MLE captioner on a/b\n')  # fmt: skip
    card = export_card(tmp_path, model, {"kind": kind}, "lm")
    head, body = card.removeprefix("---\n").split("\n---\n", 1)
    assert yaml.safe_load(head) == {**keys, "base_model": ["a/b"], "tags": ["finecap"]}
    assert body.startswith("\n# MLE captioner on a/b\n") and "A merged export of" in body


def test_export_merged_writes_a_plain_checkpoint_with_the_same_outputs(run, tmp_path, capsys):
    run_dir, model = run
    out = tmp_path / "exported"
    assert main(["export", str(run_dir), "--merged", str(out)]) == 0
    meta = json.loads((out / "captioner.json").read_text())
    assert meta["lora"] == {} and not (out / "lm_lora").exists()
    again = ClipCap.from_checkpoint(out).eval()
    assert not lora.has_adapters(again)
    with torch.no_grad():
        assert torch.allclose(again(features(again)), model(features(model)), atol=1e-5)
    card = (out / "README.md").read_text()
    assert "a merged export of" in card and "folded into the base weights: lm" in card
    assert "merged adapters: lm" in capsys.readouterr().err  # a status line: the finecap logger


def test_export_never_writes_over_what_it_did_not_make(run, tmp_path, capsys):
    run_dir, _ = run
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    assert main(["export", str(run_dir), "--merged", str(foreign)]) == 2
    assert "finecap did not write" in capsys.readouterr().err and (foreign / "notes.txt").read_text() == "keep"
    inside = run_dir / "checkpoints" / "best" / "model" / "merged"
    assert main(["export", str(run_dir), "--merged", str(inside)]) == 2
    assert "new folder" in capsys.readouterr().err and not inside.exists()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["export", str(run_dir), "--merged", str(a_file)]) == 2 and a_file.read_text() == "x"
    assert main(["export", str(run_dir)]) == 2
    assert "--merged" in capsys.readouterr().err
    # the folder OUT is first written to is never deleted when it is already there (it may be the user's)
    staging = tmp_path / ".new.tmp"
    staging.mkdir()
    (staging / "notes.txt").write_text("keep")
    assert main(["export", str(run_dir), "--merged", str(tmp_path / "new")]) == 2
    assert "unfinished export" in capsys.readouterr().err and (staging / "notes.txt").read_text() == "keep"
    assert not (tmp_path / "new").exists()


def test_an_out_that_names_no_folder_of_its_own_is_refused_before_anything_is_written(run, tmp_path, capsys,
                                                                                    monkeypatch):  # fmt: skip
    """OUT ``.`` failed with Python's "PosixPath('.') has an empty name"; ``sub/..`` made ``sub`` (where the export
    was first written, ``sub/...tmp``) and left it behind when the swap into ``..`` was refused."""
    run_dir, _ = run
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    for out in (".", "sub/..", ".."):
        assert main(["export", str(run_dir), "--merged", out]) == 2
        assert "names none" in capsys.readouterr().err, out
    assert not any(empty.iterdir())


def test_a_run_named_as_caption_checkpoint_names_it_is_found_under_the_runs_root(run, tmp_path, capsys, monkeypatch):
    """``finecap export demo/mle`` looked in the working directory alone, where ``caption --checkpoint demo/mle``
    also looks under the runs root of the finecap home (one function resolves both: checkpoint_where)."""
    run_dir, _ = run
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    run_dir.rename(home / "runs" / "mine")
    monkeypatch.setenv("FINECAP_HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["export", "mine", "--merged", "exported"]) == 0, capsys.readouterr().err
    assert (work / "exported" / "captioner.json").is_file()
    assert f"{home / 'runs' / 'mine'}" in capsys.readouterr().err  # the status line names the run it found
    assert main(["export", "nosuch", "--merged", "other"]) == 2
    assert (
        f"RUN nosuch: checkpoint or run directory not found (looked in the working directory and in {home / 'runs'})"
        in capsys.readouterr().err
    )
    assert sorted(p.name for p in work.iterdir()) == ["exported"]


def test_a_best_saved_while_it_is_exported_never_lends_the_export_its_card(run, tmp_path, monkeypatch):
    # finecap export of a run still training: the export read the weights of one best and then, unguarded, the
    # trainer_state.json, config and fingerprints of the next one swapped in meanwhile, so its card gave another
    # step's validation values than its weights were; the swap now waits for the export's reads
    import logging
    import threading

    import finecap.app.export as export

    run_dir, model = run
    best = run_dir / "checkpoints" / "best"
    cfg = load(None, ["lora.rank=4", "lora.alpha=8", "lora.lm=true", "run.name=card-test", "train.objective=sle"])
    said = threading.Event()  # the saver waited for the export, or it finished

    class Waiting(logging.Handler):
        def emit(self, record):
            if "waiting for another process to finish loading" in record.getMessage():
                said.set()

    def save_next_best():
        try:
            save_checkpoint(best, model=model, cfg=cfg, info={**INFO, "step": 9, "values": {"cider": 0.875}})
        finally:
            said.set()

    saver = threading.Thread(target=save_next_best)
    real = export.export_merged

    def merged_while_training_saves(*args, **kwargs):
        out = real(*args, **kwargs)
        saver.start()  # the run saves its next best after the export has read the weights
        assert said.wait(60)
        return out

    monkeypatch.setattr(export, "export_merged", merged_while_training_saves)
    runs_log = logging.getLogger("finecap.runs")
    handler, level = Waiting(), runs_log.level
    runs_log.addHandler(handler)
    runs_log.setLevel(logging.INFO)
    try:
        assert main(["export", str(run_dir), "--merged", str(tmp_path / "exported")]) == 0
    finally:
        saver.join(60)
        runs_log.removeHandler(handler)
        runs_log.setLevel(level)
    card = (tmp_path / "exported" / "README.md").read_text()
    assert "step 7 of 10" in card and "| cider | 0.5000 |" in card, card  # the step whose weights it holds
    assert "step 9" not in card and "0.8750" not in card
    assert json.loads((best / "trainer_state.json").read_text())["step"] == 9  # the run's save went through after


def test_an_earlier_export_is_replaced_only_with_force(run, tmp_path, capsys):
    run_dir, _ = run
    out = tmp_path / "exported"
    assert main(["export", str(run_dir), "--merged", str(out)]) == 0
    assert main(["export", str(run_dir), "--merged", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--merged", str(out), "--force"]) == 0
    assert (out / "captioner.json").is_file() and not (tmp_path / ".exported.tmp").exists()


def test_a_bfloat16_clipcaps_export_computes_as_the_run(tiny, tmp_path):
    """A bare folder loads in the dtype its captioner.json records for its frozen weights: a ClipCap's frozen encoder
    is loaded from its source (float32), which the folder's own files do not say; under model.dtype=auto the export's
    features differed from the run's. The export holds no float32 master weights (they serve a resume)."""
    from finecap import Captioner
    from finecap.models import memory
    from helpers.cli import run_cli

    run, export = tmp_path / "run16", tmp_path / "exp16"
    assert run_cli(["train", *tiny["base"], "model.dtype=bfloat16", "--out", str(run)])[0] == 0
    assert run_cli(["export", str(run), "--merged", str(export)])[0] == 0
    assert not (export / memory.MASTERS).parent.exists()
    ours, theirs = Captioner.from_pretrained(run, device="cpu"), Captioner.from_pretrained(export, device="cpu")
    assert memory.part_dtypes(theirs.model)["encoder"] == memory.part_dtypes(ours.model)["encoder"] == {
        "frozen": "bfloat16"}  # fmt: skip
    images = sorted((tiny["root"] / "world" / "images").rglob("*.png"))[:4]
    assert theirs.caption(images) == ours.caption(images)
    again = tmp_path / "again"  # an export of the export (no run configuration): the dtype its folder records
    assert run_cli(["export", str(export), "--merged", str(again)])[0] == 0
    assert set(memory.part_dtypes(Captioner.from_pretrained(again, device="cpu").model)["lm"].values()) == {"bfloat16"}


def test_an_export_whose_frozen_encoder_moved_captions_with_model_encoder(run, tmp_path, capsys):
    """The export refers to the CLIP folder it was trained with by its absolute path: on another machine (or after a
    move) model.encoder names where it is now, and without it the error says so; an encoder still where the
    checkpoint says is always the one read."""
    from PIL import Image

    run_dir, _ = run
    out = tmp_path / "exported"
    assert main(["export", str(run_dir), "--merged", str(out)]) == 0
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(2):
        Image.new("RGB", (16, 16), (40 * i, 90, 200)).save(photos / f"p{i}.png")
    before = main(["caption", "--checkpoint", str(out), "--images", str(photos), "--out", str(tmp_path / "a.json")])
    assert before == 0
    (tmp_path / "clip").rename(tmp_path / "clip-moved")
    capsys.readouterr()
    args = ["caption", "--checkpoint", str(out), "--images", str(photos), "--out", str(tmp_path / "b.json")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"the frozen encoder it refers to, {tmp_path / 'clip'}, is not there" in err
    assert "finecap caption takes where it is now as model.encoder=PATH" in err
    assert main([*args, f"model.encoder={tmp_path / 'clip-moved'}"]) == 0
    assert json.loads((tmp_path / "b.json").read_text()) == json.loads((tmp_path / "a.json").read_text())


def _resave(model, tmp_path, *overrides: str, info: dict = INFO):
    """The run fixture's captioner saved as the best checkpoint of another run with ``overrides``."""
    cfg = load(None, ["lora.rank=4", "lora.alpha=8", "lora.lm=true", "run.name=card-test", *overrides])
    run_dir = tmp_path / "other"
    save_checkpoint(run_dir / "checkpoints" / "best", model=model, cfg=cfg, info=info, fingerprints=FINGERPRINTS)
    return run_dir


@pytest.mark.parametrize(
    ("device", "autocast"),
    [
        ("cpu", None),
        ("cuda", "float16"),
        (None, "float16 if it ran on a GPU (its trainer_state.json records no device)"),
    ],
)
def test_an_fp16_runs_export_warns_of_an_autocast_only_where_the_run_had_one(run, tmp_path, capsys, device, autocast):
    # fp16 autocasts on a GPU only (finecap.caption.autocast_dtype, as accelerate): the export of a run on the CPU
    # warned that "the run captioned under train.mixed_precision=fp16 (an autocast)", which it never did
    info = {**INFO, **({"device": device} if device else {})}
    run_dir = _resave(run[1], tmp_path, "train.mixed_precision=fp16", info=info)
    capsys.readouterr()
    assert main(["export", str(run_dir), "--merged", str(tmp_path / "export")]) == 0
    err = capsys.readouterr().err
    card = (tmp_path / "export" / "README.md").read_text()
    if autocast is None:
        assert "autocast" not in err and "autocast" not in card, err
    else:
        assert f"train.mixed_precision=fp16 (an autocast to {autocast})" in err, err
        assert f"the run computed under an autocast to {autocast} (train.mixed_precision)" in card


@pytest.mark.parametrize(
    ("overrides", "otherwise"),
    [
        ([], None),
        (
            ["train.mixed_precision=bf16"],
            "the run computed under an autocast to bfloat16 (train.mixed_precision), this export without it",
        ),
        (["model.dtype=bfloat16"], "its LoRA adapters are merged into bfloat16 weights, rounded to that dtype"),
    ],
)
def test_the_export_card_says_its_validation_values_are_the_runs(run, tmp_path, overrides, otherwise):
    # the export's card showed the source's validation table (computed by the run, adapters unmerged, under its
    # autocast) as the export's own, also where the export computes otherwise: a lost autocast, a 16-bit merge
    run_dir = _resave(run[1], tmp_path, *overrides, info={**INFO, "device": "cpu"})
    assert main(["export", str(run_dir), "--merged", str(tmp_path / "export")]) == 0
    card = (tmp_path / "export" / "README.md").read_text()
    section = card.split("## Validation of the run at this checkpoint\n\n")[1].split("\n## ")[0]
    source = run_dir / "checkpoints" / "best" / "model"
    assert section.startswith(f"The run's values, measured by the run on `{source}`, not on this export")
    assert "| cider | 0.5000 |" in section
    if otherwise is None:
        assert "computes otherwise" not in section
    else:
        assert f"which computes otherwise: {otherwise}; its own scores can differ" in section


def test_the_export_card_of_a_best_checkpoint_without_values_says_so(run, tmp_path):
    # the note of a checkpoint without values called every folder "the run's last state", a best one too
    run_dir = _resave(run[1], tmp_path, info={"step": 7})
    assert main(["export", str(run_dir), "--merged", str(tmp_path / "export")]) == 0
    card = (tmp_path / "export" / "README.md").read_text()
    assert "a best checkpoint records the validation values it was chosen by" in card and "last state" not in card
