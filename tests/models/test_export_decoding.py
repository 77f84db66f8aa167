"""An export captions like its run (issue 49, item 2): ``Captioner.from_pretrained`` on the run, on its checkpoint, on
its merged export and on the export loaded by plain transformers (``generate`` with the folder's own
``generation_config.json``) gives the same captions, with the run's decoding (beam 3, 6 tokens); a call may still
override it; a bare folder's edited ``generation_config.json`` is honoured."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from finecap import Captioner
from finecap.app.cli import main
from finecap.config import load
from finecap.models import lora
from finecap.models.backbones import build_model
from finecap.models.presets import save_tiny_vlm
from finecap.train.checkpoint import decode_of_folder, save_checkpoint

DECODE = ["decode.strategy=beam", "decode.beam_size=3", "decode.max_length=6", "decode.finished_beams=set_aside"]


def images(n: int = 4) -> list[Image.Image]:
    rng = np.random.default_rng(7)
    return [Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]


def save_with_drawn_adapters(folder: Path, overrides: list[str]) -> None:
    """A checkpoint in ``folder`` of the captioner ``overrides`` configure, its LoRA ``B`` matrices drawn large (seed
    0) so that the adapters move the captions."""
    cfg = load(None, overrides)
    torch.manual_seed(0)
    model = lora.configure_training(build_model(cfg), cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    save_checkpoint(folder, model=model.eval(), cfg=cfg, info={"step": 1})


def blip_with_lora(tiny: Path) -> list[str]:
    """The tiny BLIP ``tiny`` with LoRA on both parts (rank 4), greedy captions of 8 tokens."""
    return ["model.kind=blip", f"blip.name={tiny}", "lora.lm=true", "lora.encoder=true", "model.train_encoder=true",
            "lora.rank=4", "lora.alpha=8", "decode.max_length=8"]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run whose best checkpoint is a tiny Idefics3 (SmolVLM's family) with random LoRA adapters on its language
    model, saved by the checkpoint writer with the run's beam decoding."""
    root = tmp_path_factory.mktemp("export")
    tiny = save_tiny_vlm(root / "vlm", "idefics3")
    run_dir = root / "run"
    save_with_drawn_adapters(run_dir / "checkpoints" / "best", ["model.kind=vlm", f"vlm.name={tiny}", "lora.lm=true",
                             "lora.rank=4", "lora.alpha=8", "run.name=export-test", *DECODE])  # fmt: skip
    export = root / "export"
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["export", str(run_dir), "--merged", str(export)]) == 0, err.getvalue()
    return run_dir, export


def test_the_export_decodes_with_the_runs_settings(run):
    run_dir, export = run
    settings = Captioner.from_pretrained(export, device="cpu").cfg.decode
    assert (settings.strategy, settings.beam_size, settings.max_length, settings.finished_beams) == (
        "beam", 3, 6, "set_aside")  # fmt: skip
    assert decode_of_folder(export)["beam_size"] == 3


def test_run_checkpoint_export_and_transformers_caption_alike(run):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    run_dir, export = run
    pictures = images()
    ours = Captioner.from_pretrained(run_dir, device="cpu").caption(pictures)
    assert len(set(ours)) > 1  # the images get different captions
    assert Captioner.from_pretrained(run_dir / "checkpoints" / "best", device="cpu").caption(pictures) == ours
    exported = Captioner.from_pretrained(export, device="cpu")
    assert exported.caption(pictures) == ours
    # plain transformers on the export, with nothing but the folder: generate reads its generation_config.json
    model = AutoModelForImageTextToText.from_pretrained(export).eval()
    processor = AutoProcessor.from_pretrained(export)
    prompt = exported.model.prompt_text
    inputs = processor(text=[prompt] * len(pictures), images=[[im] for im in pictures], padding=True,
                       return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        out = model.generate(**inputs)
    theirs = processor.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert [t.strip() for t in theirs] == ours


def test_a_bfloat16_runs_export_keeps_its_dtype_and_captions_as_the_run(tmp_path):
    """The export loads the run in its model.dtype (it loaded every run in float32: a bfloat16 run's export was a
    float32 model twice the size, captioning as the run decoded in float32, not as the run)."""
    tiny = save_tiny_vlm(tmp_path / "vlm", "idefics3")
    cfg = load(None, ["model.kind=vlm", f"vlm.name={tiny}", "model.dtype=bfloat16", "decode.max_length=6"])
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():  # weights of its own, not the base's
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_checkpoint(tmp_path / "run" / "checkpoints" / "best", model=model.eval(), cfg=cfg, info={"step": 1})
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["export", str(tmp_path / "run"), "--merged", str(tmp_path / "export")]) == 0
    assert json.loads((tmp_path / "export" / "config.json").read_text())["dtype"] == "bfloat16"
    exported = Captioner.from_pretrained(tmp_path / "export", device="cpu")
    assert {p.dtype for p in exported.model.parameters()} == {torch.bfloat16}
    pictures = images()
    assert exported.caption(pictures) == Captioner.from_pretrained(tmp_path / "run", device="cpu").caption(pictures)


def test_a_call_overrides_and_an_edited_generation_config_is_honoured(run, tmp_path):
    run_dir, export = run
    exported = Captioner.from_pretrained(export, device="cpu")
    pictures = images(2)
    greedy = exported.caption(pictures, strategy="greedy", max_length=3)
    assert all(len(c.split()) <= 3 for c in greedy)
    assert exported.cfg.decode.strategy == "beam"  # the call changed nothing
    edited = tmp_path / "edited"
    import shutil

    shutil.copytree(export, edited)
    config = json.loads((edited / "generation_config.json").read_text())
    config.update(num_beams=1, max_new_tokens=2)
    (edited / "generation_config.json").write_text(json.dumps(config))
    settings = Captioner.from_pretrained(edited, device="cpu").cfg.decode
    assert (settings.strategy, settings.max_length) == ("greedy", 2)
    code = None
    out = tmp_path / "c.json"
    picture = tmp_path / "p.png"
    pictures[0].save(picture)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["caption", "--checkpoint", str(edited), "--images", str(picture), "--out", str(out)])
    assert code == 0 and len(json.loads(out.read_text())[0]["caption"].split()) <= 2


def test_the_export_card_says_what_the_folder_is(run):
    run_dir, export = run
    source = (run_dir / "checkpoints" / "best" / "model" / "README.md").read_text()
    # a LoRA checkpoint: a transformers model at the top (the Hub offers peft's loader only for an adapter there)
    assert source.startswith("---\nlibrary_name: transformers\n") and "`adapter/`" in source
    prompt = json.loads((run_dir / "checkpoints" / "best" / "model" / "captioner.json").read_text())["prompt"]
    assert f"- **Prompt**: `{prompt}` (the user's turn of the chat template" in source  # in no other file but ours
    card = (export / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: image-text-to-text\n")  # a VLM's task
    assert "a merged export of" in card and "no adapter folder" in card and "`adapter/`" not in card
    first = [line for line in card.splitlines() if line.startswith("# ")][0]
    assert first.startswith("# MLE captioner on ") and "a finecap captioner" not in card  # objective and base model
    assert "**Run**: `export-test`" in card and "finecap export" in card  # made by the export, from the run
    # the checkpoint's weights are the base under its adapters, the export's are the merged ones (its card said
    # "base weights without adapters" too)
    assert "`AutoModelForImageTextToText.from_pretrained(folder)`, base weights without adapters)" in source
    assert "`AutoModelForImageTextToText.from_pretrained(folder)`, the captioner's weights; no adapter to add)" in card


def test_a_recipes_decoding_wins_over_the_exports_and_an_override_over_both(run, tmp_path):
    # docs/caption.md: "a recipe's or the command line's decode.* win"; the export's beam size and length replaced a
    # recipe's (only overrides were kept)
    from finecap.train.checkpoint import folder_config

    _, export = run
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("decode:\n  beam_size: 2\n  max_length: 12\n")
    cfg = folder_config(export, str(recipe))
    assert (cfg.decode.strategy, cfg.decode.beam_size, cfg.decode.max_length) == ("beam", 2, 12)  # strategy: saved
    cfg = folder_config(export, str(recipe), ["decode.beam_size=4"])
    assert (cfg.decode.beam_size, cfg.decode.max_length) == (4, 12)
    assert folder_config(export).decode.beam_size == 3  # nothing given: the export's own


def test_a_16_bit_export_of_adapters_says_its_rounding_changes_captions(tmp_path, caplog):
    """Adapters merged into bfloat16 weights are rounded with them (``W + BA`` in bfloat16; the run adds the float32
    adapters' product to the bfloat16 layer's output): docs/caption.md said such an export "captions as the run
    does", and export_merged said nothing; on this tiny BLIP with LoRA on both parts 3 of its 4 greedy captions
    differ. The export now says so in a warning (a float32 run's export does not: it captions as its run)."""
    import logging

    from finecap.models.export import export_merged
    from finecap.models.presets import save_tiny_blip

    tiny = save_tiny_blip(tmp_path / "blip")
    pictures = images()
    for dtype in ("bfloat16", "float32"):
        source = tmp_path / dtype / "checkpoints" / "best"
        save_with_drawn_adapters(source, [*blip_with_lora(tiny), f"model.dtype={dtype}"])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="finecap.models.export"):
            export_merged(source / "model", tmp_path / f"{dtype}-export", dtype)
        warned = [r.getMessage() for r in caplog.records if "rounded to that dtype" in r.getMessage()]
        ours = Captioner.from_pretrained(tmp_path / dtype, device="cpu").caption(pictures)
        theirs = Captioner.from_pretrained(tmp_path / f"{dtype}-export", device="cpu").caption(pictures)
        assert len(set(ours)) > 1  # the images matter
        if dtype == "float32":
            assert theirs == ours and not warned
        else:
            assert sum(a != b for a, b in zip(ours, theirs, strict=True)) == 3  # the rounding the warning names
            assert len(warned) == 1 and "bfloat16 weights" in warned[0], caplog.text


def test_an_export_of_an_autocast_run_says_its_captions_can_differ(tmp_path):
    """A float32 run with train.mixed_precision=bf16 captions under autocast (finecap caption, the API); no file of
    its export carries the autocast, so finecap and transformers caption the export without it: on this tiny BLIP 2
    of 4 greedy captions differed and finecap export said nothing. It now warns naming the setting."""
    from finecap.models.presets import save_tiny_blip

    tiny = save_tiny_blip(tmp_path / "blip")
    best = tmp_path / "run" / "checkpoints" / "best"
    save_with_drawn_adapters(best, [*blip_with_lora(tiny), "train.mixed_precision=bf16"])
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["export", str(tmp_path / "run"), "--merged", str(tmp_path / "export")]) == 0, err.getvalue()
    pictures = images()
    ours = Captioner.from_pretrained(tmp_path / "run", device="cpu").caption(pictures)
    theirs = Captioner.from_pretrained(tmp_path / "export", device="cpu").caption(pictures)
    assert len(set(ours)) > 1 and sum(a != b for a, b in zip(ours, theirs, strict=True)) == 2  # what it warns of
    assert "train.mixed_precision=bf16 (an autocast to bfloat16)" in err.getvalue(), err.getvalue()
    assert "rounded" not in err.getvalue()  # float32 weights: the merge rounds nothing


def test_the_card_of_a_shifted_export_says_generate_writes_the_shift_token(tmp_path):
    """Weights that start every caption with SMILE's shift token (``first_token_shift`` in ``captioner.json``):
    finecap writes their captions without it, transformers' ``generate`` on the export with it. The export's card
    (and the checkpoint's) said only "a plain transformers checkpoint", so a Hub user got captions that all began
    with a token the run's never had. Here the shift token is the first token the run's weights emit for the first
    image, so the difference is the model's own."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from finecap.models.first_token import unshift_as

    def generated(folder: Path, prompt: str) -> torch.Tensor:
        """The caption tokens transformers' ``generate`` writes for the image, with the folder alone."""
        model = AutoModelForImageTextToText.from_pretrained(folder).eval()
        processor = AutoProcessor.from_pretrained(folder)
        inputs = processor(text=[prompt], images=[picture], return_tensors="pt")
        with torch.no_grad():
            return model.generate(**inputs)[0, inputs["input_ids"].shape[1] :]

    tiny = save_tiny_vlm(tmp_path / "vlm", "idefics3", std=0.3)
    cfg = load(None, ["model.kind=vlm", f"vlm.name={tiny}", "decode.max_length=6", "run.name=shifted"])
    model = build_model(cfg).eval()
    picture = images(1)
    first = generated(tiny, model.prompt_text)[0].item()
    best = tmp_path / "run" / "checkpoints" / "best"
    save_checkpoint(best, model=unshift_as(model, {"form": "token", "token_id": first}), cfg=cfg, info={"step": 1})
    export = tmp_path / "export"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["export", str(tmp_path / "run"), "--merged", str(export)]) == 0
    ours = Captioner.from_pretrained(export, device="cpu").caption(picture)[0]
    theirs = generated(export, model.prompt_text)
    assert theirs[0].item() == first  # generate writes the shift token first ...
    assert ours == AutoProcessor.from_pretrained(export).decode(theirs[1:], skip_special_tokens=True).strip()
    # ... which finecap leaves out
    line = f"Its weights start every caption with SMILE's shift token (token id {first};"
    for card in (export / "README.md", best / "model" / "README.md"):
        assert line in card.read_text(), card
