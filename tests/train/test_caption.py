import json

import pytest

from finecap.app.caption import main
from finecap.app.train import train
from finecap.caption import caption_stats, generate_captions
from finecap.config import DecodeConfig
from finecap.data.datasets import load_records
from finecap.home import run_path
from finecap.metrics.suite import evaluate
from finecap.models.clipcap import ClipCap
from finecap.registry import lookup
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.validators import VALIDATORS, caption_stats_validator, retrieval_validator


def test_caption_stats_hand_computed():
    # first captions: "a red circle" (3 words), "a circle" (2) -> mean 2.5; distinct words {a, red, circle} -> 3
    assert caption_stats({1: ["a red circle", "ignored extra sample"], 2: ["a circle"]}) == {
        "length": 2.5, "vocab": 3.0}  # fmt: skip
    # Words as finecap eval counts them (PTB tokens): "A red circle." -> a, red, circle (3; the period is dropped
    # and "A" is "a"); "the dog's ball" -> the, dog, 's, ball (4) -> mean 3.5; distinct words: 7
    stats = caption_stats({1: ["A red circle."], 2: ["the dog's ball"]})
    assert stats == {"length": 3.5, "vocab": 7.0}
    assert stats["length"] == evaluate({1: "A red circle.", 2: "the dog's ball"}, None, metrics="length")["Length"]


def test_validators_registry_resolves_to_the_factories():
    assert lookup("captions", VALIDATORS, "train.validators", "validator") is caption_stats_validator
    assert lookup("retrieval", VALIDATORS, "train.validators", "validator") is retrieval_validator


def test_retrieval_validator_needs_a_trained_retriever(make_cfg):
    # load_retriever only loads: without retriever.checkpoint and no trained world encoder, the error names the
    # command that trains it.
    with pytest.raises(FileNotFoundError, match="finecap retriever train"):
        retrieval_validator(make_cfg())


def test_caption_main_writes_coco_results(make_cfg, tmp_path):
    run_dir = train(make_cfg("train.max_steps=2"))
    out = tmp_path / "results.json"
    cfg = make_cfg("decode.strategy=beam", "decode.beam_size=2", "decode.batch_size=3")
    assert main(cfg, checkpoint=str(checkpoint_dir(run_dir, "best")), split="test", out=out) == out
    results = json.loads(out.read_text())
    assert all(set(r) == {"image_id", "caption"} for r in results)
    assert all(isinstance(r["caption"], str) and r["caption"] for r in results)
    assert sorted(r["image_id"] for r in results) == sorted(r.image_id for r in load_records(cfg, "test"))
    assert len(results) == 8  # the tiny world's test split


def test_generate_captions_several_per_image(make_cfg):
    cfg = make_cfg("train.max_steps=1")
    train(cfg)
    model = ClipCap.from_checkpoint(model_dir(checkpoint_dir(run_path(cfg.run), "last")))
    decode = DecodeConfig(strategy="sample", num_return_sequences=3, max_length=6, batch_size=2)
    captions = generate_captions(model, cfg, "val", limit=5, decode=decode, progress=False)
    assert len(captions) == 5 and all(len(c) == 3 for c in captions.values())
    assert all(len(text.split()) <= 6 for caps in captions.values() for text in caps)
