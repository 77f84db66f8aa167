"""METEOR's fast paths give what the plain ones give: the numpy scan of the paraphrase table against the line-by-line
parse (tables with the layouts a scan can trip on), the cache key, and the scorer's memos against a fresh scorer."""

from __future__ import annotations

import gzip
import os
import select
import signal
import zlib
from itertools import pairwise

import numpy as np
import pytest

from finecap.metrics.meteor import meteor_per_item, meteor_scorer, table_scan
from finecap.metrics.meteor import resources as R
from finecap.metrics.meteor.align import align
from finecap.metrics.meteor.inputs import segment_fields
from finecap.metrics.meteor.match import EXACT, Segment, Word, candidates, java_hash
from finecap.metrics.meteor.score import segment_score
from finecap.metrics.meteor.scorer import bound
from finecap.metrics.meteor.table_scan import MAX_WORD_BYTES, TableScanError, scan_table
from helpers.meteor_cases import coco_like, fake_meteor_jar, stress
from helpers.waiting import until


def _table(tmp_path, text: str, name: str = "paraphrase-en.gz", members: int = 1):
    path = tmp_path / name
    data = text.encode("utf-8")
    cut = len(data) // members
    pieces = [data[k * cut : (k + 1) * cut if k < members - 1 else len(data)] for k in range(members)]
    path.write_bytes(b"".join(gzip.compress(p) for p in pieces))
    return path


def _pairs(index: R.ParaphraseIndex) -> list[tuple[list[str], list[str]]]:
    return [(list(a), list(b)) for a, b in index.pairs()]


def _same_layout(fast: R.ParaphraseIndex, plain: R.ParaphraseIndex) -> None:
    """The scan's index is the line parse's array for array: the same runs, and the same words where the two give
    ids (the scan gives them in its hash table's order, the parse in the table's)."""
    for name in ("phrase_starts", "run_starts", "para_starts"):
        assert np.array_equal(getattr(fast, name), getattr(plain, name)), name
    for name in ("phrase_tokens", "para_tokens"):
        words = [[index.vocab[t] for t in getattr(index, name).tolist()] for index in (fast, plain)]
        assert words[0] == words[1], name


_LONG = "x" * MAX_WORD_BYTES  # the longest word the scan keys exactly
_VARIANTS = {
    "plain": "0.5\na dog\none dog\n0.25\na dog\ndogs\n0.1\nthe dog\na hound\n",
    "no final newline": "0.5\na dog\none dog\n0.25\nthe cat\na kitten",
    "incomplete last pair": "0.5\na dog\none dog\n0.25\nthe cat\n",
    "double and edge spaces": "0.5\na  dog\n dog \n0.1\n\n \n",
    "tabs and carriage returns inside words": "0.5\na\tdog\r\ndog\x0bx\n0.2\na\tdog\r\ndog\n",
    "unicode": "0.5\ncafé naïve\nжук 東京 😀\n0.1\ncafé\ncafe\n",
    "word lengths around 8, 16 and 24 bytes": "".join(
        f"0.1\n{'a' * n} {'b' * (n + 1)}\n{'a' * (n - 1)} {'a' * n}b\n" for n in (7, 8, 9, 15, 16, 17, 23)
    )
    + f"0.1\n{_LONG}\n{_LONG[:-1]}y\n",
    "words equal in their first 8 or 16 bytes": "0.1\nabcdefgh1 abcdefgh2\nabcdefghijklmnop1 abcdefghijklmnop2\n",
    # runs: a phrase line said again joins the run of the pair before; one that differs in any byte does not
    "runs of one phrase": "".join(
        f"0.1\n{a}\n{b}\n"
        for a, b in [
            ("a big dog", "a large dog"),
            ("a big dog", "a huge dog"),
            ("a big dog", "big dog"),
            ("a big cat", "a large cat"),
            ("a big dog", "a hound"),  # the same phrase after another: a new run
            ("the quick brown fox jumps", "x"),
            ("the quick brown fox jumpz", "y"),  # differ in the last of 25 bytes
            ("the quick brown fox jumpz", "z"),
            ("abcdefgh", "p"),
            ("abcdefgi", "q"),
            ("abcdefgi ", "r"),
            ("", "empty"),
            ("", "empty again"),
            (" ", "a space"),
            ("  ", "two spaces"),
            ("  ", "two again"),
        ]
    ),  # fmt: skip
    "empty": "",
}


@pytest.mark.parametrize("name", list(_VARIANTS))
def test_scan_equals_the_line_parse(tmp_path, name):
    gz = _table(tmp_path, _VARIANTS[name])
    fast, plain = R.build_paraphrase_index(gz), R.parse_lines(gz)
    assert _pairs(fast) == _pairs(plain)
    # every word once (an incomplete last pair's words may be listed too, unused)
    assert set(plain.vocab) <= set(fast.vocab) and len(set(fast.vocab)) == len(fast.vocab)
    assert fast.phrase_tokens.dtype == np.uint16 and fast.para_tokens.dtype == np.uint16
    if name != "incomplete last pair":
        _same_layout(fast, plain)


def test_runs_hold_each_phrase_once():
    index = R.ParaphraseIndex.from_scan(
        table_scan.ScannedTable(
            ["a", "dog", "one", "the", "cat"],
            np.array([0, 1, 3, 4]),
            np.array([2, 2]),
            np.array([2, 1]),
            np.array([2, 1, 1, 1, 0]),
            np.array([2, 1, 2]),
        )  # fmt: skip
    )
    assert len(index) == 3
    assert index.pairs() == [(("a", "dog"), ("one", "dog")), (("a", "dog"), ("dog",)), (("the", "cat"), ("dog", "a"))]
    assert index.word_counts().tolist() == [3, 5, 1, 1, 1]  # "a": in a phrase of 2 pairs, in a paraphrase


_INFLATERS = ["zlib"] + (["isal"] if table_scan._inflater is not zlib else [])


@pytest.fixture(params=_INFLATERS)
def inflater(request, monkeypatch):
    """The scan with each library that can inflate here: zlib, and ISA-L where ``isal`` is installed."""
    if request.param == "zlib":
        monkeypatch.setattr(table_scan, "_inflater", zlib)
    return request.param


def test_scan_over_many_blocks_and_gzip_members(tmp_path, monkeypatch, inflater):
    rng = np.random.default_rng(0)
    vocab = ["".join(rng.choice(list("abcdé "), size=int(rng.integers(1, 30)))) for _ in range(3000)]
    lines = []
    phrase = ""
    for _ in range(1500):
        if rng.random() < 0.7:  # most pairs start a run; the others repeat the phrase before, across blocks too
            phrase = " ".join(rng.choice(vocab, size=int(rng.integers(1, 4))))
        para = " ".join(rng.choice(vocab, size=int(rng.integers(1, 4))))
        lines += [f"{rng.random():.3f}", phrase, para]
    text = "\n".join(lines) + "\n"
    monkeypatch.setattr(table_scan, "_BLOCK", 4096)  # blocks cut mid-pair, many of them
    monkeypatch.setattr(table_scan, "_READ", 1000)
    gz = _table(tmp_path, text, members=3)
    plain = R.parse_lines(gz)
    if max(len(w.encode()) for w in plain.vocab) > MAX_WORD_BYTES:  # some words are longer: the scan says so
        with pytest.raises(TableScanError, match="longer than 24 bytes"):
            scan_table(gz)
        short = "\n".join(" ".join(w[:MAX_WORD_BYTES] for w in line.split(" ")) for line in lines) + "\n"
        gz = _table(tmp_path, short, "short.gz", members=3)
        plain = R.parse_lines(gz)
    fast = R.build_paraphrase_index(gz)
    assert len(fast) == 1500 and _pairs(fast) == _pairs(plain)
    assert len(fast.run_starts) - 1 < 1200  # runs of several pairs, joined across blocks as the line parse joins them
    _same_layout(fast, plain)


@pytest.mark.parametrize("block", [64, 100, 257, 4096])
def test_runs_cut_by_a_block_are_joined(tmp_path, monkeypatch, block):
    # long runs of one phrase over blocks of every alignment: a block starting inside a run starts a run of its own,
    # joined at the end to the run before; a phrase that only looks alike (the same length) is not joined
    lines = []
    for k in range(60):
        for j in range(k % 7 + 1):
            lines += ["0.5", f"phrase {k // 2} x" if k % 2 else f"phrase {k // 2} y", f"para {k} {j}"]
    monkeypatch.setattr(table_scan, "_BLOCK", block)
    monkeypatch.setattr(table_scan, "_READ", 37)
    gz = _table(tmp_path, "\n".join(lines) + "\n")
    fast, plain = R.build_paraphrase_index(gz), R.parse_lines(gz)
    assert len(plain.run_starts) - 1 == 60 and _pairs(fast) == _pairs(plain)
    _same_layout(fast, plain)


@pytest.mark.parametrize("blocks", ["one block", "many blocks"])
def test_more_than_65536_words(tmp_path, monkeypatch, blocks):
    # one block: more new words than the id table's 65,536 first slots (it must grow within the block, not probe a
    # full table for ever); many blocks: the first blocks' ids kept as uint16, those after the 65,537th word as
    # uint32, joined without cutting any
    lines = []
    for k in range(0, 70_000, 2):
        lines += ["0.1", f"w{k}", f"w{k + 1} w{k % 7}"]
    if blocks == "many blocks":
        monkeypatch.setattr(table_scan, "_BLOCK", 1 << 14)
        monkeypatch.setattr(table_scan, "_READ", 1 << 10)
    gz = _table(tmp_path, "\n".join(lines) + "\n")
    scanned = scan_table(gz)
    tokens = np.concatenate([scanned.phrase_tokens, scanned.para_tokens])
    assert len(scanned.words) == 70_000 and tokens.dtype == np.uint32 and int(tokens.max()) == 69_999
    assert _pairs(R.build_paraphrase_index(gz)) == _pairs(R.parse_lines(gz))


def test_words_the_scan_cannot_key_fall_back_to_the_line_parse(tmp_path):
    gz = _table(tmp_path, f"0.5\n{'y' * (MAX_WORD_BYTES + 1)} dog\n{'y' * (MAX_WORD_BYTES + 2)}\n")
    with pytest.raises(TableScanError):
        scan_table(gz)
    assert _pairs(R.build_paraphrase_index(gz)) == [(["y" * 25, "dog"], ["y" * 26])]


def test_a_hash_collision_is_caught_not_merged(tmp_path, monkeypatch):
    # every word hashed alike: the key comparison must catch it rather than give two words one id
    monkeypatch.setattr(table_scan, "_hash", lambda parts, lens: np.full(len(lens), 7, dtype=np.uint64))
    gz = _table(tmp_path, _VARIANTS["plain"])
    with pytest.raises(TableScanError, match="same 64-bit hash"):
        scan_table(gz, helper=False)  # the patch is this process's: the helper would hash for real
    monkeypatch.setattr(R, "scan_table", lambda gz: scan_table(gz, helper=False))
    assert _pairs(R.build_paraphrase_index(gz)) == _pairs(R.parse_lines(gz))


def _many_blocks(tmp_path, monkeypatch, n: int = 1500):
    """A table of ``n`` pairs (runs among them) in blocks of 4 kB, and its line parse."""
    rng = np.random.default_rng(1)
    vocab = [f"w{k}" for k in range(400)]
    lines, phrase = [], ""
    for _ in range(n):
        if rng.random() < 0.6:
            phrase = " ".join(rng.choice(vocab, size=int(rng.integers(1, 4))))
        lines += ["0.1", phrase, " ".join(rng.choice(vocab, size=int(rng.integers(1, 4))))]
    monkeypatch.setattr(table_scan, "_BLOCK", 4096)
    gz = _table(tmp_path, "\n".join(lines) + "\n")
    return gz, R.parse_lines(gz)


@pytest.mark.parametrize("helper", [True, False])
def test_the_scan_with_and_without_its_helper_process(tmp_path, monkeypatch, helper):
    gz, plain = _many_blocks(tmp_path, monkeypatch)
    theirs = []
    real = table_scan._Helper.results
    monkeypatch.setattr(table_scan._Helper, "results", lambda self: theirs.append(real(self)) or theirs[-1])
    scanned = R.ParaphraseIndex.from_scan(scan_table(gz, helper=helper))
    assert _pairs(scanned) == _pairs(plain)
    _same_layout(scanned, plain)
    if helper:  # the helper scanned blocks (the first one always: its queue is empty then), not all of them here
        assert len(theirs) == 1 and len(theirs[0][1]) > 0 and theirs[0][1][0].number == 0
    else:
        assert theirs == []


def test_a_helper_that_dies_leaves_the_scan_to_this_process(tmp_path, monkeypatch):
    # the helper started with an argument its file does not answer: it exits at once without scanning anything
    gz, plain = _many_blocks(tmp_path, monkeypatch)
    monkeypatch.setattr(table_scan, "_HELPER_ARG", "--not-the-argument")
    started = []
    real = table_scan._Helper.__init__
    monkeypatch.setattr(table_scan._Helper, "__init__", lambda self, gz: started.append(1) or real(self, gz))
    scanned = R.ParaphraseIndex.from_scan(scan_table(gz, helper=True))
    assert started == [1] and _pairs(scanned) == _pairs(plain)
    _same_layout(scanned, plain)


@pytest.mark.parametrize(
    ("executable", "python"),
    [("/usr/bin/python3.11", True), ("C:\\Python311\\python.exe", True), ("/opt/pypy3", True),
     ("/usr/sbin/uwsgi", False), ("/usr/sbin/apache2", False), ("", False), (None, False)],
)  # fmt: skip
def test_which_executables_can_run_the_helper(executable, python):
    assert table_scan._is_python(executable) is python


def test_an_embedded_interpreter_scans_without_a_helper(tmp_path, monkeypatch):
    gz, plain = _many_blocks(tmp_path, monkeypatch, 30)
    monkeypatch.setattr(table_scan.sys, "executable", "/usr/sbin/uwsgi")
    monkeypatch.setattr(table_scan, "_Helper", lambda gz: pytest.fail("a helper was started"))
    assert _pairs(R.ParaphraseIndex.from_scan(scan_table(gz))) == _pairs(plain)


def test_no_interpreter_to_start_a_helper(tmp_path, monkeypatch):
    gz, plain = _many_blocks(tmp_path, monkeypatch, 200)
    monkeypatch.setattr(table_scan.sys, "executable", "")
    assert _pairs(R.ParaphraseIndex.from_scan(scan_table(gz, helper=True))) == _pairs(plain)


@pytest.mark.parametrize("helper", [True, False])
def test_a_table_whose_only_word_is_empty(tmp_path, helper):
    # every line empty: one word, "" (the helper's answer must not lose it)
    gz = _table(tmp_path, "0.1\n\n\n" * 4)
    scanned = R.ParaphraseIndex.from_scan(scan_table(gz, helper=helper))
    assert _pairs(scanned) == _pairs(R.parse_lines(gz)) == [([""], [""])] * 4


def test_a_process_forked_during_the_scan_does_not_hold_the_helper(tmp_path, monkeypatch):
    # a child forked while the helper runs (a DataLoader, a pool) inherits the write end of the helper's input: the
    # helper ends at the end mark, not at the end of its input, which the child keeps open until it exits
    gz, plain = _many_blocks(tmp_path, monkeypatch)
    children = []
    real = table_scan._Helper.results

    def fork_then_results(self):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: holds every inherited descriptor until the test lets it go (at most 60 s)
            os.close(write)
            select.select([read], [], [], 60)
            os._exit(0)
        os.close(read)
        children.append((pid, write))
        return real(self)

    monkeypatch.setattr(table_scan._Helper, "results", fork_then_results)
    try:
        scanned = R.ParaphraseIndex.from_scan(scan_table(gz, helper=True))
        ((pid, write),) = children
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # the scan ended while the child still held the pipe
        assert _pairs(scanned) == _pairs(plain)
    finally:
        for pid, write in children:
            os.close(write)
            os.waitpid(pid, 0)


def _ignores_sigint(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT now (its ``SigIgn`` mask in /proc: the helper sets it first thing)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(line for line in f if line.startswith("SigIgn:")).split()[1]
    return bool(int(mask, 16) >> (signal.SIGINT - 1) & 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads a process's signal mask from Linux's /proc")
def test_ctrl_c_in_the_process_group_leaves_the_helper_scanning(tmp_path, monkeypatch):
    # SIGINT reaches the helper too (one process group): it ignores it, and the scan does not start again here
    gz, plain = _many_blocks(tmp_path, monkeypatch)
    calls, answers = [], []
    real_offer, real_results, real_scan = table_scan._Helper.offer, table_scan._Helper.results, table_scan.scan_table

    def offer(self, number, line0, block):
        if number == 0:
            # the signal goes once the helper ignores it (it starts with Python's default handler, as a child of
            # this process does: a Ctrl+C before that ends it, and the caller scans its blocks itself)
            pid = self.process.pid
            until(lambda: self.process.poll() is not None or _ignores_sigint(pid), "no handler set", timeout=60)
            assert self.process.poll() is None, "the helper ended before it set its handler"
            self.process.send_signal(signal.SIGINT)
        return real_offer(self, number, line0, block)

    monkeypatch.setattr(table_scan._Helper, "offer", offer)
    monkeypatch.setattr(table_scan._Helper, "results", lambda self: answers.append(real_results(self)) or answers[-1])
    monkeypatch.setattr(
        table_scan, "scan_table", lambda gz, helper=None: calls.append(helper) or real_scan(gz, helper)
    )
    scanned = R.ParaphraseIndex.from_scan(table_scan.scan_table(gz, helper=True))
    assert calls == [True] and len(answers) == 1 and len(answers[0][1]) > 0  # no second scan; the helper answered
    assert _pairs(scanned) == _pairs(plain)


def test_what_the_helper_cannot_scan_is_raised_here(tmp_path):
    # a one-block table: the helper is given the first block (its queue is empty), and finds the long word there
    gz = _table(tmp_path, f"0.5\n{'y' * (MAX_WORD_BYTES + 1)} dog\ncat\n")
    with pytest.raises(TableScanError, match="longer than 24 bytes"):
        scan_table(gz, helper=True)


@pytest.mark.parametrize("damage", ["truncated", "not gzip"])
def test_a_damaged_table_raises_as_gzip_does(tmp_path, damage, inflater):
    gz = _table(tmp_path, _VARIANTS["plain"] * 50)
    data = gz.read_bytes()
    gz.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"plain text\n" * 10)
    with pytest.raises((EOFError, zlib.error)):
        scan_table(gz)
    with pytest.raises((EOFError, OSError)):
        R.parse_lines(gz)


def test_cache_key_follows_the_content(tmp_path):
    a = _table(tmp_path, _VARIANTS["plain"], "a.gz")
    b = _table(tmp_path, _VARIANTS["plain"], "b.gz")
    assert R.fingerprint(a) == R.fingerprint(b)  # the same content: the same key, wherever it is
    rng = np.random.default_rng(1)
    lines = [f"0.1\n{rng.integers(1 << 40)}\n{rng.integers(1 << 40)}\n" for _ in range(40_000)]
    c = _table(tmp_path, "".join(lines), "c.gz")
    lines[20_000] = "0.1\nx\ny\n"  # one pair in the middle changed
    d = _table(tmp_path, "".join(lines), "d.gz")
    assert c.stat().st_size > 3 * R._FINGERPRINT_BYTES
    assert R.fingerprint(c) != R.fingerprint(d)  # the gzip trailer's CRC-32 differs


@pytest.mark.slow  # seconds: the jar's data and 600 caption sets
@pytest.mark.skipif(R.data_unavailable_reason() is not None, reason="pycocoevalcap's METEOR data missing")
def test_references_skipped_by_their_bound_could_not_have_been_chosen():
    """The scorer aligns references in the order of an upper bound of their score and skips those whose bound is
    below the best score found: the bound must hold for every reference (not only the skipped ones), and the
    statistics chosen must be those of the first reference with the highest score, as when every one is aligned."""
    scorer = meteor_scorer()
    items = coco_like(200, seed=31) + coco_like(100, seed=32, refs=1) + stress(200, seed=33)
    items += stress(100, seed=34, repetitive=True)
    items = [segment_fields(h, refs) for h, refs in items]
    scorer.prepare(t for h, refs in items for t in (h, *refs))
    skipped = 0
    for hyp, refs in items:
        h = scorer.segment(hyp)
        every = []
        for r in refs:
            seg = scorer.segment(r)
            cands = candidates(h, seg)
            st = scorer.pair_statistics(h, seg, cands)
            every.append((st, segment_score(st)))
            assert segment_score(st) <= bound(h, seg, cands), (hyp, r)
        first_best = max(range(len(every)), key=lambda k: (every[k][1], -k)) if every else None
        assert scorer._best(hyp, refs) == (every[first_best][0] if every else [])
        top = max((s for _, s in every), default=0.0)
        skipped += sum(bound(h, scorer.segment(r), candidates(h, scorer.segment(r))) < top for r in refs)
    assert skipped > 200  # the bound does skip references


def _segment(words: str, function: set[str] = frozenset({"a"})) -> Segment:
    ws = words.split()
    return Segment(ws, [Word(java_hash(w), java_hash(w), w in function, ((w, EXACT),)) for w in ws], None)


def test_bound_by_hand():
    """Hypothesis "a a a dog" against reference "a dog" ("a" a function word, weight 1 - delta = 0.25; "dog" 0.75):
    the hypothesis's three "a" share the reference's one, so its weighted matches are at most 0.25 + 0.75 = 1.0 (not
    3 x 0.25 + 0.75 = 1.5), and the longest chunk is "a dog" on both sides, 4 words, so the fragmentation is at least
    2 / 4. The bound is then the score of the best alignment (a -> the third "a", then dog: one chunk)."""
    hyp, ref = _segment("a a a dog"), _segment("a dog")
    cands = candidates(hyp, ref)
    p = 1.0 / (0.75 * 1 + 0.25 * 3)  # precision: 1.0 over the hypothesis's weighted length, 1.5
    r = 1.0 / (0.75 * 1 + 0.25 * 1)
    fmean = 1.0 / (0.15 / p + 0.85 / r)
    expected = fmean * (1.0 - 0.6 * 0.5**0.2)
    assert bound(hyp, ref, cands) == pytest.approx(expected * (1 + 1e-9), rel=1e-12)  # raised by 1e-9 (score_bound)
    assert align(cands, 4) == [(0, 1, 2, 1, EXACT), (1, 1, 3, 1, EXACT)]
    scorer_stats = [4, 2, 3, 1, 1, 1, 1, 1] + [0] * 12 + [1, 2, 2]  # a -> a, dog -> dog, one chunk
    assert segment_score(scorer_stats) == pytest.approx(expected, rel=1e-12)
    assert segment_score(scorer_stats) <= bound(hyp, ref, cands)
    # "a dog" against itself: one chunk can hold every word, no penalty; "dog a" against "a dog": two chunks at least
    assert bound(_segment("a dog"), ref, candidates(_segment("a dog"), ref)) == pytest.approx(1.0 + 1e-9, rel=1e-12)
    swapped = _segment("dog a")
    assert bound(swapped, ref, candidates(swapped, ref)) == pytest.approx((1.0 - 0.6) * (1 + 1e-9), rel=1e-12)


@pytest.mark.parametrize("blocker", ["file", "file in the way of the key folder"])
def test_a_failed_index_load_is_raised_and_tried_again(tmp_path, blocker):
    # the index loads in a thread (PendingIndex) while the jar's data is read: its error reaches the caller, and the
    # next evaluation loads again instead of keeping the failed scorer
    jar = fake_meteor_jar(tmp_path, [("a dog", "one dog")])
    cache = tmp_path / "cache"
    in_the_way = cache if blocker == "file" else R.index_path(jar, cache).parent
    in_the_way.parent.mkdir(parents=True, exist_ok=True)
    in_the_way.write_text("not a folder")
    preds, refs = {1: "one dog"}, {1: ["a dog"]}
    with pytest.raises(OSError):
        meteor_per_item(preds, refs, jar=jar, cache_root=cache)
    in_the_way.unlink()
    corpus, per = meteor_per_item(preds, refs, jar=jar, cache_root=cache)
    assert R.index_path(jar, cache).is_file()
    # the paraphrase matched (the index was loaded): both words on each side, in one chunk, at the weight 0.6
    assert per[1]["METEOR"] == corpus["METEOR"] == pytest.approx(0.6)


@pytest.mark.slow  # seconds: the jar's data, two scorers over 700 caption sets
@pytest.mark.skipif(R.data_unavailable_reason() is not None, reason="pycocoevalcap's METEOR data missing")
def test_the_adjacent_word_filter_keeps_every_pair_that_can_match():
    """restrict() drops the pairs with two adjacent words never adjacent in a caption: the statistics are those of
    the table restricted by the words alone, with far fewer pairs."""
    from finecap.metrics.meteor.scorer import MeteorScorer

    index = meteor_scorer().index

    class WordsOnly:  # the index, restricted by the words alone
        def restrict(self, words, bigrams=None):
            return index.restrict(words)

    data = R.read_jar_data(R.find_meteor_jar())
    items = coco_like(300, seed=41) + coco_like(100, seed=42, refs=1) + stress(200, seed=43)
    items += stress(100, seed=44, repetitive=True)
    hyps, refs = [h for h, _ in items], [r for _, r in items]
    filtered, words_only = MeteorScorer(data, index), MeteorScorer(data, WordsOnly())
    assert filtered.score_all(hyps, refs, processes=1) == words_only.score_all(hyps, refs, processes=1)
    kept = sum(map(len, filtered.table.pairs.values()))
    assert 0 < kept < sum(map(len, words_only.table.pairs.values())) / 3
    # a later evaluation with a new pair of adjacent words (known words) restricts again and finds its pairs
    before = filtered.table
    a, b = next(
        (a, b)
        for a, bs in words_only.table.pairs.items()
        for b in bs
        if len(a) > 1 and len(b) > 1 and b not in before.pairs.get(a, ())
    )
    filtered.score_all([" ".join(b)], [[" ".join(a)]], processes=1)
    assert filtered.table is not before and b in filtered.table.pairs[a]


@pytest.mark.skipif(R.data_unavailable_reason() is not None, reason="pycocoevalcap's METEOR data missing")
@pytest.mark.parametrize("extra", [[], ["A Dog | runs.", "x ||| y"]])
def test_words_and_adjacent_words_of_many_captions(extra):
    """The scorer finds the words and adjacent-word pairs of many captions at once (one split of all of them when they
    are all tokenised, as numbers): the same as caption by caption."""
    from finecap.metrics.meteor.scorer import MeteorScorer

    scorer = MeteorScorer(R.read_jar_data(R.find_meteor_jar()), None)
    texts = [h for h, refs in coco_like(50, seed=51) for h in (h, *refs)] + ["", "one", "a  b"] + extra
    words, pairs = set(), set()
    for t in texts:
        ws = scorer.normalizer.words(t)
        words.update(ws)
        pairs.update(pairwise(ws))
    assert scorer._words_and_bigrams(texts) == (words, pairs)
    assert ("|" in words) == bool(extra)


@pytest.mark.skipif(R.data_unavailable_reason() is not None, reason="pycocoevalcap's METEOR data missing")
def test_a_segment_of_new_words_is_prepared_first():
    """segment() of a text whose words were never prepared prepares it (its words' match tables), and a segment made
    before (its matches already listed against another reference) matches the new words too: its candidates are
    those of a scorer that prepared every text first."""
    from finecap.metrics.meteor.scorer import MeteorScorer

    data = R.read_jar_data(R.find_meteor_jar())
    fresh, prepared = MeteorScorer(data, None), MeteorScorer(data, None)
    prepared.prepare(["dogs run", "cats sleep", "a dog running"])
    hyp = fresh.segment("dogs run")
    assert candidates(hyp, fresh.segment("cats sleep")) == [(), ()]
    expected = candidates(prepared.segment("dogs run"), prepared.segment("a dog running"))
    assert candidates(hyp, fresh.segment("a dog running")) == expected
    assert any(m[4] == 1 for ms in expected for m in ms)  # dogs -> dog is a stem match
