"""Python PTB tokenizer: hand-checked outputs (from the Java tokenizer) and equality with pycocoevalcap's Java one."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from finecap.metrics.ptb_tokenize import (
    _ABBREV,
    _FAST,
    PUNCTUATIONS,
    _batch_lines,
    _expand,
    _keeps_period,
    _Text,
    ptb_tokenize,
    tokenize,
    tokenize_all,
    tokens,
)
from helpers.scripts import benchmark

ROOT = Path(__file__).resolve().parents[2]


def coco_like_captions(n_images: int, seed: int) -> list[str]:
    """Raw COCO-like captions of the benchmark generator (benchmarks/coco_like.py), references then predictions."""
    refs, preds = benchmark("coco_like").generate(n_images, seed)
    return [c for caps in refs.values() for c in caps] + list(preds.values())


# (input, what pycocoevalcap's PTBTokenizer (CoreNLP 3.4.1 + punctuation removal) returned for it)
EXPECTED = [
    ("A man riding a wave on top of a surfboard.", "a man riding a wave on top of a surfboard"),
    (
        "The man's dog can't swim, won't eat and doesn't care.",
        "the man 's dog ca n't swim wo n't eat and does n't care",
    ),
    (
        "I'm sure they're here; we've seen it. I'll go, I'd say.",
        "i 'm sure they 're here we 've seen it i 'll go i 'd say",
    ),
    ("A \"quoted\" word and 'single quoted' words.", "a quoted word and single quoted words"),
    (
        "Mr. Smith and Dr. Who on St. Patrick's day in the U.S. etc.",
        "mr. smith and dr. who on st. patrick 's day in the u.s. etc.",
    ),
    (
        "A black-and-white photo -- with (parentheses) [brackets] {braces}.",
        "a black-and-white photo with -lrb- parentheses -rrb- -lsb- brackets -rsb- -lcb- braces -rcb-",
    ),
    ("Cost $5.50, 1,000 people, 3.5 miles and 10:30 am!", "cost $ 5.50 1,000 people 3.5 miles and 10:30 am"),
    ("A man/woman with a cell-phone... wait? yes!", "a man/woman with a cell-phone wait yes"),
    ("gonna gotta wanna cannot lemme", "gon na got ta wan na can not lem me"),
    ("The dogs' toys & cats' toys @ home #1 50% off *star*", "the dogs toys & cats toys @ home # 1 50 % off * star *"),
    ("Two people    standing   near   a   bus.  ", "two people standing near a bus"),
    ("Is this a  test?It is.A man", "is this a test?it is.a man"),
    ("A 2 1/2 year old", "a 2\xa01/2 year old"),
    ("y'all o'clock rock'n'roll 'tis", "y' all o'clock rock 'n' roll 't is"),
    ("The '90s and 90's and 1950s", "the '90s and 90 's and 1950s"),
    ("a sign that says no. 5", "a sign that says no. 5"),
    ("the sign says no.", "the sign says no"),
    ("plan b.", "plan b."),
    ("plan b .", "plan b"),  # a period apart from the letter: its own token (checked with the jar)
    ("on St .", "on st"),
    ("wait!!! what?! --dash-- a --- b", "wait !!! what ?! dash a b"),
    ("don\u2019t \u201cquote\u201d \u2018single\u2019 it\u2014is a\u2026", "do n't quote single it is a"),
    ("IT'S A DOG'S LIFE", "it 's a dog 's life"),
    ("a :) smiley (^_^)", "a :-rrb- smiley -lrb-^_^-rrb-"),
    ("email a@b.com or www.google.com", "email a@b.com or www.google.com"),
    ("", ""),
    ("...", ""),
]


@pytest.mark.parametrize(("text", "expected"), EXPECTED)
def test_hand_checked_outputs(text, expected):
    assert tokenize(text) == expected


def test_raw_tokens_keep_ptb_escapes():
    # before lower-casing and punctuation removal
    assert tokens('He said "hi" (twice).') == ["He", "said", "``", "hi", "''", "-LRB-", "twice", "-RRB-", "."]
    assert "-LRB-" in PUNCTUATIONS and "-lrb-" not in PUNCTUATIONS  # why brackets survive in pycocoevalcap


def test_ptb_tokenize_mapping_accepts_strings_and_coco_dicts():
    out = ptb_tokenize({1: ["A Dog."], "x": [{"caption": "Two cats, sleeping."}, {"caption": ""}]})
    assert out == {1: ["a dog"], "x": ["two cats sleeping", ""]}
    with pytest.raises(TypeError, match=r"captions\[1\]"):
        ptb_tokenize({1: "a dog"})


def caption_like(n: int, seed: int) -> list[str]:
    """Seeded caption-like sentences mixing the features the tokenizer must get right."""
    rng = random.Random(seed)
    dets = ["a", "the", "two", "an old", "some", "this", "my", "three small"]
    adjs = ["red", "large", "black-and-white", "wooden", "stainless-steel", "old-fashioned", "3-year-old", "grey"]
    nouns = ["man", "woman", "dog", "cat", "bus", "pizza", "t-shirt", "kitchen", "giraffe", "hot dog", "x-ray"]
    verbs = ["sitting", "standing", "holding", "eating", "riding", "walking", "parked"]
    preps = ["on", "in", "next to", "near", "under", "with", "in front of"]
    extras = ["it's", "there's", "isn't", "can't", "won't", "they're", "we've", "I'm", "you'll", "he'd", "let's",
              "cannot", "gonna", "o'clock", "McDonald's", "O'Brien"]  # fmt: skip
    nums = ["2", "10", "3.5", "1,000", "12:30", "1/2", "2nd", "1950s", "'90s", "4x4", "10am", "3 1/2", "$5", "50%",
            "#1", "1950's", "-5", "0.5"]  # fmt: skip
    abbrs = ["St.", "Mr.", "Dr.", "U.S.", "a.m.", "p.m.", "etc.", "vs.", "Jr.", "e.g.", "No. 5", "Mt."]
    syms = ["&", "and/or", "w/", "/", "+", "=", "*", "@", "~", "--", "-", " - ", "\u2014", "...", ";", ":", "!", "?",
            "?!", "..", "(", ")", "[", "]", "{", "}", "<", ">"]  # fmt: skip
    out = []
    for _ in range(n):
        words = [rng.choice(dets), rng.choice(adjs), rng.choice(nouns)]
        if rng.random() < 0.4:
            words[-1] += rng.choice(["'s", "s'", "\u2019s"])
            words.append(rng.choice(nouns))
        words += [rng.choice(verbs), rng.choice(preps), rng.choice(dets), rng.choice(nouns)]
        for pool, p in [(extras, 0.4), (nums, 0.4), (abbrs, 0.25), (syms, 0.4)]:
            while rng.random() < p:
                words.insert(rng.randrange(len(words) + 1), rng.choice(pool))
                p /= 2
        if rng.random() < 0.25:
            i = rng.randrange(len(words))
            q = rng.choice(['"', "'", "\u201c", "\u2018"])
            words[i] = q + words[i] + {"\u201c": "\u201d", "\u2018": "\u2019"}.get(q, q)
        if rng.random() < 0.2:
            i = rng.randrange(len(words))
            j = min(len(words), i + rng.randint(1, 3))
            sp = rng.choice(["", " "])
            words[i] = "(" + sp + words[i]
            words[j - 1] = words[j - 1] + sp + ")"
        s = ""
        for w in words:
            s = w if not s else s + rng.choice([" "] * 12 + ["  ", ", ", " , ", ","]) + w
        r = rng.random()
        s = s[0].upper() + s[1:] if r < 0.5 else s.upper() if r < 0.56 else s.title() if r < 0.6 else s
        out.append(s + rng.choice([".", ".", ".", "", "", " .", "!", "?", "...", ". ", " ", ".."]))
    return out


def test_fast_path_equals_lexer():
    # plain sentences take a shortcut; it must give what the full lexer gives
    simple = [s.replace("'", "").replace("-", " ") for s in caption_like(300, seed=11)]
    simple = ["".join(ch for ch in s if ch.isalpha() or ch in " ,.") for s in simple]
    simple += ["A man riding a wave.", "plan b.", "on St.", "a dog , a cat", "Cannot stop", "the  dog .", " a, b."]
    # ... and possessives, hyphenated words, integers, commas with spaces around (most raw COCO captions)
    simple += ["A dog's toy, a black-and-white cat's bowl , 2 cups.", "IT'S 10 O-CLOCK", "the U.S. flag", "x a.",
               "it's a dog's life", "the cats's bed .", "x-ray 7 , 12", "A man on St.", "cannot-stop 5"]  # fmt: skip
    simple += [c for c in coco_like_captions(100, seed=5) if _FAST.fullmatch(c)]
    fast = [c for c in simple if _FAST.fullmatch(c)]
    assert len(fast) > 400
    for s in simple:
        lexed = " ".join(t for t in (w.lower() for w in tokens(s)) if t not in PUNCTUATIONS)
        assert tokenize(s) == lexed, s


# Lines whose end Java reads together with the start of the next line, and what it returned for the first line.
NEXT_LINE = [
    (["x a.", "The bar"], "x a"),
    (["x a. ", "The bar"], "x a"),
    (["x A.", "A\tbar"], "x a"),
    (["x a.", " The bar"], "x a"),
    (["x a.", "Mr. bar"], "x a"),
    (["x a.", "The", "foo"], "x a"),
    (["x a.", "The"], "x a."),
    (["x a.", "the bar"], "x a."),
    (["x a.", "However, bar"], "x a."),
    (["x a.", "Foo bar"], "x a."),
    (["says no.", "5 dogs"], "says no."),
    (["says No.", "5"], "says no."),
    (["says no.", " 5 dogs"], "says no"),
    (["says nos.", "5 dogs"], "says nos."),
    (["dogs 7.", "5 dogs"], "dogs 7"),
    (["the U.S.", "The bar"], "the u.s."),
    (["on st.", "The bar"], "on st."),
]


@pytest.mark.parametrize(("lines", "first"), NEXT_LINE)
def test_next_line_effects_hand_checked(lines, first):
    assert tokenize_all(lines)[0] == first
    assert ptb_tokenize({0: lines})[0][0] == first


REALISTIC = [
    "A man riding a wave on top of a surfboard.",
    "A couple of people that are standing in the grass.",
    "a kitchen with a stove , a sink , and a refrigerator",
    "Two giraffes standing next to each other in a field.",
    "A plate of food with broccoli, meat and potatoes.",
    "The bathroom has a toilet and a sink .",
    "A man in a black shirt is playing a Wii game.",
    "a black and white photo of a man on a motorcycle",
    "A red double-decker bus driving down the street.",
    "Someone is holding a hot dog with mustard & ketchup.",
    "An airplane flying in the sky over a city's skyline.",
    'A street sign for "Main St." and "5th Ave."',
    'A sign that says "STOP" on a pole',
    "Two zebras grazing in a field; one is looking up.",
    "A boy is swinging a bat at a ball...",
    "A clock tower with a clock on it's side.",
    "The man is wearing a tie and glasses (and a hat).",
    "A woman holding an umbrella in the rain!",
    "Is that a giraffe?",
    "A close-up of a donut with sprinkles",
    "A teddy bear sitting on a bed w/ pillows",
    "A young boy's birthday cake with 7 candles.",
    "People at a farmer's market buying fruits and vegetables.",
    "A train pulling into the station at 3:45 p.m.",
    "A woman sits at a table with a laptop, papers, etc.",
    "A skateboarder doing a trick -- in the air",
    "Pizza with pepperoni & olives on a plate",
    "A baseball player swinging at a pitch ... ",
    "There's a dog that's laying on the couch",
    "A laptop, keyboard and mouse on a desk",
    "This is an image of a NYC street",
    "The U.S. flag flying over a building",
    "A sign for the Washington D.C. metro",
    "A 1950's style diner with a jukebox",
    "A tennis player at the U.S. Open.",
    "A kid's toy-box full of toys: cars, trucks, and blocks.",
    "Two dogs  playing with a frisbee at the park",
    "The cat isn't happy about the bath",
    "A 3-year-old girl holding a 1/2 eaten sandwich",
    "A sign reads 'No Parking' next to a fire hydrant.",
]


@pytest.mark.java
@pytest.mark.skipif(shutil.which("java") is None, reason="java not on PATH: pycocoevalcap's PTBTokenizer needs Java")
def test_equals_java_ptb_tokenizer():
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    sentences = caption_like(500, seed=0) + REALISTIC + [t for t, _ in EXPECTED if t]
    java = PTBTokenizer().tokenize({i: [{"caption": s}] for i, s in enumerate(sentences)})
    diffs = [(s, java[i][0], tokenize(s)) for i, s in enumerate(sentences) if java[i][0] != tokenize(s)]
    assert diffs == []


@pytest.mark.java
@pytest.mark.skipif(shutil.which("java") is None, reason="java not on PATH: pycocoevalcap's PTBTokenizer needs Java")
def test_batch_equals_java_ptb_tokenizer_with_line_context():
    # one batch, as pycocoevalcap tokenises a whole reference set: the generator's raw COCO-like captions, the
    # caption-like sentences and the next-line cases, shuffled so that every kind of caption follows every other
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    rng = random.Random(1)
    sentences = coco_like_captions(150, seed=7) + caption_like(300, seed=2) + REALISTIC
    sentences += [line for lines, _ in NEXT_LINE for line in lines]
    rng.shuffle(sentences)
    captions = {i: [{"caption": s} for s in sentences[i : i + 5]] for i in range(0, len(sentences), 5)}
    java = PTBTokenizer().tokenize(captions)
    ours = ptb_tokenize(captions)
    diffs = [
        (c["caption"], j, o) for i in captions for c, j, o in zip(captions[i], java[i], ours[i], strict=True) if j != o
    ]
    assert diffs == []


# --------------------------------------------------------------------------------------------------------------------
# tokenize_all's batch grammar (most captions tokenised at once, the others one by one)
# --------------------------------------------------------------------------------------------------------------------


def batch_like(n: int, seed: int, near: bool = False) -> list[str]:
    """Seeded lines at the edges of tokenize_all's batch grammar: contractions in every case, double quotes, tabs,
    commas and periods with any spacing, hyphenated words with contractions, digits next to letters, final
    abbreviations and single letters in every case, cannot / gonna inside words, non-ASCII text, blank lines.
    ``near``: only the separators, contractions and endings of the grammar (most lines then are in it)."""
    rng = random.Random(seed)
    words = ["a", "dog", "The", "cat", "red", "black-and-white", "x-ray", "t-shirt", "man", "St", "b", "I", "no",
             "Mr", "etc", "Ark", "ark", "co", "mass", "Mass", "u", "wash", "NYC", "it", "is", "DOG", "Dog",
             "pro-choice", "cannot", "Gonna", "scannot", "tinned", "gotta", "5", "12", "2nd", "3-year", "o", "nos",
             "prop", "don", "can", "won", "Cmdr", "mfg", "vs", "Bancorp"]  # fmt: skip
    suffixes = ["'s", "'S", "'d", "'D", "'m", "'M", "'re", "'RE", "'Re", "'ve", "'VE", "'ll", "'LL", "n't", "N'T",
                "n'T", "'", "s'", "'t", "'em", "'all", "'n", "'90s"]  # fmt: skip
    seps = [" "] * 10 + ["  ", "\t", ", ", " , ", ",", " ,", ",  ", ' "', '" ', ' " ', "-", " - ", "--", ". ",
                         "; ", "\u00a0", " \u2019", "'", " '"]  # fmt: skip
    ends = ["", ".", " .", ". ", "  ", ".  ", "..", "!", "?", '."', '".', "\t", " ", ",", "-", "'", '"']
    if near:
        suffixes, seps, ends = suffixes[:16], seps[:18], ends[:6] + ['".', "\t", " "]
    out = []
    for _ in range(n):
        toks = []
        for _ in range(rng.randint(1, 9)):
            w = rng.choice(words)
            if rng.random() < 0.25:
                w += rng.choice(suffixes)
            if rng.random() < 0.08:
                w = '"' + w + '"'
            if rng.random() < 0.02 and not near:
                w = rng.choice(["caf\u00e9", "na\u00efve", "\u201cquote\u201d", "don\u2019t"])
            toks.append(w)
        s = toks[0] + "".join(rng.choice(seps) + t for t in toks[1:])
        s = rng.choice(["", "", "", " ", "  ", '"', "\t"]) + s + rng.choice(ends)
        if rng.random() < 0.02:
            s = rng.choice(["", " ", ".", ",", '""', "  .  "])
        out.append(s)
    return out


def lexed(text: str) -> str:
    """The full lexer's answer for one line (no shortcut): lower-cased tokens without punctuation."""
    return " ".join(t for t in (w.lower() for w in tokens(text)) if t not in PUNCTUATIONS)


def test_batch_equals_the_lexer_line_by_line():
    # every line followed by "x", which starts no sentence: no line's end depends on the next one here
    lines = (
        batch_like(3000, seed=4)
        + batch_like(2000, seed=8, near=True)
        + caption_like(500, seed=9)
        + coco_like_captions(200, seed=5)
        + REALISTIC
    )
    lines += [t for t, _ in EXPECTED] + ["a, b", "cat's", "isn't", "I'M", "YOU'LL", "a-b's c", "a-b c's", "b'll"]
    batch = tokenize_all([y for line in lines for y in (line, "x")])[::2]
    diffs = [(line, lexed(line), got) for line, got in zip(lines, batch, strict=True) if got != lexed(line)]
    assert diffs == []
    assert batch == [tokenize(line) for line in lines]  # the one-caption function agrees


def test_batch_keeps_next_line_effects_and_line_breaks():
    for lines, first in NEXT_LINE:  # in the middle of a batch, after a line of the batch grammar
        assert tokenize_all(["A dog.", *lines])[1] == first
    # a caption holding a line break: whitespace (pycocoevalcap would split it into two lines)
    assert tokenize_all(["A dog\non a mat.", "The cat."]) == ["a dog on a mat", "the cat"]
    assert tokenize_all([]) == []


def test_final_abbreviations_are_those_of_keeps_period():
    # the batch grammar tests a final word against the expanded abbreviation list; it must be _keeps_period's
    words = _expand(_ABBREV)
    assert {"jan", "sept", "kan", "kans", "cmdr", "comdr", "mfg", "mtg", "st", "ste", "etc", "bancorp"} <= set(words)
    variants = {v for w in words for v in (w, w.upper(), w.capitalize())}
    variants |= {"Ark", "ark", "ARK", "Ill", "ill", "Mass", "mass", "Pa", "pa", "La", "Tex", "Del", "Wash", "b", "B",
                 "table", "stop", "co", "cos", "corp", "no", "nos", "prop", "abcdefg"}  # fmt: skip
    lines = [f"a {w}." for w in sorted(variants)]
    batch = tokenize_all([y for line in lines for y in (line, "x")])[::2]
    for w, got in zip(sorted(variants), batch, strict=True):
        assert got.endswith(".") == _keeps_period(w + "."), w


@pytest.mark.java
@pytest.mark.skipif(shutil.which("java") is None, reason="java not on PATH: pycocoevalcap's PTBTokenizer needs Java")
def test_batch_grammar_edges_equal_java_ptb_tokenizer():
    # One batch of edge lines, as pycocoevalcap tokenises a reference set; compared on the lines the batch grammar
    # takes (the others go to the lexer, compared with Java above and equal to the batch on every line below).
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    lines = batch_like(1500, seed=3, near=True) + coco_like_captions(60, seed=11)
    random.Random(0).shuffle(lines)
    _, outside = _batch_lines(_Text(lines, "\n".join(lines)))
    assert 0.4 < 1 - outside.mean() < 0.95  # many lines in the grammar, many not
    java = PTBTokenizer().tokenize({0: [{"caption": s} for s in lines]})[0]
    ours = tokenize_all(lines)
    diffs = [(s, java[k], ours[k]) for k, s in enumerate(lines) if not outside[k] and java[k] != ours[k]]
    assert diffs == []
