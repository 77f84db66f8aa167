"""BLEU-1..4, ROUGE-L and CIDEr-D in numpy, giving the numbers of pycocoevalcap 1.2 without Java.

All functions take *tokenised* captions (words separated by whitespace, as pycocoevalcap's scorers do; run
:func:`finecap.metrics.ptb_tokenize.ptb_tokenize` first on raw text) and follow the metric signature
``(predictions: dict[id, str], references: dict[id, list[str]]) -> dict[str, float]``. The ``*_per_item`` variants
return ``(corpus, per_item)`` with ``per_item[id] = {metric: score}``. Images are those of ``predictions`` (like
``COCOEvalCap``, which evaluates the images of the results file); extra ``references`` are ignored.

Example::

    >>> preds = {1: "a red circle", 2: "a blue square"}
    >>> refs = {1: ["a red circle", "a small red circle"], 2: ["a green square"]}
    >>> round(bleu(preds, refs)["BLEU-1"], 6)
    0.833333
    >>> cider = CiderD(refs)             # reward form: reference statistics computed once
    >>> cider.score(["a red circle", "a circle"], [1, 1]).shape
    (2,)

pycocoevalcap quirks reproduced on purpose (each is tested against pycocoevalcap):

- BLEU: words are ``str.split()`` tokens; the brevity penalty uses the reference length *closest* to the candidate
  length (ties -> the shorter reference); each precision is ``(correct + 1e-15) / (guess + 1e-9)`` so that a zero
  count gives a tiny positive score rather than 0; per-image scores use the same formula on one image; the corpus
  score sums counts over images. Counts are clipped by the maximum count of the n-gram in any one reference.
- ROUGE-L: words are ``str.split(" ")`` tokens (so an empty caption is one empty word, and double spaces create
  empty words), LCS-based precision/recall maximised separately over references, beta = 1.2, corpus = mean.
- CIDEr-D (pycocoevalcap's ``Cider`` class *is* CIDEr-D): tf-idf n-gram vectors (n = 1..4) with
  ``idf = log(N) - log(max(1, df))``, where N is the number of *images* and df the number of images whose reference
  set contains the n-gram; the candidate weight is clipped at the reference weight (``min(v_c, v_r) * v_r``); a
  Gaussian length penalty ``exp(-delta^2 / (2 sigma^2))`` with sigma = 6 where delta is the difference in the
  number of *bigrams* (i.e. words - 1, floored at 0); the mean over n of the cosine sums is divided by the number
  of references and multiplied by 10. A cosine is only normalised when both norms are non-zero.
- CIDEr-D document frequencies: by default from the evaluated references (pycocoevalcap); ``df_references`` takes
  them from a fixed corpus instead (then N is that corpus' number of images), which is what self-critical
  training's ``CiderD(df=...)`` does with the training references.
"""

from finecap.metrics.ngram.bleu_scorer import bleu, bleu_per_item
from finecap.metrics.ngram.cider_scorer import CiderD, cider_d, cider_d_per_item
from finecap.metrics.ngram.counting import PerItem
from finecap.metrics.ngram.rouge_scorer import lcs_lengths, rouge_l, rouge_l_per_item
from finecap.metrics.ngram.shared import NGRAM_METRICS, ngram_metrics

__all__ = [
    "CiderD",
    "bleu",
    "bleu_per_item",
    "cider_d",
    "cider_d_per_item",
    "lcs_lengths",
    "ngram_metrics",
    "rouge_l",
    "rouge_l_per_item",
    "NGRAM_METRICS",
    "PerItem",
]
