"""METEOR in Python: hand-checkable pieces (normaliser, Java hash, search weights, scores), the stemmer pin, the data
read from pycocoevalcap and its cache, availability messages, and METEOR with no Java at all. SPICE's availability
messages too. The differential tests against the jar are in test_meteor_jar.py."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from finecap.metrics.meteor import (
    METEOR_ENV,
    MetricUnavailable,
    find_meteor_jar,
    meteor,
    meteor_per_item,
    meteor_scorer,
    meteor_unavailable_reason,
)
from finecap.metrics.meteor import resources as R
from finecap.metrics.meteor.align import align, count_chunks, fixed_positions
from finecap.metrics.meteor.inputs import segment_fields
from finecap.metrics.meteor.match import EXACT, PARAPHRASE, STEM, SYNONYM, java_hash, synonym_sets
from finecap.metrics.meteor.normalize import Normalizer, java_lower, java_trim, parse_prefixes
from finecap.metrics.meteor.score import corpus_score, java_pow, segment_score
from finecap.metrics.meteor.scorer import MeteorScorer
from finecap.metrics.meteor.stemmer import Stemmer
from finecap.metrics.spice import SPICE_ENV, spice, spice_unavailable_reason
from helpers.meteor_cases import fake_meteor_jar

PREDS = {1: "a man surfing on a wave", 2: "a dog running on grass"}
REFS = {
    1: ["a man riding a wave on a surfboard", "a surfer on a wave"],
    2: ["two dogs playing in the grass", "dogs running on a lawn"],
}
# pycocoevalcap's Meteor().compute_score on PREDS / REFS returned (0.3640791704740925, [0.4448605116078899,
# 0.2952867001592558]); the corpus value pools the statistics, it is not the mean of the two (0.3700736)
JAR_CORPUS, JAR_PER = 0.3640791704740925, {1: 0.4448605116078899, 2: 0.2952867001592558}

needs_data = pytest.mark.skipif(R.data_unavailable_reason() is not None, reason="pycocoevalcap's METEOR data missing")


@pytest.fixture(scope="module")
def prefixes():
    if R.data_unavailable_reason() is not None:
        return {"Mr": 1, "No": 2, "U": 1, "S": 1}
    return R.read_jar_data(R.find_meteor_jar()).prefixes


# --------------------------------------------------------------------------------------------------------------------
# The normaliser (-norm)
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("It's a dog.", ["it", "'s", "a", "dog", "."]),  # apostrophe rules and the final dot
        ("the dogs' ball", ["the", "dogs", "'", "ball"]),
        ("5's and 5't", ["5", "'s", "and", "5't"]),
        ("the U.S. army", ["the", "us", "army"]),  # an inner dot and a letter: every dot goes
        ("e.g. this", ["eg", "this"]),
        ("Mr. Smith", ["mr.", "smith"]),  # a listed prefix keeps its dot
        ("No. 5 and no. 5", ["no.", "5", "and", "no", ".", "5"]),  # numeric-only prefix, case-sensitive
        ("Foo. bar and Foo. Bar", ["foo.", "bar", "and", "foo", ".", "bar"]),  # a lower-case next word keeps it
        ("a-b c--d e \u2013 f", ["a", "b", "c", "d", "e", "-", "f"]),  # hyphens between letters go
        ("a---b", ["a--b"]),
        ("a...b a.. b", ["a", "...", "b", "a", "..", "b"]),  # runs of dots stay together
        ("5,300 a,b 5, x", ["5,300", "a", ",", "b", "5", ",", "x"]),  # commas between digits stay
        ("\u201cquoted\u201d ``x'' \u2018y\u2019", ['"', "quoted", '"', '"', "x", '"', "'", "y", "'"]),
        ("a\u00a0b\u2009c\u3000d\te", ["a", "b", "c", "d", "e"]),  # Unicode spaces and tabs separate words
        ("x\x0by", ["x\x0by"]),  # a vertical tab is Java whitespace for the rules, yet splits nothing
        ("caf\u00e9 \u0416\u0423\u041a \u00d7", ["caf\u00e9", "\u0436\u0443\u043a", "\u00d7"]),
        ("a\u00d7b \u6771\u4eac", ["a", "\u00d7", "b", "\u6771", "\u4eac"]),  # other characters are split off
        ("DOTMULTI", ["."]),  # the jar's placeholder for dot runs is not protected from the input
    ],
)
def test_normaliser_examples(prefixes, text, words):
    assert Normalizer(prefixes).words(text) == words


def test_java_trim_and_lower():
    assert java_trim("\x01\t a b \x0b") == "a b" and java_trim("\u00a0a\u00a0") == "\u00a0a\u00a0"
    # U+2C2F is an upper-case letter only since Unicode 14; Java 17 (Unicode 13) leaves it as it is
    assert java_lower("ABC\u2c2f\u0130") == "abc\u2c2fi\u0307"
    assert parse_prefixes("#x\nA\nNo #NUMERIC_ONLY# \n\n") == {"A": 1, "No": 2}


def test_segment_fields_follow_pycocoevalcap_and_the_jar():
    # pycocoevalcap removes ||| from the hypothesis only, and halves double spaces; the jar splits on ||| and trims
    assert segment_fields("a  dog ||| x", ["one ||| two", "\tthree "]) == ("a dog x", ["one", "two", "three"])
    assert segment_fields("a   dog", ["x"]) == ("a  dog", ["x"])  # one replacement pass: three spaces leave two
    assert segment_fields("", [""]) == ("", [""])


# --------------------------------------------------------------------------------------------------------------------
# Matching
# --------------------------------------------------------------------------------------------------------------------


def test_java_hash_and_its_collisions():
    assert java_hash("") == 0 and java_hash("a") == 97 and java_hash("hello") == 99162322
    assert java_hash("as") == java_hash("c5") == 3122  # 97*31 + 115 == 99*31 + 53
    assert java_hash("20s") == java_hash("225")
    assert java_hash("polygenelubricants") == -2147483648  # int overflow wraps
    assert java_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # over UTF-16 code units


def test_synonym_sets_rules():
    data = R.JarData(
        function_words=frozenset(),
        prefixes={},
        synsets={"hat": "1", "hate": "2", "loathe": "2", "a": "3", "glass": "4", "glas": "5", "be": "6", "ba": "7"},
        exceptions={"was": ("be",)},
    )
    assert synonym_sets("hated", data) == {"2"}  # ed -> e ("hate") comes before ed -> "" ("hat")
    assert synonym_sets("was", data) == {"6"}  # an irregular form: its base's synsets
    assert synonym_sets("as", data) == frozenset()  # two letters: no base ("a")
    assert synonym_sets("bas", data) == {"7"}
    assert synonym_sets("glass", data) == {"4"}  # a word ending in ss is no plural of "glas"


def test_stemmer_is_the_pinned_pure_python_snowball():
    stem = Stemmer()
    # the pure-Python class itself, not snowballstemmer.stemmer(), which returns PyStemmer's when it is installed
    assert type(stem._stemmer).__module__ == "snowballstemmer.english_stemmer"
    assert int(importlib.metadata.version("snowballstemmer").split(".")[0]) < 3
    # words the jar and snowballstemmer 2.x stem alike and 3.x / PyStemmer stem otherwise
    assert [stem(w) for w in ("evening", "added", "adds", "organization", "generously")] == [
        "even", "ad", "add", "organ", "generous",
    ]  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# The alignment search
# --------------------------------------------------------------------------------------------------------------------


def test_search_weights_truncate_like_java_ints():
    # a one-word stem match weighs int(0.5) + int(0.5) = 0 and, once its chunk has ended, costs a chunk: with another
    # candidate beside it (not fixed), the empty alignment wins ("dogs" against "dog": the jar matches nothing)
    assert align([[(0, 1, 0, 1, STEM), (0, 1, 0, 1, SYNONYM)]], 1) == []
    # alone, it is fixed: taken whatever it weighs
    assert align([[(0, 1, 0, 1, STEM)]], 1) == [(0, 1, 0, 1, STEM)]
    # one reference word for two hypothesis words: int(0.5) + int(1.0) = 1 > 0, taken
    assert align([[(0, 1, 0, 2, PARAPHRASE), (0, 1, 1, 1, PARAPHRASE)]], 2) == [(0, 1, 0, 2, PARAPHRASE)]


def test_ranking_counts_chunks_once_they_have_ended():
    # The stem and synonym children (weight 0, one chunk each, still open at position 0) rank level with the empty
    # path, and ties keep the list order: children first. The chunks count once the walk is over, so with room for
    # every path the empty one wins; with a beam of 1 or 2 it is cut before. (The jar alike: "dogs" against "dog"
    # has four candidates, stem, synonym and two paraphrases; with -x 1 to 4 it keeps the stem match, with -x 5 or
    # more nothing.)
    cands = [[(0, 1, 0, 1, STEM), (0, 1, 0, 1, SYNONYM)]]
    assert [align(cands, 1, beam=b) for b in (1, 2, 3)] == [[(0, 1, 0, 1, STEM)], [(0, 1, 0, 1, STEM)], []]
    # An exact match and a 2-to-2 paraphrase at position 0 both weigh 2; at position 1 the exact match's chunk has
    # ended and the paraphrase's has not, so the paraphrase moves ahead and stays there.
    assert align([[(0, 1, 0, 1, EXACT), (0, 2, 0, 2, PARAPHRASE)], []], 2) == [(0, 2, 0, 2, PARAPHRASE)]
    # ref "x a b", hyp "b a b" ("a" fixed): of the two "b" children the one extending the fixed match's chunk ranks
    # first, so even a beam of 1 keeps it (as the jar does with -x 1)
    cands = [[], [(1, 1, 1, 1, EXACT)], [(2, 1, 0, 1, EXACT), (2, 1, 2, 1, EXACT)]]
    assert align(cands, 3, beam=1) == [(1, 1, 1, 1, EXACT), (2, 1, 2, 1, EXACT)]
    # ref "x b a", hyp "b b a" ("a" fixed, after the choice): at position 1 neither "b" has met "a" yet, so a beam of
    # 1 keeps the first; with room for both, (1, 1) joins the fixed match's chunk at position 2 and wins
    cands = [[], [(1, 1, 0, 1, EXACT), (1, 1, 1, 1, EXACT)], [(2, 1, 2, 1, EXACT)]]
    assert align(cands, 3, beam=1) == [(1, 1, 0, 1, EXACT), (2, 1, 2, 1, EXACT)]
    assert align(cands, 3) == [(1, 1, 1, 1, EXACT), (2, 1, 2, 1, EXACT)]


def test_fixed_matches_and_chunks():
    cands = [[(0, 1, 0, 1, EXACT)], [(1, 1, 1, 1, STEM), (1, 1, 1, 1, PARAPHRASE)], [(2, 1, 2, 1, EXACT)]]
    assert fixed_positions(cands, 3) == [0, 2]
    # the stem match joins the fixed matches on both sides into one chunk, so it costs nothing: taken
    assert align(cands, 3) == [(0, 1, 0, 1, EXACT), (1, 1, 1, 1, STEM), (2, 1, 2, 1, EXACT)]
    assert count_chunks([(0, 1, 0, 1, 0), (1, 1, 1, 1, 0), (2, 2, 3, 1, 3), (4, 1, 4, 1, 0)]) == 2


def test_distance_goes_to_the_parent_path():
    # ref "x y a", hyp "a a z": taking (2, 0) adds |2 - 0| to the path that skipped it, from which (2, 1) is then
    # copied: (2, 0) ranks first although (2, 1) is nearer, as in the jar
    assert align([[], [], [(2, 1, 0, 1, EXACT), (2, 1, 1, 1, EXACT)]], 3) == [(2, 1, 0, 1, EXACT)]
    # ref "a a", hyp "a": (0, 0) and (1, 0) both have distance 0 (the 1 went to the empty path); at position 1 the
    # chunk of (0, 0) has ended and that of (1, 0) has not, so (1, 0) ranks first and wins, as in the jar
    assert align([[(0, 1, 0, 1, EXACT)], [(1, 1, 0, 1, EXACT)]], 1) == [(1, 1, 0, 1, EXACT)]


# --------------------------------------------------------------------------------------------------------------------
# Scores
# --------------------------------------------------------------------------------------------------------------------


def _stats(tl, rl, tf, rf, stages, chunks, tm, rm):
    out = [tl, rl, tf, rf]
    for s in stages:
        out += s
    return [float(x) for x in out + [chunks, tm, rm]]


def test_segment_score_by_hand():
    # 3 test words (1 function), 4 reference words (1 function); exact: 2 content + 1 function matched on each side
    st = _stats(3, 4, 1, 1, [[2, 2, 1, 1], [0] * 4, [0] * 4, [0] * 4], chunks=1, tm=3, rm=3)
    p = (0.75 * 2 + 0.25 * 1) / (0.75 * 2 + 0.25 * 1)  # 1.0
    r = (0.75 * 2 + 0.25 * 1) / (0.75 * 3 + 0.25 * 1)  # 1.75 / 2.5 = 0.7
    fmean = 1 / (0.15 / p + 0.85 / r)
    frag = 1 / ((3 + 3) / 2)  # not all words matched: 1 chunk still counts
    assert segment_score(st) == pytest.approx(fmean * (1 - 0.6 * frag**0.2), rel=1e-15)
    # everything matched in one chunk: no penalty
    assert segment_score(_stats(2, 2, 0, 0, [[2, 2, 0, 0], [0] * 4, [0] * 4, [0] * 4], 1, 2, 2)) == 1.0
    assert segment_score([0.0] * 23) == 0.0  # empty segments: NaN becomes 0


def test_corpus_score_pools_statistics_and_perfect_segments_add_no_chunk():
    perfect = _stats(2, 2, 0, 0, [[2, 2, 0, 0], [0] * 4, [0] * 4, [0] * 4], 1, 2, 2)
    other = _stats(4, 4, 0, 0, [[2, 2, 0, 0], [0] * 4, [0] * 4, [0] * 4], 2, 2, 2)
    pooled = _stats(6, 6, 0, 0, [[4, 4, 0, 0], [0] * 4, [0] * 4, [0] * 4], 2, 4, 4)  # chunks: 0 + 2
    assert corpus_score([perfect, other]) == segment_score(pooled)
    assert corpus_score([perfect, other]) != (segment_score(perfect) + segment_score(other)) / 2


def test_java_pow_follows_the_jvm():
    # HotSpot's Math.pow(6 / 23.5, 0.2) is 0x1.85a9a8a65f4d1p-1, one unit above the C library's math.pow
    assert java_pow(6 / 23.5) == 0.7610561111586592 != math.pow(6 / 23.5, 0.2)
    assert java_pow(0.5) == math.pow(0.5, 0.2) and java_pow(0.0) == 0.0


# --------------------------------------------------------------------------------------------------------------------
# Data from pycocoevalcap, and the cache of the paraphrase index
# --------------------------------------------------------------------------------------------------------------------


@needs_data
def test_data_is_read_from_pycocoevalcaps_jar():
    jar = R.find_meteor_jar()
    assert jar.name == "meteor-1.5.jar" and R.paraphrase_path(jar).is_file()
    data = R.read_jar_data(jar)
    assert len(data.function_words) == 93 and {"the", ",", "'s", "\u201c"} <= data.function_words
    assert data.prefixes["Mr"] == 1 and data.prefixes["No"] == 2 and len(data.prefixes) == 93
    assert len(data.synsets) == 147306 and "08641944" in data.synsets_of("'hood")
    assert "be" in data.exceptions["was"]


def test_paraphrase_index_is_built_once_cached_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    jar = fake_meteor_jar(tmp_path / "m", [("a dog", "one dog"), ("the dog", "a hound"), ("a dog", "dogs")])
    cache = tmp_path / "cache"
    index = R.load_paraphrase_index(jar, cache)
    path = R.index_path(jar, cache)
    assert path.is_file() and path.parent.parent == cache
    table = index.restrict(["a", "dog", "one", "dogs", "hound"])
    assert table.pairs == {("a", "dog"): [("one", "dog"), ("dogs",)]}  # "the dog" -> "a hound": "the" unused
    assert table.prefixes == {("a",)} and table.max_len == 2
    data = path.read_bytes()  # plain arrays after a JSON header, nothing pickled
    assert data.startswith(R._MAGIC) and b'"arrays": [["vocab", "|u1"' in data and b"pickle" not in data
    # a second load reads the cache and parses nothing
    monkeypatch.setattr(R, "build_paraphrase_index", lambda gz: pytest.fail("rebuilt a valid cache"))
    assert R.load_paraphrase_index(jar, cache).vocab == index.vocab
    monkeypatch.undo()
    good = path.read_bytes()
    for damaged in (b"damaged", good[:-1], good + b"x", good[:-1] + bytes([good[-1] ^ 1]), good[: len(R._MAGIC) + 20]):
        path.write_bytes(damaged)  # not an index, truncated, longer, one bit flipped, the header cut
        with pytest.raises(ValueError):
            R._load(path)
        assert R.load_paraphrase_index(jar, cache).vocab == index.vocab
        assert path.read_bytes() == good  # rebuilt and cached again
    # a listing damaged so that the arrays' bytes stay where they were: one length moved from one array to the next
    # (the same total size, the arrays' bytes and their CRC unchanged), caught by the CRC over the listing too
    size = int.from_bytes(good[len(R._MAGIC) : len(R._MAGIC) + 8], "little")
    header = json.loads(good[len(R._MAGIC) + 8 : len(R._MAGIC) + 8 + size])
    (_, _, n_phrase_len), (_, _, n_run_pairs) = header["arrays"][2], header["arrays"][3]
    header["arrays"][2][2], header["arrays"][3][2] = n_phrase_len + 1, n_run_pairs - 1
    moved = json.dumps(header).encode("utf-8")
    assert len(moved) == size
    path.write_bytes(good[: len(R._MAGIC)] + size.to_bytes(8, "little") + moved + good[len(R._MAGIC) + 8 + size :])
    with pytest.raises(ValueError, match="damaged"):
        R._load(path)
    # arrays that are each whole but do not fit together (written by hand, their CRC right): refused too
    broken = R.ParaphraseIndex(index.vocab, index.phrase_tokens, index.phrase_starts, index.run_starts,
                               index.para_tokens, index.para_starts[:-1])  # fmt: skip
    R._save(broken, path)
    with pytest.raises(ValueError, match="do not fit together"):
        R._load(path)
    assert R.load_paraphrase_index(jar, cache).pairs() == index.pairs()  # rebuilt
    # another table beside the jar: another key
    (jar.parent / "data" / "paraphrase-en.gz").write_bytes(gzip.compress(b"0.5\nx\ny\n"))
    assert R.index_path(jar, cache) != path


def test_scorer_on_tiny_data(tmp_path):
    jar = fake_meteor_jar(tmp_path, [("a dog", "one dog")])
    scorer = MeteorScorer(R.read_jar_data(jar), R.load_paraphrase_index(jar, tmp_path / "cache"))
    scorer.prepare(["a dog", "one dog", "the hound"])
    st = scorer.statistics("one dog", ["a dog"])  # the paraphrase: 2 reference words, 2 hypothesis words
    assert st[:4] == [2, 2, 0, 1] and st[16:20] == [2, 1, 0, 1] and st[20:] == [1, 2, 2]
    st = scorer.statistics("the hound", ["a dog"])  # WordNet: dog ~ hound (a function word alone stays unmatched)
    assert st[12:16] == [1, 1, 0, 0]


# --------------------------------------------------------------------------------------------------------------------
# Availability, inputs, no Java
# --------------------------------------------------------------------------------------------------------------------


def test_missing_data_says_what_to_install(tmp_path, monkeypatch):
    missing = tmp_path / "meteor-1.5.jar"
    assert "meteor-1.5.jar not found at" in meteor_unavailable_reason(jar=missing)
    with pytest.raises(MetricUnavailable, match="install pycocoevalcap"):
        meteor(PREDS, REFS, jar=missing)
    missing.write_bytes(b"")  # jar present, paraphrase table absent
    assert "paraphrase" in meteor_unavailable_reason(jar=missing)
    monkeypatch.setattr(R, "pycocoevalcap_dir", lambda: None)
    monkeypatch.delenv(METEOR_ENV, raising=False)
    assert "pip install pycocoevalcap" in meteor_unavailable_reason()
    monkeypatch.setenv(METEOR_ENV, str(tmp_path / "elsewhere.jar"))
    assert find_meteor_jar() == tmp_path / "elsewhere.jar"


def test_backends_are_checked_and_java_is_only_needed_by_the_java_backend():
    reason = meteor_unavailable_reason(java="no-such-java-binary", backend="java")
    assert "Java runtime" in reason and "no-such-java-binary" in reason and "backend=python" in reason
    with pytest.raises(MetricUnavailable, match="Java runtime"):
        meteor(PREDS, REFS, backend="java", java="no-such-java-binary")
    with pytest.raises(ValueError, match="expected one of python, java"):
        meteor(PREDS, REFS, backend="jvm")


@pytest.mark.slow
@needs_data
def test_meteor_without_java_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run: no java
    assert shutil.which("java") is None and meteor_unavailable_reason() is None
    corpus, per = meteor_per_item(PREDS, REFS)
    assert corpus == {"METEOR": JAR_CORPUS} and {i: s["METEOR"] for i, s in per.items()} == JAR_PER
    # the example of meteor_per_item's docstring
    corpus, per = meteor_per_item({1: "a dog runs on grass"}, {1: ["a dog running on the grass"]})
    assert round(corpus["METEOR"], 4) == round(per[1]["METEOR"], 4) == 0.4139


@pytest.mark.slow
@needs_data
def test_meteor_input_errors_name_the_record():
    with pytest.raises(ValueError, match="no entry for prediction id 3"):
        meteor({3: "a"}, REFS)
    with pytest.raises(ValueError, match=r"references\[1\]: expected a non-empty list"):
        meteor({1: "a"}, {1: "a string"})
    with pytest.raises(ValueError, match="empty, nothing to evaluate"):
        meteor({}, REFS)


@pytest.mark.slow
@needs_data
def test_worker_processes_give_the_same_statistics(monkeypatch):
    import finecap.metrics.meteor.scorer as scorer_module

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform: METEOR scores in one process")
    scorer = meteor_scorer()
    hyps = [PREDS[1], PREDS[2]] * 6
    refs = [REFS[1], REFS[2]] * 6
    one = scorer.score_all(hyps, refs, processes=1)
    monkeypatch.setattr(scorer_module, "MIN_PARALLEL", 2)
    assert scorer.score_all(hyps, refs, processes=2) == one


@pytest.mark.slow
@needs_data
def test_evaluate_and_cocoevalcap_report_meteor_without_java(tmp_path, monkeypatch):
    from finecap.metrics.cocoeval import CaptionFile, COCOEvalCap
    from finecap.metrics.suite import evaluate_items

    monkeypatch.setenv("PATH", str(tmp_path))
    raw_preds = {1: "A man surfing on a wave.", 2: "A dog running on grass."}
    raw_refs = {1: ["A man riding a wave on a surfboard.", "A surfer on a wave."],
                2: ["Two dogs playing in the grass.", "Dogs running on a lawn."]}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing skipped
        corpus, items = evaluate_items(raw_preds, raw_refs, metrics="meteor")
    # PTB tokenisation (lower case, no punctuation) gives PREDS / REFS: the jar's numbers
    assert corpus == {"METEOR": JAR_CORPUS} and {i: s["METEOR"] for i, s in items.items()} == JAR_PER
    coco = {"images": [{"id": i} for i in raw_refs],
            "annotations": [{"image_id": i, "id": 10 * i + k, "caption": c}
                            for i, cs in raw_refs.items() for k, c in enumerate(cs)]}  # fmt: skip
    results = [{"image_id": i, "caption": c} for i, c in raw_preds.items()]
    ev = COCOEvalCap(CaptionFile(coco), CaptionFile(coco).loadRes(results), metrics=("meteor",))
    ev.evaluate()
    assert ev.eval == {"METEOR": JAR_CORPUS} and ev.imgToEval[2] == {"image_id": 2, "METEOR": JAR_PER[2]}
    with pytest.raises(ValueError, match="meteor_backend"):
        COCOEvalCap(CaptionFile(coco), CaptionFile(coco).loadRes(results), meteor_backend="jvm")


def test_importing_reads_and_builds_nothing(tmp_path):
    code = "import finecap.metrics.meteor as m, finecap.metrics.suite; assert m._SCORERS == {}"
    env = {**os.environ, "FINECAP_HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    assert list(tmp_path.iterdir()) == []  # no index built, no folder made


# --------------------------------------------------------------------------------------------------------------------
# SPICE: its jars (it stays on Java: docs/metrics.md)
# --------------------------------------------------------------------------------------------------------------------


def test_spice_missing_java_or_jars(tmp_path, monkeypatch):
    assert "Java runtime" in spice_unavailable_reason(java="no-such-java-binary")
    if shutil.which("java") is None:
        return
    # an empty SPICE folder: the jar is missing
    assert "spice-1.0.jar not found" in spice_unavailable_reason(spice_dir=tmp_path)
    # the jar present but not the Stanford CoreNLP models pycocoevalcap downloads at first use
    (tmp_path / "spice-1.0.jar").write_bytes(b"")
    reason = spice_unavailable_reason(spice_dir=tmp_path)
    assert "stanford-corenlp-3.6.0.jar" in reason and "does not download" in reason
    monkeypatch.setenv(SPICE_ENV, str(tmp_path))
    with pytest.raises(MetricUnavailable, match="CoreNLP"):
        spice(PREDS, REFS)
