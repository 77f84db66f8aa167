"""The differential harness: finecap's Python METEOR against the jar pycocoevalcap ships, compared exactly.

For every generated caption set, each segment's 23 statistics (what the jar's ``SCORE`` line returns, for the best
of the references), each segment score and the corpus score (the jar's ``EVAL``) must be equal with ``==``: no
tolerance. The jar runs as pycocoevalcap runs it (:class:`finecap.metrics.meteor.jar.JarProcess`, one JVM for the
module), and pycocoevalcap's own ``Meteor`` class is compared through the public API.

Sets: COCO-like captions of real English words (5 references each, half the hypotheses edited from a reference),
the specification's stress cases (empty captions, Unicode, Unicode spaces, tabs, contractions, abbreviations,
Java hash collisions, punctuation, the protocol's ``|||`` and double spaces), repetitive and long captions (a phrase
repeated up to 8 times, 40-100 words: where the alignment search has the most equal paths), hand-picked cases, and
human-style raw captions through the PTB tokenizer: about 25 s with the JVM's start, so the whole module is marked
slow (``make test`` runs it, plain ``pytest`` leaves it out).

Its larger tests add bigger sets (55,000 caption sets, about a minute) and compare the alignment search with the
jar's: the matches it keeps (``-writeAlignments``) on thousands of caption pairs at beam sizes 1 to 40 (``-x``),
where small beams show the order in which the search ranks its paths.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from finecap.metrics.meteor import meteor_per_item, meteor_scorer, meteor_unavailable_reason
from finecap.metrics.meteor.align import align
from finecap.metrics.meteor.jar import JarProcess
from finecap.metrics.meteor.match import Match, candidates
from finecap.metrics.meteor.resources import find_meteor_jar
from finecap.metrics.meteor.score import corpus_score, segment_score
from helpers.meteor_cases import HANDPICKED, RAW_HUMAN, Item, coco_like, stress

pytestmark = [
    pytest.mark.slow,  # the reference jar runs in a Java process: seconds per comparison
    pytest.mark.java,
    pytest.mark.skipif(shutil.which("java") is None, reason="java not on PATH: the jar is the reference here"),
    pytest.mark.skipif(
        meteor_unavailable_reason() is not None, reason=f"METEOR data missing: {meteor_unavailable_reason()}"
    ),
]


@pytest.fixture(scope="module")
def jar():
    with JarProcess() as proc:
        yield proc


def _differences(jar: JarProcess, items: list[Item]) -> list[tuple[Item, list[float], list[float]]]:
    """Items whose statistics or segment score differ, after checking the corpus score is equal when none do."""
    hyps, refs = [h for h, _ in items], [r for _, r in items]
    ours = meteor_scorer().score_all(hyps, refs, processes=1)
    theirs_lines = jar.statistics(hyps, refs)
    seg, corpus = jar.evaluate(theirs_lines)
    theirs = [[float(x) for x in line.split()] for line in theirs_lines]
    out = [
        (item, o, t) for item, o, t, s in zip(items, ours, theirs, seg, strict=True) if o != t or segment_score(o) != s
    ]
    if not out:
        assert corpus_score(ours) == corpus
    return out


def _assert_equal(jar: JarProcess, items: list[Item]) -> None:
    diff = _differences(jar, items)
    assert not diff, f"{len(diff)} of {len(items)} caption sets differ from the jar, e.g. {diff[:3]}"


def test_handpicked_cases(jar):
    _assert_equal(jar, HANDPICKED)


def test_coco_like_captions(jar):
    _assert_equal(jar, coco_like(3000, seed=0))


def test_stress_cases(jar):
    _assert_equal(jar, stress(3000, seed=1))


def test_repetitive_and_long_captions(jar):
    _assert_equal(jar, stress(1000, seed=2, repetitive=True))


def test_public_api_equals_pycocoevalcap_meteor():
    """``meteor_per_item`` against pycocoevalcap's own ``Meteor().compute_score`` (its JVM, its EVAL)."""
    from pycocoevalcap.meteor.meteor import Meteor

    items = coco_like(300, seed=3) + HANDPICKED
    preds = {k: h for k, (h, _) in enumerate(items)}
    refs = {k: r for k, (_, r) in enumerate(items)}
    reference = Meteor()
    try:
        score, scores = reference.compute_score(refs, {k: [h] for k, h in preds.items()})
    finally:
        del reference
    corpus, per = meteor_per_item(preds, refs)
    assert corpus["METEOR"] == score
    assert [per[k]["METEOR"] for k in preds] == scores


def test_human_style_captions_through_the_ptb_tokenizer(jar):
    from finecap.metrics.ptb_tokenize import tokenize_all

    items = list(RAW_HUMAN)
    items += [(h, refs[::-1]) for h, refs in RAW_HUMAN]  # the same with the references in another order
    items += [(refs[0], [h, *refs[1:]]) for h, refs in RAW_HUMAN]  # a reference as the hypothesis
    flat = tokenize_all([t for h, refs in items for t in (h, *refs)])
    tokenised, k = [], 0
    for _, refs in items:
        tokenised.append((flat[k], flat[k + 1 : k + 1 + len(refs)]))
        k += 1 + len(refs)
    _assert_equal(jar, tokenised)
    _assert_equal(jar, items)  # raw, as typed


def test_coco_like_captions_large(jar):
    _assert_equal(jar, coco_like(20000, seed=10))
    _assert_equal(jar, coco_like(5000, seed=11, refs=1))


def test_stress_cases_large(jar):
    _assert_equal(jar, stress(20000, seed=12))


def test_repetitive_captions_large(jar):
    _assert_equal(jar, stress(10000, seed=13, repetitive=True))


def _jar_alignments(pairs: list[tuple[str, str]], beam: int, folder) -> list[list[Match]]:
    """The matches the jar keeps for each ``(hypothesis, reference)`` (plain-text mode, ``-writeAlignments``), as
    ``(j, ref_len, i, hyp_len, stage)`` sorted, with beam size ``beam``."""
    test, ref, prefix = folder / "test.txt", folder / "ref.txt", folder / f"beam{beam}"
    test.write_text("".join(h + "\n" for h, _ in pairs), encoding="utf-8")
    ref.write_text("".join(r + "\n" for _, r in pairs), encoding="utf-8")
    jar = find_meteor_jar()
    cmd = ["java", "-Xmx2G", "-jar", str(jar), str(test), str(ref), "-l", "en", "-norm", "-x", str(beam)]
    subprocess.run([*cmd, "-writeAlignments", "-f", str(prefix)], check=True, capture_output=True, cwd=folder)
    out: list[list[Match]] = []
    # per segment: "Alignment <n> <scores>", the two lines, a header, then "ref_start:len hyp_start:len stage score"
    for block in prefix.with_name(prefix.name + "-align.out").read_text(encoding="utf-8").split("Alignment\t")[1:]:
        matches = []
        for line in block.split("\n")[4:]:
            fields = line.split()
            if len(fields) == 4 and ":" in fields[0]:
                (j, rl), (i, hl) = (map(int, f.split(":")) for f in fields[:2])
                matches.append((j, rl, i, hl, int(fields[2])))
        out.append(sorted(matches))
    return out


def test_alignment_search_equals_the_jars_at_every_beam_size(tmp_path):
    """The matches kept, not only the statistics: at beam 1 and 2 nearly every caption pair needs many choices
    between equal paths, each decided by the ranking's order (chunks counted once they have ended, children before
    the skip, the distance on the parent), so this pins the search beyond what the default beam shows."""
    scorer = meteor_scorer()
    pairs = []
    for hyp, refs in coco_like(600, seed=20) + stress(400, seed=21, repetitive=True):
        h = " ".join(scorer.words(hyp))
        # normalised words joined by spaces, so that the jar reads the same words again (the plain-text files hold
        # one segment a line: segments the normaliser would change again, or empty ones, are left out)
        pairs += [(h, r) for r in (" ".join(scorer.words(r)) for r in refs) if h and r]
    pairs = [
        (h, r) for h, r in dict.fromkeys(pairs) if " ".join(scorer.words(h)) == h and " ".join(scorer.words(r)) == r
    ]
    assert len(pairs) > 3000
    scorer.prepare(t for p in pairs for t in p)
    cands = [(candidates(scorer.segment(h), scorer.segment(r)), len(scorer.words(h))) for h, r in pairs]
    for beam in (1, 2, 5, 40):
        theirs = _jar_alignments(pairs, beam, tmp_path)
        assert len(theirs) == len(pairs)
        differ = [p for p, (c, n), t in zip(pairs, cands, theirs, strict=True) if align(c, n, beam=beam) != t]
        assert not differ, f"beam {beam}: {len(differ)} of {len(pairs)} pairs aligned otherwise, e.g. {differ[:3]}"
