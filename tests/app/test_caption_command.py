"""``finecap caption`` reads its checkpoint (issue 21, item 7), runs are read from any directory (item 3) and refused
against changed inputs (the fingerprint-mismatch test): tiny ClipCaps trained for 2 steps on a tiny world."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from finecap.app.caption import main, resolve
from finecap.app.cli import main as cli
from finecap.caption import generate_captions
from finecap.config import DecodeConfig, load, load_stored
from finecap.data.datasets import CaptionDataset, model_collator
from finecap.data.references import load_references
from finecap.data.results import read_results
from finecap.models.backbones import load_captioner
from finecap.report.html import image_uri
from finecap.runs import FINGERPRINTS_FILE, checkpoint_dir, model_dir
from finecap.train.fingerprint import bags_file_data, data_fingerprint
from finecap.train.run import train

WORLD = ["world.n_train=40", "world.n_val=8", "world.n_test=8", "world.image_size=32", "world.seed=0"]
TINY = [*WORLD, "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
        "train.batch_size=16", "train.lr=3e-3", "train.warmup_steps=2", "train.log_every=1", "train.max_steps=2",
        "decode.max_length=10", "decode.batch_size=4"]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    from finecap.world.make import make_world

    cfg = load(None, WORLD).world
    return make_world(cfg, out=tmp_path_factory.mktemp("caption") / "world", progress=False)


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    from finecap.models.presets import save_tiny_clip

    return save_tiny_clip(tmp_path_factory.mktemp("clip"), image_size=32, patch_size=16)


def train_run(overrides: list[str]) -> Path:
    """Train a tiny run; it records its fingerprints, and its checkpoints carry a copy."""
    cfg = load(None, [*TINY, *overrides])
    run_dir = train(cfg)
    recorded = json.loads((run_dir / FINGERPRINTS_FILE).read_text())
    assert set(recorded) == {"version", "data", "captioner", "retriever"}
    for which in ("best", "last"):
        assert json.loads((checkpoint_dir(run_dir, which) / FINGERPRINTS_FILE).read_text()) == recorded
    return run_dir


def captions(path: Path) -> dict:
    return {i: c[0] for i, c in read_results(path).items()}


@pytest.fixture(scope="module")
def beam_run(world, clip, tmp_path_factory) -> Path:
    """A run whose configuration decodes with beam search of width 3, trained for 80 steps (about a second): after 2
    steps every caption is "a a a ...", whatever the decoding; after 80 beam search and greedy decoding differ."""
    tmp = tmp_path_factory.mktemp("beam")
    return train_run([f"world.out={world}", f"model.encoder={clip}", f"run.dir={tmp / 'run'}",
                      f"run.cache_dir={tmp / 'cache'}", "decode.strategy=beam", "decode.beam_size=3",
                      "train.max_steps=80"])  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# The checkpoint's decoding settings and data
# --------------------------------------------------------------------------------------------------------------------


def test_caption_uses_the_checkpoints_saved_beam(beam_run, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="finecap")
    # A run directory means its best checkpoint; its config.yaml gives decoding and data.
    setup = resolve(beam_run)
    assert setup.checkpoint == checkpoint_dir(beam_run, "best")
    d = setup.cfg.decode
    assert (d.strategy, d.beam_size, d.max_length) == ("beam", 3, 10)
    assert not setup.data_from_command_line

    default = captions(main(checkpoint=beam_run, out=tmp_path / "default.json"))
    config = checkpoint_dir(beam_run, "best") / "config.yaml"
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("caption: ")]
    assert said[-1].endswith(f"max_length=10) from the checkpoint's {config}")
    explicit = captions(main(checkpoint=beam_run, out=tmp_path / "explicit.json",
                             overrides=["decode.strategy=beam", "decode.beam_size=3"]))  # fmt: skip
    # the settings given on the command line are said to come from there, not from the checkpoint's config.yaml alone
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("caption: ")]
    assert said[-1].endswith(f"max_length=10) from the checkpoint's {config}, with decode.strategy=beam, "
                             "decode.beam_size=3 from the command line")  # fmt: skip
    assert default == explicit and len(default) == 8  # the tiny world's test split
    # An independent decode of the same model with the settings spelled out gives the same captions.
    cfg = load_stored(beam_run / "config.yaml")
    model = load_captioner(model_dir(checkpoint_dir(beam_run, "best")))
    reference = generate_captions(model, cfg, "test", decode=DecodeConfig(strategy="beam", beam_size=3, max_length=10),
                                  progress=False)  # fmt: skip
    assert default == {i: c[0] for i, c in reference.items()}
    # Greedy decoding of the same checkpoint is another result: the default really is the beam.
    greedy = captions(main(checkpoint=beam_run, out=tmp_path / "greedy.json", overrides=["decode.strategy=greedy"]))
    assert greedy != default


# Where each key of a flat model section (finecap before the backbone sections) is now: {section: {new: old}}.
FLAT_MODEL = {
    "clipcap": {k: k for k in ("lm", "mapper", "prefix_length", "mapper_layers", "mapper_heads", "tiny_layers",
                               "tiny_hidden", "tiny_heads", "tiny_dropout")},
    "blip": {"name": "blip"},
    "vlm": {"name": "vlm", "prompt": "vlm_prompt", "train_projector": "vlm_train_projector"},
}  # fmt: skip


def test_a_run_stored_before_the_backbone_sections_still_captions(beam_run, tmp_path):
    # The run's and its checkpoints' config.yaml rewritten as finecap wrote them before: one flat model section.
    old = tmp_path / "old"
    shutil.copytree(beam_run, old)
    stored = list(old.rglob("config.yaml"))
    assert len(stored) >= 3  # the run's, best's and last's
    for path in stored:
        data = yaml.safe_load(path.read_text())
        for section, keys in FLAT_MODEL.items():
            values = data.pop(section)
            data["model"].update({old_key: values[new_key] for new_key, old_key in keys.items()})
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert "prefix_length" in yaml.safe_load((old / "config.yaml").read_text())["model"]
    setup = resolve(old)
    assert (setup.cfg.decode.strategy, setup.cfg.decode.beam_size, setup.cfg.clipcap.prefix_length) == ("beam", 3, 2)
    assert setup.cfg.clipcap.tiny_hidden == 32  # the run's world-tiny size, moved to the section of model.kind
    before = captions(main(checkpoint=old, out=tmp_path / "old.json"))
    assert before == captions(main(checkpoint=beam_run, out=tmp_path / "new.json")) and len(before) == 8


def test_a_run_whose_config_names_code_is_refused_before_importing_it(beam_run, tmp_path, monkeypatch, capsys):
    """A shared run folder whose config.yaml was edited to name a module (here one beside it, which ``python -m
    finecap`` or the Python API would find on ``sys.path``): caption and the API refuse before importing it."""
    from finecap.api import Captioner
    from finecap.registry import LEGACY_TRUST_ENV, TRUST_ENV

    for env in (TRUST_ENV, LEGACY_TRUST_ENV):
        monkeypatch.delenv(env, raising=False)
    shared = tmp_path / "shared"
    shutil.copytree(beam_run, shared)
    (shared / "planted.py").write_text("import sys\nsys.planted_ran = True\n")
    monkeypatch.syspath_prepend(str(shared))
    for path in shared.rglob("config.yaml"):
        path.write_text(path.read_text().replace("engine: finecap", "engine: planted:Engine"))
    assert cli(["caption", "--checkpoint", str(shared), "--out", str(tmp_path / "c.json")]) == 2
    assert "decode.engine names 'planted:Engine', code of one's own" in capsys.readouterr().err
    with pytest.raises(ValueError, match="decode.engine names 'planted:Engine'"):
        Captioner.from_pretrained(shared)
    assert not hasattr(sys, "planted_ran") and not (tmp_path / "c.json").exists()


def test_data_given_is_not_split_by_the_training_datas_fractions(beam_run, world, tmp_path):
    # a run trained with data.val_fraction=0.25 (own/mle holds 10 % out) applied it to the folder given with --data:
    # `--split train` captioned 3 of its 4 images, an INFO line saying why
    run = tmp_path / "run"
    shutil.copytree(beam_run, run)
    for path in run.rglob("config.yaml"):
        data = yaml.safe_load(path.read_text())
        data["data"].update(val_fraction=0.25, split_seed=3)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    photos = tmp_path / "photos"
    photos.mkdir()
    for k, image in enumerate(sorted((world / "images").rglob("*.png"))[:4]):
        shutil.copy(image, photos / f"photo{k}.png")
    setup = resolve(run, data=photos)
    assert (setup.cfg.data.val_fraction, setup.cfg.data.split_seed) == (0.0, 0)
    assert resolve(run, data=photos, overrides=["data.val_fraction=0.5"]).cfg.data.val_fraction == 0.5
    recipe = tmp_path / "mine.yaml"  # a recipe's data.* describe the data set it trains on, not --data's
    recipe.write_text("data:\n  val_fraction: 0.5\n  images: /data/coco/images\n")
    from_recipe = resolve(run, data=photos, recipe=str(recipe)).cfg.data
    assert (from_recipe.val_fraction, from_recipe.images) == (0.0, "")
    assert resolve(run).cfg.data.val_fraction == 0.25  # the run's own data keeps its settings
    # ... and is never split otherwise: the test split would hold images the run trained or validated on (a new
    # user followed 'set data.test_fraction' and captioned two training images as test)
    for change in ("data.test_fraction=0.5", "data.val_fraction=0.1", "data.split_seed=4"):
        key = change.split("=")[0]
        with pytest.raises(ValueError, match=rf"^{key}=.*: the run was trained on this data set split with {key}="):
            resolve(run, overrides=[change])
    assert resolve(run, overrides=["data.val_fraction=0.25"]).cfg.data.val_fraction == 0.25  # the same: free
    out = main(checkpoint=run, data=photos, split="train", out=tmp_path / "photos.json")
    assert len(read_results(out)) == 4


def test_data_given_reads_its_own_images_not_the_training_datas(beam_run, tmp_path):
    # --data FILE kept the checkpoint's data.images: a JSONL's relative image paths were read from the training data's
    # image folder (another image of the same name captioned under the new file's id), silently
    run = tmp_path / "run"
    shutil.copytree(beam_run, run)
    for path in run.rglob("config.yaml"):  # a run trained on data with an image root of its own
        stored = yaml.safe_load(path.read_text())
        stored["data"]["images"] = str(tmp_path / "training-images")
        path.write_text(yaml.safe_dump(stored, sort_keys=False))
    data = tmp_path / "new" / "test.jsonl"
    data.parent.mkdir()
    data.write_text(json.dumps({"image": "0001.png", "captions": ["a red circle"], "split": "test"}) + "\n")
    assert resolve(run).cfg.data.images == str(tmp_path / "training-images")
    setup = resolve(run, data=data)
    assert (setup.cfg.data.format, setup.cfg.data.images) == ("jsonl", "")  # the file's own folder
    chosen = resolve(run, data=data, overrides=[f"data.images={tmp_path / 'mine'}"])
    assert chosen.cfg.data.images == str(tmp_path / "mine")


def test_only_the_keys_given_override_the_checkpoint(beam_run, tmp_path):
    setup = resolve(beam_run, overrides=["decode.strategy=greedy"])
    # strategy replaced; the checkpoint's max_length (10, not the default 24) and beam_size (3) kept
    assert (setup.cfg.decode.strategy, setup.cfg.decode.max_length, setup.cfg.decode.beam_size) == ("greedy", 10, 3)
    wide = resolve(checkpoint_dir(beam_run, "last"), overrides=["decode.beam_size=5"])
    assert (wide.checkpoint, wide.cfg.decode.strategy, wide.cfg.decode.beam_size) == (
        checkpoint_dir(beam_run, "last"), "beam", 5)  # fmt: skip
    # The command line: an override changes the captions, nothing else given keeps the checkpoint's beam 3.
    out = tmp_path / "cli.json"
    assert cli(["caption", "--checkpoint", str(beam_run), "--out", str(out)]) == 0
    assert cli(["caption", "--checkpoint", str(beam_run), "--out", str(tmp_path / "b3.json"),
                "decode.strategy=beam", "decode.beam_size=3"]) == 0  # fmt: skip
    assert captions(out) == captions(tmp_path / "b3.json")
    assert cli(["caption", "--checkpoint", str(beam_run), "--out", str(tmp_path / "g.json"),
                "decode.strategy=greedy"]) == 0  # fmt: skip
    assert captions(tmp_path / "g.json") != captions(out)


def test_generation_config_json_carries_the_decoding_settings(beam_run):
    from transformers import GenerationConfig

    for which in ("best", "last"):
        folder = model_dir(checkpoint_dir(beam_run, which))
        model = load_captioner(folder)
        for place in (folder, folder / "lm"):  # the checkpoint's model folder and ClipCap's transformers LM
            raw = json.loads((place / "generation_config.json").read_text())
            assert {k: raw[k] for k in ("num_beams", "max_new_tokens", "length_penalty", "do_sample",
                                        "num_return_sequences", "eos_token_id", "pad_token_id")} == {
                "num_beams": 3, "max_new_tokens": 10, "length_penalty": 1.0, "do_sample": False,
                "num_return_sequences": 1, "eos_token_id": model.tokenizer.eos_token_id,
                "pad_token_id": model.tokenizer.pad_token_id}  # fmt: skip
            assert not {"temperature", "top_k", "top_p"} & set(raw)  # sampling settings unset for beam search
            assert GenerationConfig.from_pretrained(place).num_beams == 3


def test_generation_config_of_each_strategy():
    from finecap.train.checkpoint import generation_config

    sample = generation_config(DecodeConfig(strategy="sample", temperature=0.7, top_k=5, top_p=0.9,
                                            num_return_sequences=4, max_length=12))  # fmt: skip
    assert (sample.do_sample, sample.num_beams, sample.temperature, sample.top_k, sample.top_p) == (
        True,
        1,
        0.7,
        5,
        0.9,
    )
    assert (sample.num_return_sequences, sample.max_new_tokens, sample.length_penalty) == (4, 12, None)
    greedy = generation_config(DecodeConfig(strategy="greedy", temperature=0.5))
    assert (greedy.do_sample, greedy.num_beams, greedy.temperature, greedy.num_return_sequences) == (False, 1, None, 1)
    greedy.validate(strict=True)  # what transformers checks before save_pretrained
    assert greedy.early_stopping is None
    beam = generation_config(DecodeConfig(strategy="beam", beam_size=4, length_penalty=2.0,
                                          finished_beams="set_aside", early_stopping="never"))  # fmt: skip
    assert (beam.num_beams, beam.length_penalty, beam.early_stopping, beam.do_sample) == (4, 2.0, "never", False)
    beam.validate(strict=True)


def test_transformers_greedy_generate_reproduces_finecap_captions(world, clip, tmp_path):
    # What generation_config.json is for: transformers' own generate, given the prefix ClipCap computes and the
    # saved settings, writes the captions finecap's decoder writes.
    import torch
    from transformers import GenerationConfig

    run = train_run([f"world.out={world}", f"model.encoder={clip}", f"run.dir={tmp_path / 'run'}",
                     f"run.cache_dir={tmp_path / 'cache'}", "train.max_steps=80"])  # fmt: skip
    folder = model_dir(checkpoint_dir(run, "best"))
    model = load_captioner(folder).eval()
    finecap_caps = captions(main(checkpoint=run, out=tmp_path / "greedy.json"))
    cfg = load_stored(run / "config.yaml")
    records = load_references(cfg, split="test").records
    batch = model_collator(model, cfg.data.max_tokens)(list(CaptionDataset(records, per_caption=False)))
    gen = GenerationConfig.from_pretrained(folder / "lm")
    assert (gen.num_beams, gen.do_sample, gen.max_new_tokens) == (1, False, 10)
    with torch.no_grad():
        prefix = model._prefix(model.image_features(batch))  # (B, k, H): what finecap's decoder starts from
        out = model.lm.generate(inputs_embeds=prefix, attention_mask=torch.ones(prefix.shape[:2], dtype=torch.long),
                                generation_config=gen)  # fmt: skip
    hf_caps = {
        r.image_id: model.tokenizer.decode(seq, skip_special_tokens=True).strip()
        for r, seq in zip(records, out, strict=True)
    }
    assert hf_caps == finecap_caps


@pytest.fixture(scope="module")
def set_aside_run(world, clip, tmp_path_factory) -> Path:
    """``beam_run`` with generate's finishing rule (decode.finished_beams=set_aside) and early_stopping=never."""
    tmp = tmp_path_factory.mktemp("set_aside")
    return train_run([f"world.out={world}", f"model.encoder={clip}", f"run.dir={tmp / 'run'}",
                      f"run.cache_dir={tmp / 'cache'}", "decode.strategy=beam", "decode.beam_size=3",
                      "decode.finished_beams=set_aside", "decode.early_stopping=never",
                      "train.max_steps=80"])  # fmt: skip


@pytest.mark.slow
def test_transformers_beam_generate_reproduces_set_aside_captions(set_aside_run, tmp_path):
    # With decode.finished_beams=set_aside, transformers' generate on ClipCap's saved LM, given the prefix and the
    # saved generation_config.json, writes finecap caption's beam captions, and its three hypotheses per image are
    # finecap's (tokens, scores, order) although hypotheses end before the last step (checked).
    import torch
    from transformers import GenerationConfig

    folder = model_dir(checkpoint_dir(set_aside_run, "best"))
    model = load_captioner(folder).eval()
    finecap_caps = captions(main(checkpoint=set_aside_run, out=tmp_path / "beam.json"))
    cfg = load_stored(set_aside_run / "config.yaml")
    records = load_references(cfg, split="test").records
    batch = model_collator(model, cfg.data.max_tokens)(list(CaptionDataset(records, per_caption=False)))
    gen = GenerationConfig.from_pretrained(folder / "lm")
    assert (gen.num_beams, gen.do_sample, gen.max_new_tokens, gen.early_stopping) == (3, False, 10, "never")
    with torch.no_grad():
        prefix = model._prefix(model.image_features(batch))  # (B, k, H): what finecap's decoder starts from
        mask = torch.ones(prefix.shape[:2], dtype=torch.long)
        out = model.lm.generate(inputs_embeds=prefix, attention_mask=mask, generation_config=gen)
        all_k = model.lm.generate(inputs_embeds=prefix, attention_mask=mask, generation_config=gen,
                                  num_return_sequences=3, return_dict_in_generate=True,
                                  output_scores=True)  # fmt: skip
    hf_caps = {
        r.image_id: model.tokenizer.decode(seq, skip_special_tokens=True).strip()
        for r, seq in zip(records, out, strict=True)
    }
    assert hf_caps == finecap_caps and len(hf_caps) == 8
    three = dataclasses.replace(cfg.decode, num_return_sequences=3)
    ours = model.generate(batch, three)
    for row, seq in enumerate(all_k.sequences.tolist()):
        n = int(ours.lengths[row])
        assert ours.sequences[row, :n].tolist() == seq[:n]
        assert all(t in (model.tokenizer.pad_token_id, model.tokenizer.eos_token_id) for t in seq[n:])
    assert torch.allclose(ours.scores, all_k.sequences_scores, atol=1e-5)
    assert int(ours.lengths.min()) < cfg.decode.max_length  # hypotheses ended before the last step
    # finecap's default rule (keep) answers otherwise on this model: the gap the option closes.
    keep = model.generate(batch, dataclasses.replace(cfg.decode, finished_beams="keep", early_stopping=False)).texts
    assert keep != [hf_caps[r.image_id] for r in records]


# --------------------------------------------------------------------------------------------------------------------
# From another directory
# --------------------------------------------------------------------------------------------------------------------


def test_run_read_from_another_directory(world, clip, tmp_path, monkeypatch):
    # Trained with paths relative to the working directory, as a user types them ...
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(world, work / "data" / "world")
    shutil.copytree(clip, work / "clip")
    monkeypatch.chdir(work)
    run_dir = train_run(["world.out=data/world", "model.encoder=clip", "run.dir=runs/r", "run.cache_dir=cache",
                         "retriever.checkpoint=clip"])  # fmt: skip
    from finecap.app.bags import main as build_bags

    build_bags(load(None, [*TINY, "world.out=data/world", "retriever.checkpoint=clip", "run.cache_dir=cache"]),
               split="test", sizes="2", out="runs/r/bags_test.json")  # fmt: skip
    stored = load_stored(work / "runs" / "r" / "config.yaml")
    assert stored.world.out == str(work / "data" / "world") and stored.model.encoder == str(work / "clip")
    assert stored.run.dir == str(work / "runs" / "r") and stored.retriever.checkpoint == str(work / "clip")
    assert json.loads((work / "runs/r/bags_test.json").read_text())["data"] == str(work / "data/world/dataset.json")

    # ... then read from another directory, where none of these relative paths exist.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run_dir = work / "runs" / "r"
    out = main(checkpoint=run_dir, out=elsewhere / "captions.json")
    assert len(captions(out)) == 8
    data = bags_file_data(run_dir / "bags_test.json")  # the bags review's loader
    assert data == str(work / "data" / "world" / "dataset.json")
    refs = load_references(load(None), data, split="test", check_images=True)
    assert len(refs.records) == 8 and all(r.path.is_file() for r in refs.records)
    # The report: a run directory holding this run's captions, drawn with the images of its data.
    (run_dir / "captions").mkdir()
    shutil.copy(out, run_dir / "captions" / "mle.json")
    assert cli(["report", str(run_dir), "--no-bag-outcomes", "--out", str(elsewhere / "report.html")]) == 0
    html = (elsewhere / "report.html").read_text()
    assert all(image_uri(r.path) in html for r in refs.records)  # the gallery found every test image
    assert sorted(p.name for p in elsewhere.iterdir()) == ["captions.json", "report.html"]  # nothing else written


# --------------------------------------------------------------------------------------------------------------------
# Changed inputs
# --------------------------------------------------------------------------------------------------------------------


def test_changed_data_is_refused_by_caption_and_report(world, clip, tmp_path, capsys):
    data = tmp_path / "data" / "captions.json"
    data.parent.mkdir()
    shutil.copy(world / "dataset.json", data)  # a Karpathy file (no scene graphs next to it)
    run_dir = train_run(["data.format=karpathy", f"data.path={data}", f"data.images={world / 'images'}",
                         f"model.encoder={clip}", f"run.dir={tmp_path / 'run'}",
                         f"run.cache_dir={tmp_path / 'cache'}"])  # fmt: skip
    (run_dir / "captions").mkdir()
    assert cli(["caption", "--checkpoint", str(run_dir), "--out", str(run_dir / "captions" / "mle.json")]) == 0
    assert cli(["report", str(run_dir), "--no-bag-outcomes"]) == 0
    recorded = json.loads((run_dir / FINGERPRINTS_FILE).read_text())["data"]
    capsys.readouterr()

    # The data changes after training: one reference caption edited.
    content = json.loads(data.read_text())
    content["images"][-1]["sentences"][0]["raw"] = "a caption written after training"
    data.write_text(json.dumps(content))
    out = tmp_path / "after.json"
    assert cli(["caption", "--checkpoint", str(run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    now = data_fingerprint(load_stored(run_dir / "config.yaml"))
    assert "data fingerprint" in err and recorded["id"] in err and now["id"] in err and recorded["id"] != now["id"]
    assert f"sha256: '{recorded['sha256']}' -> '{now['sha256']}'" in err
    assert not out.exists()  # refused before decoding
    assert cli(["report", str(run_dir), "--no-bag-outcomes", "--out", str(tmp_path / "r.html")]) == 2
    assert recorded["id"] in capsys.readouterr().err and not (tmp_path / "r.html").exists()
    # Captioning other data on purpose is the user's call: --data is not checked against the run's.
    assert cli(["caption", "--checkpoint", str(run_dir), "--out", str(out), "--data", str(data),
                f"data.images={world / 'images'}"]) == 0  # fmt: skip
    assert len(captions(out)) == 8


def test_transformers_blip_generate_reads_the_saved_settings(world, tmp_path):
    # A BLIP checkpoint's model/ is a BlipForConditionalGeneration folder: transformers' generate, given the saved
    # generation config, writes finecap's captions. (BLIP's generate hands over to its text decoder, which has its own
    # defaults: pass generation_config=model.generation_config.)
    import torch
    from transformers import AutoImageProcessor, BlipForConditionalGeneration

    from finecap.models.blip import Blip
    from finecap.models.presets import save_tiny_blip
    from finecap.train.checkpoint import save_checkpoint

    model = Blip.from_pretrained(save_tiny_blip(tmp_path / "blip")).eval()
    images = [r.path for r in load_references(load(None, [f"world.out={world}", *WORLD]), split="test").records]
    for strategy, rule in (("greedy", "keep"), ("beam", "keep"), ("beam", "set_aside")):
        cfg = load(None, [f"decode.strategy={strategy}", "decode.beam_size=3", "decode.max_length=7",
                          f"decode.finished_beams={rule}"])  # fmt: skip
        folder = save_checkpoint(tmp_path / f"{strategy}_{rule}", model=model, cfg=cfg, info={}) / "model"
        hf = BlipForConditionalGeneration.from_pretrained(folder).eval()
        pixels = AutoImageProcessor.from_pretrained(folder)([Image.open(p) for p in images], return_tensors="pt")
        with torch.no_grad():
            out = hf.generate(pixel_values=pixels["pixel_values"], generation_config=hf.generation_config)
            ours = model.generate({"pixel_values": pixels["pixel_values"]}, cfg.decode).texts
        assert (hf.generation_config.num_beams, hf.generation_config.max_new_tokens) == (
            3 if strategy == "beam" else 1, 7)  # fmt: skip
        assert [model.tokenizer.decode(s, skip_special_tokens=True).strip() for s in out] == ours


def test_a_checkpoint_name_is_found_under_the_runs_root_as_train_init_from_is(beam_run, tmp_path, monkeypatch):
    """``--checkpoint demo/mle`` (not in the working directory): the run under ``<home>/runs`` (or ``run.root``), as
    ``train.init_from=demo/mle`` finds it; found nowhere, one line naming where it looked and the command making it."""
    home = tmp_path / "home"
    shutil.copytree(beam_run, home / "runs" / "demo" / "mle")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FINECAP_HOME", str(home))
    found = resolve("demo/mle")
    assert found.checkpoint == home / "runs" / "demo" / "mle" / "checkpoints" / "best"
    assert resolve("mle", overrides=[f"run.root={home / 'runs' / 'demo'}"]).checkpoint == found.checkpoint
    out = tmp_path / "named.json"
    assert cli(["caption", "--checkpoint", "demo/mle", "--out", str(out)]) == 0
    assert captions(out) == captions_of(beam_run, tmp_path)
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError) as e:
        resolve("demo/mle")
    assert str(e.value) == (
        f"--checkpoint demo/mle: checkpoint or run directory not found (looked in the working "
        f"directory and in {tmp_path / 'empty' / 'runs'}); make it with `finecap train demo/mle`"
    )


def captions_of(run: Path, tmp_path: Path) -> dict:
    """The captions of ``finecap caption --checkpoint RUN`` (its path as such)."""
    out = tmp_path / "by-path.json"
    assert cli(["caption", "--checkpoint", str(run), "--out", str(out)]) == 0
    return captions(out)


def test_caption_data_may_be_a_hub_name_with_data_format_hf(beam_run, world, tmp_path, monkeypatch):
    """``--data <hub name> data.format=hf``: not a local path, so read by the format that reads Hub names
    (``datasets.load_dataset`` answering from memory here, no network), as ``finecap eval --references`` does."""
    datasets = pytest.importorskip("datasets")
    records = load_references(load(None, [f"world.out={world}", *WORLD]), split="test").records
    rows = {"image": [r.path.relative_to(world / "images").as_posix() for r in records],
            "captions": [list(r.captions) for r in records], "cocoid": list(range(len(records)))}  # fmt: skip
    monkeypatch.setattr(datasets, "load_dataset", lambda name, *a, **k: datasets.DatasetDict(
        {"test": datasets.Dataset.from_dict(rows)}))  # fmt: skip
    out = tmp_path / "hub.json"
    assert cli(["caption", "--checkpoint", str(beam_run), "--out", str(out), "--data", "someone/captions",
                "--split", "test", "data.format=hf", f"data.images={world / 'images'}",
                "data.hf.id_column=cocoid"]) == 0  # fmt: skip
    assert sorted(captions(out)) == list(range(len(records)))


def test_a_missing_split_of_the_runs_own_data_points_to_images_it_never_saw(beam_run, world, tmp_path):
    """A run on data without a test split: 'set data.test_fraction' (the data readers' advice) would have been refused
    as re-splitting the run's data, so captioning the run's own data says what works instead, before any model
    loads; another data set named on the command line keeps the readers' advice."""
    photos = tmp_path / "photos"
    photos.mkdir()
    lines = []
    for k, image in enumerate(sorted((world / "images").rglob("*.png"))[:4]):
        shutil.copy(image, photos / f"photo{k}.png")
        lines.append(json.dumps({"image": f"photo{k}.png", "captions": ["a red circle"]}))
    data = photos / "captions.jsonl"
    data.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    shutil.copytree(beam_run, run)
    for path in run.rglob("config.yaml"):
        stored = yaml.safe_load(path.read_text())
        stored["data"].update(format="jsonl", path=str(data), val_fraction=0.25)
        path.write_text(yaml.safe_dump(stored, sort_keys=False))
    with pytest.raises(ValueError) as e:
        main(checkpoint=run, out=tmp_path / "t.json")
    assert "no records in split 'test'" in str(e.value) and "--images FOLDER, or --data FILE" in str(e.value)
    assert "data.test_fraction" not in str(e.value)
    with pytest.raises(ValueError, match=r"no records in split 'test'.*set data.test_fraction"):
        main(checkpoint=run, data=data, out=tmp_path / "t.json")


def test_data_given_without_the_default_split_names_the_split_option(beam_run, world, tmp_path):
    """``--data captions_val.json`` (a COCO file: its name's split, val) without ``--split``: captioning reads the
    default split, test, which the file does not hold. The error names --split and the splits the file holds; it
    said only "give some records split 'test'", advice for a file one wants to caption as test, not this one."""
    images = sorted((world / "images").rglob("*.png"))[:2]
    data = tmp_path / "captions_val.json"
    entries = [{"id": k, "file_name": str(p.relative_to(world / "images"))} for k, p in enumerate(images)]
    notes = [{"id": k, "image_id": k, "caption": "a red circle"} for k in range(len(images))]
    data.write_text(json.dumps({"images": entries, "annotations": notes}))
    with pytest.raises(ValueError) as e:
        main(checkpoint=beam_run, data=data, out=tmp_path / "t.json", overrides=[f"data.images={world / 'images'}"])
    assert "no records in split 'test'; splits present: val" in str(e.value)
    assert "with --split val (--split defaults to test)" in str(e.value)
    with pytest.raises(ValueError) as e:  # a split given: no default to name
        main(checkpoint=beam_run, data=data, split="train", out=tmp_path / "t.json",
             overrides=[f"data.images={world / 'images'}"])  # fmt: skip
    assert "no records in split 'train'" in str(e.value) and "with --split val, or give" in str(e.value)


# --------------------------------------------------------------------------------------------------------------------
# The results file other tools read
# --------------------------------------------------------------------------------------------------------------------


def test_results_of_coco_and_karpathy_splits_are_read_by_pycocotools_with_their_int_ids(beam_run, world, tmp_path,
                                                                                         capsys):  # fmt: skip
    """``finecap caption --data`` on COCO caption annotations, or on Karpathy's ``dataset_coco.json`` (ids from
    ``cocoid``), writes COCO results whose ``image_id`` are the data set's integers, never their strings: pycocotools'
    ``loadRes`` asserts that every result's ``image_id`` is an image of the annotations (``"391895"`` is not
    ``391895`` there), and pycocoevalcap's example flow on the file (finecap's drop-in ``COCOEvalCap``: no Java) gives
    the numbers ``finecap eval --format coco`` prints."""
    from pycocotools.coco import COCO

    from finecap.metrics.cocoeval import COCOEvalCap

    ids = [391895, 522418, 184613, 318219]
    folder = tmp_path / "coco" / "val2014"
    folder.mkdir(parents=True)
    names = [f"COCO_val2014_{i:012d}.png" for i in ids]
    for name, image in zip(names, sorted((world / "images" / "test").glob("*.png")), strict=False):
        shutil.copy(image, folder / name)
    references = {i: [f"a large star number {k}", "A red circle near a small star.", "a shape"]
                  for k, i in enumerate(ids)}  # fmt: skip
    annotations = tmp_path / "coco" / "captions_val2014.json"
    annotations.write_text(json.dumps({
        "images": [{"id": i, "file_name": f"val2014/{name}"} for i, name in zip(ids, names, strict=True)],
        "annotations": [{"id": 10 * i + k, "image_id": i, "caption": c}
                        for i, caps in references.items() for k, c in enumerate(caps)],
    }))  # fmt: skip
    karpathy = tmp_path / "coco" / "dataset_coco.json"
    karpathy.write_text(json.dumps({"images": [
        {"filepath": "val2014", "filename": name, "imgid": k, "cocoid": i, "split": "test",
         "sentences": [{"raw": c, "tokens": c.lower().strip(".").split()} for c in references[i]]}
        for k, (i, name) in enumerate(zip(ids, names, strict=True))]}))  # fmt: skip
    for data, split in ((annotations, "val"), (karpathy, "test")):
        out = tmp_path / f"{data.stem}-results.json"
        assert cli(["caption", "--checkpoint", str(beam_run), "--data", str(data), "--split", split, "--out",
                    str(out)]) == 0  # fmt: skip
        rows = json.loads(out.read_text())
        assert [r["image_id"] for r in rows] == ids and all(type(r["image_id"]) is int for r in rows)
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints as it loads
            coco = COCO(str(annotations))
            result = coco.loadRes(str(out))
        assert result.getImgIds() == ids
        assert {i: [a["caption"] for a in result.imgToAnns[i]] for i in ids} == {r["image_id"]: [r["caption"]]
                                                                                for r in rows}  # fmt: skip
        flow = COCOEvalCap(coco, result, metrics=("bleu", "cider"))
        flow.params["image_id"] = result.getImgIds()
        flow.evaluate()
        capsys.readouterr()
        assert cli(["eval", "--predictions", str(out), "--references", str(annotations), "--metrics", "bleu,cider",
                    "--format", "coco"]) == 0  # fmt: skip
        printed = json.loads(capsys.readouterr().out)
        assert printed == pytest.approx(flow.eval, rel=1e-12) and printed["Bleu_1"] > 0
