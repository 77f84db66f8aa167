"""One's own captioned photos offline (issue 49, item 1): a word-level vocabulary made for other captions
(``clipcap.lm=world-tiny``, the world's 74 words) is refused with one line naming the share of unknown tokens, the
worst caption as tokenised and the fix, before any feature is cached; ``clipcap.lm=data-tiny`` trains a world-sized
GPT-2 over the training captions' own words, whose tokenizer every checkpoint stores."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from finecap.config import load
from finecap.data.targets import UnknownTokens, unknown_tokens
from finecap.models.tokenizer import caption_vocabulary, world_tokenizer
from helpers.cli import run_cli

CAPTIONS = {
    "astronaut": ["a woman astronaut in an orange suit smiling", "an astronaut smiling in her orange suit"],
    "harbour": ["fishing boats moored in a quiet harbour", "small boats in a harbour at dawn"],
    "market": ["a crowded market stall selling ripe mangoes", "people buying mangoes at a market"],
    "glacier": ["hikers crossing a glacier under grey clouds", "a glacier with hikers and clouds"],
}


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> dict:
    """A folder of 16 photos (4 scenes x 4 noisy copies) captioned in words the world never uses, and a tiny CLIP."""
    from finecap.models.presets import save_tiny_clip

    root = tmp_path_factory.mktemp("own")
    folder = root / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    lines = []
    for k, (scene, caps) in enumerate(CAPTIONS.items()):
        base = np.zeros((32, 32, 3), np.uint8)
        base[..., k % 3] = 200
        for copy in range(4):
            pixels = np.clip(base + rng.integers(0, 40, base.shape), 0, 255).astype(np.uint8)
            name = f"{scene}_{copy}.png"
            Image.fromarray(pixels).save(folder / name)
            lines.append({"image": name, "captions": caps, "split": "val" if copy == 3 else "train"})
    (folder / "captions.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    clip = save_tiny_clip(root / "clip", image_size=32, patch_size=16)
    base = [f"data.path={folder}", "data.format=folder", f"model.encoder={clip}", "clipcap.tiny_layers=1",
            "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2", "train.batch_size=8",
            "train.max_steps=2", "train.warmup_steps=1", "train.eval_samples=4", "decode.max_length=10",
            f"run.cache_dir={root / 'cache'}"]  # fmt: skip
    return {"root": root, "folder": folder, "base": base}


def test_unknown_tokens_counts_by_hand():
    tok = world_tokenizer(["a", "red", "circle"])
    # "a red circle": 3 known; "a big red dog .": a, red known; big, dog, . unknown -> 3 of 8 tokens
    found = unknown_tokens(tok, ["a red circle", "a big red dog."])
    assert found.share == 3 / 8
    assert found.example == "a big red dog." and found.tokenised == "a <unk> red <unk> <unk>"
    assert unknown_tokens(tok, ["a red circle"]).share == 0.0
    # A special token's text is read as the training targets read it: "<", "eos", ">", 3 unknown words of 4 tokens
    # (before: the EOS token, known: share 0)
    assert unknown_tokens(tok, ["a <eos>"]) == UnknownTokens(3 / 4, "a <eos>", "a <unk> <unk> <unk>")


def test_unknown_words_of_a_vlm_or_blip_name_its_own_option():
    """A tiny or world VLM (or BLIP) knows the world's words only: the refusal named clipcap.lm=data-tiny, a key
    model.kind=vlm does not read, as the fix (shown with `finecap models tiny qwen2_5_vl` and finecap train
    coco/mle_vlm on one's own captions). It names the backbone's own name key now; ClipCap keeps its advice."""
    from finecap.data.records import DataError, Record
    from finecap.train.setup import check_captions

    tok = world_tokenizer(["a", "red", "circle"])
    records = [Record(0, None, "train", ["a big red dog"])]
    for kind, key in (("vlm", "vlm.name=tiny:qwen2_5_vl"), ("blip", "blip.name=world-tiny")):
        cfg = load(None, [f"model.kind={kind}", key, "data.path=own.jsonl"])
        with pytest.raises(DataError) as e:
            check_captions(tok, records, cfg)
        said = str(e.value)
        assert said.startswith("own.jsonl: 50% of the training captions' tokens are unknown")  # big, dog: 2 of 4
        assert f"a pretrained model whose tokenizer has them ({kind}.name=...; {key} knows the world's words" in said
        assert "model.kind=clipcap clipcap.lm=data-tiny" in said and "vlm.name=...)" not in said
    with pytest.raises(DataError, match=r"captions: clipcap.lm=data-tiny \(a word-level GPT-2"):
        check_captions(tok, records, load(None, ["data.path=own.jsonl"]))


def test_caption_vocabulary_is_the_captions_words_most_frequent_first():
    assert caption_vocabulary(["The dog.", "the cat", "THE dog"]) == ["the", "dog", ".", "cat"]
    assert caption_vocabulary(["b a", "a b c"], max_words=2) == ["a", "b"]
    assert caption_vocabulary(["<unk> x"]) == ["<", ">", "unk", "x"]  # special tokens split apart, never clash


@pytest.mark.slow
def test_world_vocabulary_on_own_captions_is_refused_before_any_work(photos, tmp_path):
    code, _, err = run_cli(["train", "demo/mle", *photos["base"], "clipcap.lm=world-tiny", "--out",
                            str(tmp_path / "run")])  # fmt: skip
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("finecap: error: ") and err.count("error") == 1 and "Traceback" not in err, err
    assert "of the training captions' tokens are unknown to the captioner's tokenizer" in line
    assert "<unk>" in line and "clipcap.lm=data-tiny" in line and "data.max_unk_share=0.02" in line
    assert not (photos["root"] / "cache").exists() or not any((photos["root"] / "cache").rglob("*.safetensors"))
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_data_tiny_trains_on_own_captions_with_their_words(photos, tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli(["train", "demo/mle", *photos["base"], "clipcap.lm=data-tiny", "--out", str(run)])
    assert code == 0, err
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run / "checkpoints" / "best" / "model" / "lm")
    every = [c for caps in CAPTIONS.values() for c in caps]
    assert unknown_tokens(tok, every).share == 0.0
    assert "astronaut" in tok.get_vocab() and "mangoes" in tok.get_vocab()
    out = tmp_path / "c.json"
    code, _, err = run_cli(["caption", "--checkpoint", str(run), "--images", str(photos["folder"]), "--out", str(out)])
    assert code == 0, err
    words = {w for r in json.loads(out.read_text()) for w in r["caption"].split()}
    assert words <= set(tok.get_vocab())  # captions in the run's own words
    # a raised limit lets the world vocabulary through, as the option says
    cfg = load("demo/mle", [*photos["base"], "data.max_unk_share=1"])
    assert cfg.data.max_unk_share == 1.0
