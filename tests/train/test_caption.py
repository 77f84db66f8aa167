import json

import pytest

from finecap.app.caption import main
from finecap.caption import caption_stats, generate_captions
from finecap.config import DecodeConfig
from finecap.data.datasets import load_records
from finecap.home import run_path
from finecap.metrics.suite import evaluate
from finecap.models.clipcap import ClipCap
from finecap.registry import lookup
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.run import train
from finecap.train.validators import VALIDATORS, caption_stats_validator, cider_validator, retrieval_validator


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
    assert lookup("cider", VALIDATORS, "train.validators", "validator") is cider_validator


def test_retrieval_validator_needs_a_trained_retriever(make_cfg):
    # load_retriever only loads: without retriever.checkpoint and no trained world encoder, the error names the
    # command that trains it.
    with pytest.raises(FileNotFoundError, match="finecap retriever train"):
        retrieval_validator(make_cfg())


def test_cider_validator_is_finecap_evals_cider_d_of_the_same_captions(make_cfg, tmp_path, capsys, monkeypatch):
    from accelerate import Accelerator

    from finecap.app.eval import main as eval_main
    from finecap.data.references import data_file

    run_dir = train(make_cfg("train.max_steps=8"))
    cfg = make_cfg("decode.strategy=beam", "decode.beam_size=2", "train.eval_samples=6")
    checkpoint = checkpoint_dir(run_dir, "best")
    model = ClipCap.from_checkpoint(model_dir(checkpoint))
    values = cider_validator(cfg)(model, cfg, Accelerator(cpu=True))
    assert set(values) == {"cider_d", "length", "vocab"}
    # the same captions written by `finecap caption` and scored by `finecap eval` against the world's validation
    # split: eval_samples=6 of its 8 images, each against all of its references, document frequencies from them
    out = main(cfg, checkpoint=str(checkpoint), split="val", out=tmp_path / "val.json")
    results = json.loads(out.read_text())
    first_six = [r.image_id for r in load_records(cfg, "val")[:6]]
    (tmp_path / "six.json").write_text(json.dumps([r for r in results if r["image_id"] in first_six]))
    scored = eval_main(cfg, predictions=tmp_path / "six.json", references=data_file(cfg), split="val",
                       metrics="cider")  # fmt: skip
    assert values["cider_d"] == scored["CIDEr-D"]
    # 8 tiny steps give near-degenerate captions whose CIDEr-D may round to 0; so that the equality above is not
    # 0 == 0 by luck, the same path on captions that do share n-grams (each image's second reference) scores > 0
    # and equals finecap eval's score of them
    records = load_records(cfg, "val")[:6]
    second = {r.image_id: [r.captions[1]] for r in records}
    monkeypatch.setattr("finecap.train.validators.generate_captions", lambda *a, **k: second)
    again = cider_validator(cfg)(model, cfg, Accelerator(cpu=True))["cider_d"]
    (tmp_path / "second.json").write_text(json.dumps([{"image_id": i, "caption": c[0]} for i, c in second.items()]))
    expected = eval_main(cfg, predictions=tmp_path / "second.json", references=data_file(cfg), split="val",
                         metrics="cider")["CIDEr-D"]  # fmt: skip
    assert again == expected > 0.1
    assert values["length"] == evaluate({r["image_id"]: r["caption"] for r in results if r["image_id"] in first_six},
                                        None, metrics="length")["Length"]  # fmt: skip


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
