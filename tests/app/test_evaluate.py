"""Evaluation: the metric-group registry and hand-computed groups (finecap.metrics.suite), reference detection
(finecap.data.references), and `finecap eval` / `finecap bags build` end to end (finecap.app)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import math
import random
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from transformers import CLIPImageProcessor, CLIPModel

from finecap import registry
from finecap.app.cli import main as cli
from finecap.app.eval import main as eval_main
from finecap.config import WorldConfig, load
from finecap.data.formats import detect_format
from finecap.data.records import DataError, Record
from finecap.data.references import load_references
from finecap.data.results import write_results
from finecap.metrics.cocoeval import COCO_NAMES, COCOEvalCap
from finecap.metrics.diversity import set_diversity
from finecap.metrics.suite import METRICS, NOT_IMAGE_MEANS, evaluate, evaluate_items, parse_metrics
from finecap.models.presets import tiny_clip_config
from finecap.models.retriever import Retriever
from finecap.models.tokenizer import world_tokenizer
from finecap.world.make import make_world
from finecap.world.scene import Obj, Scene
from helpers.cli import refused
from helpers.coco_reference import NoSpice
from helpers.fake_retriever import PREDS, FakeRetriever, Rec
from helpers.scripts import benchmark

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------------------------------
# Registry and text metrics
# --------------------------------------------------------------------------------------------------------------------


def test_registry_names_are_the_config_table():
    # config.py checks eval.metrics at load against finecap.registry.METRIC_GROUPS (torch-free); the groups that
    # can run are the keys of METRICS: one list of names.
    assert tuple(METRICS) == tuple(registry.METRIC_GROUPS)


def test_unknown_metric_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown metric\(s\) 'blue'.*valid metrics: bleu, rouge, cider"):
        evaluate({1: "a"}, {1: ["a"]}, metrics=["bleu", "blue"])
    assert parse_metrics("bleu, cider,bleu") == ["bleu", "cider"]
    assert parse_metrics(None, ["length"]) == ["length"]


def test_length_and_vocab_by_hand():
    preds = {1: "A red circle.", 2: "a red red square", 3: "a red circle", 4: "a Red star, big", 5: "a red"}
    out = evaluate(preds, None, metrics="length,vocab")
    # PTB-tokenised (lower-cased, punctuation dropped): 3 + 4 + 3 + 4 + 2 = 16 words / 5 captions = 3.2
    assert out["Length"] == pytest.approx(3.2)
    # counts: a 5, red 6, circle 2, square 1, star 1, big 1 -> 6 distinct words; used >= 5 times: a, red -> 2
    assert out["Lexical diversity"] == 6.0
    assert out["Vocab usage"] == 2.0
    cfg = load(None, ["eval.vocab_min_count=6"])
    assert evaluate(preds, None, metrics="vocab", cfg=cfg)["Vocab usage"] == 1.0  # only "red" (6 times)


def test_ngram_groups_on_tokenised_text_by_hand():
    # One image, candidate "A red circle." = reference "a red circle" after PTB tokenisation.
    out = evaluate({1: "A red circle."}, {1: ["a red circle"]}, metrics=["bleu", "rouge", "cider"])
    # BLEU-n precisions: (3/3, 2/2, 1/1) then no 4-gram: (0 + 1e-15) / (0 + 1e-9) = 1e-6; brevity penalty 1.
    assert out["BLEU-1"] == pytest.approx(1.0)
    assert out["BLEU-3"] == pytest.approx(1.0)
    assert out["BLEU-4"] == pytest.approx(1e-6 ** (1 / 4), rel=1e-6)  # (1 * 1 * 1 * 1e-6)^(1/4) = 0.0316
    assert out["ROUGE-L"] == pytest.approx(1.0)
    # CIDEr-D with a single image: idf = log(1) - log(1) = 0 for every n-gram -> 0
    assert out["CIDEr-D"] == 0.0
    assert list(out) == ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D"]


def test_missing_references_for_a_prediction_is_named():
    with pytest.raises(ValueError, match=r"no references for 1 image\(s\), e.g. \[2\]"):
        evaluate({1: "a", 2: "b"}, {1: ["a"]}, metrics="bleu")


def test_diversity_by_hand():
    samples = {1: ["A red circle", "a blue circle."], 2: ["a star", "a star"]}
    out = evaluate({1: "a red circle", 2: "a star"}, None, metrics="diversity", samples=samples)
    # image 1: unigrams {a, red, circle, blue} = 4 over 6 words; bigrams {a red, red circle, a blue, blue circle} = 4
    # image 2: unigrams {a, star} = 2 over 4 words; bigrams {a star} = 1 over 4
    assert out["Div-1"] == pytest.approx((4 / 6 + 2 / 4) / 2, rel=1e-5)
    assert out["Div-2"] == pytest.approx((4 / 6 + 1 / 4) / 2, rel=1e-5)
    tokenised = {1: ["a red circle", "a blue circle"], 2: ["a star", "a star"]}
    assert out["mBLEU-4"] == pytest.approx(set_diversity(tokenised)["mBLEU-4"])
    with pytest.raises(ValueError, match="'diversity' needs samples"):
        evaluate({1: "a"}, None, metrics="diversity")


def test_faithfulness_group_and_missing_scenes():
    scene = Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)])
    # "a blue circle": object(circle) true, color(circle)=blue false -> precision 1/2; scene facts: background,
    # count, object, color, size, position = 6 -> recall 1/6
    out = evaluate({0: "a blue circle"}, None, metrics="faithfulness", scenes={0: scene})
    assert out["faith/precision"] == 0.5
    assert out["faith/recall"] == pytest.approx(1 / 6)
    assert out["faith/halluc/color"] == 1.0
    with pytest.raises(ValueError, match="'faithfulness' needs scenes"):
        evaluate({0: "a"}, None, metrics="faithfulness")


def test_java_metric_unavailable_warns_and_others_still_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FINECAP_METEOR_JAR", str(tmp_path / "missing.jar"))
    monkeypatch.setenv("FINECAP_SPICE_DIR", str(tmp_path / "no-spice"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = evaluate({1: "a red circle"}, {1: ["a red circle"]}, metrics="meteor,spice,rouge")
    messages = [str(w.message) for w in record]
    assert any("skipping METEOR" in m for m in messages) and any("skipping SPICE" in m for m in messages)
    assert out == {"ROUGE-L": pytest.approx(1.0)}


def test_perplexity_needs_eval_lm():
    with pytest.raises(ValueError, match="eval.lm"):
        evaluate({1: "a"}, None, metrics="perplexity")


# --------------------------------------------------------------------------------------------------------------------
# CLIP-based groups with a fake retriever whose embeddings are chosen by hand
# --------------------------------------------------------------------------------------------------------------------


def test_retrieval_and_bags_by_hand():
    cfg = load(None, ["eval.n_distractors=3", "eval.draws=2"])
    bags = {2: [[0, 1], [2, 3]], 3: [[1, 2, 3]]}
    out = evaluate(PREDS, None, metrics="retrieval,bags", retriever=FakeRetriever(),
                   images=[Rec(i) for i in range(4)], bags=bags, cfg=cfg)  # fmt: skip
    # ranks 1, 2, 1, 1 -> R@1 = 3/4, mean rank 5/4, median 1; RD-3 draws every other image = the pool
    assert out["pool/R@1"] == 0.75
    assert "pool/R@5" not in out and "RD3/R@5" not in out  # among 4 images every caption is in the top 5: left out
    assert out["pool/mean_rank"] == 1.25 and out["pool/median_rank"] == 1.0
    assert out["RD3/R@1"] == 0.75 and out["RD3/mean_rank"] == 1.25
    # bags of 2: "one" against {0, 1} ranks 2, the others rank 1 -> R@1 3/4 over 4 captions
    assert out["bag2/R@1"] == 0.75 and out["bag2/n"] == 4.0
    # bag of 3 {1, 2, 3}: "one" scores (0.6, 0, 0) -> rank 1; "two" (0, 1, 0.6)... all rank 1; image 0 in no bag
    assert out["bag3/R@1"] == 1.0 and out["bag3/n"] == 3.0


def test_clipscore_by_hand():
    refs = {i: [c] for i, c in PREDS.items()}  # each reference = the caption: max reference cosine 1
    out = evaluate(PREDS, refs, metrics="clipscore", retriever=FakeRetriever(), images=[Rec(i) for i in range(4)])
    # CLIP-S = 2.5 * cos(caption, own image) = 2.5 * (1, 0.6, 1, 0.8) = (2.5, 1.5, 2.5, 2.0): mean 8.5 / 4 = 2.125
    assert out["CLIPScore"] == pytest.approx(2.125, rel=1e-6)
    # RefCLIP-S = harmonic mean(CLIP-S, 1) = 2 * c / (c + 1): 5/3.5, 3/2.5, 5/3.5, 4/3
    expected = (2 * 5 / 3.5 + 3 / 2.5 + 4 / 3) / 4
    assert out["RefCLIPScore"] == pytest.approx(expected, rel=1e-6)


def assert_image_means_are_corpus_values(corpus, items, keys):
    """Every per-image key but :data:`NOT_IMAGE_MEANS` averages (over the images that have it) to its corpus value;
    ``keys``: the keys that must have per-image values."""
    per_key: dict[str, list[float]] = {}
    for scores in items.values():
        for key, value in scores.items():
            per_key.setdefault(key, []).append(value)
    assert set(keys) <= set(per_key), sorted(set(keys) - set(per_key))
    for key, values in per_key.items():
        if key not in NOT_IMAGE_MEANS:
            assert sum(values) / len(values) == pytest.approx(corpus[key], rel=1e-9, abs=1e-12), key


def test_per_image_values_of_the_image_groups_average_to_the_corpus_values():
    cfg = load(None, ["eval.n_distractors=2", "eval.draws=3"])  # 3 random draws of 2 distractors: R@1 varies by draw
    bags = {2: [[0, 1], [2, 3]], 3: [[1, 2, 3]]}
    refs = {i: [c] for i, c in PREDS.items()}
    corpus, items = evaluate_items(PREDS, refs, metrics="retrieval,bags,clipscore", retriever=FakeRetriever(),
                                   images=[Rec(i) for i in range(4)], bags=bags, cfg=cfg)  # fmt: skip
    keys = ["RD2/R@1", "RD2/mean_rank", "pool/R@1", "pool/mean_rank", "bag2/R@1", "bag2/mean_rank", "bag3/R@1",
            "CLIPScore", "RefCLIPScore"]  # fmt: skip  # no R@5: among 4 images it cannot fail (recall_ks)
    assert_image_means_are_corpus_values(corpus, items, keys)
    # "one" ranks 2nd in the pool and in its bag of 2, 1st in the bag of 3; image 0 is in no bag of 3
    assert items[1]["pool/R@1"] == 0.0 and items[1]["bag2/R@1"] == 0.0 and items[1]["bag3/R@1"] == 1.0
    assert "bag3/R@1" not in items[0] and "ClipSc" not in items[0]
    assert 0 < corpus["RD2/R@1"] < 1 and items[3]["CLIPScore"] == pytest.approx(2.0)


def test_per_image_values_of_the_text_groups_average_to_the_corpus_values():
    scenes = {
        0: Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)]),
        1: Scene(1, "sand", [Obj("square", "blue", "small", 0, 2), Obj("star", "green", "large", 2, 0)]),
    }
    predictions = {0: "a blue circle on grass", 1: "a small blue square and a green star on sand"}
    references = {0: ["a red circle on grass", "a large red circle"], 1: ["a blue square and a green star"]}
    corpus, items = evaluate_items(predictions, references, metrics="bleu,rouge,cider,length,faithfulness",
                                   scenes=scenes)  # fmt: skip
    keys = ["CIDEr-D", "ROUGE-L", "Length", "faith/precision", "faith/recall", "faith/facts", "faith/no_facts",
            "faith/halluc_rate"]  # fmt: skip
    assert_image_means_are_corpus_values(corpus, items, keys)
    assert items[0]["Length"] == 5 and items[0]["faith/halluc_rate"] == 1.0  # "blue" is false of the red circle
    assert corpus["faith/precision"] < 1 and corpus["CIDEr-D"] > 0


def test_retrieval_needs_images():
    with pytest.raises(ValueError, match="'retrieval' needs images"):
        evaluate(PREDS, None, metrics="retrieval", retriever=FakeRetriever())


# --------------------------------------------------------------------------------------------------------------------
# Files and the commands, on a tiny generated world
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    make_world(WorldConfig(n_train=24, n_val=4, n_test=12, image_size=32, families=3), out, progress=False)
    return out


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    """A tiny random CLIP over the world tokenizer, saved like a Hub checkpoint."""
    torch.manual_seed(0)
    tok = world_tokenizer()
    cfg = tiny_clip_config(len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, image_size=32, max_text_length=48)  # fmt: skip
    proc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    out = tmp_path_factory.mktemp("clip")
    Retriever(CLIPModel(cfg).eval(), tok, proc).save(out)
    return out


def test_detect_format(world, tmp_path):
    assert detect_format(world) == ("world", world / "dataset.json")
    assert detect_format(world / "dataset.json")[0] == "world"
    coco = tmp_path / "captions_val2014.json"
    coco.write_text(json.dumps({"images": [], "annotations": []}))
    assert detect_format(coco)[0] == "coco"
    karpathy = tmp_path / "dataset_coco.json"
    karpathy.write_text(json.dumps({"images": []}))
    assert detect_format(karpathy)[0] == "karpathy"
    (tmp_path / "x.jsonl").write_text("")
    assert detect_format(tmp_path / "x.jsonl")[0] == "jsonl"
    with pytest.raises(FileNotFoundError):
        detect_format(tmp_path / "nope.json")


def test_eval_command_scores_first_caption_and_uses_all_as_samples(world, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="finecap")
    refs = load_references(load(), world, split="test")
    first, second = refs.records[0], refs.records[1]
    path = tmp_path / "r.json"
    # Each image is listed twice (its 1st and its 3rd reference captions), interleaved as pycocotools allows.
    rows = [{"image_id": r.image_id, "caption": r.captions[j]} for j in (0, 2) for r in (first, second)]
    path.write_text(json.dumps(rows))
    out = eval_main(load(), predictions=path, references=world, metrics="length,diversity", out=tmp_path / "e.json")
    assert "2 image(s) have several captions" in caplog.text
    only_first = evaluate({first.image_id: first.captions[0], second.image_id: second.captions[0]}, None,
                          metrics="length")  # fmt: skip
    only_third = evaluate({r.image_id: r.captions[2] for r in (first, second)}, None, metrics="length")
    assert only_first["Length"] != only_third["Length"]  # so the next line tells which captions were scored
    assert out["Length"] == only_first["Length"]  # the second captions are not scored
    samples = {r.image_id: [r.captions[0], r.captions[2]] for r in (first, second)}
    want = evaluate({i: c[0] for i, c in samples.items()}, None, metrics="diversity", samples=samples)
    assert out["Div-1"] == pytest.approx(want["Div-1"]) and 0 < out["Div-1"] < 1


def test_eval_command_end_to_end_text_metrics(world, tmp_path, capsys):
    refs = load_references(load(), world, split="test")
    assert refs.scenes is not None and len(refs.records) == 12
    # Predictions: each test image's first reference caption. They state only true facts, so faithfulness
    # precision is exactly 1 with no hallucination, and BLEU-1 is 1 (every word matches, same length).
    write_results(tmp_path / "results.json", {r.image_id: r.captions[0] for r in refs.records})
    metrics = "bleu,rouge,cider,length,vocab,faithfulness"
    code = cli(["eval", "--predictions", str(tmp_path / "results.json"), "--references", str(world),
                "--metrics", metrics, "--out", str(tmp_path / "eval.json")])  # fmt: skip
    assert code == 0
    out = json.loads((tmp_path / "eval.json").read_text())
    assert out["faith/precision"] == 1.0 and out["faith/hallucinated"] == 0.0
    assert out["BLEU-1"] == pytest.approx(1.0) and out["ROUGE-L"] == pytest.approx(1.0)
    assert out["CIDEr-D"] > 0
    expected_len = sum(len(r.captions[0].split()) for r in refs.records) / 12
    assert out["Length"] == pytest.approx(expected_len)
    printed = capsys.readouterr()
    assert "| metric | results.json |" in printed.out and "| faith/precision | 1.000 |" in printed.out
    assert out["faith/no_facts"] == 0.0 and "state no fact" not in printed.out + printed.err  # references state facts


def test_eval_says_when_most_captions_state_no_fact(world, tmp_path, capsys):
    # captions naming no shape got faith/precision 1.000 and faith/halluc_rate 0.000, the rule only in a docstring
    refs = load_references(load(), world, split="test")
    silent = {r.image_id: "a big big big big" for r in refs.records[:9]}  # 9 of 12 state nothing
    write_results(tmp_path / "silent.json", silent | {r.image_id: r.captions[0] for r in refs.records[9:]})
    args = ["eval", "--predictions", str(tmp_path / "silent.json"), "--references", str(world), "--metrics",
            "length,faithfulness"]  # fmt: skip
    assert cli(args) == 0
    printed = capsys.readouterr()
    assert "| faith/no_facts | 0.750 |" in printed.out and "| faith/precision | 1.000 |" in printed.out
    assert "state no fact" not in printed.out  # a note is a log record on stderr, not a row of the table
    notes = [line for line in printed.err.splitlines() if "state no fact" in line]
    assert notes == ["note: 75% of the captions (9 of 12) state no fact the world's parser reads; each such caption "
                     "counts as faith/precision 1 and no hallucination, so faith/precision and faith/halluc_rate say "
                     "little about them (docs/metrics.md#faithfulness-on-the-world)"]  # fmt: skip
    assert cli([*args, "--format", "json"]) == 0  # the note on stderr here too: stdout stays the JSON
    captured = capsys.readouterr()
    assert json.loads(captured.out)["faith/no_facts"] == 0.75 and "note: 75% of the captions" in captured.err


def test_eval_names_an_empty_predictions_file(world, tmp_path):
    # "predictions: empty, nothing to evaluate" named neither the option nor the file
    empty = tmp_path / "none.json"
    empty.write_text("[]")
    refused(["eval", "--predictions", str(empty), "--references", str(world), "--metrics", "bleu"],
            f"--predictions: {empty}: no captions in it (read as coco predictions); nothing to evaluate")  # fmt: skip


def test_eval_command_unknown_metric_and_missing_ids(world, tmp_path, capsys):
    write_results(tmp_path / "r.json", {99999: "a red circle"})
    args = ["eval", "--predictions", str(tmp_path / "r.json"), "--references", str(world), "--out",
            str(tmp_path / "e.json")]  # fmt: skip
    assert cli([*args, "--metrics", "length,nope"]) == 2
    assert "valid metrics" in capsys.readouterr().err
    assert cli([*args, "--metrics", "length"]) == 2
    assert "not in the references" in capsys.readouterr().err


def test_default_metrics_follow_what_a_world_holds(world, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="finecap")
    monkeypatch.setenv("FINECAP_METEOR_JAR", str(tmp_path / "missing.jar"))  # no METEOR here: said, not an error
    refs = load_references(load(), world, split="val")
    write_results(tmp_path / "r.json", {r.image_id: "a red circle" for r in refs.records})
    out = eval_main(load(), predictions=tmp_path / "r.json", references=world)
    notes = caplog.text
    # caption metrics, text statistics and the world's faithfulness; image metrics need a retriever: none trained
    assert list(out)[:6] == ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D"]
    assert {"Length", "Vocab usage", "faith/precision"} <= set(out) and "CLIPScore" not in out
    assert "skipping meteor: meteor-1.5.jar not found" in notes
    assert "skipping clipscore, retrieval: no retriever: retriever.checkpoint is not set" in notes
    assert "no world encoder of this world is trained with these retriever.* settings" in notes
    # asked for by name, the same reason is an error naming the option
    with pytest.raises(ValueError, match=r"^--metrics: metric 'retrieval' cannot run here: no retriever: "):
        eval_main(load(), predictions=tmp_path / "r.json", references=world, metrics="bleu,retrieval")


def test_the_default_set_skips_retrieval_on_a_pool_smaller_than_rd_n(world, clip_dir, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="finecap")
    # with a retriever, the default set ran RD99 on a pool of 4 images: the whole evaluation failed, exit 2
    monkeypatch.setenv("FINECAP_METEOR_JAR", str(tmp_path / "missing.jar"))
    refs = load_references(load(), world, split="val")
    write_results(tmp_path / "r.json", {r.image_id: "a red circle" for r in refs.records})
    cfg = load(None, [f"retriever.checkpoint={clip_dir}", f"run.cache_dir={tmp_path / 'cache'}"])
    out = eval_main(cfg, predictions=tmp_path / "r.json", references=world)
    assert "CLIPScore" in out and "CIDEr-D" in out and not any(k.startswith(("RD", "pool/")) for k in out)
    assert "skipping retrieval: RD99 needs at least 100 images, the pool has 4" in caplog.text
    with pytest.raises(ValueError, match=r"^--metrics: metric 'retrieval' cannot run here: RD99 needs at least 100"):
        eval_main(cfg, predictions=tmp_path / "r.json", references=world, metrics="retrieval")


def test_metrics_asked_for_that_cannot_run_name_the_option(world, tmp_path):
    refs = load_references(load(), world, split="val")
    write_results(tmp_path / "r.json", {r.image_id: "a red circle" for r in refs.records})
    cfg = load(None, ["eval.metrics=[length,faithfulness,perplexity]"])
    with pytest.raises(ValueError, match=r"^eval\.metrics: metric 'perplexity' cannot run here: .*set eval\.lm="):
        eval_main(cfg, predictions=tmp_path / "r.json", references=world)
    with pytest.raises(ValueError, match=r"^--metrics: metric 'diversity' cannot run here: .*several captions"):
        eval_main(cfg, predictions=tmp_path / "r.json", references=world, metrics="bleu,diversity")


def _id_only_coco(tmp_path: Path, n: int = 40, seed: int = 3) -> tuple[Path, Path]:
    """COCO files whose images carry only an id (no file_name, no image files), COCO-like raw captions."""
    refs, res = benchmark("coco_like").write_coco(tmp_path / "coco", n, seed)
    data = json.loads(refs.read_text())
    data["images"] = [{"id": img["id"]} for img in data["images"]]
    refs = refs.with_name("captions_val2014.json")
    refs.write_text(json.dumps(data))
    return refs, res


def test_id_only_coco_references_give_the_caption_metrics_first_time(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FINECAP_METEOR_JAR", str(tmp_path / "missing.jar"))
    refs, res = _id_only_coco(tmp_path)
    assert cli(["eval", "--predictions", str(res), "--references", str(refs), "--out", str(tmp_path / "e.json")]) == 0
    out = json.loads((tmp_path / "e.json").read_text())
    assert [k for k in out if k in COCO_NAMES] == ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D"]
    assert "CLIPScore" not in out and "faith/precision" not in out
    printed = capsys.readouterr().err
    assert "skipping clipscore, retrieval: it needs the image files" in printed
    assert "names its images by id only, without 'file_name'" in printed and "data.images" not in printed
    # an image metric asked for by name: an error naming --metrics (exit 2), not data.images
    assert cli(["eval", "--predictions", str(res), "--references", str(refs), "--metrics", "bleu,clipscore"]) == 2
    err = capsys.readouterr().err
    assert "--metrics: metric 'clipscore' cannot run here: it needs the image files, but 40 of 40 image" in err
    assert "--images DIR" in err and "data.images" not in err
    assert cli(["eval", "--predictions", str(res), "--references", str(refs), "eval.metrics=[clipscore]"]) == 2
    assert "eval.metrics: metric 'clipscore' cannot run here" in capsys.readouterr().err


def test_format_coco_and_per_image_equal_the_drop_in_cocoevalcap(tmp_path, capsys):
    # Without Java: the three n-gram metrics against finecap.metrics.COCOEvalCap (itself compared with pycocoevalcap
    # in tests/metrics/test_cocoeval.py); with Java, the whole default set against pycocoevalcap below.
    refs, res = _id_only_coco(tmp_path)
    argv = ["eval", "--predictions", str(res), "--references", str(refs), "--metrics", "bleu,rouge,cider", "--format",
            "coco", "--out", str(tmp_path / "e.json"), "--per-image", str(tmp_path / "items.json")]  # fmt: skip
    assert cli(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    ref = COCOEvalCap(str(refs), str(res), metrics=("bleu", "rouge", "cider"))
    ref.evaluate()
    assert printed == json.loads((tmp_path / "e.json").read_text())
    assert list(printed) == list(ref.eval) == ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"]
    assert printed == pytest.approx(ref.eval, rel=1e-12)
    items = json.loads((tmp_path / "items.json").read_text())
    assert [x["image_id"] for x in items] == list(ref.imgToEval)
    for x in items:
        assert x == pytest.approx(ref.imgToEval[x["image_id"]], rel=1e-9, abs=1e-12)
    # finecap's own names with the other formats, in the per-image file too
    assert cli([*argv[:-6], "--format", "json", "--per-image", str(tmp_path / "items2.json")]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D"]
    assert set(json.loads((tmp_path / "items2.json").read_text())[0]) == {"image_id", "BLEU-1", "BLEU-2", "BLEU-3",
                                                                           "BLEU-4", "ROUGE-L", "CIDEr-D"}  # fmt: skip


@pytest.mark.slow
@pytest.mark.java
@pytest.mark.skipif(shutil.which("java") is None, reason="pycocoevalcap's tokenizer and METEOR need Java")
def test_format_coco_keys_and_values_equal_pycocoevalcap(tmp_path, capsys, monkeypatch):
    import pycocoevalcap.eval as reference
    from pycocotools.coco import COCO

    from finecap.metrics.spice import spice_unavailable_reason

    refs, res = _id_only_coco(tmp_path, n=30, seed=5)
    spice_missing = spice_unavailable_reason() is not None
    if spice_missing:
        monkeypatch.setattr(reference, "Spice", NoSpice)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocoevalcap's example flow (it prints as it goes)
        coco = COCO(str(refs))
        coco_result = coco.loadRes(str(res))
        ref = reference.COCOEvalCap(coco, coco_result)
        ref.params["image_id"] = coco_result.getImgIds()
        ref.evaluate()
    expected = {k: v for k, v in ref.eval.items() if not (spice_missing and k == "SPICE")}
    argv = ["eval", "--predictions", str(res), "--references", str(refs), "--format", "coco", "--per-image",
            str(tmp_path / "items.json")]  # fmt: skip
    assert cli(argv) == 0
    out = capsys.readouterr()
    printed = json.loads(out.out)
    assert list(printed) == list(expected)  # Bleu_1 .. Bleu_4, METEOR, ROUGE_L, CIDEr (and SPICE with its jars)
    assert printed == expected  # bit for bit (JSON round-trips a float exactly)
    assert ("skipping spice" in out.err) == spice_missing
    items = json.loads((tmp_path / "items.json").read_text())
    assert [x["image_id"] for x in items] == list(ref.imgToEval)
    for x in items:
        want = {k: v for k, v in ref.imgToEval[x["image_id"]].items() if k in expected or k == "image_id"}
        assert x == want


@pytest.mark.skipif(
    importlib.util.find_spec("pycocoevalcap") is None, reason="METEOR reads its data from pycocoevalcap"
)
@pytest.mark.slow
def test_eval_meteor_runs_without_java(tmp_path, capsys, monkeypatch):
    refs, res = _id_only_coco(tmp_path, n=30, seed=7)
    argv = ["eval", "--predictions", str(res), "--references", str(refs), "--metrics", "meteor", "--format", "coco",
            "--per-image", str(tmp_path / "items.json")]  # fmt: skip
    jar = None
    if shutil.which("java") is not None:  # the jar itself on the same (PTB-tokenised) captions, while Java is there
        jar = COCOEvalCap(str(refs), str(res), metrics=("meteor",), meteor_backend="java")
        jar.evaluate()
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert shutil.which("java") is None
    assert cli(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    items = json.loads((tmp_path / "items.json").read_text())
    assert list(printed) == ["METEOR"] and 0 < printed["METEOR"] < 1 and len(items) == 30
    if jar is not None:  # equal, not close
        assert printed == jar.eval
        assert {x["image_id"]: x for x in items} == jar.imgToEval
    # the java backend, asked for without Java: an error naming the option and what to install
    assert cli([*argv, "eval.meteor_backend=java"]) == 2
    err = capsys.readouterr().err
    assert "--metrics: metric 'meteor' cannot run here: the java METEOR backend needs a Java runtime" in err
    assert "eval.meteor_backend=python" in err


def test_eval_meteor_without_pycocoevalcap_says_what_to_install(tmp_path, capsys, monkeypatch):
    import finecap.metrics.meteor.resources as meteor_resources

    monkeypatch.setattr(meteor_resources, "pycocoevalcap_dir", lambda: None)  # as if not installed
    monkeypatch.delenv("FINECAP_METEOR_JAR", raising=False)
    refs, res = _id_only_coco(tmp_path, n=5)
    argv = ["eval", "--predictions", str(res), "--references", str(refs), "--out", str(tmp_path / "e.json")]
    assert cli([*argv, "--metrics", "bleu,meteor"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("finecap: error: --metrics: metric 'meteor' cannot run here: meteor-1.5.jar not found")
    assert "pip install pycocoevalcap" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "e.json").exists()
    # not asked for by name: left out with a note saying the same, the other metrics computed
    assert cli(argv) == 0
    assert "skipping meteor: meteor-1.5.jar not found" in capsys.readouterr().err
    assert "METEOR" not in json.loads((tmp_path / "e.json").read_text())


# --------------------------------------------------------------------------------------------------------------------
# Duplicate image ids: an error naming them, or merged where the format means it (COCO annotations)
# --------------------------------------------------------------------------------------------------------------------


def test_duplicate_reference_ids_are_named(tmp_path):
    karpathy = {"images": [{"filename": f"{i}.jpg", "split": "test", "cocoid": i, "sentences": [{"raw": f"a {i}"}]}
                           for i in (7, 8, 7, 9, 8)]}  # fmt: skip
    (tmp_path / "dataset_coco.json").write_text(json.dumps(karpathy))
    with pytest.raises(DataError, match=r"2 image id\(s\) appear in several images: id 7 in images\[0, 2\]; "
                                        r"id 8 in images\[1, 4\]"):  # fmt: skip
        load_references(load(), tmp_path / "dataset_coco.json")
    coco = {"images": [{"id": 1}, {"id": 1}], "annotations": [{"image_id": 1, "caption": "a"}]}
    (tmp_path / "captions_val.json").write_text(json.dumps(coco))
    with pytest.raises(DataError, match=r"images\[1\]: duplicate image id 1"):
        load_references(load(), tmp_path / "captions_val.json")
    (tmp_path / "refs.jsonl").write_text("".join(json.dumps({"id": 3, "image": f"{k}.png", "captions": ["a"]}) + "\n"
                                                 for k in range(2)))  # fmt: skip
    with pytest.raises(DataError, match=r"line 2: duplicate image id 3"):
        load_references(load(), tmp_path / "refs.jsonl")


def test_duplicate_ids_from_any_reader_are_named(tmp_path, monkeypatch):
    # a format's reader that does not check (a Hugging Face data set, one's own): read_dataset checks every format
    from finecap.data import formats

    records = [Record(5, tmp_path / "a.png", "test", ["a cat"]), Record(5, tmp_path / "b.png", "test", ["a dog"])]
    unchecking = formats.Format("jsonl", lambda source: records)
    monkeypatch.setattr(formats, "data_format", lambda fmt: unchecking)
    (tmp_path / "x.jsonl").write_text("")
    with pytest.raises(
        DataError, match=r"x\.jsonl: 1 image id\(s\) appear in several records: id 5 in records\[0, 1\]"
    ):
        load_references(load(None, ["data.format=jsonl", f"data.path={tmp_path / 'x.jsonl'}"]))


def test_coco_annotations_of_one_image_are_its_references_as_pycocotools_groups_them(tmp_path, capsys):
    from pycocotools.coco import COCO

    refs, res = _id_only_coco(tmp_path, n=12, seed=2)
    data = json.loads(refs.read_text())
    rng = random.Random(0)
    rng.shuffle(data["annotations"])  # one image's annotations anywhere in the file, as COCO has them
    refs.write_text(json.dumps(data))
    with contextlib.redirect_stdout(io.StringIO()):
        grouped = COCO(str(refs)).imgToAnns
    loaded = load_references(load(), refs).captions()
    assert loaded == {i: [a["caption"].strip() for a in grouped[i]] for i in loaded}
    assert all(len(c) == 5 for c in loaded.values())
    argv = [
        "eval",
        "--predictions",
        str(res),
        "--references",
        str(refs),
        "--metrics",
        "bleu,cider",
        "--format",
        "coco",
    ]
    assert cli(argv) == 0
    ref = COCOEvalCap(str(refs), str(res), metrics=("bleu", "cider"))
    ref.evaluate()
    assert json.loads(capsys.readouterr().out) == pytest.approx(ref.eval, rel=1e-12)


def test_duplicate_prediction_ids_are_refused_as_pycocoevalcap_does_unless_they_are_samples(tmp_path, capsys):
    from pycocoevalcap.bleu.bleu import Bleu

    # pycocoevalcap: loadRes keeps both captions, then every scorer asserts one caption per image
    with pytest.raises(AssertionError):
        Bleu(4).compute_score({1: ["a red circle"]}, {1: ["a red circle", "a blue circle"]})
    refs, res = _id_only_coco(tmp_path, n=6, seed=1)
    rows = json.loads(res.read_text())
    res.write_text(json.dumps([*rows, rows[2], {"image_id": rows[4]["image_id"], "caption": "another one"}]))
    assert cli(["eval", "--predictions", str(res), "--references", str(refs), "--metrics", "bleu"]) == 2
    err = capsys.readouterr().err
    assert f"2 image id(s) have several captions, e.g. [{rows[2]['image_id']}, {rows[4]['image_id']}]" in err
    assert "--metrics diversity" in err
    # asked for diversity (every image sampled twice): an image's captions are its samples, the first is scored
    res.write_text(json.dumps([*rows, *({**r, "caption": r["caption"].upper() + " again"} for r in rows)]))
    assert cli(["eval", "--predictions", str(res), "--references", str(refs), "--metrics", "bleu,diversity",
                "--format", "json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    first = evaluate({r["image_id"]: r["caption"] for r in rows}, load_references(load(), refs).captions(),
                     metrics="bleu")  # fmt: skip
    assert out["BLEU-4"] == pytest.approx(first["BLEU-4"]) and 0 < out["Div-1"] <= 1


def test_bags_larger_than_the_split_are_refused_before_embedding_it(world, clip_dir, tmp_path, capsys, monkeypatch):
    # The test split holds 12 images: bags of 13 cannot be made. The error came from build_bags after the whole split
    # was embedded ("bag sizes must lie in [2, 12] (number of images)", naming neither --sizes nor the split).
    def embedded(*args, **kwargs):
        raise AssertionError("the split was embedded before its size was checked")

    monkeypatch.setattr("finecap.app.bags.record_embeddings", embedded)
    assert cli(["bags", "build", "--data", str(world), "--split", "test", "--sizes", "3,13",
                "--out", str(tmp_path / "bags.json"), f"retriever.checkpoint={clip_dir}"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--sizes: a bag of 13 needs 13 images; split 'test' of" in err and "holds 12" in err
    assert not (tmp_path / "bags.json").exists()


def test_bags_build_refuses_repeated_image_ids_before_embedding(world, clip_dir, tmp_path, capsys, monkeypatch):
    # A guard, not a fix: build_bags checks its ids after the split is embedded, but the command never gets there
    # with a repeated id: the data set's reader refuses it (read_dataset; 1 and "1" are one id) before embedding.
    def embedded(*args, **kwargs):
        raise AssertionError("the split was embedded before its ids were checked")

    monkeypatch.setattr("finecap.app.bags.record_embeddings", embedded)
    images = []
    for k, image in enumerate(sorted((world / "images" / "test").glob("*.png"))[:3]):
        images.append(f"{k}.png")
        shutil.copyfile(image, tmp_path / images[-1])
    for ids in ([1, 1, 2], [1, "1", 2]):
        data = tmp_path / "data.jsonl"
        data.write_text("".join(json.dumps({"id": i, "image": str(image), "captions": ["x"], "split": "test"}) + "\n"
                                for i, image in zip(ids, images, strict=True)))  # fmt: skip
        assert cli(["bags", "build", "--data", str(data), "--split", "test", "--sizes", "2",
                    "--out", str(tmp_path / "bags.json"), f"retriever.checkpoint={clip_dir}"]) == 2  # fmt: skip
        assert "line 2: duplicate image id" in capsys.readouterr().err
    assert not (tmp_path / "bags.json").exists()


def test_bags_build_names_images_without_a_caption_before_embedding(world, clip_dir, tmp_path, monkeypatch):
    # A folder data set's images may have no caption. Half of an image's multimodal embedding is the mean of its
    # captions' text embeddings: the command embedded the whole split, then failed with "every image needs at least
    # one reference caption", naming neither the image nor the data set.
    def embedded(*args, **kwargs):
        raise AssertionError("the split was embedded before its captions were checked")

    monkeypatch.setattr("finecap.app.bags.record_embeddings", embedded)
    photos = tmp_path / "photos"
    photos.mkdir()
    lines = []
    for k, image in enumerate(sorted((world / "images" / "test").glob("*.png"))[:4]):
        shutil.copyfile(image, photos / image.name)
        lines.append({"image": image.name, "captions": [] if k == 2 else ["a shape"], "split": "test"})
    (photos / "captions.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    refused(["bags", "build", "--data", str(photos), "--split", "test", "--sizes", "2", "--out",
             str(tmp_path / "bags.json"), f"retriever.checkpoint={clip_dir}"],
            f"1 of 4 images of split 'test' have no caption ({lines[2]['image']})")  # fmt: skip
    assert not (tmp_path / "bags.json").exists()


def test_bags_build_and_eval_never_write_into_the_retriever_checkpoint(world, clip_dir, tmp_path):
    # The retriever checkpoint is an input of both commands: `--out CLIP/config.json --force` replaced the
    # checkpoint's config.json with the bags (or the scores), and the retriever no longer loaded.
    clip = tmp_path / "clip"
    shutil.copytree(clip_dir, clip)
    config = (clip / "config.json").read_bytes()
    for out in (clip / "config.json", clip / "bags.json"):
        refused(["bags", "build", "--data", str(world), "--split", "test", "--sizes", "2", "--out", str(out),
                 "--force", f"retriever.checkpoint={clip}"], "--out", "retriever.checkpoint")  # fmt: skip
    refs = load_references(load(), world, split="test")
    write_results(tmp_path / "results.json", {r.image_id: r.captions[0] for r in refs.records})
    refused(["eval", "--predictions", str(tmp_path / "results.json"), "--references", str(world), "--metrics",
             "retrieval", "--out", str(clip / "config.json"), "--force", f"retriever.checkpoint={clip}",
             "eval.n_distractors=5", f"run.cache_dir={tmp_path / 'cache'}"],
            "--out", "retriever.checkpoint")  # fmt: skip
    assert (clip / "config.json").read_bytes() == config and not (clip / "bags.json").exists()


def test_bags_build_never_writes_into_the_world_encoder_it_reads(world, clip_dir, tmp_path):
    # With retriever.checkpoint empty the retriever is the world encoder (<cache>/world_encoder/<key>), but only
    # retriever.checkpoint was among the inputs: `--out <encoder>/encoder.json --force` was not refused.
    from finecap.models.world_encoder_cache import encoder_dir

    cache = f"run.cache_dir={tmp_path / 'cache'}"
    encoder = encoder_dir(load(None, [cache]))
    shutil.copytree(clip_dir, encoder)  # a trained world encoder: CLIP weights and its encoder.json
    (encoder / "encoder.json").write_text("{}")
    for out in (encoder / "encoder.json", encoder / "bags.json"):
        refused(["bags", "build", "--data", str(world), "--split", "test", "--sizes", "2", "--out", str(out),
                 "--force", cache], "--out", "world encoder (retriever.checkpoint is empty)")  # fmt: skip
    assert (encoder / "encoder.json").read_text() == "{}" and not (encoder / "bags.json").exists()
    # a retriever.checkpoint set: the world encoder is not read, so not an input
    assert cli(["bags", "build", "--data", str(world), "--split", "test", "--sizes", "2", "--out",
                str(encoder / "bags.json"), cache, f"retriever.checkpoint={clip_dir}"]) == 0  # fmt: skip


def test_bags_build_and_clip_metrics_end_to_end(world, clip_dir, tmp_path, capsys):
    overrides = [f"retriever.checkpoint={clip_dir}", f"run.cache_dir={tmp_path / 'cache'}", "eval.n_distractors=5",
                 "eval.draws=2"]  # fmt: skip
    assert cli(["bags", "build", "--data", str(world), "--split", "test", "--sizes", "3,2",
                "--out", str(tmp_path / "bags.json"), *overrides]) == 0  # fmt: skip
    built = json.loads((tmp_path / "bags.json").read_text())
    assert built["sizes"] == [2, 3] and built["n_images"] == 12
    for size in ("2", "3"):
        members = [i for b in built["bags"][size] for i in b["images"]]
        assert len(members) == len(set(members)) and all(len(b["images"]) == int(size) for b in built["bags"][size])
        sims = [b["similarity"] for b in built["bags"][size]]
        assert sims == sorted(sims, reverse=True)
        assert 0.0 <= built["family_purity"][size] <= 1.0
    assert "within one family" in capsys.readouterr().err  # bags build's summary lines: the finecap logger
    # bags.keep_hardest: the most similar share of the curated bags of each size (NDLB's filter, automated)
    assert cli(["bags", "build", "--data", str(world), "--split", "test", "--sizes", "3,2",
                "--out", str(tmp_path / "hard.json"), "bags.keep_hardest=0.5", *overrides]) == 0  # fmt: skip
    hard = json.loads((tmp_path / "hard.json").read_text())
    assert hard["keep_hardest"] == 0.5
    for size in ("2", "3"):
        curated = built["bags"][size]
        assert hard["curated"][size] == len(curated) and hard["bags"][size] == curated[: -(-len(curated) // 2)]
        alphas = [b["similarity"] for b in curated]
        assert hard["alpha_curated"][size] == pytest.approx(sum(alphas) / len(alphas))
        kept = [b["similarity"] for b in hard["bags"][size]]
        assert len(kept) < len(alphas) and alphas[0] > alphas[-1]  # something filtered, and the bags differ in alpha
        assert sum(kept) / len(kept) > hard["alpha_curated"][size]  # so the filtered bags are more similar

    refs = load_references(load(), world, split="test")
    write_results(tmp_path / "results.json", {r.image_id: r.captions[0] for r in refs.records})
    assert cli(["eval", "--predictions", str(tmp_path / "results.json"), "--references", str(world), "--bags",
                str(tmp_path / "bags.json"), "--metrics", "retrieval,bags,clipscore", "--out",
                str(tmp_path / "eval.json"), *overrides]) == 0  # fmt: skip
    out = json.loads((tmp_path / "eval.json").read_text())
    for key in ("RD5/R@1", "RD5/R@5", "pool/R@1", "pool/R@10", "pool/mean_rank", "bag2/R@1", "bag3/R@1"):
        assert 0.0 <= out[key] <= 12.0, key
    assert out["pool/R@10"] <= 1.0 and 1.0 <= out["pool/mean_rank"] <= 12.0
    assert out["bag2/n"] == 2 * len(built["bags"]["2"])
    assert 0.0 <= out["CLIPScore"] <= 2.5 and math.isfinite(out["RefCLIPScore"])


def test_eval_prints_the_librarys_numbers_for_the_image_and_world_metrics(world, clip_dir, tmp_path, capsys):
    # What `finecap eval` prints (JSON and table) is what the library computes on the same captions, pool, bags and
    # retriever: SelfRetrieval (RD-N, pool, TrueMatch bags of two sizes, which share images), CLIPScore, the listener
    # (on the retriever's draws, with exploit), faithfulness and the vocabulary counts.
    from finecap.data.bags_file import read_bags
    from finecap.metrics.clipscore import CLIPScore
    from finecap.metrics.diversity import vocabulary_metrics
    from finecap.metrics.faithfulness import faithfulness
    from finecap.metrics.listener import listener_retrieval
    from finecap.metrics.retrieval import SelfRetrieval
    from finecap.models.retriever import load_retriever

    overrides = [f"retriever.checkpoint={clip_dir}", f"run.cache_dir={tmp_path / 'cache'}", "eval.n_distractors=5",
                 "eval.draws=2"]  # fmt: skip
    bags_file = tmp_path / "bags.json"
    assert cli(["bags", "build", "--data", str(world), "--split", "test", "--sizes", "3,2", "--out", str(bags_file),
                *overrides]) == 0  # fmt: skip
    refs = load_references(load(), world, split="test")
    preds = {r.image_id: r.captions[1] for r in refs.records}
    preds[refs.records[0].image_id] = "a thing"  # states no fact: the listener guesses
    write_results(tmp_path / "results.json", preds)
    metrics = "retrieval,bags,clipscore,listener,faithfulness,vocab"
    command = ["eval", "--predictions", str(tmp_path / "results.json"), "--references", str(world), "--bags",
               str(bags_file), "--metrics", metrics, *overrides]  # fmt: skip
    capsys.readouterr()
    assert cli([*command, "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert cli(command) == 0
    table = capsys.readouterr().out

    cfg = load(None, overrides)
    retriever, bags = load_retriever(cfg), read_bags(bags_file)
    sr = SelfRetrieval(retriever, refs.records, n_distractors=5, draws=2, seed=cfg.eval.seed,
                       bags=[b for size in bags.values() for b in size])  # fmt: skip
    want = sr(preds)
    want |= CLIPScore(retriever, refs.records)(preds, {r.image_id: r.captions for r in refs.records})
    want |= listener_retrieval(preds, refs.scenes, [r.image_id for r in refs.records], 5, 2, cfg.eval.seed, bags,
                               sr.scores(preds)[1])  # fmt: skip
    want |= faithfulness(preds, refs.scenes)
    want |= {k: v for k, v in vocabulary_metrics(preds).items() if k != "Length"}
    assert set(printed) == set(want)
    for key, value in want.items():
        assert printed[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    # the table shows the same values, 3 decimals (whole counts without)
    assert f"| RD5/R@1 | {want['RD5/R@1']:.3f} |" in table and f"| bag2/n | {int(want['bag2/n'])} |" in table
    assert f"| listener/bag3/R@1_expected | {want['listener/bag3/R@1_expected']:.3f} |" in table
    assert f"| ClipSc | {want['ClipSc']:.3f} |" in table and f"| Vocab usage | {int(want['Vocab usage'])} |" in table


def test_a_value_that_is_no_number_is_written_null_in_strict_json(tmp_path, monkeypatch, capsys):
    """SPICE's jar writes ``"NaN"`` for an image it cannot score (pycocoevalcap reads it as NaN, and so does finecap):
    ``--out``, ``--per-image`` and ``--format json`` write it as ``null``; the ``NaN`` token was not JSON that ``jq``
    or JavaScript read."""
    import finecap.metrics.spice as spice

    def jar(predictions, references, **kwargs):  # the jar's results for two images, the second unscorable
        results = {1: {"All": {"f": 0.5}}, 2: {"All": {"f": "NaN"}}}
        return [1, 2], [0, 1], results

    monkeypatch.setattr(spice, "spice_unavailable_reason", lambda *args: None)  # no jars here: the jar's output
    monkeypatch.setattr(spice, "spice_results", jar)
    refs = tmp_path / "refs.jsonl"
    refs.write_text("".join(json.dumps({"id": i, "image": f"{i}.png", "captions": [c]}) + "\n"
                            for i, c in ((1, "a red circle"), (2, "a blue square"))))  # fmt: skip
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}, {"image_id": 2, "caption": "a"}]))
    out, per = tmp_path / "scores.json", tmp_path / "per.json"
    assert cli(["eval", "--predictions", str(preds), "--references", str(refs), "--metrics", "spice", "--format",
                "json", "--out", str(out), "--per-image", str(per)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    for text in (printed, out.read_text(), per.read_text()):
        assert "NaN" not in text
        json.loads(text, parse_constant=lambda token: pytest.fail(f"{token} is not JSON"))
    assert json.loads(out.read_text()) == {"SPICE": None}  # pycocoevalcap's mean with the NaN included: NaN
    assert [row["SPICE"] for row in json.loads(per.read_text())] == [0.5, None]


def test_refclipscore_refuses_a_predicted_image_without_references():
    # references given but image 3 has none: RefCLIPScore over images 0-2 would be another corpus's; it used to
    # vanish from the results without a word, while bleu refuses (test_missing_references_for_a_prediction_is_named)
    refs = {i: [c] for i, c in PREDS.items() if i != 3}
    with pytest.raises(ValueError, match=r"metric 'clipscore': no references for 1 image\(s\), e.g. \[3\]"):
        evaluate(PREDS, refs, metrics="clipscore", retriever=FakeRetriever(), images=[Rec(i) for i in range(4)])
    refs[3] = []  # an empty list is no references either
    with pytest.raises(ValueError, match=r"no references for 1 image\(s\), e.g. \[3\]"):
        evaluate(PREDS, refs, metrics="clipscore", retriever=FakeRetriever(), images=[Rec(i) for i in range(4)])
    out = evaluate(PREDS, None, metrics="clipscore", retriever=FakeRetriever(), images=[Rec(i) for i in range(4)])
    assert set(out) == {"CLIPScore", "ClipSc"}  # no references given: CLIPScore alone, as before


def test_ids_written_as_strings_against_a_worlds_int_ids_score_as_the_ints_do(world, clip_dir, tmp_path, capsys):
    # a results file and a bags file giving the world's int ids as strings ("3" for 3): the same images in every
    # group (retrieval, bags, CLIPScore, the listener, faithfulness; the bags' ids were "not among the scored
    # images"), and the per-image rows carry the world's ids as it writes them
    overrides = [f"retriever.checkpoint={clip_dir}", f"run.cache_dir={tmp_path / 'cache'}", "eval.n_distractors=5",
                 "eval.draws=2"]  # fmt: skip
    ids = [r.image_id for r in load_references(load(), world, split="test").records]
    refs = load_references(load(), world, split="test").captions()
    for name, key in (("ints", lambda i: i), ("texts", str)):
        write_results(tmp_path / f"{name}.json", {key(i): refs[i][0] for i in ids})
        bags = {"2": [{"images": [key(i) for i in ids[k : k + 2]]} for k in range(0, 6, 2)]}
        (tmp_path / f"{name}_bags.json").write_text(json.dumps({"bags": bags}))
        assert cli(["eval", "--predictions", str(tmp_path / f"{name}.json"), "--references", str(world), "--split",
                    "test", "--bags", str(tmp_path / f"{name}_bags.json"), "--metrics",
                    "retrieval,bags,clipscore,listener,faithfulness", "--out", str(tmp_path / f"{name}_out.json"),
                    "--per-image", str(tmp_path / f"{name}_items.json"), "--format", "json",
                    *overrides]) == 0  # fmt: skip
    capsys.readouterr()
    got, want = (json.loads((tmp_path / f"{n}_out.json").read_text()) for n in ("texts", "ints"))
    assert got == want and got["bag2/n"] == 6.0
    rows, want_rows = (json.loads((tmp_path / f"{n}_items.json").read_text()) for n in ("texts", "ints"))
    assert rows == want_rows and [r["image_id"] for r in rows] == ids  # the world's int ids
