"""Seeded caption sets for the METEOR differential tests (tests/metrics/test_meteor_jar.py): COCO-like captions of
real English words (so that the stem, synonym and paraphrase stages fire), and the stress cases of the METEOR
specification (empty captions, Unicode, Unicode spaces, tabs, contractions, abbreviations, Java hash collisions,
repetition, long captions, the pycocoevalcap protocol's ``|||`` and double spaces)."""

from __future__ import annotations

import gzip
import random
import zipfile
from pathlib import Path

Item = tuple[str, list[str]]  # (hypothesis, references)

WORDS = """a an the one two three several some many man men woman women person people guy boy boys girl girls child
children kid kids lady player players dog dogs puppy cat cats kitten horse horses cow cows sheep bird birds elephant
elephants giraffe giraffes zebra bear teddy train trains bus buses car cars truck street road sidewalk city building
buildings table tables plate plates food pizza sandwich cake donut banana bananas apple broccoli vegetables bowl cup
glass bottle kitchen room bathroom toilet sink bed couch chair tv laptop computer phone keyboard desk window door wall
field grass snow beach ocean water wave waves surfboard surfer surfing board skateboard skateboarder skiing skier skis
snowboard frisbee ball tennis racket baseball bat game sky kite kites umbrella clock tower sign stop light traffic
sitting sits sat standing stands stood walking walks walked riding rides rode holding holds held eating eats ate
playing plays played looking looks lying laying flying flies parked parking is are was were be being has have with on
in of at to near next by front top side behind under over inside outside down up while and or large big small little
huge tiny red blue white black green yellow brown orange pink gray grey young old new wooden metal open empty full
together other each its their his her it there this that these those very lots lot group bunch pair couple herd flock
piece slice""".split()  # noqa: SIM905 (a word list reads better as text)

PHRASES = [
    "in front of", "next to", "on top of", "a group of", "a couple of", "a pair of", "a lot of", "lots of", "close up",
    "a bunch of", "side by side", "in the middle of", "at the beach", "on the street", "each other", "in front",
    "a herd of", "a flock of", "a plate of", "a slice of", "on a", "of a", "is sitting", "are standing",
]  # fmt: skip

STRESS_PIECES = [
    # Unicode letters, marks, symbols and spaces; tabs and vertical tabs
    "café", "naïve", "Ärger", "Ωmega", "ЖУК", "жук", "東京", "😀", "e\u0301", "İstanbul", "straße", "\u00a0", "\u2009",
    "\u3000", "\t", "\x0b", "\u200b", "\u202f",
    # contractions, possessives, quotes and dashes
    "it's", "don't", "dogs'", "5's", "rock'n'roll", "‘quoted’", "“quote”", "''", "``", "--", "–", "—", "-",
    # abbreviations and non-breaking prefixes
    "U.S.", "e.g.", "i.e.", "Mr.", "Dr.", "No.", "No. 5", "pp. 12", "Art.", "a.m.", "etc.", "...", "x.", "1.5",
    # numbers and commas
    "5,300", "1,000", "3.14", ",", ";", ":", "!", "?", "(", ")", "[", "]", "$5", "100%", "#1", "@", "&", "/",
    # Java hash collisions: exact matches in the jar
    "as", "c5", "20s", "225", "Aa", "BB",
    # the protocol: pycocoevalcap removes ||| from the hypothesis only; double spaces
    "|||", "||", "|", "  ", "   ",
    # capitals
    "A", "The", "DOG", "Dog",
]  # fmt: skip


def caption(rng: random.Random, lo: int = 4, hi: int = 16) -> str:
    """A COCO-like caption: real words and frequent multi-word phrases."""
    out: list[str] = []
    n = rng.randint(lo, hi)
    while len(out) < n:
        out.extend(rng.choice(PHRASES).split() if rng.random() < 0.15 else [rng.choice(WORDS)])
    return " ".join(out)


def edited(rng: random.Random, text: str, ops: int) -> str:
    """``text`` with ``ops`` random word deletions, insertions and substitutions."""
    words = text.split()
    for _ in range(ops):
        k = rng.randrange(len(words) + 1)
        r = rng.random()
        if r < 0.3 and words:
            words.pop(min(k, len(words) - 1))
        elif r < 0.6:
            words.insert(k, rng.choice(WORDS))
        elif words:
            words[min(k, len(words) - 1)] = rng.choice(WORDS)
    return " ".join(words)


def coco_like(n: int, seed: int, refs: int = 5) -> list[Item]:
    """``n`` images: ``refs`` references each and a hypothesis, half of them edited from a reference."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        rs = [caption(rng) for _ in range(refs)]
        hyp = edited(rng, rng.choice(rs), rng.randint(0, 5)) if rng.random() < 0.5 else caption(rng)
        items.append((hyp, rs))
    return items


def _stress_caption(rng: random.Random, repetitive: bool) -> str:
    kind = rng.random()
    if kind < 0.06:
        return rng.choice(["", " ", "\t", ".", "|||", "a"])
    if repetitive and kind < 0.14:  # a phrase repeated
        unit = caption(rng, 1, 3)
        return " ".join([unit] * rng.randint(2, 8))
    if repetitive and kind < 0.2:  # long
        return caption(rng, 40, 100)
    words: list[str] = []
    for _ in range(rng.randint(1, 14)):
        words.append(rng.choice(STRESS_PIECES) if rng.random() < 0.35 else rng.choice(WORDS))
    sep = rng.choice([" ", " ", " ", "", "  "])
    text = sep.join(words)
    return text.capitalize() if rng.random() < 0.3 else text


def stress(n: int, seed: int, repetitive: bool = False) -> list[Item]:
    """``n`` images of the specification's stress cases, 1-5 references each; with ``repetitive``, a fifth of the
    captions are also long (40-100 words) or a short phrase repeated up to 8 times."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        rs = [_stress_caption(rng, repetitive) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.3:
            hyp = rng.choice(rs)
        elif rng.random() < 0.3 and rs[0].strip():
            hyp = edited(rng, rs[0], rng.randint(1, 4))
        else:
            hyp = _stress_caption(rng, repetitive)
        items.append((hyp, rs))
    return items


RAW_HUMAN: list[Item] = [
    ("A man riding a wave on top of a surfboard.", [
        "A surfer riding a large wave in the ocean.", "A man on a surfboard rides a wave.",
        "A person surfing on a big wave.", "Surfer in a wetsuit riding a breaking wave.",
        "A man is surfing in the ocean on a sunny day."]),
    ("Two giraffes standing next to each other in a field.", [
        "Two giraffes are standing in a grassy field.", "A pair of giraffes next to a tree.",
        "Giraffes standing together on the savannah.", "Two tall giraffes eating leaves from a tree.",
        "A couple of giraffes in an enclosure at the zoo."]),
    ("A plate of food with broccoli and rice.", [
        "A white plate topped with chicken, rice and broccoli.", "Broccoli and rice on a dinner plate.",
        "A meal of meat, vegetables and rice.", "A plate holds a healthy meal with broccoli.",
        "Some food is sitting on a plate on the table."]),
    ("A cat laying on a laptop keyboard.", [
        "A cat is sleeping on top of a laptop.", "An orange cat lying across a computer keyboard.",
        "The kitten sits on the open laptop.", "A cat resting on a keyboard next to a mouse.",
        "A lazy cat naps on someone's laptop."]),
    ("A red double decker bus driving down a street.", [
        "A double-decker bus travels down the city street.", "A red bus is parked by the sidewalk.",
        "The big red bus drives past some buildings.", "A tour bus on a busy road in London.",
        "A red two-story bus driving on the road."]),
    ("A group of people flying kites on the beach.", [
        "People are flying kites at the beach.", "Several kites fly over a sandy beach.",
        "A crowd of people on the shore with colorful kites.", "Kids fly kites by the ocean.",
        "Many people gather on a beach to fly kites."]),
    ("A baseball player swinging a bat at a ball.", [
        "A batter swings at the pitch during a game.", "A baseball player is about to hit the ball.",
        "The batter takes a swing while the catcher waits.", "A man holding a bat at home plate.",
        "A player in a uniform swings his bat."]),
    ("A kitchen with a stove, a sink and a refrigerator.", [
        "A small kitchen with white appliances.", "A clean kitchen has a sink and an oven.",
        "The kitchen contains a fridge, a stove and cabinets.", "A kitchen with wooden cabinets and a sink.",
        "An empty kitchen in a house with a refrigerator."]),
    ("A dog catching a frisbee in the park.", [
        "A dog jumps to catch a frisbee.", "A brown dog leaping in the air for a disc.",
        "The dog is playing frisbee on the grass.", "A dog running after a flying frisbee.",
        "A puppy catches a frisbee in its mouth."]),
    ("A woman holding an umbrella in the rain.", [
        "A woman walks down the street with an umbrella.", "A lady holding a black umbrella on a rainy day.",
        "A person with an umbrella standing in the rain.", "A woman under an umbrella on a wet sidewalk.",
        "Someone is carrying an umbrella while it rains."]),
    ("An elephant walking through the tall grass.", [
        "A large elephant walks in a grassy field.", "An elephant standing in the brush.",
        "A gray elephant roams the savanna.", "The elephant is walking near some trees.",
        "A big elephant in the wild eating grass."]),
    ("A young boy brushing his teeth in the bathroom.", [
        "A little boy brushes his teeth at the sink.", "A child with a toothbrush in his mouth.",
        "A kid is brushing his teeth before bed.", "A boy standing in a bathroom with a toothbrush.",
        "A young child cleaning his teeth."]),
]  # fmt: skip
"""Human-style raw captions (capitals, punctuation, hyphens, possessives), 5 references each, written for these
tests in the manner of COCO's; the tests tokenise them with the PTB tokenizer as ``COCOEvalCap`` does."""


HANDPICKED: list[Item] = [
    # empty segments; Java hash collisions (exact matches in the jar); identical segments (only the exact stage runs)
    ("", [""]), ("", ["a dog"]), ("a dog", [""]), ("as", ["c5"]), ("20s", ["225"]),
    ("the cat sat", ["the cat sat"]), ("a dog", ["a dog", "a dog"]),
    # the normaliser: contractions, abbreviations, prefixes, dashes, quotes, Unicode spaces and letters, the protocol
    ("It's the U.S. cat, e.g. Mr. Smith's dog--and \u201cquotes\u201d.", ["the us cat e.g. mr. smith dog and quotes"]),
    ("a\u00a0dog\tand\u2009a cat", ["a dog and a cat"]), ("a ||| b", ["c ||| d", "e"]),
    ("caf\u00e9 na\u00efve \u0416\u0423\u041a", ["cafe naive \u0436\u0443\u043a"]),
    ("no. 5 and No. 5 and No. x", ["no 5"]),
    # stems (the pinned Snowball: added -> ad, evening -> even)
    ("dogs", ["dog"]), ("x dog", ["x dogs"]), ("added", ["ad"]), ("evening news", ["even news"]),
    # the search: repeated words, ties, chunks ending, distance on the parent, paraphrases of several words
    ("a a a a a a a a", ["a a a a"]), ("the dog the dog the dog", ["a dog the dog"]), ("a", ["a a"]),
    ("dogs", ["dog dog"]), ("of a", ["a of a of"]), ("b b a", ["x b a"]), ("a a z", ["x y a"]),
    ("very", ["a lot of"]), ("very", ["x a lot of"]), ("cars on", ["car on"]), ("near to", ["next to"]),
    ("a man surfing on a wave", ["a man riding a wave on a surfboard", "a surfer on a wave"]),
    ("a dog running on grass", ["two dogs playing in the grass", "dogs running on a lawn"]),
]  # fmt: skip
"""Small cases worth naming: empty segments, collisions, identical segments, normaliser examples, stems, and the
search's rules (ties, chunks, distances) on minimal inputs."""


def fake_meteor_jar(folder: Path, pairs: list[tuple[str, str]]) -> Path:
    """A fake METEOR jar in ``folder`` (made if missing) holding the four data files METEOR reads, and beside it
    ``data/paraphrase-en.gz``: a paraphrase table of ``pairs`` (phrase, paraphrase), each with probability 0.5."""
    folder.mkdir(parents=True, exist_ok=True)
    jar = folder / "meteor-1.5.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("function/english.words", "a\nthe\n")
        z.writestr("nonbreaking/english.prefixes", "Mr\n")
        z.writestr("synonym/english.synsets", "dog\n1\nhound\n1\n")
        z.writestr("synonym/english.exceptions", "be\nwas were\n")
    table = "".join(f"0.5\n{a}\n{b}\n" for a, b in pairs)
    (folder / "data").mkdir()
    (folder / "data" / "paraphrase-en.gz").write_bytes(gzip.compress(table.encode()))
    return jar
