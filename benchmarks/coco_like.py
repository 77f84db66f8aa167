"""Seeded COCO-like raw captions for benchmarks: a reference file and a results file in COCO format.

    .venv/bin/python benchmarks/coco_like.py --images 5000 --out /tmp/coco_like [--seed 0]

writes ``OUT/captions_test.json`` (``{"images": [{"id", "file_name"}], "annotations": [{"image_id", "id",
"caption"}]}``) and ``OUT/results.json`` (``[{"image_id", "caption"}]``).

What the text looks like (what makes real captions cost more than ``w123`` tokens):

- a vocabulary of ``--vocab`` (10,000) word types: 60 function words at the top ranks, then pronounceable made-up
  words; word frequencies are Zipfian (Zipf-Mandelbrot ``1 / (rank + 2.7)``, as word frequencies in English text);
- 8-20 words per reference, 8-14 per prediction; each image has 8 topic words (drawn by frequency) that its
  references and prediction share, so n-gram matches are as frequent as between real references;
- raw text: first letter capitalised (90% of captions), a final period (75%); per word: a comma after it (1.5%),
  possessive (``dog's``, 0.8%), hyphenated with the next word (``black-and``, 0.6%), a number instead (0.6%), a
  contraction instead (``isn't``, ``there's``, 0.3%), capitalised (1%), quoted (0.1%). About 35% of the captions then
  hold some punctuation other than the final period, 11% an apostrophe, 9% a number: somewhat more than COCO's
  human captions (a pessimistic mix for a tokenizer). 5 references per image.

The per-image choices are vectorised with numpy, so 200k images (1.2M captions) take a few seconds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

FUNCTION = [
    "a",
    "the",
    "of",
    "on",
    "in",
    "with",
    "and",
    "is",
    "an",
    "to",
    "at",
    "two",
    "are",
    "sitting",
    "standing",
    "next",
    "near",
    "some",
    "his",
    "her",
    "that",
    "there",
    "it",
    "three",
    "front",
    "top",
    "side",
    "while",
    "other",
    "large",
    "small",
    "white",
    "black",
    "red",
    "blue",
    "green",
    "young",
    "man",
    "woman",
    "people",
    "street",
    "table",
    "field",
    "water",
    "dog",
    "cat",
    "plate",
    "group",
    "room",
    "down",
    "up",
    "by",
    "for",
    "from",
    "under",
    "over",
    "behind",
    "looking",
    "holding",
]
CONTRACTIONS = ("isn't", "there's", "it's", "can't", "they're", "doesn't")


def _vocabulary(n: int, rng: np.random.Generator) -> list[str]:
    onsets = [
        "b",
        "c",
        "d",
        "f",
        "g",
        "h",
        "j",
        "k",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "w",
        "z",
        "br",
        "cr",
        "dr",
        "fl",
        "gr",
        "pl",
        "st",
        "tr",
        "sh",
        "ch",
        "th",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "oo", "ou"]
    codas = [""] * 6 + ["n", "r", "s", "t", "l", "m", "ng", "ck", "st"]
    words = list(FUNCTION)
    seen = set(words)
    while len(words) < n:
        k = int(rng.integers(1, 4))
        w = "".join(
            onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))] + codas[rng.integers(len(codas))]
            for _ in range(k)
        )
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def _zipf(n: int) -> np.ndarray:
    p = 1.0 / (np.arange(n) + 2.7)
    return p / p.sum()


def _captions(
    rng: np.random.Generator, words: list[str], topics: np.ndarray, img: np.ndarray, lo: int, hi: int
) -> list[str]:
    """One raw caption per entry of ``img`` (its image index), built from the image's ``topics`` row."""
    n_func, v = len(FUNCTION), len(words)
    lengths = rng.integers(lo, hi + 1, size=len(img))
    total = int(lengths.sum())
    cap_of = np.repeat(np.arange(len(img)), lengths)  # caption of each word slot
    u = rng.random(total)
    func = rng.choice(n_func, size=total, p=_zipf(n_func))
    topic = topics[img[cap_of], rng.integers(topics.shape[1], size=total)]
    free = rng.choice(v, size=total, p=_zipf(v))
    ids = np.where(u < 0.45, func, np.where(u < 0.8, topic, free))
    last = np.cumsum(lengths) - 1
    ids[last] = topic[last]  # captions end with a content word ("... on a surfboard.")
    deco = rng.random((total, 6))
    out, start = [], 0
    for length in lengths.tolist():
        toks = []
        for j in range(start, start + length):
            w = words[ids[j]]
            d = deco[j]
            if d[0] < 0.008:
                w += "'s"
            elif d[1] < 0.006 and j + 1 < start + length:
                w += "-" + words[ids[j + 1]]
            elif d[2] < 0.006:
                w = str(int(d[5] * 20) + 2)
            elif d[3] < 0.003:
                w = CONTRACTIONS[int(d[5] * len(CONTRACTIONS))]
            elif d[4] < 0.01:
                w = w.capitalize()
            if d[4] > 0.999:
                w = f'"{w}"'
            if d[3] > 0.985 and j + 1 < start + length:
                w += ","
            toks.append(w)
        start += length
        s = " ".join(toks)
        r = deco[start - 1, 5]
        if r < 0.9:
            s = s[0].upper() + s[1:]
        if deco[start - 1, 0] < 0.75:
            s = s.rstrip(",") + "."
        out.append(s)
    return out


def generate(n_images: int, seed: int = 0, n_refs: int = 5, vocab: int = 10_000):
    """``(references {image_id: [caption] * n_refs}, predictions {image_id: caption})`` of raw COCO-like text."""
    rng = np.random.default_rng(seed)
    words = _vocabulary(vocab, rng)
    content = rng.choice(np.arange(len(FUNCTION), vocab), size=(n_images, 8), p=_zipf(vocab - len(FUNCTION)))
    ref_img = np.repeat(np.arange(n_images), n_refs)
    refs_flat = _captions(rng, words, content, ref_img, 8, 20)
    preds = _captions(rng, words, content, np.arange(n_images), 8, 14)
    ids = [100_000 + i for i in range(n_images)]  # COCO-like ids, not 0..N-1
    refs = {i: refs_flat[k * n_refs : (k + 1) * n_refs] for k, i in enumerate(ids)}
    return refs, dict(zip(ids, preds))


def write_coco(out: str | Path, n_images: int, seed: int = 0) -> tuple[Path, Path]:
    """Write ``captions_test.json`` and ``results.json`` of :func:`generate` under ``out``; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    refs, preds = generate(n_images, seed)
    anns = [{"image_id": i, "id": 5 * k + j, "caption": c} for k, (i, caps) in enumerate(refs.items())
            for j, c in enumerate(caps)]  # fmt: skip
    coco = {"images": [{"id": i, "file_name": f"{i:012d}.jpg"} for i in refs], "annotations": anns}
    ref_path, res_path = out / "captions_test.json", out / "results.json"
    ref_path.write_text(json.dumps(coco))
    res_path.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in preds.items()]))
    return ref_path, res_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    for p in write_coco(args.out, args.images, args.seed):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
