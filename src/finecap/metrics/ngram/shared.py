"""BLEU, ROUGE-L and CIDEr-D at once over one reference index (what ``finecap eval`` and ``COCOEvalCap`` run)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

from finecap.metrics.ngram.cider_scorer import df_lists
from finecap.metrics.ngram.counting import PerItem, align, per_item_rows
from finecap.metrics.ngram.index import RefIndex
from finecap.metrics.ngram.rouge_scorer import rouge_l_arrays, rouge_l_ids

NGRAM_METRICS = ("bleu", "rouge_l", "cider_d")


def ngram_metrics(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    metrics: Iterable[str] = NGRAM_METRICS,
    *,
    df_references: Mapping[Hashable, Sequence[str]] | None = None,
    per_item: bool = True,
) -> tuple[dict[str, float], PerItem]:
    """Several n-gram metrics at once, sharing the reference n-gram index: ``(corpus, per_item)``.

    ``metrics`` is a subset of ``NGRAM_METRICS`` = ``("bleu", "rouge_l", "cider_d")``. ``per_item=False`` returns
    ``{}`` as ``per_item`` (building a dict per image costs as much as ROUGE-L itself on large corpora).
    """
    metrics = list(metrics)
    unknown = [m for m in metrics if m not in NGRAM_METRICS]
    if unknown:
        raise ValueError(f"unknown n-gram metric(s) {unknown}; valid: {list(NGRAM_METRICS)}")
    ids, preds, refs = align(predictions, references)
    columns: dict[str, np.ndarray] = {}
    corpus: dict[str, float] = {}
    img = np.arange(len(ids))
    index = None
    if "bleu" in metrics or "cider_d" in metrics:
        index = RefIndex(refs, 4, df_refs=df_lists(df_references), cider="cider_d" in metrics, extra=preds,
                          keep_words="rouge_l" in metrics)  # fmt: skip
        if "bleu" in metrics:
            c, per = index.bleu(preds, img)
            for j in range(4):
                corpus[f"BLEU-{j + 1}"] = float(c[j])
                columns[f"BLEU-{j + 1}"] = per[:, j]
    if "rouge_l" in metrics:
        if index is not None and index.rouge_words is not None:  # the index's word ids serve ROUGE-L too
            per = rouge_l_ids(*index.rouge_words, index.n_refs)
        else:
            per = rouge_l_arrays(preds, refs)
        corpus["ROUGE-L"], columns["ROUGE-L"] = float(np.mean(per)), per
    if "cider_d" in metrics:
        per = index.cider(preds, img)
        corpus["CIDEr-D"], columns["CIDEr-D"] = float(np.mean(per)), per
    return corpus, per_item_rows(ids, columns) if per_item else {}
