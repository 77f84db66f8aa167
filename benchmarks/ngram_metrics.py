"""Time finecap's n-gram metrics against pycocoevalcap in the same run and print the speed ratios.

    .venv/bin/python benchmarks/ngram_metrics.py [--images 5000] [--refs 5] [--repeat 3] [--json OUT]

Data: synthetic tokenised captions (seeded; Zipf-distributed words from a 1,000-word vocabulary, 8-15 words), one
prediction and ``--refs`` references per image. Each timing is the best of ``--repeat`` runs, the two sides interleaved
run by run (:mod:`timing`; the range of the rounds' ratios is printed beside the best's), measured by default as
CPU time of this process (``time.process_time``; both implementations are single-threaded), which is robust to other
jobs sharing the machine; ``--clock wall`` measures wall time instead. Metrics:

- ``bleu``, ``rouge_l``, ``cider_d``: corpus + per-image scores on all images (pycocoevalcap's ``compute_score``).
- ``scst_batch``: one self-critical batch, 100 images x 5 sampled captions, scored with CIDEr-D against document
  frequencies of the whole reference corpus. The reference is what self-critical code does every step: build
  pycocoevalcap's CIDEr-D scorer for the batch (cook the 500 candidates and their images' references) and score it
  with the precomputed corpus document frequencies; finecap's :class:`CiderD` precomputes the reference statistics
  once (constructor not timed) and only processes the candidates. Timed over 10 batches.

Also checks that both give the same numbers (max absolute difference printed). Target ratios: CIDEr-D >= 20x,
BLEU and ROUGE-L >= 5x, SCST batch >= 40x. ``--json OUT`` writes ``{metric: {"finecap_s", "reference_s", "ratio",
"finecap_runs", "reference_runs", "ratio_rounds"}}`` and ``"machine"``.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer
from pycocoevalcap.rouge.rouge import Rouge

from finecap.metrics.ngram import CiderD, bleu_per_item, cider_d_per_item, rouge_l_per_item

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)
from metric_args import corpus_parser  # noqa: E402
from timing import Timing, interleaved, spread  # noqa: E402  (benchmarks/timing.py)

TARGETS = {"bleu": 5.0, "rouge_l": 5.0, "cider_d": 20.0, "scst_batch": 40.0}


def synthetic_corpus(n_images: int, n_refs: int, seed: int = 0, vocab: int = 1000):
    """Seeded tokenised captions: ``(predictions {id: str}, references {id: [str]}, sampler)``."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    weights = [1.0 / (i + 1) for i in range(vocab)]

    def caption() -> str:
        return " ".join(rng.choices(words, weights, k=rng.randint(8, 15)))

    refs = {i: [caption() for _ in range(n_refs)] for i in range(n_images)}
    preds = {i: caption() for i in range(n_images)}
    return preds, refs, caption


class _CorpusLen(list):
    """A list whose ``len`` is the corpus size: pycocoevalcap's ``compute_cider`` sets ``ref_len = log(len(crefs))``,
    so this makes it use the corpus' N (as self-critical's ``CiderD(df=...)`` does) without copying its code."""

    def __init__(self, items, n: int):
        super().__init__(items)
        self.n = n

    def __len__(self) -> int:
        return self.n


def corpus_document_frequency(refs: dict) -> defaultdict:
    """pycocoevalcap document frequencies of a reference corpus (its own ``compute_doc_freq``)."""
    scorer = CiderScorer(n=4, sigma=6.0)
    for r in refs.values():
        scorer += (None, r)
    scorer.compute_doc_freq()
    return scorer.document_frequency


def reference_scst_batch(
    df: defaultdict, n_corpus: int, refs: dict, samples: list[str], image_ids: list
) -> np.ndarray:
    """Self-critical style: a fresh pycocoevalcap CIDEr-D scorer per batch with fixed corpus document frequencies."""
    scorer = CiderScorer(n=4, sigma=6.0)
    scorer.document_frequency = df
    for s, i in zip(samples, image_ids):
        scorer += (s, refs[i])
    scorer.crefs = _CorpusLen(scorer.crefs, n_corpus)
    return np.array(scorer.compute_cider())


CLOCKS = {"process": time.process_time, "wall": time.perf_counter}


def timed(ours: Timing, ref: Timing, per: int = 1) -> dict[str, Any]:
    """The row of a metric: the best times (divided by ``per``: a batch's), their ratio, every run's time and the range
    of the rounds' ratios (:func:`timing.spread`)."""
    return {"finecap_s": ours.best / per, "reference_s": ref.best / per, "ratio": ref.best / ours.best,
            "finecap_runs": ours.runs, "reference_runs": ref.runs, "ratio_rounds": spread(ours, ref)}  # fmt: skip


def quiet(fn: Callable[[], object]) -> Callable[[], object]:
    def run():
        with contextlib.redirect_stdout(io.StringIO()):  # pycocoevalcap's Bleu prints its counts
            return fn()

    return run


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = corpus_parser(__doc__.split("\n\n")[0])
    ap.add_argument(
        "--clock", choices=sorted(CLOCKS), default="process", help="CPU time of this process (default) or wall time"
    )
    ap.add_argument("--json", type=Path, default=None, help="write {metric: {finecap_s, ...}, machine}")
    args = ap.parse_args(argv)
    clock = CLOCKS[args.clock]

    preds, refs, caption = synthetic_corpus(args.images, args.refs, args.seed)
    res = {i: [c] for i, c in preds.items()}
    results: dict[str, dict[str, float]] = {}
    diffs: dict[str, float] = {}

    cases = [
        ("bleu", lambda: Bleu(4).compute_score(refs, res), lambda: bleu_per_item(preds, refs)),
        ("rouge_l", lambda: Rouge().compute_score(refs, res), lambda: rouge_l_per_item(preds, refs)),
        ("cider_d", lambda: Cider().compute_score(refs, res), lambda: cider_d_per_item(preds, refs)),
    ]
    for name, ref_fn, our_fn in cases:
        times = interleaved({"reference": quiet(ref_fn), "finecap": our_fn}, args.repeat, clock)
        (ref_corpus, ref_per), (corpus, per) = times["reference"].out, times["finecap"].out
        if name == "bleu":
            d = max(abs(a - b) for a, b in zip(ref_corpus, corpus.values()))
            d = max(d, max(abs(ref_per[k][j] - per[i][f"BLEU-{k + 1}"]) for k in range(4) for j, i in enumerate(refs)))
        else:
            key = next(iter(corpus))
            d = max(abs(ref_corpus - corpus[key]), max(abs(ref_per[j] - per[i][key]) for j, i in enumerate(refs)))
        results[name] = timed(times["finecap"], times["reference"])
        diffs[name] = d

    # SCST: 10 batches of 100 images x 5 samples, document frequencies of the whole reference corpus
    rng = random.Random(args.seed + 1)
    image_list = list(refs)
    batches = []
    for _ in range(10):
        imgs = rng.sample(image_list, min(100, len(image_list)))
        ids = [i for i in imgs for _ in range(5)]
        batches.append(([caption() for _ in ids], ids))
    df = corpus_document_frequency(refs)
    scorer = CiderD(refs)  # precomputed once, like the reward keeps it for the whole training run

    times = interleaved({"reference": lambda: [reference_scst_batch(df, len(refs), refs, s, i) for s, i in batches],
                         "finecap": lambda: [scorer.score(s, i) for s, i in batches]}, args.repeat, clock)  # fmt: skip
    ref_scores, our_scores = times["reference"].out, times["finecap"].out
    diffs["scst_batch"] = max(float(np.abs(a - b).max()) for a, b in zip(ref_scores, our_scores))
    results["scst_batch"] = timed(times["finecap"], times["reference"], per=len(batches))

    print(f"{args.images} images x {args.refs} references, best of {args.repeat}, {args.clock} time; {machine_line()}")
    print(f"{'metric':<12} {'finecap_s':>10} {'reference_s':>12} {'ratio':>8} {'target':>7} {'max |diff|':>11}")
    for name, r in results.items():
        ok = "ok" if r["ratio"] >= TARGETS[name] else "MISS"
        print(
            f"{name:<12} {r['finecap_s']:>10.4f} {r['reference_s']:>12.4f} {r['ratio']:>7.1f}x "
            f"{TARGETS[name]:>5.0f}x {diffs[name]:>11.2e}  {ok}  (rounds {r['ratio_rounds'].split('rounds ')[1]}"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**results, "machine": machine()}, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
