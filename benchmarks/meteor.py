"""Time finecap's Python METEOR against pycocoevalcap's ``Meteor`` (the jar) in the same run; check the scores agree.

    .venv/bin/python benchmarks/meteor.py [--images 5000] [--refs 5] [--repeat 3] [--processes N] [--json OUT]
        [--vocabulary N]

Data: seeded COCO-like tokenised captions of real English words (:func:`coco_like_real`: a 420-word caption
vocabulary with Zipfian frequencies and frequent multi-word phrases, 8-20 words per reference, 8-14 per prediction,
8 topic words shared within an image, each named at most once per caption), so that METEOR's stem, synonym and
paraphrase stages work as on COCO. ``--vocabulary N`` adds the N words the paraphrase table holds most often
(:func:`frequent_words`), for a vocabulary as large as real captions'. Three timings, each the best of ``--repeat``
wall-clock runs, the two sides interleaved:

- **cold**: a fresh Python process whose finecap home (``$FINECAP_HOME``) is a new empty folder, as on a machine that
  never ran METEOR: ``meteor_per_item`` builds the paraphrase index from pycocoevalcap's ``paraphrase-en.gz`` and
  caches it, then scores (imports, the jar's data, worker processes included);
- **cached**: the same in a fresh process whose finecap home holds the index (built by a cold run of this benchmark);
- **warm**: a second evaluation in the same process: ``meteor_per_item`` again (data loaded) against
  ``compute_score`` on the same ``Meteor`` (JVM running).

The jar has no cache: its fresh-process time (``Meteor()`` + ``compute_score``: imports, the JVM's start and its
loading of the paraphrase table, the SCORE and EVAL lines) is what both cold and cached are compared with. Every
run's scores are compared with ``==`` (per image and corpus) and the differing images are counted (none are expected:
docs/metrics.md, "How exact"). Target: finecap >= 3x the jar in each of the three timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)
from metric_args import corpus_parser  # noqa: E402

TARGET = 3.0

_WORDS = """man woman person people men women boy girl child kid player skier surfer dog cat horse cow sheep bird
elephant giraffe zebra bear teddy train bus car truck motorcycle bike bicycle boat plane airplane street road sidewalk
city building house tower clock sign light traffic table plate food pizza sandwich cake donut banana apple orange
broccoli carrot hot bowl cup glass bottle wine kitchen room bathroom toilet sink bed couch chair tv laptop computer
phone keyboard desk window door wall field grass snow beach ocean water wave surfboard skateboard skis snowboard kite
frisbee ball tennis racket baseball bat glove umbrella bench park tree sky hill mountain river lake fence shirt hat
jacket dress suit tie bag luggage suitcase vase flowers refrigerator oven stove microwave counter shelf book remote
mirror picture lamp pillow blanket animal animals group couple pair herd flock bunch lot lots piece slice top front
side middle back area corner edge line row view close day night air game match court track station stop parking lot
sitting standing walking riding holding eating playing looking lying laying flying parked hanging waiting running
jumping carrying talking watching using wearing covered filled topped made sits stands walks rides holds eats plays
looks flies runs jumps is are was be being has have there it its his her their this that these those small large big
little tall long short old young new white black red blue green yellow brown gray grey orange pink purple wooden
metal open empty full several two three four many some other each few different various very together near next by
with on in of at to under over behind inside outside down up through while and or from for into around across along
a an the""".split()  # noqa: SIM905 (a word list reads better as text)
_PHRASES = [
    "in front of", "next to", "on top of", "a group of", "a couple of", "a pair of", "a lot of", "lots of", "close up",
    "a bunch of", "side by side", "in the middle of", "on the side of", "each other", "a herd of", "a flock of",
    "a plate of", "a slice of", "is sitting", "are standing", "is holding", "is riding",
]  # fmt: skip


def coco_like_real(
    n_images: int, n_refs: int, seed: int = 0, words: list[str] | None = None
) -> tuple[dict[int, str], dict[int, list[str]]]:
    """Seeded tokenised captions of real words: ``(predictions {id: caption}, references {id: [captions]})``;
    ``words``: the vocabulary (default: the 420 caption words)."""
    rng = np.random.default_rng(seed)
    vocab = np.array(_WORDS if words is None else words)
    p = 1.0 / (np.arange(len(vocab)) + 2.7)  # Zipf-Mandelbrot over a shuffled vocabulary
    p = p[rng.permutation(len(vocab))]
    p /= p.sum()

    def caption(topic: list[str], lo: int, hi: int) -> str:
        words: list[str] = []
        unused = list(topic)  # a caption names each topic word once, as captions rarely repeat a content word
        n = int(rng.integers(lo, hi + 1))
        while len(words) < n:
            r = rng.random()
            if r < 0.12:
                words.extend(_PHRASES[int(rng.integers(len(_PHRASES)))].split())
            elif r < 0.45 and unused:
                words.append(unused.pop(int(rng.integers(len(unused)))))
            else:
                words.append(str(vocab[rng.choice(len(vocab), p=p)]))
        return " ".join(words[:n])

    preds, refs = {}, {}
    for i in range(n_images):
        topic = [str(w) for w in vocab[rng.choice(len(vocab), size=8, replace=False, p=p)]]
        refs[i] = [caption(topic, 8, 20) for _ in range(n_refs)]
        preds[i] = caption(topic, 8, 14)
    return preds, refs


def frequent_words(n: int, cache_root: Path) -> list[str]:
    """The ``n`` words of METEOR's paraphrase table that occur most often in it (ASCII letters only): everyday English
    words, for a vocabulary as large as real captions' (the index is built in ``cache_root``, untimed)."""
    from finecap.metrics.meteor.resources import find_meteor_jar, load_paraphrase_index

    index = load_paraphrase_index(find_meteor_jar(), cache_root=cache_root)
    counts = index.word_counts()
    ranked = (index.vocab[k] for k in np.argsort(-counts, kind="stable").tolist())
    return [w for w, _ in zip((w for w in ranked if w.isascii() and w.isalpha()), range(n))]


_FINECAP = """
import json, sys
from finecap.metrics.meteor import meteor_per_item
d = json.load(open(sys.argv[1]))
preds = {int(k): v for k, v in d["preds"].items()}
refs = {int(k): v for k, v in d["refs"].items()}
processes = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
corpus, per = meteor_per_item(preds, refs, processes=processes)
print(json.dumps([corpus["METEOR"], [per[i]["METEOR"] for i in preds]]))
"""

_PYCOCOEVALCAP = """
import json, sys
from pycocoevalcap.meteor.meteor import Meteor
d = json.load(open(sys.argv[1]))
preds = {int(k): v for k, v in d["preds"].items()}
refs = {int(k): v for k, v in d["refs"].items()}
score, scores = Meteor().compute_score(refs, {i: [c] for i, c in preds.items()})
print(json.dumps([score, list(scores)]))
"""


def _run(code: str, *args: str, home: Path | None = None) -> tuple[float, tuple[float, list[float]]]:
    env = dict(os.environ) if home is None else {**os.environ, "FINECAP_HOME": str(home)}
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code, *args], check=True, capture_output=True, text=True, env=env
    ).stdout
    elapsed = time.perf_counter() - t
    corpus, per = json.loads(out.strip().splitlines()[-1])
    return elapsed, (corpus, per)


def _compare(a: tuple[float, list[float]], b: tuple[float, list[float]]) -> dict[str, float]:
    """How two ``(corpus, per-image)`` results differ: images with another score, the largest differences."""
    return {
        "images_differing": sum(x != y for x, y in zip(a[1], b[1])),
        "max_image_diff": max(abs(x - y) for x, y in zip(a[1], b[1])),
        "corpus_diff": abs(a[0] - b[0]),
    }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = corpus_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=None, help="finecap's worker processes (default: the CPUs)")
    ap.add_argument("--json", type=Path, default=None, help="write {timing: {finecap_s, ...}, comparison, machine}")
    ap.add_argument("--vocabulary", type=int, default=0, metavar="N",
                    help="add the N words the paraphrase table holds most often to the 420 caption words (real "
                    "captions use thousands: more synonyms and paraphrase pairs to keep; default 0)")  # fmt: skip
    args = ap.parse_args(argv)

    from pycocoevalcap.meteor.meteor import Meteor

    from finecap.home import CACHE
    from finecap.metrics.meteor import meteor_per_item
    from finecap.utils.system import usable_cpus

    procs = "" if args.processes is None else str(args.processes)
    results: dict[str, dict[str, float]] = {}
    comparisons: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        words = None
        if args.vocabulary:
            words = list(dict.fromkeys(_WORDS + frequent_words(args.vocabulary, Path(tmp) / "words-index")))
        load = os.getloadavg()[0]
        preds, refs = coco_like_real(args.images, args.refs, args.seed, words)
        data = Path(tmp) / "captions.json"
        data.write_text(json.dumps({"preds": preds, "refs": refs}))
        cached_home = Path(tmp) / "home-cached"
        best = {"cold": float("inf"), "cached": float("inf"), "reference": float("inf")}
        for k in range(args.repeat):  # interleaved, so that both see the same load on the machine
            t_ref, ref_scores = _run(_PYCOCOEVALCAP, str(data))
            cold_home = Path(tmp) / f"home-cold-{k}"  # empty: nothing cached
            t_cold, cold_scores = _run(_FINECAP, str(data), procs, home=cold_home)
            if k == 0:
                cold_home.rename(cached_home)  # holds the index the cold run built
            t_cached, cached_scores = _run(_FINECAP, str(data), procs, home=cached_home)
            comparisons += [_compare(cold_scores, ref_scores), _compare(cached_scores, ref_scores)]
            for name, t in (("reference", t_ref), ("cold", t_cold), ("cached", t_cached)):
                best[name] = min(best[name], t)
        for name in ("cold", "cached"):
            results[name] = {"finecap_s": best[name], "reference_s": best["reference"],
                             "ratio": best["reference"] / best[name]}  # fmt: skip

        cache = {"cache_root": cached_home / CACHE / "meteor"}  # this process: the index the cold run cached
        gts = {i: r for i, r in refs.items()}
        res = {i: [c] for i, c in preds.items()}
        reference = Meteor()
        reference.compute_score(gts, res)  # warm-up: the JVM is running, the paraphrase table loaded
        meteor_per_item(preds, refs, processes=args.processes, **cache)  # warm-up: data loaded
        best_ours = best_ref = float("inf")
        for _ in range(args.repeat):
            t = time.perf_counter()
            score, scores = reference.compute_score(gts, res)
            best_ref = min(best_ref, time.perf_counter() - t)
            t = time.perf_counter()
            corpus, per = meteor_per_item(preds, refs, processes=args.processes, **cache)
            best_ours = min(best_ours, time.perf_counter() - t)
            comparisons.append(_compare((corpus["METEOR"], [per[i]["METEOR"] for i in preds]), (score, list(scores))))
        del reference
        results["warm"] = {"finecap_s": best_ours, "reference_s": best_ref, "ratio": best_ref / best_ours}

    cpus = usable_cpus()
    vocabulary = f", {len(words):,}-word vocabulary" if words is not None else ""
    print(
        f"{args.images} images x {args.refs} references{vocabulary}, best of {args.repeat}, wall time, {cpus} CPUs, "
        f"load average {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end"
    )
    print(machine_line())
    print(f"{'timing':<11} {'finecap_s':>10} {'pycocoevalcap_s':>16} {'ratio':>8}")
    for name, r in results.items():
        ok = ("  ok" if r["ratio"] >= TARGET else "  MISS") + f" (target {TARGET:g}x)"
        print(f"{name:<11} {r['finecap_s']:>10.2f} {r['reference_s']:>16.2f} {r['ratio']:>7.1f}x{ok}")
    worst = max(comparisons, key=lambda c: (c["images_differing"], c["corpus_diff"]))
    identical = worst["images_differing"] == 0 and worst["corpus_diff"] == 0
    print(
        f"scores compared with ==, every run: {'identical' if identical else 'NOT identical'}: "
        f"{worst['images_differing']} of {args.images} images differ (max |diff| {worst['max_image_diff']:.1e}), "
        f"corpus |diff| {worst['corpus_diff']:.1e}"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**results, "comparison": worst, "machine": machine()}, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
